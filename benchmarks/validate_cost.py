"""Cost of DpComm(validate=True) on gloo: 4 CPU processes, MAX_LEN gather and
reduce_scatter of [64, 256] float32 per replica, 200 steps each, validate off vs on.

    python benchmarks/validate_cost.py
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import tempfile
import time

WORLD, STEPS = 4, 20


def _rank(rank: int, init: str, q) -> None:
    import torch
    import torch.distributed as dist

    import dpx
    from dpx_torch import DpComm

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    lay = dpx.DpLayout(WORLD, 2)
    res = {}
    for validate in (False, True):
        comm = DpComm(lay, validate=validate)
        for partial in (True, False):
            plan = dpx.plan_step([64, 64], lay, mode="max_len")
            x = torch.ones(64, 256)
            times = []
            for _ in range(STEPS):
                dist.barrier()
                t0 = time.perf_counter()
                g = comm.gather(x, plan, partial=partial)
                comm.reduce_scatter(g, plan)
                times.append(time.perf_counter() - t0)
            res[(validate, partial)] = statistics.median(times) * 1e6
        comm.destroy()
    q.put((rank, res))
    dist.destroy_process_group()


def main() -> None:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    init = os.path.join(tempfile.mkdtemp(), "rdv")
    procs = [ctx.Process(target=_rank, args=(r, init, q)) for r in range(WORLD)]
    for p in procs:
        p.start()
    res = dict(q.get(timeout=600) for _ in range(WORLD))
    for p in procs:
        p.join()
    r0 = res[0]
    print(f"gloo, world {WORLD} (dp 2, attn_tp 2), gather+reduce_scatter of [64, 256] fp32, "
          f"median of {STEPS} steps, rank 0:")
    for partial in (True, False):
        off, on = r0[(False, partial)], r0[(True, partial)]
        print(f"  partial={partial!s:<5}  validate off {off:8.0f} us   on {on:8.0f} us   "
              f"(+{on - off:.0f} us, {on / off:.2f}x)")


if __name__ == "__main__":
    main()
