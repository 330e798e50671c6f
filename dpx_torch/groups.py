"""Process groups a :class:`dpx_torch.DpComm` needs, built from a :class:`dpx.DpLayout`."""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from dpx.errors import DpxTypeError, DpxValueError
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
    cpu: dist.ProcessGroup | None  # None: the caller gave no gloo group (NCCL world)
    rank: int
    backend: str
    global_ranks: tuple[int, ...]
    owned: bool = True  # the communicator created attn_tp / replica / cpu itself


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


def _ranks_of(name: str, g: object) -> tuple[int, ...]:
    if g is dist.GroupMember.NON_GROUP_MEMBER:
        raise DpxValueError(f"{name} is a group that global rank {dist.get_rank()} is not "
                            f"a member of")
    if not isinstance(g, dist.ProcessGroup):
        raise DpxTypeError(f"{name} must be a torch.distributed.ProcessGroup, got "
                           f"{type(g).__name__}")
    return tuple(dist.get_process_group_ranks(g))


def adopt_groups(layout: DpLayout, group: dist.ProcessGroup | None,
                 attn_tp_group: dist.ProcessGroup | None,
                 replica_group: dist.ProcessGroup | None,
                 cpu_group: dist.ProcessGroup | None) -> DpGroups:
    """The caller's groups, checked against the layout; creates none (no ``new_group``).

    ``group`` (default: the default group) is the world in layout rank order;
    ``attn_tp_group`` must hold exactly this rank's attn-tp ranks in order (needed when
    ``attn_tp_size > 1``), ``replica_group`` this rank's replica (needed when ``cp_size >
    1``). ``cpu_group`` is a gloo group over the world for host exchanges (``validate``,
    ``sync_counts``); a gloo world serves itself, and without one on NCCL those raise a
    dpx error."""
    if not dist.is_initialized():
        raise DpxValueError("torch.distributed is not initialised: call "
                            "dist.init_process_group before building a DpComm")
    world = group if group is not None else dist.group.WORLD
    glob = _ranks_of("group", world)
    if len(glob) != layout.world_size:
        raise DpxValueError(f"group has {len(glob)} ranks but layout.world_size="
                            f"{layout.world_size}; they must be equal")
    rank = dist.get_rank(world)
    me = layout.coords(rank)
    backend = str(dist.get_backend(world)).lower()

    def check(name: str, g, ranks: tuple[int, ...]) -> dist.ProcessGroup | None:
        want = tuple(glob[r] for r in ranks)
        if len(ranks) == 1:
            if g is not None and _ranks_of(name, g) != want:
                raise DpxValueError(f"{name} holds global ranks {list(_ranks_of(name, g))}; "
                                    f"this rank's group is {list(want)}")
            return None
        if len(ranks) == layout.world_size and g is None:
            return world
        if g is None:
            raise DpxValueError(f"{name}= is needed: layout {layout.describe()} has "
                                f"{len(ranks)}-rank groups (this rank's: global ranks "
                                f"{list(want)})")
        got = _ranks_of(name, g)
        if got != want:
            raise DpxValueError(f"{name} holds global ranks {list(got)}; layout "
                                f"{layout.describe()} needs this rank's group in order: "
                                f"{list(want)}")
        return g

    tp_ranks = tuple(layout.rank_of(me.attn_dp_rank, me.attn_cp_rank, t)
                     for t in range(layout.attn_tp_size))
    attn_tp = check("attn_tp_group", attn_tp_group, tp_ranks)
    if layout.cp_size == 1:
        if replica_group is not None:
            check("replica_group", replica_group, tp_ranks)
        replica = attn_tp
    else:
        replica = check("replica_group", replica_group, layout.replica_ranks(me.attn_dp_rank))
    if cpu_group is not None:
        if _ranks_of("cpu_group", cpu_group) != glob:
            raise DpxValueError(f"cpu_group holds global ranks "
                                f"{list(_ranks_of('cpu_group', cpu_group))}; it must be the "
                                f"world {list(glob)}")
        if str(dist.get_backend(cpu_group)).lower() != "gloo":
            raise DpxValueError("cpu_group must be a gloo group (host exchanges)")
        cpu = cpu_group
    else:
        cpu = world if backend == "gloo" else None
    return DpGroups(world=world, attn_tp=attn_tp, replica=replica, cpu=cpu, rank=rank,
                    backend=backend, global_ranks=tuple(glob), owned=False)
