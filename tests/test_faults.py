"""A peer that dies mid-step makes the others fail with an error, not hang (gloo)."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time

import pytest

pytestmark = pytest.mark.multiproc
WORLD, DIES_AT = 3, 3


def _rank(rank: int, init: str, q, path) -> None:
    sys.path[:0] = path
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import dpx
    from dpx_torch import DpComm

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank,
                            world_size=WORLD, timeout=timedelta(seconds=20))
    comm = DpComm(dpx.DpLayout(WORLD, WORLD))
    plan = dpx.plan_step([4, 0, 2], comm.layout)
    x = torch.ones(4, 8)
    t0 = time.time()
    try:
        for step in range(10):
            if rank == 2 and step == DIES_AT:
                os._exit(17)  # the peer dies without a word
            comm.reduce_scatter(comm.gather(x, plan, partial=True), plan)
        q.put((rank, "finished", time.time() - t0, ""))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        q.put((rank, "error", time.time() - t0, f"{type(exc).__name__}: {exc}"[:300]))


def test_dead_peer_raises_on_survivors(tmp_path):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, str(tmp_path / "rdv"), q, list(sys.path)),
                         daemon=True) for r in range(WORLD)]
    for p in procs:
        p.start()
    results = {}
    deadline = time.time() + 120
    while len(results) < WORLD - 1 and time.time() < deadline:
        try:
            rank, status, secs, msg = q.get(timeout=5)
            results[rank] = (status, secs, msg)
        except Exception:  # noqa: BLE001 - queue.Empty: keep waiting until the deadline
            pass
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    assert procs[2].exitcode == 17
    assert set(results) == {0, 1}, f"survivors hung: got {results}"
    for rank, (status, secs, msg) in results.items():
        assert status == "error", f"rank {rank} did not notice the dead peer"
        assert secs < 60, f"rank {rank} took {secs:.0f}s to fail"
