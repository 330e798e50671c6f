"""Process groups a :class:`dpx_torch.DpComm` needs, built from a :class:`dpx.DpLayout` or
adopted from the caller, and what their backends can do.

Layer: transports. Imports dpx, the shims and passes layers and the modules before it in
its own row (docs/semantics.md, "Where things live").

Backends are asked, not named (:mod:`dpx_torch.shims.backends`): which device types a
group carries (``"gloo"`` carries CPU and CUDA tensors, ``"nccl"`` CUDA, ``"cpu:gloo"``
CPU, ``"cuda:nccl,cpu:gloo"`` both) and whether its backend for a device coalesces
collectives (NCCL does, gloo does not). A host exchange
(``validate=True``, ``sync_counts``) runs on a group that carries CPU tensors: the world
itself when it does, else a gloo group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist

from dpx.errors import DpxTypeError, DpxValueError
from dpx.layout import DpLayout
from dpx.modes import Group
from dpx_torch.shims.backends import coalesces, device_types

__all__ = ["adopt_groups", "build_groups", "DpGroups", "mesh_groups"]


@dataclass(frozen=True)
class DpGroups:
    """The world group, this rank's attn-tp and replica groups, and a group for host
    exchanges. ``rank`` is this process's rank in ``world`` (the layout's rank numbering).
    ``devices``: the device types every group carries; ``owned``: the groups this
    communicator created (``destroy`` frees those only)."""

    world: dist.ProcessGroup
    attn_tp: dist.ProcessGroup | None  # None when attn_tp_size == 1 (no attn-tp collective)
    replica: dist.ProcessGroup | None  # this rank's replica (cp x attn_tp ranks); None if 1
    cpu: dist.ProcessGroup | None  # carries CPU tensors; None: none was given (NCCL world)
    rank: int
    global_ranks: tuple[int, ...]
    devices: frozenset[str]
    owned: tuple[dist.ProcessGroup, ...] = ()
    _coalesce: dict = field(default_factory=dict, compare=False, repr=False)

    def process_group(self, g: Group) -> dist.ProcessGroup:
        if g is Group.WORLD:
            return self.world
        return self.attn_tp if g is Group.ATTN_TP else self.replica

    def coalesces(self, device_type: str) -> bool:
        """Whether collectives on tensors of ``device_type`` can go out as one launch."""
        c = self._coalesce.get(device_type)
        if c is None:
            c = self._coalesce[device_type] = coalesces(self.world, device_type)
        return c

    def describe(self) -> str:
        return f"{dist.get_backend(self.world)} (carries {', '.join(sorted(self.devices))})"


def _common_devices(groups: list[dist.ProcessGroup]) -> frozenset[str]:
    out: frozenset[str] | None = None
    for g in groups:
        d = device_types(g)
        out = d if out is None else out & d
    return out or frozenset()


def build_groups(layout: DpLayout, group: dist.ProcessGroup | None) -> DpGroups:
    """Create the subgroups. Collective over the *default* process group: every one of its
    ranks must build its ``DpComm``s in the same order (torch.distributed's rule for
    ``new_group``).

    ``group`` defaults to the default process group; its size must equal
    ``layout.world_size``. Every attn-tp group is created on every rank, in layout order,
    so group names and store keys agree everywhere (communicators can be destroyed and
    built again). A gloo group for host exchanges is created only when the world carries
    no CPU tensors.
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
    glob = [dist.get_global_rank(world, r) for r in range(size)]
    created: list[dist.ProcessGroup] = []

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
                created.append(g)
        return mine

    attn_tp = subgroups(layout.attn_tp_groups())
    if layout.cp_size == 1:
        replica = attn_tp  # the same ranks
    else:
        replica = subgroups(tuple(layout.replica_ranks(d) for d in range(layout.dp_size)))
    devices = device_types(world)
    if "cpu" in devices:
        cpu = world
    else:
        cpu = dist.new_group(glob, backend="gloo")
        created.append(cpu)
    return DpGroups(world=world, attn_tp=attn_tp, replica=replica, cpu=cpu, rank=rank,
                    global_ranks=tuple(glob), devices=devices, owned=tuple(created))


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
    1``). ``cpu_group`` is a group over the world that carries CPU tensors, for host
    exchanges (``validate``, ``sync_counts``); a world that carries CPU tensors serves
    itself, and without one those raise a dpx error."""
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
        if "cpu" not in device_types(cpu_group):
            raise DpxValueError(f"cpu_group must carry CPU tensors (host exchanges); its "
                                f"backend {dist.get_backend(cpu_group)} does not")
        cpu = cpu_group
    else:
        cpu = world if "cpu" in device_types(world) else None
    devices = _common_devices([g for g in (world, attn_tp, replica) if g is not None])
    return DpGroups(world=world, attn_tp=attn_tp, replica=replica, cpu=cpu, rank=rank,
                    global_ranks=tuple(glob), devices=devices)


def mesh_groups(layout: DpLayout, mesh: object, group: dist.ProcessGroup | None
                ) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """``(world, attn_tp)`` of a ``DeviceMesh`` whose dims are (dp, cp, tp) in that order
    (or (dp, tp) when ``cp_size == 1``): the world group (``group``, default the default
    group) checked to order the mesh's ranks as the mesh does, and the mesh's last dim's
    group. Creates no group."""
    from torch.distributed.device_mesh import DeviceMesh

    if not isinstance(mesh, DeviceMesh):
        raise DpxTypeError(f"mesh must be a torch.distributed.DeviceMesh, got "
                           f"{type(mesh).__name__}")
    want = ((layout.dp_size, layout.cp_size, layout.attn_tp_size) if mesh.ndim == 3
            else (layout.dp_size, layout.attn_tp_size))
    if mesh.ndim not in (2, 3) or (mesh.ndim == 2 and layout.cp_size > 1) \
            or tuple(mesh.shape) != want:
        raise DpxValueError(f"mesh of shape {tuple(mesh.shape)} does not match layout "
                            f"{layout.describe()}: its dims must be (dp, cp, tp) = "
                            f"{(layout.dp_size, layout.cp_size, layout.attn_tp_size)}"
                            + (" or (dp, tp)" if layout.cp_size == 1 else ""))
    ranks = [int(r) for r in mesh.mesh.flatten().tolist()]
    world = group if group is not None else dist.group.WORLD
    if dist.get_process_group_ranks(world) != ranks:
        raise DpxValueError(f"the mesh orders global ranks {ranks}; group= must be the "
                            f"world group in that order (got "
                            f"{dist.get_process_group_ranks(world)})")
    return world, mesh.get_group(mesh.ndim - 1)
