"""A two-rank script that gathers and exits, run by tests/test_exit.py under torchrun.

    exit_script.py DP VARIANT

VARIANT: ``both`` (``comm.destroy()`` then ``dist.destroy_process_group()``), ``pg_only``
(only the latter), ``prepared`` (``both``, holding prepared ops past the teardown, as a
server holds them), ``validate_error`` (a ``validate=True`` communicator whose call is
rejected and caught, then a valid gather, ``comm.destroy()``, a world collective and
``dist.destroy_process_group()``), ``refs`` (``both``, then report whether any process
group the communicator used is still alive), ``refs_at_exit`` (``pg_only`` and the
communicator's interpreter-exit hook, then the same report), ``prepared_refs`` and
``validate_refs`` (``prepared`` / ``validate_error`` with the cyclic garbage collector
off, then the same report: a group kept by a reference cycle shows as alive). Prints
``ok <rank>`` and, for the ``*refs*`` variants, ``alive=<n>``.
"""

from __future__ import annotations

import gc
import sys
import weakref

import torch
import torch.distributed as dist

import dpx
from dpx_torch import DpComm

dp, variant = int(sys.argv[1]), sys.argv[2]
if variant in ("prepared_refs", "validate_refs"):
    gc.disable()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
layout = dpx.DpLayout(world_size=world, dp_size=dp)
validating = variant.startswith("validate")
comm = DpComm(layout, validate=validating)
plan = dpx.plan_step([3] * dp, layout)
x = torch.ones(3, 8)
if validating:
    try:
        comm.gather(x.double(), plan, partial=True)
    except ValueError:
        raise AssertionError("a rejected dtype is a TypeError on every rank")
    except TypeError:
        pass
got = comm.gather(x, plan, partial=True)
assert got.shape == (plan.global_rows, 8)
held = []
if variant.startswith("prepared"):
    held = [comm.prepare_gather(x, plan, partial=True),
            comm.prepare_scatter_columns(got, plan)]
    for _ in range(3):
        assert torch.equal(held[0](x), got)
        held[1](got)
groups = [g for g in (comm.groups.world, comm.groups.attn_tp, comm.groups.replica,
                      *comm.groups.owned) if g is not None]
refs = [weakref.ref(g) for g in groups]
del groups
if variant != "pg_only" and variant != "refs_at_exit":
    comm.destroy()
if validating:
    names: list = [None] * world
    dist.all_gather_object(names, f"rank {rank}")
    assert names == [f"rank {r}" for r in range(world)]
if variant == "refs_at_exit":
    dist.destroy_process_group()
    comm._exit_hook()          # what interpreter exit runs for a communicator not destroyed
else:
    dist.destroy_process_group()
if variant in ("refs", "refs_at_exit"):
    gc.collect()
if "refs" in variant:
    print(f"alive={sum(r() is not None for r in refs)}")
print("ok", rank, flush=True)
