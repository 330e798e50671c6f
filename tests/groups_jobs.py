"""Communicators over the caller's own groups (see harness.py): explicit groups and a
DeviceMesh; no group is created; results equal the reference; mismatches are refused."""

from __future__ import annotations

import torch
import torch.distributed as dist

import dpx
from dpx_torch import DpComm
from harness import raised
from torch_jobs import check_cases


class _Ctx:
    def __init__(self, rank: int, comm: DpComm) -> None:
        self.rank, self._comm = rank, comm

    def comm(self, layout, **kwargs):
        return self._comm


def _counting_new_group():
    calls = []
    real = dist.new_group

    def counted(*a, **k):
        calls.append(a)
        return real(*a, **k)
    return calls, real, counted


def check_adopted(ctx, layout_args, cases) -> dict:
    """Groups made by the caller (every group on every rank, in order), then a DeviceMesh
    with the caller's dim names: both communicators create no group and pass the cases."""
    from torch.distributed.device_mesh import init_device_mesh

    lay = dpx.DpLayout(*layout_args)
    me = lay.coords(ctx.rank)
    mine_tp = mine_rep = None
    for ranks in lay.attn_tp_groups():
        g = dist.new_group(list(ranks)) if len(ranks) > 1 else None
        if ctx.rank in ranks:
            mine_tp = g
    if lay.cp_size > 1:
        for d in range(lay.dp_size):
            g = dist.new_group(list(lay.replica_ranks(d)))
            if d == me.attn_dp_rank:
                mine_rep = g
    calls, real, counted = _counting_new_group()
    dist.new_group = counted
    try:
        comm = DpComm(lay, attn_tp_group=mine_tp, replica_group=mine_rep,
                      cpu_group=dist.group.WORLD)
    finally:
        dist.new_group = real
    created = {"explicit": len(calls)}
    done = check_cases(_Ctx(ctx.rank, comm), layout_args, cases)
    dims = (lay.dp_size, lay.cp_size, lay.attn_tp_size)
    mesh = init_device_mesh("cpu", dims, mesh_dim_names=("data", "context", "tensor"))
    calls, real, counted = _counting_new_group()
    dist.new_group = counted
    try:
        mcomm = DpComm.from_mesh(lay, mesh, replica_group=mine_rep)
    finally:
        dist.new_group = real
    created["mesh"] = len(calls)
    done += check_cases(_Ctx(ctx.rank, mcomm), layout_args, cases)
    # destroy() destroys only the groups a communicator created: the caller's and the
    # mesh's still sum over their ranks afterwards
    comm.destroy()
    mcomm.destroy()
    sums = []
    for g in (mine_tp, mine_rep, mesh.get_group("tensor") if lay.attn_tp_size > 1 else None):
        if g is not None:
            t = torch.ones(1)
            dist.all_reduce(t, group=g)
            sums.append(int(t.item()) == dist.get_world_size(g))
    return dict(created=created, done=done, after_destroy=sums)


def check_mismatched(ctx) -> dict:
    """World 4, layout (4, 2): an attn-tp group this rank is not in, one of the wrong ranks,
    none where one is needed, a cpu_group that is not the world, a mesh of the wrong
    shape: dpx errors naming them (torch orders a group's ranks, so order cannot differ)."""
    from torch.distributed.device_mesh import init_device_mesh

    lay = dpx.DpLayout(4, 2)
    groups = [dist.new_group(r) for r in ([0, 1], [2, 3], [0, 2], [1, 3])]
    out = {}

    foreign = groups[1] if ctx.rank < 2 else groups[0]
    other = groups[2] if ctx.rank % 2 == 0 else groups[3]
    out["foreign"] = raised(lambda: DpComm(lay, attn_tp_group=foreign))
    out["other"] = raised(lambda: DpComm(lay, attn_tp_group=other))
    out["missing"] = raised(lambda: DpComm(lay, cpu_group=dist.group.WORLD))
    out["cpu"] = raised(lambda: DpComm(lay, attn_tp_group=groups[ctx.rank // 2],
                                    cpu_group=groups[ctx.rank // 2]))
    mesh = init_device_mesh("cpu", (4, 1), mesh_dim_names=("a", "b"))
    out["mesh"] = raised(lambda: DpComm.from_mesh(lay, mesh))
    nccl_like = DpComm(lay, attn_tp_group=groups[ctx.rank // 2])
    out["ok_dp"] = nccl_like.dp_rank
    return out
