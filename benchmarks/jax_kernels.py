"""The same place kernel launched from JAX (jax-triton) and from torch, against XLA's own
versions, on one GPU, in one process and one run.

    XLA_PYTHON_CLIENT_PREALLOCATE=false python benchmarks/jax_kernels.py

Device times come from CUPTI (``common.profiled_us``): it records every kernel and copy on
the device whoever launched it, so the torch launch, the jax-triton launch and XLA's own
kernels are timed by the same clock. Per size (``G`` global rows, ``dp`` slots of
``n = G / dp`` rows, hidden 7168 bf16), device µs per placed slot:

  torch_int         dpx_torch.place_rows, start/count as ints
  torch_dev         the same with start/count in device memory (the JAX launch always
                    reads them from device memory: they are traced values)
  jax_triton        dpx_jax.place_rows(impl="triton"): all device work of one call of a
                    jitted place (start passed in as a device int32 scalar), whatever XLA
                    adds around the kernel included
  jax_triton_kernel the place kernel alone in that call
  jax_xla           impl="xla" (clipped gather + mask), the same jitted call
  jax_dus           jnp.zeros + lax.dynamic_update_slice, the same jitted call

Host side, per call (start passed as a device int32, as a jitted step does):
  jax_dispatch_us   wall time per jitted place call, 50 back to back, one sync
  jax_dispatch_pyint_us  the same with start passed as a Python int (shipped to the
                    device on every call)
  jax_host_us       time for the jitted call to return (host cost only)
  jit_floor_host_us the same for a jitted program that only slices its input
                    (what any jitted call costs on this host)
  torch_eager_us    wall time per eager torch place_rows call, back to back
  torch_host_us     time for the eager torch call to return
  loop_wall_us      wall time per iteration of K calls in a jitted fori_loop, against
  loop_device_us    the device time per iteration of that loop (the difference is XLA's
                    per-iteration loop cost, not the kernel's)

It also compares the PTX jax-triton generated for the prefill kernel with the PTX Triton
compiled for the torch launch with device start/count. Writes jax_kernels.csv and
jax_kernels.png.
"""

from __future__ import annotations

import argparse
import difflib
import glob
import os
import statistics
import tempfile
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

import dpx_jax
from common import import_jax_triton, out_dir, print_table, profiled_us, pyplot, write_csv
from dpx.kernels import launch
from dpx.kernels import rows as kernels
from dpx_torch import place_rows

K = 50


def _wall_us(call: Callable[[], object], calls: int = K, rounds: int = 5) -> float:
    """Wall µs per call of ``calls`` back-to-back calls and one sync (median of rounds)."""
    jax.block_until_ready(call())
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = None
        for _ in range(calls):
            out = call()
        jax.block_until_ready(out)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e6 / calls)
    return statistics.median(times)


def _host_us(call: Callable[[], object], calls: int = K) -> float:
    """Median µs for ``call()`` to return, each call awaited before the next."""
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        out = call()
        times.append((time.perf_counter() - t0) * 1e6)
        jax.block_until_ready(out)
        torch.cuda.synchronize()
    return statistics.median(times)


