"""The demo's PyTorch runner: one gloo process per rank (see ``dpx.demo``)."""

from __future__ import annotations

import multiprocessing as mp
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from dpx.demo import DemoProblem
from dpx_torch.comm import DpComm


def _rank_main(rank: int, problem: DemoProblem, init_file: str, results: mp.Queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=problem.world)
    try:
        comm = DpComm(problem.layout)
        w1, w2 = (torch.from_numpy(a) for a in problem.shard(rank))
        d = problem.layout.coords(rank).attn_dp_rank
        for step in range(problem.steps):
            plan = problem.plan(step)
            local = torch.from_numpy(problem.partial_states(step, rank, plan.num_tokens[d]))
            dist.barrier()
            t0 = time.perf_counter()
            gathered = comm.gather(local, plan, partial=True)
            partial_out = torch.relu(gathered @ w1) @ w2
            out = comm.reduce_scatter(partial_out, plan)
            ms = (time.perf_counter() - t0) * 1e3
            results.put((rank, step, ms, gathered.numpy().copy(), out.numpy().copy()))
        comm.destroy()
    finally:
        dist.destroy_process_group()


def run(problem: DemoProblem) -> list[dict]:
    """Per step: ``out`` (per rank), ``gathered`` (per rank), ``gather_ok``, ``ms``."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = str(Path(tmp) / "rendezvous")
        procs = [ctx.Process(target=_rank_main, args=(r, problem, init, results), daemon=True)
                 for r in range(problem.world)]
        for p in procs:
            p.start()
        steps = [dict(out=[None] * problem.world, gathered=[None] * problem.world, ms=0.0)
                 for _ in range(problem.steps)]
        for _ in range(problem.world * problem.steps):
            rank, step, ms, g, o = results.get(timeout=300)
            s = steps[step]
            s["out"][rank], s["gathered"][rank] = o, g
            s["ms"] = max(s["ms"], ms)
            if all(x is not None for x in s["out"]):
                print(f"  [torch] step {step} done", flush=True)
        for p in procs:
            p.join(timeout=60)
    for s in steps:
        s["gather_ok"] = all(np.array_equal(g, s["gathered"][0]) for g in s["gathered"])
    return steps
