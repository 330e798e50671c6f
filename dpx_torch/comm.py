"""``DpComm``: DP-attention gather / scatter / reduce_scatter over torch.distributed.

Per-rank shape algebra (``d`` = this rank's attn-dp rank, ``n_d`` its real count,
``H...`` the trailing dims)::

    gather(local [>= n_d, H...], plan, partial)  -> [plan.global_rows, H...]
    scatter(global_ [global_rows, H...], plan)   -> [plan.slot_rows[d], H...]   (no collective)
    reduce_scatter(global_ [global_rows, H...])  -> [plan.slot_rows[d], H...]

Every output row that is not a real token row is zero; no op modifies its input (an
in-place gather's input is the caller's rows inside its output). What a call does is its
schedule (``dpx.build_schedule``: the planner's steps for this rank); ``DpComm`` checks the
inputs and hands the call to its :class:`~dpx_torch.runner.Runner`, which holds every
cache, the scratch pool, the overflow flags and the comm stream.

Streams: a call enqueues its kernels and collectives on the current CUDA stream and
returns without a host sync; ``gather_async`` / ``reduce_scatter_async`` run on the
communicator's one comm stream instead (:mod:`dpx_torch.overlap`).
"""

from __future__ import annotations

import atexit
import weakref
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from dpx import counts as C
from dpx import wire as W
from dpx.errors import DpxCapacityError, DpxError, DpxMismatchError, DpxTypeError, DpxValueError
from dpx.extents import local_rows, op_rows
from dpx.layout import DpLayout
from dpx.modes import Op, Wire
from dpx.plan import DpPlan
from dpx.schedule import Schedule, build_schedule
from dpx_torch.agreement import Agreement
from dpx_torch.autograd import OpFunction
from dpx_torch.checks import InputChecks
from dpx_torch.groups import DpGroups, adopt_groups, build_groups
from dpx_torch.overlap import DpWork
from dpx_torch.padrows import mask_pad_rows, pad_row_mask
from dpx_torch.prepared import PreparedClass, PreparedOp
from dpx_torch.collectives import all_gather_single
from dpx_torch.program import PreparedCall
from dpx_torch.rows import overlaps
from dpx_torch.runner import Call, CacheLimits, Runner
from dpx_torch.wire import split_wire

__all__ = ["DpComm", "counts_tensor"]

_compiling = torch.compiler.is_compiling
# prepared-op key tags, and what a call that needs the full path gets back
_GATHER, _SCATTER, _REDUCE_SCATTER, _SCATTER_COLUMNS = 0, 1, 2, 3
#: The method and prepared-op tag of each op taking a gathered buffer.
_GLOBAL_OPS = {Op.SCATTER: ("scatter", _SCATTER), Op.REDUCE_SCATTER: ("reduce_scatter",
               _REDUCE_SCATTER), Op.SCATTER_COLUMNS: ("scatter_columns", _SCATTER_COLUMNS)}
_MISS = object()

Tensors = tuple[torch.Tensor, ...]


