"""gather / reduce_scatter in every mode against the plain collectives, on several ranks.

    torchrun --nproc-per-node 8 benchmarks/collectives.py            # NCCL, one GPU a rank
    torchrun --nproc-per-node 2 benchmarks/collectives.py --backend gloo --quick   # smoke run

For hidden 7168 bf16 (fp32 on gloo), decode and prefill token counts and four count
patterns (uniform, skewed, one idle replica, one replica with everything), times
``DpComm.gather(partial=True)`` and ``reduce_scatter`` in MAX_LEN, SUM_LEN and GATHERV, and
the plain ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` of the same global buffer
size in the same run. Prints algbw and busbw (nccl-tests: busbw = algbw * (n-1)/n for
all-gather and reduce-scatter) and the ratio to the plain collective; then fits
``dpx.CostModel`` (latency and bus bandwidth, least squares over the plain collectives)
and reports how often ``policy="cost"`` with the fitted model picks a mode within 5% of the
measured fastest, and the loss when it does not. Rank 0 writes collectives.csv (and a plot
when matplotlib is present) to $OUT or benchmarks/out.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

import dpx
from common import out_dir, print_table, write_csv
from dpx_torch import DpComm

PATTERNS = {
    "uniform": lambda dp, n: [n] * dp,
    "skewed": lambda dp, n: [max(1, (2 * n * (d + 1)) // (dp + 1)) for d in range(dp)],
    "one_idle": lambda dp, n: [0] + [n] * (dp - 1),
    "one_has_all": lambda dp, n: [n * dp] + [0] * (dp - 1),
}


def _time(fn, reps: int, cuda: bool) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        dist.barrier()
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    t = torch.tensor([statistics.median(times)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=_CPU)
    return float(t)


_CPU = None


def main() -> None:
    global _CPU  # noqa: PLW0603 - benchmark script state, not library code
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="nccl")
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--dp", type=int, default=None, help="default: world size (attn_tp 1)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, few repetitions")
    args = ap.parse_args()
    cuda = args.backend == "nccl"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(args.backend)
    _CPU = dist.new_group(backend="gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    lay = dpx.DpLayout(world, args.dp or world)
    comm = DpComm(lay)
    dtype = torch.bfloat16 if cuda else torch.float32
    H = 64 if args.quick else args.hidden
    item = torch.empty(0, dtype=dtype).element_size()
    dev = "cuda" if cuda else "cpu"
    scales = {"decode": 4, "prefill": 16} if args.quick else {"decode": 32, "prefill": 4096}
    reps = 3 if args.quick else 20
    rows = []
    for scale, n in scales.items():
        for pattern, make in PATTERNS.items():
            counts = make(lay.dp_size, n)
            local = torch.ones(max(counts), H, dtype=dtype, device=dev)
            for mode in ("max_len", "sum_len", "gatherv"):
                plan = dpx.plan_step(counts, lay, mode=mode)
                G = plan.global_rows
                gbuf = torch.empty(G, H, dtype=dtype, device=dev)
                big = torch.ones(G, H, dtype=dtype, device=dev)
                t_g = _time(lambda: comm.gather(local, plan, partial=True, out=gbuf), reps, cuda)
                t_rs = _time(lambda: comm.reduce_scatter(big, plan), reps, cuda)
                per = -(-G // world)
                ag_in = torch.ones(per, H, dtype=dtype, device=dev)
                ag_out = torch.empty(per * world, H, dtype=dtype, device=dev)
                t_ag = _time(lambda: dist.all_gather_into_tensor(ag_out, ag_in), reps, cuda)
                t_prs = _time(lambda: dist.reduce_scatter_tensor(ag_in, ag_out), reps, cuda)
                size = G * H * item
                f = (world - 1) / world
                rows.append(dict(scale=scale, pattern=pattern, counts=str(counts), mode=mode,
                                 MiB=round(size / 2**20, 3),
                                 gather_busbw_GBs=size / t_g * f / 1e9,
                                 allgather_busbw_GBs=per * world * H * item / t_ag * f / 1e9,
                                 gather_vs_plain=t_ag / t_g,
                                 rs_busbw_GBs=size / t_rs * f / 1e9,
                                 rs_vs_plain=t_prs / t_rs, gather_us=t_g * 1e6,
                                 rs_us=t_rs * 1e6, plain_ag_us=t_ag * 1e6,
                                 plain_rs_us=t_prs * 1e6, plain_bytes=per * world * H * item))
    if rank == 0:
        print(f"{world} ranks, backend {args.backend}, layout {lay.describe()}, hidden {H} "
              f"{dtype}")
        print_table(rows, ["scale", "pattern", "mode", "MiB", "gather_busbw_GBs",
                           "allgather_busbw_GBs", "gather_vs_plain", "rs_busbw_GBs",
                           "rs_vs_plain", "gather_us", "rs_us"])
        _fit_and_score(rows, lay, H * item)
        write_csv(out_dir() / "collectives.csv", rows)
    comm.destroy()
    dist.destroy_process_group()


def _fit_and_score(rows, lay, row_bytes) -> None:
    """Least-squares latency + bandwidth from the plain all-gathers (t = a + b * moved),
    then the planner's choice with that model against the measured fastest mode."""
    n = lay.world_size
    xs = [r["plain_bytes"] * (n - 1) / n for r in rows]
    ys = [r["plain_ag_us"] * 1e-6 for r in rows]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs) or 1.0
    slope = max(sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var, 1e-15)
    lat = max(my - slope * mx, 0.0)
    model = dpx.CostModel(bus_bandwidth=1.0 / slope, latency=lat)
    print(f"fitted CostModel: bus_bandwidth={model.bus_bandwidth / 1e9:.4g} GB/s, "
          f"latency={model.latency * 1e6:.4g} us")
    points, within, losses = 0, 0, []
    keys = sorted({(r["scale"], r["pattern"]) for r in rows})
    for key in keys:
        group = {r["mode"]: r["gather_us"] + r["rs_us"] for r in rows
                 if (r["scale"], r["pattern"]) == key}
        counts = eval(next(r["counts"] for r in rows if (r["scale"], r["pattern"]) == key))  # noqa: S307
        pick = dpx.plan_step(counts, lay, policy="cost", cost_model=model,
                             row_bytes=row_bytes).mode.value
        best = min(group.values())
        points += 1
        if group[pick] <= 1.05 * best:
            within += 1
        else:
            losses.append(group[pick] / best - 1)
    print(f"planner within 5% of the fastest mode at {within}/{points} points"
          + (f"; mean loss elsewhere {100 * statistics.fmean(losses):.0f}%" if losses else ""))


if __name__ == "__main__":
    main()
