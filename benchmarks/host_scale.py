"""Host cost of planning one step, at worlds 8 to 1024 (pure Python, no device).

    python benchmarks/host_scale.py [--quick]

For every world (dp = world, and dp = world / 8: attn-tp 8), a stream of steps whose
counts are all distinct (so no per-plan cache ever hits), each timed as:

``plan_schedules_us``: ``plan_step(counts)`` (sglang policy) plus the schedules of rank 0's
    gather (partial) and reduce_scatter, built by ``build_schedule(..., cache=cache)`` with
    one :class:`dpx.ScheduleCache` for the run -- what a server plans per step. The cache
    holds templates per plan *structure*; new counts of a known structure are evaluated by
    the template, never rebuilt (``template_builds`` counts the builds, all in warm-up).
``capacity_us``: the same for a capacity plan (``capacity=64``, host counts).
``sglang_us`` / ``cost_us``: ``plan_step`` alone with ``policy="sglang"`` / ``"cost"``.
``cold_us``: one step's plan and schedules without a cache (every template built anew).
``cold_build_us``: ``plan_step`` and one gather schedule without a cache (one build, no
    generated code).

Each figure is the best of 5 rounds (rounds interleave the measurements, so slow drift of
the host hits all alike). Writes ``host_scale.csv`` and ``host_scale.png`` (log-log) to
``$OUT`` (default ``benchmarks/out``).
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Callable

import dpx
from common import out_dir, print_table, world_plot, write_csv


def _per_call(fn: Callable[[list[int]], object], steps: list[list[int]]) -> float:
    t0 = time.perf_counter()
    for c in steps:
        fn(c)
    return (time.perf_counter() - t0) / len(steps) * 1e6


def measure(world: int, dp: int, *, n: int, rounds: int = 5, seed: int = 0) -> dict:
    lay = dpx.DpLayout(world, dp)
    rng = random.Random(seed)
    cache = dpx.ScheduleCache()
    cap_cache = dpx.ScheduleCache()

    def plan_schedules(c):
        p = dpx.plan_step(c, lay)
        dpx.build_schedule(p, dpx.Op.GATHER, rank=0, partial=True, cache=cache)
        dpx.build_schedule(p, dpx.Op.REDUCE_SCATTER, rank=0, cache=cache)

    def capacity(c):
        p = dpx.plan_step(c, lay, capacity=64)
        dpx.build_schedule(p, dpx.Op.GATHER, rank=0, partial=True, cache=cap_cache)
        dpx.build_schedule(p, dpx.Op.REDUCE_SCATTER, rank=0, cache=cap_cache)

    def cold(c):
        p = dpx.plan_step(c, lay)
        dpx.build_schedule(p, dpx.Op.GATHER, rank=0, partial=True)
        dpx.build_schedule(p, dpx.Op.REDUCE_SCATTER, rank=0)

    def cold_build(c):
        dpx.build_schedule(dpx.plan_step(c, lay), dpx.Op.GATHER, rank=0, partial=True)

    fns = {"plan_schedules_us": plan_schedules, "capacity_us": capacity,
           "sglang_us": lambda c: dpx.plan_step(c, lay),
           "cost_us": lambda c: dpx.plan_step(c, lay, policy="cost"), "cold_us": cold,
           "cold_build_us": cold_build}

    def counts() -> list[list[int]]:
        return [[rng.randrange(0, 65) for _ in range(dp)] for _ in range(n)]

    for fn in fns.values():  # warm-up: every structure's templates built here
        _per_call(fn, counts()[:max(n // 4, 4)])
    builds = cache.builds
    best = {k: float("inf") for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            steps = counts()[:max(n // 10, 2)] if name.startswith("cold") else counts()
            best[name] = min(best[name], _per_call(fn, steps))
    return dict(world=world, dp=dp, attn_tp=world // dp, **best,
                cost_vs_sglang=best["cost_us"] / best["sglang_us"],
                template_builds=builds, builds_after_warmup=cache.builds - builds)


def _plot(rows: list[dict], path) -> None:
    lines = []
    for key, label, style in (("plan_schedules_us", "plan + 2 schedules", "o-"),
                              ("capacity_us", "capacity plan + 2 schedules", "s-"),
                              ("sglang_us", "plan_step, sglang policy", "^--"),
                              ("cost_us", "plan_step, cost policy", "v--")):
        for dp_is_world, alpha in ((True, 1.0), (False, 0.5)):
            pts = [r for r in rows if (r["dp"] == r["world"]) == dp_is_world]
            lines.append((f"{label} ({'dp = world' if dp_is_world else 'dp = world/8'})",
                          style, alpha, [r["world"] for r in pts], [r[key] for r in pts]))
    world_plot(lines, path, ylabel="host µs per step (best of 5)",
               title="dpx planning cost per step, new counts every step")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="worlds 8 and 64, few steps")
    args = ap.parse_args()
    worlds = (8, 64) if args.quick else (8, 64, 256, 1024)
    rows = []
    for w in worlds:
        for dp in (w, w // 8):
            n = 20 if args.quick else (400 if w <= 64 else 100 if w <= 256 else 40)
            rows.append(measure(w, dp, n=n))
    print("host µs per step, new counts every step (best of 5 rounds):")
    print_table(rows, list(rows[0]))
    out = out_dir()
    write_csv(out / "host_scale.csv", rows)
    _plot(rows, out / "host_scale.png")


if __name__ == "__main__":
    main()
