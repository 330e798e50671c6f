"""Timing and reporting helpers shared by the benchmarks (GPU only)."""

from __future__ import annotations

import csv
import os
import statistics
from pathlib import Path
from typing import Callable, Sequence


def cuda_time_us(fn: Callable[[], object], *, reps: int = 50, rounds: int = 7,
                 warmup: int = 5) -> float:
    """Median over ``rounds`` of the mean device time of ``reps`` back-to-back calls (µs),
    measured with CUDA events around the whole batch (one sync per round)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3 / reps)
    return statistics.median(times)


def out_dir(default: str = "benchmarks/out") -> Path:
    path = Path(os.environ.get("OUT", default))
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
