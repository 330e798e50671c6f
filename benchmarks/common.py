"""Timing and reporting helpers shared by the benchmarks (GPU only)."""

from __future__ import annotations

import csv
import os
import statistics
from pathlib import Path
from typing import Callable, Sequence

#: nvfp4's global scale in the GPU tables (rows of N(0, 1) values: an amax near 5 maps
#: to e4m3's largest scale times e2m1's largest code)
NV_SCALE = 448 * 6 / 5.0


def cuda_time_us(fn: Callable[[], object], *, reps: int = 50, rounds: int = 7,
                 warmup: int = 3, graph: bool = True) -> float:
    """Device time per call (µs): ``reps`` calls captured in one CUDA graph, replayed
    ``rounds`` times between CUDA events, median taken. The graph removes host launch
    cost, so small sizes show the kernels' own time. ``graph=False`` times eager
    back-to-back calls instead (host-bound when launches cost more than the work)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    run = fn
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(reps):
                fn()
        run = g.replay
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        if graph:
            run()
        else:
            for _ in range(reps):
                run()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3 / reps)
    return statistics.median(times)


def copy_us(moved: int, cache: dict | None = None) -> float:
    """The copy ceiling: device time (µs, :func:`cuda_time_us`) of a device-to-device
    ``copy_`` that reads and writes ``moved`` bytes in all, memoised in ``cache``."""
    if cache is not None and moved in cache:
        return cache[moved]
    import torch

    a = torch.empty(moved // 2, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    t = cuda_time_us(lambda: b.copy_(a))
    if cache is not None:
        cache[moved] = t
    return t


def out_dir() -> Path:
    """Where a benchmark writes its CSVs and plots: ``$OUT`` if set, else ``out/`` beside
    the benchmark scripts (wherever they are run from)."""
    path = Path(os.environ.get("OUT") or Path(__file__).resolve().parent / "out")
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_csv(path: Path, rows: Sequence[dict]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def print_table(rows: Sequence[dict], columns: Sequence[str]) -> str:
    def fmt(v):
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    widths = [max(len(c), *(len(fmt(r[c])) for r in rows)) for c in columns]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(fmt(r[c]).rjust(w) for c, w in zip(columns, widths)) + " |"
              for r in rows]
    text = "\n".join(lines)
    print(text)
    return text


def profiled_us(fn: Callable[[], object], *, reps: int = 5) -> tuple[float, dict[str, float]]:
    """Device time of ``fn`` from CUPTI (``torch.profiler``): ``(total µs per call, {kernel
    name: median µs})``. CUPTI sees every kernel and copy of the process on the device,
    whoever launched it (torch, Triton, XLA), so launches from different frameworks are
    timed by one clock. ``fn`` must synchronize (``torch.cuda.synchronize`` or
    ``jax.block_until_ready``) before returning; one warm-up call runs first."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    per_name: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            per_name.setdefault(e.name, []).append(e.time_range.elapsed_us())
    total = sum(sum(v) for v in per_name.values()) / reps
    return total, {k: statistics.median(v) for k, v in per_name.items()}


def import_jax_triton() -> object | None:
    """Import jax-triton, keeping ``TRITON_CACHE_DIR`` as it was: jax-triton 0.3.x sets it
    to ``""`` when imported, which makes Triton compiles launched from torch in the same
    process fail afterwards. ``None`` when jax-triton cannot be imported here."""
    before = os.environ.get("TRITON_CACHE_DIR")
    try:
        import jax_triton
    except Exception:  # noqa: BLE001 - ImportError, or a jaxlib without GPU support
        return None
    finally:
        if before is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = before
    return jax_triton


def pyplot():
    """matplotlib's ``pyplot`` on the file backend, or None (and a note) where matplotlib
    is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return None
    return plt


def world_plot(lines: Sequence[tuple], path: Path, *, ylabel: str, title: str) -> None:
    """A log-log plot against the world size: ``lines`` of ``(label, style, alpha, worlds,
    values)``; a note instead where matplotlib is not installed."""
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, style, alpha, xs, ys in lines:
        ax.plot(xs, ys, style, alpha=alpha, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("world size")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
