"""dpx_torch on CPU tensors against the stock torch ops that move the same rows.

    python benchmarks/cpu_ops.py [--rows 1000,100000,400000,1000000] [--width 16]

gloo world 1, float32 rows of ``width`` elements, every op and padding mode, host counts
(one replica of ``rows`` rows, aligned, no padding: the stock sequence is exact). The stock
sequences:

- ``scatter``: ``out.copy_(g[offset:offset + n])`` (the slot is the replica's rows);
- ``gather`` MAX_LEN / GATHERV: ``all_gather_into_tensor(out, x)``;
- ``gather`` SUM_LEN: ``out.zero_(); out[offset:offset + n].copy_(x); all_reduce(out)``;
- ``reduce_scatter`` (every mode): ``reduce_scatter_tensor(out, g)``.

The fastest of 5 calls each (ms) and the ratio dpx / stock; writes cpu_ops.csv to $OUT.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dpx  # noqa: E402
from common import out_dir, print_table, write_csv  # noqa: E402


def _best_ms(fn, reps: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1000,100000,400000,1000000")
    ap.add_argument("--width", type=int, default=16)
    args = ap.parse_args()
    init = os.path.join(tempfile.mkdtemp(), "rdv")
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=0, world_size=1)
    from dpx_torch import DpComm

    torch.set_num_threads(1)
    layout = dpx.DpLayout(1, 1)
    comm = DpComm(layout)
    rows = []
    for n in (int(r) for r in args.rows.split(",")):
        x = torch.randn(n, args.width)
        for mode in ("max_len", "sum_len", "gatherv"):
            plan = dpx.plan_step([n], layout, mode=mode)
            g = torch.randn(plan.global_rows, args.width)
            out_g = torch.empty(plan.global_rows, args.width)
            out_s = torch.empty(n, args.width)
            o = plan.offsets[0]
            if mode == "sum_len":
                def stock_gather():
                    out_g.zero_()
                    out_g[o:o + n].copy_(x)
                    dist.all_reduce(out_g)
            else:
                def stock_gather():
                    dist.all_gather_into_tensor(out_g, x)
            cases = {
                "gather": (lambda: comm.gather(x, plan, partial=True, out=out_g),
                           stock_gather),
                "scatter": (lambda: comm.scatter(g, plan, out=out_s),
                            lambda: out_s.copy_(g[o:o + n])),
                "reduce_scatter": (lambda: comm.reduce_scatter(g, plan, out=out_s),
                                   lambda: dist.reduce_scatter_tensor(out_s, g)),
            }
            for op, (ours, stock) in cases.items():
                a, b = _best_ms(ours), _best_ms(stock)
                rows.append(dict(rows=n, op=op, mode=mode, dpx_ms=a, stock_ms=b,
                                 ratio=a / b))
    print(f"torch {torch.__version__}, gloo world 1, CPU, float32 x {args.width}, one thread")
    print_table(rows, ["rows", "op", "mode", "dpx_ms", "stock_ms", "ratio"])
    print(f"worst ratio: {max(r['ratio'] for r in rows):.2f}")
    write_csv(out_dir() / "cpu_ops.csv", rows)
    comm.destroy()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
