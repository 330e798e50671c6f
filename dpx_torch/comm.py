"""``DpComm``: DP-attention gather / scatter / reduce_scatter over torch.distributed.

Layer: public. Imports dpx, the shims, passes, transports, runner and call paths layers
and the modules before it in its own row (docs/semantics.md, "Where things live").

Per-rank shape algebra (``d`` = this rank's attn-dp rank, ``n_d`` its real count,
``H...`` the trailing dims)::

    gather(local [>= n_d, H...], plan, partial)  -> [plan.global_rows, H...]
    scatter(global_ [global_rows, H...], plan)   -> [plan.slot_rows[d], H...]   (no collective)
    reduce_scatter(global_ [global_rows, H...])  -> [plan.slot_rows[d], H...]

Every output row that is not a real token row is zero; no op modifies its input (an
in-place gather's input is the caller's rows inside its output). What a call does is its
schedule (``dpx.build_schedule``: the planner's steps for this rank); ``DpComm`` checks the
inputs and hands the call to its prepared op (:mod:`dpx_torch.prepared`; the checks and
the ``validate=True`` exchange: :mod:`dpx_torch.fullpath`), whose program its
:class:`~dpx_torch.runner.Runner` binds (schedules, compiled programs, device tables, the
scratch pool, the overflow flags and the comm stream).

Streams: a call enqueues its kernels and collectives on the current CUDA stream and
returns without a host sync; ``gather_async`` / ``reduce_scatter_async`` run on the
communicator's one comm stream instead (:mod:`dpx_torch.overlap`).
"""

from __future__ import annotations

import atexit
import functools
import weakref
from typing import Sequence

import torch
import torch.distributed as dist

from dpx.errors import DpxTypeError, check_bool
from dpx.layout import DpLayout
from dpx.modes import Op, Transport, Wire
from dpx.plan import DpPlan
from dpx.schedule import Schedule, build_schedule
from dpx_torch.agreement import Agreement
from dpx_torch.checks import InputChecks
from dpx_torch.exchange import CountsExchange
from dpx_torch.flags import OverflowMethods
from dpx_torch.fullpath import FullPath, in_place
from dpx_torch.groups import DpGroups, adopt_groups, build_groups, mesh_groups
from dpx_torch.lifecycle import Lifecycle, exit_hook
from dpx_torch.overlap import DpWork
from dpx_torch.padrows import pad_row_mask
from dpx_torch.peer import PeerOptions, TransportMethods
from dpx_torch.prepared import PreparedOp, PreparedOps
from dpx_torch.runner import CacheLimits, CacheMethods, Runner

__all__ = ["DpComm", "counts_tensor"]

_GATHER, _NATIVE = Op.GATHER._value_, Wire.NATIVE


