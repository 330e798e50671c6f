"""Process groups a :class:`dpx_torch.DpComm` needs, built from a :class:`dpx.DpLayout`."""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from dpx.errors import DpxValueError
from dpx.layout import DpLayout


@dataclass(frozen=True)
class DpGroups:
    """The world group, this rank's attn-tp and replica groups, and a CPU (gloo) group for
    host exchanges.

    ``rank`` is this process's rank in ``world`` (the layout's rank numbering).
    """

    world: dist.ProcessGroup
    attn_tp: dist.ProcessGroup | None  # None when attn_tp_size == 1 (no attn-tp collective)
    replica: dist.ProcessGroup | None  # this rank's replica (cp x attn_tp ranks); None if 1
    cpu: dist.ProcessGroup
    rank: int
    backend: str
    global_ranks: tuple[int, ...]


def build_groups(layout: DpLayout, group: dist.ProcessGroup | None) -> DpGroups:
    """Create the subgroups. Collective over the *default* process group: every one of its
    ranks must build its ``DpComm``s in the same order (torch.distributed's rule for
    ``new_group``).

    ``group`` defaults to the default process group; its size must equal
    ``layout.world_size``. Every attn-tp group is created on every rank, in layout order,
    so group names and store keys agree everywhere (communicators can be destroyed and
    built again).
    """
    if not dist.is_initialized():
        raise DpxValueError("torch.distributed is not initialised: call "
                            "dist.init_process_group before building a DpComm")
    world = group if group is not None else dist.group.WORLD
    size = dist.get_world_size(world)
    if size != layout.world_size:
        raise DpxValueError(f"process group has {size} ranks but layout.world_size="
                            f"{layout.world_size}; they must be equal")
    rank = dist.get_rank(world)
    backend = str(dist.get_backend(world)).lower()
    glob = [dist.get_global_rank(world, r) for r in range(size)]

    def subgroups(groups: tuple[tuple[int, ...], ...]) -> dist.ProcessGroup | None:
        """This rank's group among ``groups`` (every one created on every rank, in order)."""
        size = len(groups[0])
        if size == 1:
            return None
        if size == layout.world_size:
            return world
        mine = None
        for ranks in groups:
            g = dist.new_group([glob[r] for r in ranks])
            if rank in ranks:
                mine = g
        return mine

    attn_tp = subgroups(layout.attn_tp_groups())
    if layout.cp_size == 1:
        replica = attn_tp  # the same ranks
    else:
        replica = subgroups(tuple(layout.replica_ranks(d) for d in range(layout.dp_size)))
    cpu = world if backend == "gloo" else dist.new_group(glob, backend="gloo")
    return DpGroups(world=world, attn_tp=attn_tp, replica=replica, cpu=cpu, rank=rank,
                    backend=backend, global_ranks=tuple(glob))