class DpComm:
    """The communicator of one DP-attention layout over one process group.

    ``group`` (default: the default process group) must have ``layout.world_size`` ranks.
    Given only ``group``, construction creates the attn-tp (and replica) subgroups with
    ``new_group`` -- and a gloo group for host exchanges when the world carries no CPU
    tensors -- so like ``new_group`` it is collective over the default process group:
    every rank builds its communicators in the same order. Given the groups a stack
    already has (``attn_tp_group``, ``replica_group`` when ``cp_size > 1``, optionally a
    ``cpu_group``), or through :meth:`from_mesh`, it creates none and checks that they
    match the layout (sizes and rank order). Tensors may be on any device the groups'
    backends carry (``"gloo"``: CPU and CUDA; ``"nccl"``: CUDA; ``"cuda:nccl,cpu:gloo"``:
    both). It holds all state (groups, caches bounded by ``limits``, scratch pool, comm
    stream, events, overflow flags), so several communicators coexist.

    ``validate=True`` adds one small host exchange before every collective call: all ranks
    compare the plan (mode, counts, capacity), op, dtype, width, ``partial`` and device
    counts (and, for a replicated gather, a digest of each replica's rows across its
    attn-tp ranks), and check device counts against the plan's capacity; every rank raises
    the same :class:`dpx.DpxMismatchError` (or :class:`dpx.DpxCapacityError`) naming what
    differs, instead of entering a collective that would hang or corrupt. Without it,
    device counts are checked on the device: a violation sets the sticky flag
    :meth:`overflowed` reads.
    """

    def __init__(self, layout: DpLayout, *, group: dist.ProcessGroup | None = None,
                 attn_tp_group: dist.ProcessGroup | None = None,
                 replica_group: dist.ProcessGroup | None = None,
                 cpu_group: dist.ProcessGroup | None = None,
                 validate: bool = False, limits: CacheLimits | None = None) -> None:
        if not isinstance(layout, DpLayout):
            raise DpxTypeError(f"layout={layout!r} must be a dpx.DpLayout")
        if limits is not None and not isinstance(limits, CacheLimits):
            raise DpxTypeError(f"limits={limits!r} must be a dpx_torch.CacheLimits")
        self.layout = layout
        adopt = any(g is not None for g in (attn_tp_group, replica_group, cpu_group))
        self.groups: DpGroups = (adopt_groups(layout, group, attn_tp_group, replica_group,
                                              cpu_group) if adopt
                                 else build_groups(layout, group))
        self.rank = self.groups.rank
        coords = layout.coords(self.rank)
        self.dp_rank, self.cp_rank = coords.attn_dp_rank, coords.attn_cp_rank
        self.validate = bool(validate)
        self.runner = Runner(self.groups, limits or CacheLimits())
        self.checks = InputChecks(layout, self.dp_rank, self.groups)
        self.agreement = Agreement(layout, self.groups)
        self._sources: dict[tuple, torch.Tensor] = {}
        self._prepared, self._classes = self.runner.prepared, self.runner.classes
        self._destroyed = False
        self._exit_hook = _exit_hook(weakref.ref(self))
        atexit.register(self._exit_hook)

    @classmethod
    def from_mesh(cls, layout: DpLayout, mesh, *, group: dist.ProcessGroup | None = None,
                  replica_group: dist.ProcessGroup | None = None,
                  cpu_group: dist.ProcessGroup | None = None,
                  validate: bool = False, limits: CacheLimits | None = None) -> "DpComm":
        """A communicator over a ``torch.distributed.DeviceMesh`` whose dims are (dp, cp,
        tp) in that order (or (dp, tp) when ``cp_size == 1``), named as the caller chose:
        its last dim's group is the attn-tp group; creates no group. ``group`` (the world
        in layout rank order) defaults to the default group when the mesh spans it in
        order; ``replica_group`` is needed when ``cp_size > 1`` (a mesh has no group
        spanning two dims without creating one)."""
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
        tp_group = mesh.get_group(mesh.ndim - 1)
        return cls(layout, group=world, attn_tp_group=tp_group, replica_group=replica_group,
                   cpu_group=cpu_group, validate=validate, limits=limits)

    # ------------------------------------------------------------------ public ops
    def gather(self, local: torch.Tensor | Sequence[torch.Tensor], plan: DpPlan, *,
               partial: bool | Sequence[bool], counts: torch.Tensor | None = None,
               out: torch.Tensor | None = None, wire: Wire | str | Sequence = Wire.NATIVE,
               dequantize: bool = True, wire_scale: float | Sequence | None = None):
        """``local [>= n_d, H...] -> [plan.global_rows, H...]`` on every rank.

        Slot ``d`` row ``j < n_d`` holds the sum over replica d's attn-tp ranks of their
        ``local[j]`` when ``partial``; otherwise the one value its attn-tp ranks all hold
        (each contributes its own block of it). Every other row is 0. ``counts`` (int32
        ``[dp_size]`` on the data's device, capacity plans only; ``[dp_size, cp_size]``
        shard counts for a sharded plan) carries this step's real counts as device data.
        ``out`` receives the result (no allocation). With context parallelism, ``local``
        holds this CP rank's rows (its replica's, or its shard).

        In place: when ``local`` is :meth:`local_slot` ``(out, plan)`` -- this rank's rows
        of ``out``, written there by the caller -- the collectives read them where they
        are and no row moves locally (pad rows of the slot may hold anything; they are
        zeroed). Under torch.compile the view cannot be recognised and the gather runs
        from it as from a separate input (same result).

        Differentiable: the gradient is ``reduce_scatter`` of the output gradient.

        ``wire="fp8"`` / ``"nvfp4"`` / ``"mxfp4"`` (``dpx.Wire``; MAX_LEN and GATHERV
        plans, float ``[rows, H]`` input, ``H`` a multiple of 128 / 16 / 32): the world
        collective moves the rows quantized (:mod:`dpx.wire`; nvfp4 takes the global scale
        ``wire_scale=g``, a float, the same on every rank); the result is dequantized to
        ``local``'s dtype, or with ``dequantize=False`` returned as ``(payload, scales)``,
        views of one uint8 buffer: fp8 ``(float8_e4m3fn [global_rows, H], float32
        [global_rows, H/128])``, fp4 ``(uint8 [global_rows, H/2], uint8 [global_rows,
        H/16 or H/32])``. Not differentiable.

        Several tensors: ``gather((a, b, ...), plan, partial=(pa, pb, ...))`` (``partial``,
        ``wire``, ``wire_scale`` one each or one for all; one ``wire_scale`` applies to the
        nvfp4 tensors) returns a tuple, each result as if gathered
        alone; the tensors' collectives go out batched (:mod:`dpx.batch`: one grouped launch
        per batch where the backend coalesces). When a tensor requires grad, each is
        gathered by its own differentiable call instead. ``out=`` is for one tensor.
        """
        wkey = wire if wire_scale is None else (wire, wire_scale)
        if type(local) is torch.Tensor and type(partial) is bool and not _compiling() \
                and (wire_scale is None or type(wire_scale) is float):
            res = self._run_prepared(_key(_GATHER, plan, partial, wkey, dequantize, local,
                                          counts, out), plan, local, counts, out)
            if res is not _MISS:
                return res
        self._alive()
        if isinstance(local, (tuple, list)):
            return self._gather_many(tuple(local), plan, partial, counts, out, wire,
                                     dequantize, wire_scale)
        op = self._prepare_gather(local, plan, partial, counts, out, wire, dequantize,
                                  wire_scale)
        if isinstance(op, PreparedOp):
            return op.run(local, counts, out)
        prep: PreparedCall = op
        return self._dispatch(prep, plan, Op.GATHER, counts, local, out, "local")

    def _run_prepared(self, key: tuple, plan: DpPlan, x: torch.Tensor, counts, out):
        """The call through its prepared op (of its plan, or made from its structure's
        class), or ``_MISS`` when it needs the full path."""
        hit = self._prepared.get(key)
        if hit is not None:
            return hit.run(x, counts, out) if hit.admits(x, counts, out) else _MISS
        hit = self._of_class(key, plan, x, counts, out)
        return _MISS if hit is None else hit.run(x, counts, out)

    def _prepare_gather(self, local, plan, partial, counts, out, wire, dequantize,
                        wire_scale=None) -> PreparedOp | PreparedCall:
        """The checked gather of one tensor: a :class:`PreparedOp` (kept for the next call
        of its plan, and its class for the next plan of its structure), or, for a call
        that records autograd (or is traced, or validated), its prepared program alone."""
        wire_in, wire = wire, Wire.parse(wire)
        in_place = self._in_place(local, out, plan, counts)
        prep = self._checked(_gather_label(wire, wire_scale), plan, local, partial, counts,
                             self._gather_checks, local, plan, partial, counts, out, wire,
                             bool(dequantize), in_place, "caller", wire_scale)
        if wire is Wire.NATIVE and local.requires_grad and torch.is_grad_enabled():
            return prep
        full = (self.gather, plan, dict(partial=partial, wire=wire_in, dequantize=dequantize,
                                        wire_scale=wire_scale))
        split = wire is not Wire.NATIVE and not dequantize
        op = PreparedOp(prep, full, local, counts=counts, out=out, in_place=in_place,
                        split=split)
        wkey = wire_in if wire_scale is None else (wire_in, wire_scale)
        self._keep(_key(_GATHER, plan, partial, wkey, dequantize, local, counts, out), op,
                   Op.GATHER, plan, local, partial=partial, wire=wire,
                   dequantize=bool(dequantize), in_place=in_place)
        return op

    def _keep(self, key: tuple, op: PreparedOp, kind: Op, plan: DpPlan, x: torch.Tensor, *,
              partial: bool, wire: Wire, dequantize: bool, in_place: bool) -> None:
        """Keep ``op`` for the next call of its plan (``key``), and its class for the next
        plan of its structure -- not with validate, not while traced."""
        if self.validate or _compiling():
            return
        self._prepared.put(key, op)
        tkey = self.runner.template_key(plan, kind, partial=partial,
                                        device_counts=key[8] is False, wire=wire,
                                        dequantize=dequantize, in_place=in_place)
        self._classes.put(self._class_key(key, plan, x, in_place), PreparedClass(
            self.runner, kind, tkey, op.prep.shape, op.full, split=op.split))

    @staticmethod
    def _class_key(key: tuple, plan: DpPlan, x: torch.Tensor, in_place: bool) -> tuple:
        """The key of a call's :class:`PreparedClass`: its prepared-op key with the plan's
        structure for the plan and the input's trailing shape for its shape."""
        return (key[0], plan.structure, key[2], key[3], key[4], x.shape[1:], key[6],
                key[7], key[8], key[9], in_place)

    def _of_class(self, key: tuple, plan: DpPlan, x: torch.Tensor, counts, out
                  ) -> PreparedOp | None:
        """The prepared op of a new plan of a known structure (kept; it admits these
        tensors), or None."""
        if not isinstance(plan, DpPlan):
            return None
        in_place = key[0] == _GATHER and out is not None and self._in_place(x, out, plan,
                                                                            counts)
        cls = self._classes.get(self._class_key(key, plan, x, in_place))
        if cls is None:
            return None
        op = cls.prepare(plan, x, counts, out, in_place)
        if op is not None:
            self._prepared.put(key, op)
        return op

    def prepare_gather(self, local: torch.Tensor, plan: DpPlan, *, partial: bool,
                       counts: torch.Tensor | None = None, out: torch.Tensor | None = None,
                       wire: Wire | str = Wire.NATIVE, dequantize: bool = True,
                       wire_scale: float | None = None) -> PreparedOp:
        """:meth:`gather` decided once for tensors like these (the explicit prepared
        call, :mod:`dpx_torch.prepared`): checks them (raising what :meth:`gather`
        raises), binds the program, and returns ``op`` with ``op(local, counts=...,
        out=...) == gather(local, plan, partial=..., counts=..., out=..., wire=...,
        dequantize=..., wire_scale=...)``; a call guards only what can change (shapes,
        dtypes, devices, contiguity, aliasing) and otherwise runs the bound steps. Runs
        nothing itself."""
        self._alive()
        self.checks.tensor("local", local)
        op = self._prepare_gather(local, plan, partial, counts, out, wire, dequantize,
                                  wire_scale)
        if not isinstance(op, PreparedOp):
            raise DpxValueError("prepare_gather: local requires grad; a prepared call records "
                                "no autograd graph (call gather, or pass a detached tensor)")
        return op

    def local_slot(self, out: torch.Tensor, plan: DpPlan) -> torch.Tensor:
        """This rank's rows of the gather's output ``out [plan.global_rows, H...]`` (its
        replica's slot, pad rows included, or its CP shard): write the rank's rows there
        and ``gather(slot, plan, partial=..., out=out)`` moves none of them locally. A
        dpx error when the place is device data (SUM_LEN / GATHERV capacity plans used
        with device counts, CP shards with device counts: call with ``counts=`` to ask)."""
        return self.local_slot_for(out, plan, counts=None)

    def local_slot_for(self, out: torch.Tensor, plan: DpPlan, *,
                       counts: torch.Tensor | None) -> torch.Tensor:
        """:meth:`local_slot` for a call that will pass ``counts`` (device counts)."""
        self.checks.plan(plan)
        if not isinstance(out, torch.Tensor) or out.dim() < 1 \
                or out.shape[0] != plan.global_rows:
            raise DpxValueError(f"out must be a tensor of plan.global_rows={plan.global_rows} "
                                f"rows, got shape {tuple(getattr(out, 'shape', ()))}")
        first, rows = local_rows(plan, self.rank, device_counts=counts is not None)
        return out[first:first + rows]

    def _in_place(self, local: torch.Tensor, out: torch.Tensor | None, plan: DpPlan,
                  counts: torch.Tensor | None) -> bool:
        """Whether ``local`` is this rank's slot view of ``out`` (an in-place gather); a
        dpx error when it overlaps ``out`` anywhere else."""
        if out is None or torch.compiler.is_compiling() or not isinstance(local, torch.Tensor) \
                or not isinstance(out, torch.Tensor) or not overlaps(local, out):
            return False
        if isinstance(plan, DpPlan) and plan.layout == self.layout and out.dim() >= 1 \
                and out.shape[0] == plan.global_rows and local.shape[1:] == out.shape[1:]:
            try:
                first, rows = local_rows(plan, self.rank, device_counts=counts is not None)
            except DpxValueError as exc:
                raise DpxValueError(f"local is a view of out, but {exc}") from None
            stride = out.stride(0) * out.element_size() if out.dim() else 0
            if local.shape[0] == rows and local.data_ptr() == out.data_ptr() + first * stride:
                return True
            raise DpxValueError(f"local overlaps out but is not this rank's slot of it "
                                f"(rows [{first}, {first + rows}) of out: use "
                                f"comm.local_slot(out, plan)); a separate input must not "
                                f"alias out")
        raise DpxValueError("out overlaps the input in memory; they must not alias (an "
                            "in-place gather passes comm.local_slot(out, plan))")

    @staticmethod
    def _new_out(prep: PreparedCall, x: torch.Tensor) -> torch.Tensor:
        if prep.out_wire:
            return x.new_empty((prep.out_rows, prep.shape.out_width), dtype=torch.uint8)
        return x.new_empty((prep.out_rows, *prep.shape.out_rest))

    def _gather_many(self, tensors: Tensors, plan: DpPlan, partial, counts, out, wire,
                     dequantize: bool, wire_scale=None) -> tuple:
        n = len(tensors)
        if n == 0:
            raise DpxValueError("gather of a tuple needs at least one tensor")
        if out is not None:
            raise DpxValueError("out= is for one tensor; gather of a tuple allocates its "
                                "results")
        partials = self._per_tensor("partial", partial, n)
        wires = tuple(Wire.parse(w) for w in self._per_tensor("wire", wire, n))
        if isinstance(wire_scale, (tuple, list)):
            scales = self._per_tensor("wire_scale", wire_scale, n)
        else:  # one scale for the nvfp4 tensors
            scales = tuple(wire_scale if w is Wire.NVFP4 else None for w in wires)
        if any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors) \
                and torch.is_grad_enabled():
            return tuple(self.gather(t, plan, partial=p, counts=counts, wire=w,
                                     dequantize=dequantize, wire_scale=g)
                         for t, p, w, g in zip(tensors, partials, wires, scales))
        preps = []
        for i, (t, p, w, g) in enumerate(zip(tensors, partials, wires, scales)):
            preps.append(self._checked(f"{_gather_label(w, g)}#{i}", plan, t, p, counts,
                                       self._gather_checks, t, plan, p, counts, None, w,
                                       bool(dequantize), False, f"caller#{i}", g))
        batch = self.runner.batch(tuple(preps))
        c = _flat(counts)
        calls = [(t, self._new_out(p, t), c) for p, t in zip(preps, tensors)]
        res = batch(preps, calls)
        return tuple(split_wire(r, p.shape.wire) if p.out_wire else r
                     for r, p in zip(res, preps))

    @staticmethod
    def _per_tensor(name: str, value, n: int) -> tuple:
        if isinstance(value, (tuple, list)):
            if len(value) != n:
                raise DpxValueError(f"{name} has {len(value)} entries for {n} tensors; give "
                                    f"one per tensor or one for all")
            return tuple(value)
        return (value,) * n

    def scatter(self, global_: torch.Tensor, plan: DpPlan, *,
                counts: torch.Tensor | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:
        """``global_ [global_rows, H...] -> [plan.slot_rows[d], H...]``: this replica's real
        rows of an already reduced buffer, then zeros. No collective. Differentiable."""
        return self._global_op(_SCATTER, Op.SCATTER, global_, plan, counts, out)

    def reduce_scatter(self, global_: torch.Tensor, plan: DpPlan, *,
                       counts: torch.Tensor | None = None,
                       out: torch.Tensor | None = None) -> torch.Tensor:
        """``global_ [global_rows, H...] -> [plan.slot_rows[d], H...]`` on every rank of
        replica d: row ``j < n_d`` is the sum over all ranks of ``global_[offsets[d] + j]``;
        other rows are 0. The adjoint of ``gather(partial=True)`` (and its gradient)."""
        return self._global_op(_REDUCE_SCATTER, Op.REDUCE_SCATTER, global_, plan, counts, out)

    def scatter_columns(self, shard: torch.Tensor, plan: DpPlan, *,
                        counts: torch.Tensor | None = None,
                        out: torch.Tensor | None = None) -> torch.Tensor:
        """``shard [global_rows, C] -> [plan.slot_rows[d], world_size * C]``: the LM-head
        scatter. World rank ``s`` holds columns ``[s*C, (s+1)*C)`` of the gathered rows;
        every rank gets its replica's rows (its CP shard's, with CP shards) with every
        column, pad rows zero -- ``scatter`` of the all-gathered columns, in one
        all-to-all (docs/semantics.md, "The LM-head scatter"). Differentiable."""
        return self._global_op(_SCATTER_COLUMNS, Op.SCATTER_COLUMNS, shard, plan, counts, out)

    def prepare_scatter_columns(self, shard: torch.Tensor, plan: DpPlan, *,
                                counts: torch.Tensor | None = None,
                                out: torch.Tensor | None = None) -> PreparedOp:
        """:meth:`scatter_columns` decided once (see :meth:`prepare_gather`)."""
        return self._prepare_global(Op.SCATTER_COLUMNS, shard, plan, counts, out,
                                    explicit=True)

    def prepare_scatter(self, global_: torch.Tensor, plan: DpPlan, *,
                        counts: torch.Tensor | None = None,
                        out: torch.Tensor | None = None) -> PreparedOp:
        """:meth:`scatter` decided once (see :meth:`prepare_gather`)."""
        return self._prepare_global(Op.SCATTER, global_, plan, counts, out, explicit=True)

    def prepare_reduce_scatter(self, global_: torch.Tensor, plan: DpPlan, *,
                               counts: torch.Tensor | None = None,
                               out: torch.Tensor | None = None) -> PreparedOp:
        """:meth:`reduce_scatter` decided once (see :meth:`prepare_gather`)."""
        return self._prepare_global(Op.REDUCE_SCATTER, global_, plan, counts, out,
                                    explicit=True)

    def _global_op(self, tag: int, op: Op, global_, plan, counts, out):
        if type(global_) is torch.Tensor and not _compiling():
            res = self._run_prepared(_key(tag, plan, True, Wire.NATIVE, True, global_, counts,
                                          out), plan, global_, counts, out)
            if res is not _MISS:
                return res
        prepared = self._prepare_global(op, global_, plan, counts, out)
        if isinstance(prepared, PreparedOp):
            return prepared.run(global_, counts, out)
        return self._dispatch(prepared, plan, op, counts, global_, out,
                              "shard" if op is Op.SCATTER_COLUMNS else "global_")

    def _prepare_global(self, op: Op, global_, plan, counts, out, *,
                        explicit: bool = False) -> PreparedOp | PreparedCall:
        self._alive()
        name, tag = _GLOBAL_OPS[op]
        if op is not Op.SCATTER:
            prep = self._checked(name, plan, global_, True, counts, self._global_checks, op,
                                 global_, plan, counts, out)
        else:
            prep = self._global_checks(op, global_, plan, counts, out)
        if global_.requires_grad and torch.is_grad_enabled():
            if explicit:
                arg = "shard" if op is Op.SCATTER_COLUMNS else "global_"
                raise DpxValueError(f"prepare_{name}: {arg} requires grad; a prepared call "
                                    f"records no autograd graph")
            return prep
        full = (getattr(self, name), plan, {})
        prepared = PreparedOp(prep, full, global_, counts=counts, out=out, in_place=False,
                              split=False)
        self._keep(_key(tag, plan, True, Wire.NATIVE, True, global_, counts, out), prepared, op,
                   plan, global_, partial=True, wire=Wire.NATIVE, dequantize=True,
                   in_place=False)
        return prepared

    def gather_async(self, local: torch.Tensor, plan: DpPlan, *, partial: bool,
                     counts: torch.Tensor | None = None, out: torch.Tensor | None = None,
                     key: object = 0) -> tuple[torch.Tensor, DpWork]:
        """:meth:`gather` on :attr:`comm_stream` (two-batch overlap). Returns ``(out,
        work)``: ``out`` is the caller's ``out=`` or a pooled buffer keyed by ``("gather",
        key)`` (one ``key`` per micro-batch; valid until the next call with that key), and
        ``work.wait()`` makes the current stream wait for it. In place with ``local =
        local_slot(out, plan)``. Not differentiable (a dpx error if ``local`` requires
        grad)."""
        self._alive()
        self._no_grad("gather_async", local)
        in_place = self._in_place(local, out, plan, counts)
        prep = self._checked("gather", plan, local, partial, counts, self._gather_checks,
                             local, plan, partial, counts, out, Wire.NATIVE, True, in_place,
                             _async_key(local))
        return self.runner.overlap.launch("gather", key, local, prep.out_rows,
                                          self._runner(prep, _flat(counts), local), out=out)

    def reduce_scatter_async(self, global_: torch.Tensor, plan: DpPlan, *,
                             counts: torch.Tensor | None = None,
                             out: torch.Tensor | None = None,
                             key: object = 0) -> tuple[torch.Tensor, DpWork]:
        """:meth:`reduce_scatter` on :attr:`comm_stream`; see :meth:`gather_async` (``out``
        or a pooled buffer keyed by ``("reduce_scatter", key)``)."""
        self._alive()
        self._no_grad("reduce_scatter_async", global_)
        prep = self._checked("reduce_scatter", plan, global_, True, counts,
                             self._global_checks, Op.REDUCE_SCATTER, global_, plan, counts,
                             out, _async_key(global_))
        return self.runner.overlap.launch("reduce_scatter", key, global_, prep.out_rows,
                                          self._runner(prep, _flat(counts), global_), out=out)

    def sync_counts(self, num_tokens: int, *,
                    is_extend: bool = False) -> tuple[tuple[int, ...], bool]:
        """Exchange this rank's real token count (one small host all-gather over the CPU
        group) so every rank plans from the same data. Returns ``(counts per replica,
        any rank is_extend)``. A bad count on any rank (named with its value), or attn-tp
        ranks of one replica that report different counts, make every rank raise
        :class:`dpx.DpxMismatchError`."""
        self._alive()
        return self.agreement.sync_counts(num_tokens, is_extend=is_extend)

    def exchange_counts(self, n_local: torch.Tensor, *, shards: bool = False,
                        plan: DpPlan | None = None) -> torch.Tensor:
        """This rank's real count as a device int32 tensor of shape ``(1,)`` -> the per-
        replica counts, a device int32 ``[dp_size]`` tensor (``shards=True``: each CP rank
        reports its shard, the result is the ``[dp_size, cp_size]`` shard table). One tiny
        all-gather on the world group, no host sync, capturable in a CUDA graph: the
        ``counts=`` of a capacity plan's step and of ``mask_pad_rows``. Entry ``d`` is the
        report of the rank of replica d with this rank's CP and attn-tp coordinates
        (:mod:`dpx.counts`). ``plan`` (a capacity plan): the result is checked against
        it, on the device (the overflow flag, :meth:`overflowed`) or, with ``validate``,
        on the host. With ``validate=True`` the reports are read back and every rank
        raises the same error when the ranks of a replica (of a CP rank, for shards)
        disagree, when a count is negative, or when the counts do not fit ``plan``."""
        self._alive()
        c = self.checks
        if not isinstance(n_local, torch.Tensor) or n_local.dtype != torch.int32 \
                or tuple(n_local.shape) != (1,):
            raise DpxTypeError(f"n_local must be an int32 tensor of shape (1,), got "
                               f"{getattr(n_local, 'dtype', type(n_local).__name__)} "
                               f"{tuple(getattr(n_local, 'shape', ()))}")
        c.tensor("n_local", n_local)
        if plan is not None:
            c.plan(plan)
            if plan.capacity is None:
                raise DpxValueError("exchange_counts(plan=...) checks the counts of a "
                                    "capacity plan; this plan has none")
            if shards != plan.sharded:
                raise DpxValueError(f"exchange_counts(shards={shards}) with a plan whose "
                                    f"cp_shards is {'set' if plan.sharded else 'None'}")
        lay = self.layout
        allv = n_local.new_empty(lay.world_size)
        all_gather_single(allv, n_local, group=self.groups.world)
        key = (shards, allv.device)
        idx = self._sources.get(key)
        if idx is None:
            idx = self._sources[key] = torch.tensor(
                C.sources(lay, self.rank, shards=shards), dtype=torch.long, device=allv.device)
        picked = allv[idx]
        if self.validate:
            reports = tuple(int(x) for x in allv.tolist())
            bad = C.disagreements(lay, reports, shards=shards)
            bad += [f"rank {r} reported {x} < 0" for r, x in enumerate(reports) if x < 0]
            if bad:
                raise DpxMismatchError("exchange_counts: " + "; ".join(bad))
            if plan is not None:
                problems = plan.count_rule.problems(tuple(int(x) for x in picked.tolist()))
                if problems:
                    raise DpxCapacityError("exchange_counts: " + "; ".join(problems))
        elif plan is not None:
            self.runner.flags.check(picked, plan.count_rule,
                                    self.runner.passes_for(picked.device))
        return picked.view(lay.dp_size, lay.cp_size) if shards else picked

    def mask_pad_rows(self, t: torch.Tensor, plan: DpPlan, *,
                      counts: torch.Tensor | None = None,
                      fill: int | float = -1) -> torch.Tensor:
        """:func:`dpx_torch.mask_pad_rows` with this communicator's device tables (a
        captured graph replays it) and, with device counts, their check (the overflow
        flag)."""
        self._alive()
        self.checks.plan(plan)
        runner = self.runner
        passes = runner.passes_for(t.device) if isinstance(t, torch.Tensor) else None
        out = mask_pad_rows(t, plan, counts=counts, fill=fill, tables=runner.tables,
                            passes=passes)
        if counts is not None:
            runner.flags.check(_flat(counts), plan.count_rule, passes)
        return out

    def pad_row_mask(self, plan: DpPlan, *, counts: torch.Tensor | None = None,
                     device: torch.device | str | None = None) -> torch.Tensor:
        """:func:`dpx_torch.pad_row_mask` with this communicator's device tables."""
        self._alive()
        self.checks.plan(plan)
        return pad_row_mask(plan, counts=counts, device=device, tables=self.runner.tables)

    def overflowed(self) -> bool:
        """Whether any step's device counts broke its capacity plan since the last
        :meth:`reset_overflow` (a host sync: read it after a graph replay, not inside
        one). The flag is sticky; :meth:`overflow_reason` names what broke."""
        return self.runner.flags.value() != 0

    def overflow_reason(self) -> str:
        """What the overflow flag records (``"none"`` when clear)."""
        return self.runner.flags.describe(self.runner.flags.value())

    def reset_overflow(self) -> None:
        """Clear the overflow flag (in place: capturable, and graphs keep reading it)."""
        self.runner.flags.reset()

    def overflow_flag(self, device: torch.device | str) -> torch.Tensor:
        """The int32 ``[1]`` device flag itself (nonzero after an overflow): read it on the
        device, e.g. to branch or to copy it out with the step's results."""
        return self.runner.flags.flag(torch.device(device))

    def schedule(self, plan: DpPlan, op: Op | str, *, partial: bool = True,
                 device_counts: bool = False, in_rows: int | None = None,
                 in_place: bool = False) -> Schedule:
        """The steps this rank runs for ``op`` (what ``python -m dpx plan --rank`` prints)."""
        return build_schedule(plan, op, rank=self.rank, partial=partial,
                              device_counts=device_counts, transport=self.runner.transport,
                              in_rows=in_rows, in_place=in_place,
                              cache=self.runner.schedules)

    def cache_sizes(self) -> dict[str, int]:
        """Entries in each of this communicator's caches (see :class:`CacheLimits`)."""
        return self.runner.sizes()

    def clear_caches(self) -> None:
        """Empty every cache and the scratch pool (recapture CUDA graphs after this)."""
        self.runner.clear()
        self._sources.clear()

    @property
    def comm_stream(self) -> torch.cuda.Stream:
        """The one communication stream of the ``*_async`` calls."""
        return self.runner.overlap.stream

    def destroy(self) -> None:
        """Destroy the subgroups this communicator created (none when it was given the
        caller's groups), drop every reference it holds to a process group, and refuse any
        later call. Collective: every rank calls it. Each subgroup is drained with a
        barrier before it is destroyed, and the world group after, so no rank tears a
        group down while a peer still uses it.

        Dropping the references matters at exit: a process group's C++ object joins its
        gloo worker threads only when the last reference to it goes. A group kept alive
        by a communicator past ``dist.destroy_process_group()`` is destroyed during
        interpreter finalization instead, where a worker thread still releasing a tensor
        of a finished collective cannot take the GIL and the process aborts
        ("terminate called without an active exception"). Without ``destroy()``, the same
        release runs at interpreter exit (an ``atexit`` hook; the subgroups this
        communicator created are destroyed there, without barriers)."""
        if self._destroyed:
            return
        g = self.groups
        for pg in g.owned:
            dist.barrier(group=pg)
            dist.destroy_process_group(pg)
        if g.owned:
            dist.barrier(group=g.world)
        self._release()

    def _release(self) -> None:
        """Forget every process group and cache (see :meth:`destroy`)."""
        self._destroyed = True
        self.runner.clear()
        self.groups = self.runner = self.checks = self.agreement = None  # type: ignore
        self._sources.clear()
        atexit.unregister(self._exit_hook)

    def __del__(self) -> None:
        hook = getattr(self, "_exit_hook", None)
        if hook is not None:
            atexit.unregister(hook)

    def _at_exit(self) -> None:
        if self._destroyed:
            return
        for pg in self.groups.owned:
            try:
                dist.destroy_process_group(pg)
            except (ValueError, RuntimeError):  # already destroyed with the world
                pass
        self._release()

    # ------------------------------------------------------------------ calls
    def _alive(self) -> None:
        if self._destroyed:
            raise DpxValueError("this DpComm was destroyed (DpComm.destroy()); build a new "
                                "one to run collectives")

    def _gather_checks(self, local, plan, partial, counts, out, wire: Wire,
                       dequantize: bool, in_place: bool, scratch_key: str = "caller",
                       wire_scale: object = None) -> PreparedCall:
        c = self.checks
        if not isinstance(partial, bool):
            c.partial(partial)
        c.tensor("local", local)
        if not isinstance(plan, DpPlan) or plan.layout != self.layout:
            c.plan(plan)
        compiling = torch.compiler.is_compiling()
        g = W.check_wire_scale(wire, wire_scale)
        if wire is not Wire.NATIVE:
            W.check_wire(wire, plan.mode, tuple(local.shape),
                         str(local.dtype).replace("torch.", ""))
            self._no_grad(f"gather(wire='{wire.value}')", local, f"{wire.value} rounding has "
                          f"no gradient; gather in the native dtype")
            if out is not None and not dequantize:
                raise DpxValueError("out= takes the dequantized result; with dequantize="
                                    "False the gather returns views of its own wire buffer")
        if counts is not None:
            c.counts(plan, counts, local)
        rows = op_rows(plan, Op.GATHER, self.rank, device_counts=counts is not None)
        if local.shape[0] < rows.need:
            c.tensor("local", local, min_rows=rows.need)
        grad = local.requires_grad and torch.is_grad_enabled()
        if not in_place:
            c.out(out, local, rows.out, compiling=compiling)
        elif grad:
            raise DpxValueError("an in-place gather records no autograd graph; gather from "
                                "a separate input to differentiate")
        # kept by the runner only where no prepared op keeps it
        return self.runner.prepare(plan, Op.GATHER, local, partial=partial,
                                   device_counts=counts is not None, wire=wire,
                                   dequantize=dequantize, wire_scale=g, in_place=in_place,
                                   scratch_key=scratch_key, rows=rows,
                                   cache=grad or scratch_key != "caller" or self.validate)

    def _global_checks(self, op: Op, global_, plan, counts, out,
                       scratch_key: str = "caller") -> PreparedCall:
        c = self.checks
        columns = op is Op.SCATTER_COLUMNS
        name = "shard" if columns else "global_"
        c.tensor(name, global_)
        if columns and global_.dim() != 2:
            raise DpxValueError(f"shard has shape {tuple(global_.shape)}; scatter_columns "
                                f"takes [global_rows, C] (this rank's C columns)")
        if not isinstance(plan, DpPlan) or plan.layout != self.layout:
            c.plan(plan)
        if counts is not None:
            c.counts(plan, counts, global_)
        rows = op_rows(plan, op, self.rank, device_counts=counts is not None)
        if global_.shape[0] != rows.need:
            c.tensor(name, global_, rows=rows.need)
        c.out(out, global_, rows.out, compiling=torch.compiler.is_compiling(),
              rest=(self.layout.world_size * global_.shape[1],) if columns else None)
        grad = global_.requires_grad and torch.is_grad_enabled()
        return self.runner.prepare(plan, op, global_, partial=True,
                                   device_counts=counts is not None, scratch_key=scratch_key,
                                   rows=rows,
                                   cache=grad or scratch_key != "caller" or self.validate)

    def _checked(self, op: str, plan, tensor, partial, counts,
                 checks: Callable[..., PreparedCall], *args) -> PreparedCall:
        """Run this rank's input checks. Without ``validate`` a rejected input raises here,
        before any collective. With ``validate``, every rank first exchanges what it is
        about to do (and whether its input was rejected), and all raise the same error."""
        if not self.validate:
            return checks(*args)
        try:
            result, err = checks(*args), None
        except DpxError as exc:
            result, err = None, exc
        self.agreement.check(op, plan, tensor, partial, err, counts)
        return result

    def _dispatch(self, prep: PreparedCall, plan: DpPlan, op: Op,
                  counts: torch.Tensor | None, x: torch.Tensor, out: torch.Tensor | None,
                  name: str) -> torch.Tensor:
        """A call that records autograd (or is traced by torch.compile)."""
        if x.requires_grad and torch.is_grad_enabled():
            if out is not None:
                raise DpxValueError(f"out= cannot be used when {name} requires grad")
            return OpFunction.apply(x, self.runner,
                                    Call(plan, op, _flat(counts), x.shape[0], prep))
        if out is None:
            out = self._new_out(prep, x)
        return prep.run(x, out, _flat(counts))

    @staticmethod
    def _runner(prep: PreparedCall, counts: torch.Tensor | None,
                x: torch.Tensor) -> Callable[[torch.Tensor], object]:
        return lambda out: prep.run(x, out, counts)

    @staticmethod
    def _no_grad(name: str, x: torch.Tensor,
                 hint: str = "call the synchronous form") -> None:
        if isinstance(x, torch.Tensor) and x.requires_grad and torch.is_grad_enabled():
            raise DpxValueError(f"{name} records no autograd graph and its input requires "
                                f"grad: {hint}, or pass a detached tensor under "
                                f"torch.no_grad()")


def _key(tag: int, plan: DpPlan, partial: bool, wire, dequantize, x: torch.Tensor,
         counts: torch.Tensor | None, out: torch.Tensor | None) -> tuple:
    """A prepared op's key: the op, its plan and flags, the input's shape, dtype and
    device, and whether counts and out are given (indices 8, 9)."""
    return (tag, plan, partial, wire, dequantize, x.shape, x.dtype, x.device, counts is None,
            out is None)


def _gather_label(wire: Wire, wire_scale: object) -> str:
    """A gather's name in a ``validate=True`` exchange: its wire, and nvfp4's scale (so that
    a wire or scale that differs between ranks raises on every rank)."""
    if wire is Wire.NATIVE:
        return "gather"
    return f"gather/{wire.value}" + ("" if wire_scale is None else f" scale={wire_scale!r}")


def _exit_hook(ref: "weakref.ref[DpComm]") -> Callable[[], None]:
    """What interpreter exit runs for a communicator that was not destroyed (a weak
    reference: the hook keeps nothing alive)."""
    def hook() -> None:
        comm = ref()
        if comm is not None:
            comm._at_exit()
    return hook


def _async_key(x: object) -> str:
    """The scratch key of an overlapped call: its own on the comm stream (CUDA), the
    caller's where nothing overlaps (CPU)."""
    return "comm" if isinstance(x, torch.Tensor) and x.is_cuda else "caller"


def _flat(counts: torch.Tensor | None) -> torch.Tensor | None:
    """Device counts as the schedules read them: a shard table ``[dp, cp]`` row by row."""
    return counts.reshape(-1) if counts is not None and counts.dim() == 2 else counts


def counts_tensor(num_tokens: Sequence[int], device: torch.device | str) -> torch.Tensor:
    """An int32 device tensor of per-replica counts (to update in place between replays)."""
    return torch.tensor(list(num_tokens), dtype=torch.int32, device=device)
