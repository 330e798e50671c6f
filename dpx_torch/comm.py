"""``DpComm``: DP-attention gather / scatter / reduce_scatter over torch.distributed.

Per-rank shape algebra (``d`` = this rank's attn-dp rank, ``n_d`` its real count,
``H...`` the trailing dims)::

    gather(local [>= n_d, H...], plan, partial)  -> [plan.global_rows, H...]
    scatter(global_ [global_rows, H...], plan)   -> [plan.slot_rows[d], H...]   (no collective)
    reduce_scatter(global_ [global_rows, H...])  -> [plan.slot_rows[d], H...]

Every output row that is not a real token row is zero; no op modifies its input. What a
call does is its schedule (``dpx.build_schedule``: the planner's steps for this rank);
``DpComm`` checks the inputs, looks the schedule up and runs it (:mod:`dpx_torch.interpreter`).

Streams: a call enqueues its kernels and collectives on the current CUDA stream (NCCL) and
returns without a host sync; ``gather_async`` / ``reduce_scatter_async`` run on the
communicator's one comm stream instead (:mod:`dpx_torch.overlap`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from dpx import counts as C
from dpx import wire as W
from dpx.errors import DpxError, DpxMismatchError, DpxTypeError, DpxValueError
from dpx.layout import DpLayout
from dpx.modes import Op, Transport, Wire
from dpx.plan import DpPlan
from dpx.schedule import Schedule, build_schedule
from dpx_torch.agreement import Agreement
from dpx_torch.autograd import OpFunction
from dpx_torch.checks import SUPPORTED_DTYPES, InputChecks
from dpx_torch.groups import DpGroups, adopt_groups, build_groups
from dpx_torch.interpreter import BatchProgram, Interpreter, Program, all_gather_single
from dpx_torch.overlap import DpWork, Overlap
from dpx_torch.pool import BufferPool
from dpx_torch.wire import split_wire

__all__ = ["DpComm", "DpWork", "SUPPORTED_DTYPES", "counts_tensor"]

Tensors = tuple[torch.Tensor, ...]


@dataclass(frozen=True, eq=False)
class _Prepared:
    """What a call needs that depends only on (plan, op, partial, device counts, input
    rows): its schedule, the input rows it needs at least, the output rows. Built, with the
    plan's checks, on the first call; looked up afterwards."""

    schedule: Schedule
    need: int
    out_rows: int
    program: Program


@dataclass(frozen=True, eq=False)
class _Call:
    """One differentiable call: its schedule, its device counts (or None) and the input's
    rows (the rows of the gradient the backward returns)."""

    schedule: Schedule
    counts: torch.Tensor | None
    in_rows: int