class DpComm(OverflowMethods, CacheMethods, TransportMethods):
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

    ``transport="peer"`` (every rank alike; ``peer``: its :class:`dpx_torch.PeerOptions`)
    runs the world steps through memory the ranks of one host share, where every rank can
    (docs/semantics.md, "The peer transport"): construction then also exchanges what each
    rank can do and opens the workspaces; :attr:`transport_choice` says what was chosen.

    ``validate=True`` adds one small host exchange before every call: all ranks
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
                 validate: bool = False, limits: CacheLimits | None = None,
                 transport: Transport | str = Transport.PER_ROOT,
                 peer: PeerOptions | None = None) -> None:
        if not isinstance(layout, DpLayout):
            raise DpxTypeError(f"layout={layout!r} must be a dpx.DpLayout")
        if limits is not None and not isinstance(limits, CacheLimits):
            raise DpxTypeError(f"limits={limits!r} must be a dpx_torch.CacheLimits")
        check_bool("validate", validate)   # (before any group is built)
        # What a communicator owns, in the order built: its groups; the lifecycle (alive,
        # validate, the fast paths' switch); the runner (schedule, program and table
        # caches, the scratch pool, the bound collectives, and the peer transport opened
        # last, below); the input checks and the agreement (validate); the prepared ops;
        # the full path; the counts exchange; the exit hook. destroy() ends the peer
        # transport and then the groups (TransportMethods._end), then _release ends the
        # lifecycle, severs the prepared ops' programs, clears the runner's caches and the
        # counts exchange, drops every reference and the exit hook.
        self.layout = layout
        adopt = any(g is not None for g in (attn_tp_group, replica_group, cpu_group))
        self.groups: DpGroups = (adopt_groups(layout, group, attn_tp_group, replica_group,
                                              cpu_group) if adopt
                                 else build_groups(layout, group))
        self.rank = self.groups.rank
        coords = layout.coords(self.rank)
        self.dp_rank, self.cp_rank = coords.attn_dp_rank, coords.attn_cp_rank
        limits = limits or CacheLimits()
        self._life = Lifecycle(validate=validate)
        self.runner = Runner(self.groups, limits)
        self.checks = InputChecks(layout, self.dp_rank, self.groups)
        self.agreement = Agreement(layout, self.groups)
        self.prepared = PreparedOps(self._life, self.runner, limits.calls,
                                    lambda op: getattr(self, op, None),
                                    functools.partial(in_place, layout, self.rank))
        self.full = FullPath(layout, self.rank, self.runner, self.checks, self.agreement,
                             self.prepared)
        self._counts = CountsExchange(layout, self.rank, self.groups, self.runner, self.checks,
                                      self.full.checked)
        self.transport_choice = self.runner.open_peer(layout, self._exchange, transport,
                                                      peer, self._life.fail)
        self._exit_hook = exit_hook(weakref.ref(self))
        atexit.register(self._exit_hook)

    @classmethod
    def from_mesh(cls, layout: DpLayout, mesh, *, group: dist.ProcessGroup | None = None,
                  replica_group: dist.ProcessGroup | None = None,
                  cpu_group: dist.ProcessGroup | None = None,
                  validate: bool = False, limits: CacheLimits | None = None,
                  transport: Transport | str = "per_root",
                  peer: PeerOptions | None = None) -> "DpComm":
        """A communicator over a ``torch.distributed.DeviceMesh`` whose dims are (dp, cp,
        tp) in that order (or (dp, tp) when ``cp_size == 1``), named as the caller chose:
        its last dim's group is the attn-tp group; creates no group. ``group`` (the world
        in layout rank order) defaults to the default group when the mesh spans it in
        order; ``replica_group`` is needed when ``cp_size > 1`` (a mesh has no group
        spanning two dims without creating one)."""
        world, tp_group = mesh_groups(layout, mesh, group)
        return cls(layout, group=world, attn_tp_group=tp_group, replica_group=replica_group,
                   cpu_group=cpu_group, validate=validate, limits=limits, transport=transport,
                   peer=peer)

    @property
    def validate(self) -> bool:
        """Whether every call exchanges what it is about to do first (see the class
        docstring); settable."""
        return self._life.validate

    @validate.setter
    def validate(self, value: bool) -> None:
        self._life.set_validate(value)

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
        from it as from a separate input (same result), as it does on a quantized wire,
        whose quantize reads the rows where they lie.

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
        if self._life.fast:
            op = self.prepared.again(_GATHER, plan, partial, wire, wire_scale, dequantize,
                                     local, counts, out) or self.prepared.lookup(
                _GATHER, (plan, partial, wire, wire_scale, dequantize), local, counts, out)
            if op is not None:
                return op.run(local, counts, out)
        self._life.check()
        if isinstance(local, (tuple, list)):
            return self.full.gather_many(tuple(local), plan, partial, counts, out, wire,
                                         dequantize, wire_scale)
        op = self.full.gather(local, plan, partial, counts, out, wire, dequantize, wire_scale)
        return self.full.run(op, plan, Op.GATHER, local, counts, out)

    def prepare_gather(self, local: torch.Tensor, plan: DpPlan, *, partial: bool,
                       counts: torch.Tensor | None = None, out: torch.Tensor | None = None,
                       wire: Wire | str = Wire.NATIVE, dequantize: bool = True,
                       wire_scale: float | None = None) -> PreparedOp:
        """:meth:`gather` decided once for tensors like these (the explicit prepared
        call, :mod:`dpx_torch.prepared`): checks them (raising what :meth:`gather`
        raises, exchanging first under ``validate=True``), binds the program, and returns
        ``op`` with ``op(local, counts=..., out=...) == gather(local, plan, partial=...,
        counts=..., out=..., wire=..., dequantize=..., wire_scale=...)``; a call guards
        only what can change (shapes, dtypes, devices, contiguity, aliasing) and otherwise
        runs the bound steps -- unless the communicator validates (every call exchanges
        first) or was destroyed (every call raises). Runs nothing itself."""
        self._life.check()
        return self.prepared.hold(self.full.gather(
            local, plan, partial, counts, out, wire, dequantize, wire_scale,
            refuse_grad="prepare_gather"))

    def local_slot(self, out: torch.Tensor, plan: DpPlan) -> torch.Tensor:
        """This rank's rows of the gather's output ``out [plan.global_rows, H...]`` (its
        replica's slot, pad rows included, or its CP shard): write the rank's rows there
        and ``gather(slot, plan, partial=..., out=out)`` moves none of them locally. Under
        the host counts; with device counts ask :meth:`local_slot_for` (a dpx error where
        the place is device data: SUM_LEN / GATHERV capacity plans, CP shards)."""
        return self.local_slot_for(out, plan, counts=None)

    def local_slot_for(self, out: torch.Tensor, plan: DpPlan, *,
                       counts: torch.Tensor | None) -> torch.Tensor:
        """:meth:`local_slot` for a call that will pass ``counts`` (device counts)."""
        self._life.check()
        return self.full.slot_of(out, plan, counts)

    def scatter(self, global_: torch.Tensor, plan: DpPlan, *,
                counts: torch.Tensor | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:
        """``global_ [global_rows, H...] -> [plan.slot_rows[d], H...]``: this replica's real
        rows of an already reduced buffer, then zeros. No collective (with
        ``validate=True``, the exchange). Differentiable."""
        return self._global_op(Op.SCATTER, global_, plan, counts, out)

    def reduce_scatter(self, global_: torch.Tensor, plan: DpPlan, *,
                       counts: torch.Tensor | None = None, out: torch.Tensor | None = None,
                       wire: Wire | str = Wire.NATIVE,
                       wire_scale: float | None = None) -> torch.Tensor:
        """``global_ [global_rows, H...] -> [plan.slot_rows[d], H...]`` on every rank of
        replica d: row ``j < n_d`` is the sum over all ranks of ``global_[offsets[d] + j]``;
        other rows are 0. The adjoint of ``gather(partial=True)`` (and its gradient).

        ``wire="fp8"`` / ``"nvfp4"`` (``wire_scale=g``) / ``"mxfp4"``: the quantized
        combine (every mode; float ``[global_rows, H]``): row ``j`` is the float32 sum over
        world ranks in order, from +0.0, of the rows through the gather's wire, rounded to
        ``global_``'s dtype (docs/semantics.md, "The quantized combine"). Its gradient is
        the native one (the quantization passed straight through)."""
        return self._global_op(Op.REDUCE_SCATTER, global_, plan, counts, out, wire, wire_scale)

    def scatter_columns(self, shard: torch.Tensor, plan: DpPlan, *,
                        counts: torch.Tensor | None = None,
                        out: torch.Tensor | None = None) -> torch.Tensor:
        """``shard [global_rows, C] -> [plan.slot_rows[d], world_size * C]``: the LM-head
        scatter. World rank ``s`` holds columns ``[s*C, (s+1)*C)`` of the gathered rows;
        every rank gets its replica's rows (its CP shard's, with CP shards) with every
        column, pad rows zero -- ``scatter`` of the all-gathered columns, in one
        all-to-all (docs/semantics.md, "The LM-head scatter"). Differentiable."""
        return self._global_op(Op.SCATTER_COLUMNS, shard, plan, counts, out)

    def prepare_scatter(self, global_: torch.Tensor, plan: DpPlan, *,
                        counts: torch.Tensor | None = None,
                        out: torch.Tensor | None = None) -> PreparedOp:
        """:meth:`scatter` decided once (see :meth:`prepare_gather`)."""
        return self._prepare_global(Op.SCATTER, global_, plan, counts, out)

    def prepare_reduce_scatter(self, global_: torch.Tensor, plan: DpPlan, *,
                               counts: torch.Tensor | None = None,
                               out: torch.Tensor | None = None,
                               wire: Wire | str = Wire.NATIVE,
                               wire_scale: float | None = None) -> PreparedOp:
        """:meth:`reduce_scatter` decided once (see :meth:`prepare_gather`)."""
        return self._prepare_global(Op.REDUCE_SCATTER, global_, plan, counts, out, wire,
                                    wire_scale)

    def prepare_scatter_columns(self, shard: torch.Tensor, plan: DpPlan, *,
                                counts: torch.Tensor | None = None,
                                out: torch.Tensor | None = None) -> PreparedOp:
        """:meth:`scatter_columns` decided once (see :meth:`prepare_gather`)."""
        return self._prepare_global(Op.SCATTER_COLUMNS, shard, plan, counts, out)

    def _global_op(self, kind: Op, x, plan, counts, out, wire=_NATIVE, wire_scale=None):
        if self._life.fast:
            op = self.prepared.again(kind._value_, plan, True, wire, wire_scale, True, x,
                                     counts, out) or self.prepared.lookup(
                kind._value_, (plan, True, wire, wire_scale, True), x, counts, out)
            if op is not None:
                return op.run(x, counts, out)
        self._life.check()
        op = self.full.global_op(kind, x, plan, counts, out, wire=wire, wire_scale=wire_scale)
        return self.full.run(op, plan, kind, x, counts, out)

    def _prepare_global(self, kind: Op, x, plan, counts, out, wire=_NATIVE,
                        wire_scale=None) -> PreparedOp:
        self._life.check()
        return self.prepared.hold(self.full.global_op(
            kind, x, plan, counts, out, refuse_grad=f"prepare_{kind.value}", wire=wire,
            wire_scale=wire_scale))

    def gather_async(self, local: torch.Tensor, plan: DpPlan, *, partial: bool,
                     counts: torch.Tensor | None = None, out: torch.Tensor | None = None,
                     key: object = 0, wire: Wire | str = Wire.NATIVE,
                     wire_scale: float | None = None) -> tuple[torch.Tensor, DpWork]:
        """:meth:`gather` on :attr:`comm_stream` (two-batch overlap). Returns ``(out,
        work)``: ``out`` is the caller's ``out=`` or a pooled buffer keyed by ``("gather",
        key)`` (one ``key`` per micro-batch, valid until its next call; held to an ``out=``'s
        rules: the input must not overlap it); ``work.wait()`` makes the current stream wait
        for it. In place with ``local = local_slot(out, plan)``. ``wire`` / ``wire_scale``:
        :meth:`gather`'s, dequantized into ``out``. Not differentiable (a dpx error if
        ``local`` requires grad)."""
        self._life.check()
        f = self.full
        return self.runner.overlap.launch("gather", key, local, out, f.overlapped_rows(
            Op.GATHER, plan, counts, out), f.overlapped(Op.GATHER, local, plan, partial,
                                                        counts, wire, wire_scale))

    def reduce_scatter_async(self, global_: torch.Tensor, plan: DpPlan, *,
                             counts: torch.Tensor | None = None,
                             out: torch.Tensor | None = None, key: object = 0,
                             wire: Wire | str = Wire.NATIVE,
                             wire_scale: float | None = None) -> tuple[torch.Tensor, DpWork]:
        """:meth:`reduce_scatter` on :attr:`comm_stream`; see :meth:`gather_async` (``out``
        or a pooled buffer keyed by ``("reduce_scatter", key)``)."""
        self._life.check()
        f, rs = self.full, Op.REDUCE_SCATTER
        return self.runner.overlap.launch("reduce_scatter", key, global_, out, f.overlapped_rows(
            rs, plan, counts, out), f.overlapped(rs, global_, plan, True, counts, wire,
                                                 wire_scale))

    def sync_counts(self, num_tokens: int, *,
                    is_extend: bool = False) -> tuple[tuple[int, ...], bool]:
        """Exchange this rank's real token count (one small host all-gather over the CPU
        group) so every rank plans from the same data. Returns ``(counts per replica,
        any rank is_extend)``. A bad count on any rank (named with its value), or attn-tp
        ranks of one replica that report different counts, make every rank raise
        :class:`dpx.DpxMismatchError`."""
        self._life.check()
        return self.agreement.sync_counts(num_tokens, is_extend=is_extend)

    def sync_shards(self, cp_shard_counts: Sequence[int],
                    counts: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
        """This rank's CP shard counts exchanged into a plan's shard table, checked on
        every rank (:meth:`dpx_torch.agreement.Agreement.sync_shards`)."""
        self._life.check()
        return self.agreement.sync_shards(cp_shard_counts, counts)

    def exchange_counts(self, n_local: torch.Tensor, *, shards: bool = False,
                        plan: DpPlan | None = None) -> torch.Tensor:
        """This rank's real count (device int32 ``(1,)``) -> the per-replica counts, device
        int32 ``[dp_size]`` (``shards=True``: each CP rank reports its shard; the
        ``[dp_size, cp_size]`` shard table): one tiny world all-gather, no host sync,
        CUDA-graph capturable (:meth:`gather_with_counts` rides the gather instead). Entry
        ``d`` is the report of replica d's rank with this rank's CP and attn-tp coordinates
        (:mod:`dpx.counts`). ``plan`` (a capacity plan): the result is checked against it
        on the device (the overflow flag) or, with ``validate``, on the host, where every
        rank raises the same error when a replica's (a CP rank's) ranks disagree, when a
        count is negative, or when the counts do not fit ``plan``."""
        self._life.check()
        return self._counts(n_local, shards=shards, plan=plan, validate=self.validate)

    def gather_with_counts(self, local: torch.Tensor, plan: DpPlan, *, partial: bool,
                           n_local: torch.Tensor, shards: bool = False,
                           out: torch.Tensor | None = None, wire: Wire | str = Wire.NATIVE,
                           dequantize: bool = True, wire_scale: float | None = None) -> tuple:
        """``gather(local, plan, counts=exchange_counts(n_local, shards=shards), ...)``, the
        counts riding the gather's world all-gather (MAX_LEN and GATHERV capacity plans):
        ``(result, counts)``, checked as ``counts=`` is. Not differentiable
        (docs/semantics.md, "Counts that ride the gather")."""
        self._life.check()
        return self.full.gather_with_counts(local, plan, partial, n_local, shards, out, wire,
                                            dequantize, wire_scale)

    def mask_pad_rows(self, t: torch.Tensor, plan: DpPlan, *,
                      counts: torch.Tensor | None = None,
                      fill: int | float = -1) -> torch.Tensor:
        """:func:`dpx_torch.mask_pad_rows` with this communicator's device tables (a
        captured graph replays it) and, with device counts, their check (the overflow
        flag)."""
        self._life.check()
        return self.full.mask_pad_rows(t, plan, counts, fill)

    def pad_row_mask(self, plan: DpPlan, *, counts: torch.Tensor | None = None,
                     device: torch.device | str | None = None) -> torch.Tensor:
        """:func:`dpx_torch.pad_row_mask` with this communicator's device tables."""
        self._life.check()
        self.checks.plan(plan)
        return pad_row_mask(plan, counts=counts, device=device, tables=self.runner.tables)

    def schedule(self, plan: DpPlan, op: Op | str, *, partial: bool = True,
                 device_counts: bool = False, in_rows: int | None = None,
                 in_place: bool = False) -> Schedule:
        """The steps this rank runs for ``op`` (what ``python -m dpx plan --rank`` prints)."""
        self._life.check()
        return build_schedule(plan, op, rank=self.rank, partial=partial,
                              device_counts=device_counts, transport=self.runner.transport,
                              in_rows=in_rows, in_place=in_place,
                              cache=self.runner.schedules)

    @property
    def comm_stream(self) -> torch.cuda.Stream:
        """The one communication stream of the ``*_async`` calls."""
        self._life.check()
        return self.runner.overlap.stream

    # ------------------------------------------------------------------ lifecycle
    def destroy(self) -> None:
        """Destroy the subgroups this communicator created (none when it was given the
        caller's groups), drop every reference it and its prepared ops -- those handed
        out by ``prepare_*`` too -- hold to a process group, and refuse any later call,
        prepared ops' included. Collective: every rank calls it. Each subgroup is drained
        with a barrier before it is destroyed, and the world group after, so no rank
        tears a group down while a peer still uses it (:mod:`dpx_torch.lifecycle` says
        why the references matter at exit; the peer transport's drain:
        :meth:`~dpx_torch.peer.TransportMethods._end`). Without ``destroy()``, the same
        release runs at interpreter exit (an ``atexit`` hook; the subgroups this
        communicator created are destroyed there, without barriers)."""
        if not self._life.alive:
            return
        self._end(at_exit=False)
        self._release()

    def _release(self) -> None:
        """Forget every process group, cache and prepared op's program."""
        self._life.end()
        self.prepared.sever()
        self.runner.clear()
        self._counts.clear()
        self.groups = self.runner = self.checks = self.agreement = None  # type: ignore
        self.full = self._counts = None  # type: ignore
        atexit.unregister(self._exit_hook)

    def __del__(self) -> None:
        hook = getattr(self, "_exit_hook", None)
        if hook is not None:
            atexit.unregister(hook)

    def _at_exit(self) -> None:
        if self._life.alive:
            self._end(at_exit=True)
            self._release()


def counts_tensor(num_tokens: Sequence[int], device: torch.device | str) -> torch.Tensor:
    """An int32 device tensor of per-replica counts (to update in place between replays)."""
    return torch.tensor(list(num_tokens), dtype=torch.int32, device=device)
