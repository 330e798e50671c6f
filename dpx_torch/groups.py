"""Process groups a :class:`dpx_torch.DpComm` needs, built from a :class:`dpx.DpLayout`."""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from dpx.errors import DpxValueError
from dpx.layout import DpLayout


@dataclass(frozen=True)
class DpGroups:
    """The world group, this rank's attn-tp group and a CPU (gloo) group for host exchanges.

    ``rank`` is this process's rank in ``world`` (the layout's rank numbering).
    """

    world: dist.ProcessGroup
    attn_tp: dist.ProcessGroup
    cpu: dist.ProcessGroup
    rank: int
    backend: str
    global_ranks: tuple[int, ...]


def build_groups(layout: DpLayout, group: dist.ProcessGroup | None) -> DpGroups:
    """Create the subgroups on every rank of ``group`` (collective over that group).

    ``group`` defaults to the default process group; its size must equal
    ``layout.world_size``. Subgroups are created for every attn-tp group in the same order
    on every rank (``use_local_synchronization`` keeps ranks outside ``group`` out of it).
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

    def sub(ranks: tuple[int, ...], backend_name: str | None) -> dist.ProcessGroup:
        return dist.new_group([glob[r] for r in ranks], backend=backend_name,
                              use_local_synchronization=True)

    attn_tp = world
    if layout.attn_tp_size < layout.world_size:
        mine = layout.attn_tp_groups()[rank // layout.attn_tp_size]
        attn_tp = sub(mine, None)
    cpu = world if backend == "gloo" else sub(tuple(range(size)), "gloo")
    return DpGroups(world=world, attn_tp=attn_tp, cpu=cpu, rank=rank, backend=backend,
                    global_ranks=tuple(glob))