class DpComm:
    """The communicator of one DP-attention layout over one process group.

    ``group`` (default: the default process group) must have ``layout.world_size`` ranks.
    Given only ``group``, construction creates the attn-tp (and replica) subgroups, and on
    NCCL a gloo group for host exchanges, with ``new_group``, so like ``new_group`` it is
    collective over the default process group: every rank builds its communicators in the
    same order. Given the groups a stack already has (``attn_tp_group``, ``replica_group``
    when ``cp_size > 1``, optionally a gloo ``cpu_group``), or through :meth:`from_mesh`, it
    creates none and checks that they match the layout (sizes and rank order). It holds
    all state (groups, scratch pool, comm stream, events), so several communicators
    coexist.

    ``validate=True`` adds one small host exchange before every collective call: all ranks
    compare plan fingerprint, op, dtype, width and ``partial`` (and, for a replicated
    gather, a digest of each replica's rows across its attn-tp ranks), and every rank
    raises the same :class:`dpx.DpxMismatchError` when they disagree or when any rank's
    input was rejected, instead of entering a collective that would hang or corrupt.
    """

    #: What torch.distributed's collectives can do (grouped per-root broadcasts/reduces
    #: with host sizes); it decides how GATHERV plans move their rows.
    transport = Transport.PER_ROOT
    #: Prepared calls kept per communicator (oldest dropped first beyond this).
    prepared_limit = 4096

    def __init__(self, layout: DpLayout, *, group: dist.ProcessGroup | None = None,
                 attn_tp_group: dist.ProcessGroup | None = None,
                 replica_group: dist.ProcessGroup | None = None,
                 cpu_group: dist.ProcessGroup | None = None,
                 validate: bool = False) -> None:
        if not isinstance(layout, DpLayout):
            raise DpxTypeError(f"layout={layout!r} must be a dpx.DpLayout")
        self.layout = layout
        adopt = any(g is not None for g in (attn_tp_group, replica_group, cpu_group))
        self.groups: DpGroups = (adopt_groups(layout, group, attn_tp_group, replica_group,
                                              cpu_group) if adopt
                                 else build_groups(layout, group))
        self.rank = self.groups.rank
        coords = layout.coords(self.rank)
        self.dp_rank, self.cp_rank = coords.attn_dp_rank, coords.attn_cp_rank
        self.validate = bool(validate)
        self.pool = BufferPool()
        self.checks = InputChecks(layout, self.dp_rank, self.groups.backend)
        self.agreement = Agreement(layout, self.groups)
        self.overlap = Overlap(self.pool)
        self.interpreter = Interpreter(self.groups, self.pool)
        self._prepared: dict[tuple, _Prepared] = {}
        self._batches: dict[tuple, BatchProgram] = {}
        self._sources: dict[tuple, torch.Tensor] = {}

    @classmethod
    def from_mesh(cls, layout: DpLayout, mesh, *, group: dist.ProcessGroup | None = None,
                  replica_group: dist.ProcessGroup | None = None,
                  cpu_group: dist.ProcessGroup | None = None,
                  validate: bool = False) -> "DpComm":
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
                   cpu_group=cpu_group, validate=validate)

    # ------------------------------------------------------------------ public ops
    def gather(self, local: torch.Tensor | Sequence[torch.Tensor], plan: DpPlan, *,
               partial: bool | Sequence[bool], counts: torch.Tensor | None = None,
               out: torch.Tensor | None = None, wire: Wire | str | Sequence = Wire.NATIVE,
               dequantize: bool = True):
        """``local [>= n_d, H...] -> [plan.global_rows, H...]`` on every rank.

        Slot ``d`` row ``j < n_d`` holds the sum over replica d's attn-tp ranks of their
        ``local[j]`` when ``partial``; otherwise the one value its attn-tp ranks all hold
        (each contributes its own block of it). Every other row is 0. ``counts`` (int32
        ``[dp_size]`` on the data's device, capacity plans only; ``[dp_size, cp_size]``
        shard counts for a sharded plan) carries this step's real counts as device data.
        ``out`` receives the result (no allocation). With context parallelism, ``local``
        holds this CP rank's rows (its replica's, or its shard).
        Differentiable: the gradient is ``reduce_scatter`` of the output gradient.

        ``wire="fp8"`` (``dpx.Wire.FP8``; MAX_LEN and GATHERV plans, float ``[rows, H]``
        input, ``H % 128 == 0``): the world collective moves the rows as fp8 wire rows
        (:mod:`dpx.wire`); the result is dequantized to ``local``'s dtype, or with
        ``dequantize=False`` returned as ``(payload [global_rows, H] float8_e4m3fn, scales
        [global_rows, H/128] float32)``, views of one uint8 buffer. Not differentiable.

        Several tensors: ``gather((a, b, ...), plan, partial=(pa, pb, ...))`` (``partial``,
        ``wire`` a flag each or one for all) returns a tuple, each result as if gathered
        alone; the tensors' collectives go out batched (:mod:`dpx.batch`: one grouped launch
        per batch on NCCL). When a tensor requires grad, each is gathered by its own
        differentiable call instead. ``out=`` is for one tensor.
        """
        if isinstance(local, (tuple, list)):
            return self._gather_many(tuple(local), plan, partial, counts, out, wire,
                                     dequantize)
        wire = Wire.parse(wire)
        if wire is Wire.NATIVE:
            prep = self._checked("gather", plan, local, partial, counts, self._gather_checks,
                                 local, plan, partial, counts, out)
            return self._dispatch(prep, counts, local, out, "local")
        prep = self._checked("gather/fp8", plan, local, partial, counts, self._gather_checks,
                             local, plan, partial, counts, out, wire, bool(dequantize))
        res = self._run_plain(prep, counts, local, out)
        return res if dequantize else split_wire(res)

    def _run_plain(self, prep: _Prepared, counts: torch.Tensor | None, x: torch.Tensor,
                   out: torch.Tensor | None) -> torch.Tensor:
        """A call that records no autograd graph (fp8 gathers, batched calls)."""
        if out is None:
            out = self._new_out(prep, x)
        key = "comm" if self.overlap.on_comm_stream else "caller"
        return prep.program(x, out, _flat(counts), key)

    @staticmethod
    def _new_out(prep: _Prepared, x: torch.Tensor) -> torch.Tensor:
        sched = prep.schedule
        if sched.is_wire("out"):
            return x.new_empty((prep.out_rows, W.wire_row_bytes(x.shape[1])), dtype=torch.uint8)
        return x.new_empty((prep.out_rows, *x.shape[1:]))

    def _gather_many(self, tensors: Tensors, plan: DpPlan, partial, counts, out, wire,
                     dequantize: bool) -> tuple:
        n = len(tensors)
        if n == 0:
            raise DpxValueError("gather of a tuple needs at least one tensor")
        if out is not None:
            raise DpxValueError("out= is for one tensor; gather of a tuple allocates its "
                                "results")
        partials = self._per_tensor("partial", partial, n)
        wires = tuple(Wire.parse(w) for w in self._per_tensor("wire", wire, n))
        if any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors) \
                and torch.is_grad_enabled():
            return tuple(self.gather(t, plan, partial=p, counts=counts, wire=w,
                                     dequantize=dequantize)
                         for t, p, w in zip(tensors, partials, wires))
        preps = []
        for i, (t, p, w) in enumerate(zip(tensors, partials, wires)):
            extra = () if w is Wire.NATIVE else (w, bool(dequantize))
            label = "gather" if w is Wire.NATIVE else "gather/fp8"
            preps.append(self._checked(f"{label}#{i}", plan, t, p, counts,
                                       self._gather_checks, t, plan, p, counts, None, *extra))
        key = tuple(id(p) for p in preps)
        batch = self._batches.get(key)
        if batch is None or batch.programs != tuple(p.program for p in preps):
            batch = BatchProgram(self.interpreter, tuple(p.program for p in preps))
            if len(self._batches) >= self.prepared_limit:
                del self._batches[next(iter(self._batches))]
            self._batches[key] = batch
        outs = [self._new_out(p, t) for p, t in zip(preps, tensors)]
        res = batch(tensors, outs, _flat(counts),
                    "comm" if self.overlap.on_comm_stream else "caller")
        return tuple(split_wire(r) if p.schedule.is_wire("out") else r
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
        prep = self._global_checks(Op.SCATTER, global_, plan, counts, out)
        return self._dispatch(prep, counts, global_, out, "global_")

    def reduce_scatter(self, global_: torch.Tensor, plan: DpPlan, *,
                       counts: torch.Tensor | None = None,
                       out: torch.Tensor | None = None) -> torch.Tensor:
        """``global_ [global_rows, H...] -> [plan.slot_rows[d], H...]`` on every rank of
        replica d: row ``j < n_d`` is the sum over all ranks of ``global_[offsets[d] + j]``;
        other rows are 0. The adjoint of ``gather(partial=True)`` (and its gradient)."""
        prep = self._checked("reduce_scatter", plan, global_, True, counts,
                             self._global_checks, Op.REDUCE_SCATTER, global_, plan, counts, out)
        return self._dispatch(prep, counts, global_, out, "global_")

    def gather_async(self, local: torch.Tensor, plan: DpPlan, *, partial: bool,
                     counts: torch.Tensor | None = None,
                     key: object = 0) -> tuple[torch.Tensor, DpWork]:
        """:meth:`gather` on :attr:`comm_stream` (two-batch overlap). Returns ``(out,
        work)``: ``out`` is a pooled buffer keyed by ``("gather", key)`` (one ``key`` per
        micro-batch; valid until the next call with that key) and ``work.wait()`` makes the
        current stream wait for it. Not differentiable (a dpx error if ``local`` requires
        grad)."""
        self._no_grad("gather_async", local)
        prep = self._checked("gather", plan, local, partial, counts, self._gather_checks,
                             local, plan, partial, counts, None)
        return self.overlap.launch("gather", key, local, prep.out_rows,
                                   self._runner(prep, _flat(counts), local))

    def reduce_scatter_async(self, global_: torch.Tensor, plan: DpPlan, *,
                             counts: torch.Tensor | None = None,
                             key: object = 0) -> tuple[torch.Tensor, DpWork]:
        """:meth:`reduce_scatter` on :attr:`comm_stream`; see :meth:`gather_async` (pool key
        ``("reduce_scatter", key)``)."""
        self._no_grad("reduce_scatter_async", global_)
        prep = self._checked("reduce_scatter", plan, global_, True, counts,
                             self._global_checks, Op.REDUCE_SCATTER, global_, plan, counts,
                             None)
        return self.overlap.launch("reduce_scatter", key, global_, prep.out_rows,
                                   self._runner(prep, _flat(counts), global_))

    def sync_counts(self, num_tokens: int, *,
                    is_extend: bool = False) -> tuple[tuple[int, ...], bool]:
        """Exchange this rank's real token count (one small host all-gather over the CPU
        group) so every rank plans from the same data. Returns ``(counts per replica,
        any rank is_extend)``. Attn-tp ranks of one replica that report different counts
        make every rank raise :class:`dpx.DpxMismatchError` naming the replica."""
        return self.agreement.sync_counts(num_tokens, is_extend=is_extend)

    def exchange_counts(self, n_local: torch.Tensor, *, shards: bool = False) -> torch.Tensor:
        """This rank's real count as a device int32 tensor of shape ``(1,)`` -> the per-
        replica counts, a device int32 ``[dp_size]`` tensor (``shards=True``: each CP rank
        reports its shard, the result is the ``[dp_size, cp_size]`` shard table). One tiny
        all-gather on the world group, no host sync, capturable in a CUDA graph: the
        ``counts=`` of a capacity plan's step and of ``mask_pad_rows``. Entry ``d`` is the
        report of the rank of replica d with this rank's CP and attn-tp coordinates
        (:mod:`dpx.counts`). With ``validate=True`` the reports are read back and every
        rank raises the same :class:`dpx.DpxMismatchError` when the ranks of a replica (of
        a CP rank, for shards) disagree."""
        c = self.checks
        if (not isinstance(n_local, torch.Tensor) or n_local.dtype != torch.int32
                or tuple(n_local.shape) != (1,)):
            raise DpxTypeError(f"n_local must be an int32 tensor of shape (1,), got "
                               f"{getattr(n_local, 'dtype', type(n_local).__name__)} "
                               f"{tuple(getattr(n_local, 'shape', ()))}")
        c.tensor("n_local", n_local)
        lay = self.layout
        allv = n_local.new_empty(lay.world_size)
        all_gather_single(allv, n_local, group=self.groups.world)
        if self.validate:
            bad = C.disagreements(lay, tuple(allv.tolist()), shards=shards)
            if bad:
                raise DpxMismatchError("exchange_counts: " + "; ".join(bad))
        key = ("sources", shards)
        idx = self._sources.get(key)
        if idx is None or idx.device != allv.device:
            idx = self._sources[key] = torch.tensor(C.sources(lay, self.rank, shards=shards),
                                                    dtype=torch.long, device=allv.device)
        picked = allv[idx]
        return picked.view(lay.dp_size, lay.cp_size) if shards else picked

    def schedule(self, plan: DpPlan, op: Op | str, *, partial: bool = True,
                 device_counts: bool = False, in_rows: int | None = None) -> Schedule:
        """The steps this rank runs for ``op`` (what ``python -m dpx plan --rank`` prints)."""
        return build_schedule(plan, op, rank=self.rank, partial=partial,
                              device_counts=device_counts, transport=self.transport,
                              in_rows=in_rows)

    @property
    def comm_stream(self) -> torch.cuda.Stream:
        """The one communication stream of the ``*_async`` calls."""
        return self.overlap.stream

    def destroy(self) -> None:
        """Destroy the subgroups this communicator created (none when it was given the
        caller's groups). Collective: every rank calls
        it. Each subgroup is drained with a barrier before it is destroyed, and the world
        group after, so no rank tears a group down while a peer still uses it (gloo aborts
        the process then: "terminate called without an active exception")."""
        g = self.groups
        if not g.owned:
            return  # the caller's groups stay the caller's
        for pg in {id(g.attn_tp): g.attn_tp, id(g.replica): g.replica,
                   id(g.cpu): g.cpu}.values():
            if pg is not None and pg is not g.world:
                dist.barrier(group=pg)
                dist.destroy_process_group(pg)
        dist.barrier(group=g.world)

    # ------------------------------------------------------------------ calls
    def _gather_checks(self, local, plan, partial, counts, out, wire: Wire = Wire.NATIVE,
                       dequantize: bool = True) -> _Prepared:
        c = self.checks
        if not isinstance(partial, bool):
            c.partial(partial)
        c.tensor("local", local)
        compiling = torch.compiler.is_compiling()
        if wire is not Wire.NATIVE:
            c.plan(plan)
            W.check_fp8(plan.mode, tuple(local.shape), str(local.dtype).replace("torch.", ""))
            self._no_grad("gather(wire='fp8')", local, "fp8 rounding has no gradient; "
                          "gather in the native dtype")
            if out is not None and not dequantize:
                raise DpxValueError("out= takes the dequantized result; with dequantize="
                                    "False the gather returns views of its own wire buffer")
        prep = self._prepare(Op.GATHER, plan, partial, counts, local.shape[0], compiling,
                             wire, dequantize)
        if local.shape[0] < prep.need:
            c.tensor("local", local, min_rows=prep.need)
        c.out(out, local, prep.out_rows, compiling=compiling)
        if counts is not None:
            c.counts(plan, counts, local)
        return prep

    def _global_checks(self, op: Op, global_, plan, counts, out) -> _Prepared:
        c = self.checks
        c.tensor("global_", global_)
        compiling = torch.compiler.is_compiling()
        prep = self._prepare(op, plan, True, counts, global_.shape[0], compiling)
        if global_.shape[0] != prep.need:
            c.tensor("global_", global_, rows=prep.need)
        c.out(out, global_, prep.out_rows, compiling=compiling)
        if counts is not None:
            c.counts(plan, counts, global_)
        return prep

    def _prepare(self, op: Op, plan, partial: bool, counts, in_rows: int,
                 compiling: bool, wire: Wire = Wire.NATIVE,
                 dequantize: bool = True) -> _Prepared:
        """The prepared call for these arguments: looked up, or (first time: the plan's
        checks, then its schedule) built and kept (not while torch.compile traces)."""
        if not isinstance(plan, DpPlan):
            self.checks.plan(plan)
        key = (plan, op.value, partial, counts is None, in_rows, wire, dequantize)
        prep = None if compiling else self._prepared.get(key)
        if prep is not None:
            return prep
        self.checks.plan(plan)
        d = self.dp_rank
        if op is Op.GATHER:
            if counts is not None:
                need = plan.slot_rows[d]
            else:
                need = (plan.cp_shards[d][self.cp_rank] if plan.sharded
                        else plan.num_tokens[d])
            out_rows = plan.global_rows
        else:
            need, out_rows = plan.global_rows, plan.slot_rows[d]
        sched = build_schedule(plan, op, rank=self.rank, partial=partial,
                               device_counts=counts is not None, transport=self.transport,
                               in_rows=in_rows, out_rows=out_rows, wire=wire,
                               dequantize=dequantize, cached=not compiling)
        prep = _Prepared(sched, need, out_rows, self.interpreter.compile(sched))
        if not compiling:
            if len(self._prepared) >= self.prepared_limit:
                del self._prepared[next(iter(self._prepared))]
            self._prepared[key] = prep
        return prep

    def _checked(self, op: str, plan, tensor, partial, counts,
                 checks: Callable[..., _Prepared], *args) -> _Prepared:
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

    def _adjoint(self, call: _Call) -> _Call:
        s = call.schedule
        sched = build_schedule(s.plan, s.op.adjoint, rank=self.rank, partial=True,
                               device_counts=call.counts is not None, transport=self.transport,
                               in_rows=s.out_rows, out_rows=call.in_rows,
                               cached=not torch.compiler.is_compiling())
        return _Call(sched, call.counts, s.out_rows)

    def _dispatch(self, prep: _Prepared, counts: torch.Tensor | None, x: torch.Tensor,
                  out: torch.Tensor | None, name: str) -> torch.Tensor:
        if x.requires_grad and torch.is_grad_enabled():
            if out is not None:
                raise DpxValueError(f"out= cannot be used when {name} requires grad")
            return OpFunction.apply(x, self, _Call(prep.schedule, counts, x.shape[0]))
        if out is None:
            out = x.new_empty((prep.out_rows, *x.shape[1:]))
        key = "comm" if self.overlap.on_comm_stream else "caller"
        return prep.program(x, out, _flat(counts), key)

    def _execute(self, call: _Call, x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        """Run a differentiable call's schedule (forward or backward)."""
        sched = call.schedule
        if out is None:
            out = x.new_empty((sched.out_rows, *x.shape[1:]))
        key = "comm" if self.overlap.on_comm_stream else "caller"
        return self.interpreter.run(sched, x, out, _flat(call.counts), key)

    def _runner(self, prep: _Prepared, counts: torch.Tensor | None,
                x: torch.Tensor) -> Callable[[torch.Tensor], object]:
        return lambda out: prep.program(x, out, counts,
                                        "comm" if self.overlap.on_comm_stream else "caller")

    @staticmethod
    def _no_grad(name: str, x: torch.Tensor,
                 hint: str = "call the synchronous form") -> None:
        if isinstance(x, torch.Tensor) and x.requires_grad and torch.is_grad_enabled():
            raise DpxValueError(f"{name} records no autograd graph and its input requires "
                                f"grad: {hint}, or pass a detached tensor under "
                                f"torch.no_grad()")


def _flat(counts: torch.Tensor | None) -> torch.Tensor | None:
    """Device counts as the schedules read them: a shard table ``[dp, cp]`` row by row."""
    return counts.reshape(-1) if counts is not None and counts.dim() == 2 else counts


def counts_tensor(num_tokens: Sequence[int], device: torch.device | str) -> torch.Tensor:
    """An int32 device tensor of per-replica counts (to update in place between replays)."""
    return torch.tensor(list(num_tokens), dtype=torch.int32, device=device)
