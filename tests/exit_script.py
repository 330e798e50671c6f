"""A two-rank script that gathers once and exits, run by tests/test_exit.py under torchrun.

    exit_script.py DP VARIANT

VARIANT: ``both`` (``comm.destroy()`` then ``dist.destroy_process_group()``), ``pg_only``
(only the latter), ``refs`` (``both``, then report whether any process group the
communicator used is still alive), ``refs_at_exit`` (``pg_only`` and the communicator's
interpreter-exit hook, then the same report). Prints ``ok <rank>`` and, for the ``refs``
variants, ``alive=<n>``.
"""

from __future__ import annotations

import gc
import sys
import weakref

import torch
import torch.distributed as dist

import dpx
from dpx_torch import DpComm

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
dp, variant = int(sys.argv[1]), sys.argv[2]
layout = dpx.DpLayout(world_size=world, dp_size=dp)
comm = DpComm(layout)
plan = dpx.plan_step([3] * dp, layout)
got = comm.gather(torch.ones(3, 8), plan, partial=True)
assert got.shape == (plan.global_rows, 8)
groups = [g for g in (comm.groups.world, comm.groups.attn_tp, comm.groups.replica,
                      *comm.groups.owned) if g is not None]
refs = [weakref.ref(g) for g in groups]
del groups
if variant in ("both", "refs"):
    comm.destroy()
if variant == "refs_at_exit":
    dist.destroy_process_group()
    comm._exit_hook()          # what interpreter exit runs for a communicator not destroyed
else:
    dist.destroy_process_group()
if variant.startswith("refs"):
    gc.collect()
    print(f"alive={sum(r() is not None for r in refs)}")
print("ok", rank, flush=True)