def _synced(call: Callable[[], object]) -> Callable[[], None]:
    def run() -> None:
        jax.block_until_ready(call())
        torch.cuda.synchronize()
    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--dp", type=int, default=8)
    args = ap.parse_args()
    H, dp = args.hidden, args.dp
    # read by jax-triton when it is first imported (dpx_jax imports it lazily, below)
    dump = tempfile.mkdtemp(prefix="jax_triton_dump_")
    os.environ["JAX_TRITON_DUMP_DIR"] = dump
    import_jax_triton()
    rows = []
    for name, per in (("decode", 32), ("mid", 512), ("prefill", 4096)):
        G, n = dp * per, per
        slot_t = torch.randn(n, H, device="cuda").to(torch.bfloat16)
        out_t = torch.empty(G, H, device="cuda", dtype=torch.bfloat16)
        s_dev = torch.tensor([3 * n], dtype=torch.int32, device="cuda")
        n_dev = torch.tensor([n], dtype=torch.int32, device="cuda")
        torch_int, _ = profiled_us(
            _synced(lambda: place_rows(slot_t, 3 * n, n, G, out=out_t)), reps=20)
        torch_dev, _ = profiled_us(
            _synced(lambda: place_rows(slot_t, s_dev, n_dev, G, out=out_t)), reps=20)
        torch_eager = _wall_us(lambda: place_rows(slot_t, 3 * n, n, G, out=out_t))
        torch_host = _host_us(lambda: place_rows(slot_t, 3 * n, n, G, out=out_t))

        src = jnp.asarray(slot_t.float().cpu().numpy(), jnp.bfloat16)
        st3 = jnp.int32(3 * n)
        makers = {
            "triton": lambda s, st: dpx_jax.place_rows(s, st, jnp.int32(n), G, impl="triton"),
            "xla": lambda s, st: dpx_jax.place_rows(s, st, jnp.int32(n), G, impl="xla"),
            "dus": lambda s, st: lax.dynamic_update_slice(jnp.zeros((G, H), s.dtype), s, (st, 0)),
        }
        dev: dict[str, float] = {}
        kernel_only = 0.0
        for label, maker in makers.items():
            prog = jax.jit(maker)
            dev[label], per_name = profiled_us(_synced(lambda prog=prog: prog(src, st3)), reps=20)
            if label == "triton":
                kernel_only = per_name["move_rows_kernel"]
                # bitwise: the jax-triton launch gives the torch launch's result
                a = np.asarray(prog(src, st3).astype(jnp.float32))
                assert np.array_equal(a, out_t.float().cpu().numpy()), "launches disagree"

        one = jax.jit(makers["triton"])
        jax_dispatch = _wall_us(lambda: one(src, st3))
        jax_host = _host_us(lambda: one(src, st3))
        jax_dispatch_pyint = _wall_us(lambda: one(src, 3 * n))
        floor = jax.jit(lambda s, st: s[:1])
        floor_host = _host_us(lambda: floor(src, st3))

        starts = jnp.arange(dp, dtype=jnp.int32) * n
        loop = jax.jit(lambda s, sts: lax.fori_loop(
            0, K, lambda i, buf: makers["triton"](s, sts[i % dp]), jnp.zeros((G, H), s.dtype)))
        loop_wall = _wall_us(lambda: loop(src, starts), calls=1) / K
        loop_dev, _ = profiled_us(_synced(lambda: loop(src, starts)), reps=2)

        rows.append(dict(
            name=name, global_rows=G, MiB=round(G * H * 2 / 2**20, 1),
            torch_int_us=torch_int, torch_dev_us=torch_dev,
            jax_triton_us=dev["triton"], jax_triton_kernel_us=kernel_only,
            jax_xla_us=dev["xla"], jax_dus_us=dev["dus"],
            jax_triton_vs_torch_int=dev["triton"] / torch_int,
            jax_triton_vs_torch_dev=dev["triton"] / torch_dev,
            kernel_vs_torch_dev=kernel_only / torch_dev,
            dus_vs_jax_triton=dev["dus"] / dev["triton"],
            xla_vs_jax_triton=dev["xla"] / dev["triton"],
            jax_dispatch_us=jax_dispatch, jax_dispatch_pyint_us=jax_dispatch_pyint,
            jax_host_us=jax_host, jit_floor_host_us=floor_host,
            torch_eager_us=torch_eager, torch_host_us=torch_host,
            loop_wall_us=loop_wall, loop_device_us=loop_dev / K))
        jax.clear_caches()
    print(f"device: {torch.cuda.get_device_name()}  jax {jax.__version__}  torch "
          f"{torch.__version__}  hidden={H} bfloat16  dp={dp}")
    print("device time per placed slot (CUPTI):")
    print_table(rows, ["name", "MiB", "torch_int_us", "torch_dev_us", "jax_triton_us",
                       "jax_triton_kernel_us", "jax_xla_us", "jax_dus_us",
                       "jax_triton_vs_torch_int", "jax_triton_vs_torch_dev",
                       "kernel_vs_torch_dev", "dus_vs_jax_triton", "xla_vs_jax_triton"])
    print("host side per call (wall clock):")
    print_table(rows, ["name", "jax_dispatch_us", "jax_dispatch_pyint_us", "jax_host_us",
                       "jit_floor_host_us", "torch_eager_us", "torch_host_us", "loop_wall_us",
                       "loop_device_us"])
    od = out_dir()
    write_csv(od / "jax_kernels.csv", rows)
    _plot(rows, od / "jax_kernels.png")
    _compare_ptx(dump, slot_t, s_dev, n_dev, out_t)


def _compare_ptx(dump: str, src: torch.Tensor, start: torch.Tensor, count: torch.Tensor,
                 out: torch.Tensor) -> None:
    """Print whether jax-triton's PTX of the place kernel equals the torch launch's."""
    rows, width = out.shape
    tile = launch.tile_for(rows, width, out.element_size(), src_rows=src.shape[0])
    block_r, block_c, warps = launch.row_blocks(width, tile)
    zero = torch.zeros(1, dtype=torch.int32, device=src.device)
    compiled = kernels.move_rows_kernel[launch.grid(rows, width, tile)](
        src, zero, start, count, 0, 0, 0, src.shape[0], rows, out, WIDTH=width,
        SRC_START_PTR=True, DST_START_PTR=True, COUNT_PTR=True, BLOCK_R=block_r,
        BLOCK_C=block_c, WIDE=launch.wide(src.numel(), out.numel()), STREAM=tile.stream,
        num_warps=warps)
    torch_ptx = compiled.asm["ptx"]
    jax_ptx = [open(f).read() for f in glob.glob(f"{dump}/*/move_rows_kernel.ptx")]
    same = [p == torch_ptx for p in jax_ptx]
    print(f"move_rows_kernel PTX: torch launch at the last size {len(torch_ptx.splitlines())} "
          f"lines; jax-triton compiled {len(jax_ptx)} variant(s) (one per launch tile), "
          f"identical to the torch launch's: {same}; one identical: {any(same)}")
    (out_dir() / "move_rows_torch.ptx").write_text(torch_ptx)
    for i, p in enumerate(jax_ptx):
        (out_dir() / f"move_rows_jax{i}.ptx").write_text(p)
        if p != torch_ptx and not any(same):
            diff = list(difflib.unified_diff(torch_ptx.splitlines(), p.splitlines(),
                                             "torch", f"jax{i}", n=0, lineterm=""))
            print(f"jax{i} vs torch: {len(diff)} diff lines; the first 40:")
            print("\n".join(diff[:40]))


def _plot(rows: list[dict], path) -> None:
    plt = pyplot()
    if plt is None:
        return
    keys = ["torch_int_us", "torch_dev_us", "jax_triton_us", "jax_xla_us", "jax_dus_us"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.16
    for k_i, key in enumerate(keys):
        xs = [r_i + (k_i - 2) * width for r_i in range(len(rows))]
        ax.bar(xs, [r[key] / r["torch_int_us"] for r in rows], width, label=key[:-3])
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.set_xticks(range(len(rows)), [f"{r['name']}\n{r['MiB']} MiB" for r in rows])
    ax.set_ylabel("device time / torch-launched kernel")
    ax.set_title(f"place one slot: launches and XLA versions, {torch.cuda.get_device_name()}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
