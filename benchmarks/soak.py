"""Many async gather/reduce_scatter steps of varying size on one GPU (NCCL world 1): the
numbers of events and pooled buffers and the reserved memory must stay flat.

    python benchmarks/soak.py [--steps 100000]
    python benchmarks/soak.py --device cpu --steps 5000 --hidden 16   # gloo, Triton interpreter
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time

import torch
import torch.distributed as dist

import dpx
from dpx_torch import DpComm


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = ap.parse_args()
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(0)
    dist.init_process_group("nccl" if cuda else "gloo",
                            init_method=f"file://{os.path.join(tempfile.mkdtemp(), 'r')}",
                            rank=0, world_size=1)
    lay = dpx.DpLayout(1, 1)
    comm = DpComm(lay)
    modes = ("max_len", "sum_len", "gatherv")
    rng = random.Random(0)
    src = torch.randn(1024, args.hidden, device=args.device)
    plans = [dpx.plan_step([n], lay, mode=m) for n in range(0, 1025, 7) for m in modes]
    for m in modes:  # warm-up: the largest step of every mode under both keys
        for key in (0, 1):
            p = dpx.plan_step([1024], lay, mode=m)
            g, w = comm.gather_async(src, p, partial=True, key=key)
            comm.reduce_scatter_async(g, p, key=key)[1].wait()
    def reserved() -> int:
        return torch.cuda.memory_reserved() if cuda else comm.pool.nbytes()

    if cuda:
        torch.cuda.synchronize()
    start = dict(events=len(comm.overlap.events), buffers=len(comm.pool),
                 allocations=comm.pool.allocations, reserved=reserved())
    t0 = time.perf_counter()
    bad = 0
    for i in range(args.steps):
        plan = plans[rng.randrange(len(plans))]
        n = plan.num_tokens[0]
        g, work = comm.gather_async(src[:max(n, 1)], plan, partial=True, key=i % 2)
        work.wait()
        rs, work = comm.reduce_scatter_async(g, plan, key=i % 2)
        work.wait()
        if i % 500 == 0:
            bad += not torch.equal(rs[:n], src[:n])
    if cuda:
        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    end = dict(events=len(comm.overlap.events), buffers=len(comm.pool),
               allocations=comm.pool.allocations, reserved=reserved())
    print(f"{args.steps} async gather+reduce_scatter steps on {args.device} (sizes 0..1024 "
          f"rows x {args.hidden} fp32, 3 modes, 2 micro-batch keys) in {secs:.1f} s "
          f"(reserved = {'torch.cuda.memory_reserved()' if cuda else 'pool bytes'})")
    for k in start:
        print(f"  {k:<12} after warm-up {start[k]:>12}   after all steps {end[k]:>12}")
    print(f"  spot checks failed: {bad}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
