"""Process memory (RSS) per kind of call, on one GPU (NCCL world size 1):

    python benchmarks/rss_probe.py [STEPS]

Each variant runs 2,000 warm-up steps, then ``STEPS`` (default 10,000) more, with new
counts every step unless it says otherwise, and prints how much the process's resident
memory grew over them -- next to a bare ``all_gather_into_tensor`` of a new size every
step, which shows what torch's NCCL process group itself adds. It tells dpx's memory from
the runtime's in the soak (``soak.py``).
"""

from __future__ import annotations

import gc
import os
import random
import sys
import tempfile
import time
from typing import Callable

import torch
import torch.distributed as dist

import dpx
from dpx_torch import DpComm

H = 1024
MODES = ("max_len", "sum_len", "gatherv")


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1,
                            init_method=f"file://{os.path.join(tempfile.mkdtemp(), 'r')}")
    lay = dpx.DpLayout(1, 1)
    src = torch.randn(1024, H, device="cuda")
    ids = torch.randint(0, 1000, (1024, 8), device="cuda")
    fixed = dpx.plan_step([512], lay, mode="max_len")
    cap = dpx.plan_step([0], lay, mode="max_len", capacity=1024)
    counts = torch.zeros(1, dtype=torch.int32, device="cuda")

    def new_plan(rng: random.Random, modes=MODES) -> tuple[dpx.DpPlan, int]:
        n = rng.randint(0, 1024)
        return dpx.plan_step([n], lay, mode=rng.choice(modes)), max(n, 1)

    def bare(comm, rng, i):
        n = rng.randint(1, 1024)
        dist.all_gather_into_tensor(torch.empty(n, H, device="cuda"), src[:n])

    def plan_only(comm, rng, i):
        new_plan(rng)

    def same_plan(comm, rng, i):
        comm.gather(src[:512], fixed, partial=True)

    def gather(comm, rng, i):
        p, n = new_plan(rng)
        comm.gather(src[:n], p, partial=True)

    def reduce_scatter(comm, rng, i):
        p, _ = new_plan(rng)
        comm.reduce_scatter(torch.empty(p.global_rows, H, device="cuda"), p)

    def capacity(comm, rng, i):
        counts.fill_(rng.randint(0, 1024))
        comm.gather(src, cap, partial=True, counts=counts)

    def gather_async(comm, rng, i):
        p, n = new_plan(rng, ("max_len",))
        _, work = comm.gather_async(src[:n], p, partial=True, key=i % 2)
        work.wait()

    def two_tensors(comm, rng, i):
        p, n = new_plan(rng)
        comm.gather((src[:n], ids[:n]), p, partial=(True, False))

    def fp8(comm, rng, i):
        p, n = new_plan(rng, ("max_len", "gatherv"))
        comm.gather(src[:n], p, partial=False, wire="fp8")

    def mask(comm, rng, i):
        p, _ = new_plan(rng)
        comm.mask_pad_rows(torch.empty(p.global_rows, 8, dtype=torch.int32, device="cuda"), p)

    variants: list[tuple[str, Callable]] = [
        ("bare all_gather, new sizes", bare), ("plan_step only", plan_only),
        ("gather, one plan", same_plan), ("gather", gather),
        ("reduce_scatter", reduce_scatter), ("capacity gather, device counts", capacity),
        ("gather_async", gather_async), ("two-tensor gather", two_tensors),
        ("fp8 gather", fp8), ("mask_pad_rows", mask)]
    for name, fn in variants:
        comm = DpComm(lay)
        rng = random.Random(0)
        for i in range(2000):
            fn(comm, rng, i)
        torch.cuda.synchronize()
        gc.collect()
        before, t0 = _rss_mib(), time.perf_counter()
        for i in range(steps):
            fn(comm, rng, i)
        torch.cuda.synchronize()
        gc.collect()
        print(f"{name:32s} RSS growth {_rss_mib() - before:7.2f} MiB over {steps} steps "
              f"({time.perf_counter() - t0:.1f} s)", flush=True)
        comm.destroy()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
