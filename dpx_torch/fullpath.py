"""The full path of a :class:`~dpx_torch.DpComm` call: the input checks, the
``validate=True`` exchange, and the prepared op the call runs (found in, or made for, the
communicator's one cache, :class:`~dpx_torch.prepared.PreparedOps`).

Layer: call paths. Imports dpx, the shims, passes, transports and runner layers and the
modules before it in its own row (docs/semantics.md, "Where things live").

Every call form ends here unless its prepared op admits it on the fast path: a first call,
a call whose tensors a prepared op's guards do not admit, every call while the
communicator validates, autograd calls, ``*_async`` calls and several-tensor gathers.
Checks raise before any collective (docs/errors.md, "Before any collective"). With
``validate=True`` every rank first exchanges what it is about to do -- every op takes
part, scatter included -- and all raise the same error (:meth:`FullPath.checked`).

Autograd (:class:`OpFunction`): the backward of an op is the schedule of its adjoint op
(``dpx.Op.adjoint``): gather (partial or replicated) -> reduce_scatter; reduce_scatter ->
gather_sum (the partial gather whose sums span every rank of a replica, CP ranks too);
scatter <-> scatter's adjoint. For a replicated gather every attn-tp copy receives the
whole slot's gradient, which is what the backward of a replicated activation expects. A
graph keeps its communicator's full path weakly and no prepared program: a graph held
past ``DpComm.destroy()`` holds no process group, and its backward raises that the
communicator was destroyed.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch

from dpx import wire as W
from dpx.counts import own_entry
from dpx.errors import DpxError, DpxValueError
from dpx.extents import local_rows, op_rows
from dpx.layout import DpLayout
from dpx.modes import Op, Wire
from dpx.plan import DpPlan
from dpx.schedule import check_ride
from dpx_torch.agreement import Agreement
from dpx_torch.checks import InputChecks
from dpx_torch.exchange import check_reports
from dpx_torch.lifecycle import destroyed
from dpx_torch.padrows import mask_pad_rows
from dpx_torch.prepared import CallKey, PreparedOp, PreparedOps, call_key
from dpx_torch.program import flat_counts
from dpx_torch.tensors import overlaps
from dpx_torch.runner import Call, Runner
from dpx_torch.wire import split_wire

__all__ = ["FullPath", "gather_label", "in_place", "OpFunction", "own_counts"]

_compiling = torch.compiler.is_compiling
Tensors = tuple[torch.Tensor, ...]


class OpFunction(torch.autograd.Function):
    """``apply(x, full, call)``: the call's schedule forward (``full.execute``), its
    adjoint's backward (``full.adjoint``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, full: "FullPath", call: Call) -> torch.Tensor:
        ctx.full, ctx.call = weakref.ref(full), call._replace(prep=None)
        return full.execute(call, x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        full = ctx.full()
        if full is None:
            raise destroyed()
        grad = grad.contiguous()
        adj = full.adjoint(ctx.call, grad)
        return full.execute(adj, grad), None, None


class FullPath:
    """The full path of one communicator's calls (see the module docstring)."""

    def __init__(self, layout: DpLayout, rank: int, runner: Runner, checks: InputChecks,
                 agreement: Agreement, ops: PreparedOps) -> None:
        self.layout, self.rank, self.runner = layout, rank, runner
        self.checks, self.agreement, self.ops = checks, agreement, ops

    # ------------------------------------------------------------ the checked op
    def checked(self, label: str, plan: Any, tensor: Any, partial: Any, counts: Any,
                make: Callable[[], Any]) -> Any:
        """``make()``: this rank's checks and what they build. Without ``validate`` a
        rejected input raises here, before any collective. With ``validate``, every rank
        first exchanges what it is about to do (and whether its input was rejected), and
        all raise the same error (:meth:`dpx_torch.agreement.Agreement.check`)."""
        if not self.ops.life.validate:
            return make()
        err = None
        try:
            result = make()
        except DpxError as exc:
            result, err = None, exc
        try:
            self.agreement.check(label, plan, tensor, partial, err, counts)
        finally:
            err = None   # no cycle through this frame: the groups it reaches go with it
        return result

    def gather(self, local, plan, partial, counts, out, wire, dequantize, wire_scale,
               form: Any = "", refuse_grad: str | None = None, index: str = "") -> PreparedOp:
        """The checked gather of one tensor: its prepared op. ``refuse_grad``: the name of
        a call form that records no autograd graph (an input that requires grad is an
        error of its checks). ``index``: ``"#i/n"`` for tensor ``i`` of ``n`` gathered in
        one call (part of its name in the ``validate=True`` exchange)."""
        def make() -> PreparedOp:
            if refuse_grad:
                no_grad(refuse_grad, local, "local")
            w = Wire.parse(wire)
            in_place = self.in_place(local, out, plan, counts)
            rows, g = self.gather_checks(local, plan, partial, counts, out, w,
                                         W.dequantized(w, dequantize), in_place, wire_scale)
            key = call_key(Op.GATHER._value_, plan, partial, wire, wire_scale, dequantize,
                           local, counts, out, in_place, form)
            return self._op(key, local, counts, out, in_place, rows, dict(
                partial=partial, wire=wire, dequantize=dequantize, wire_scale=wire_scale),
                wire=w, dequantize=bool(dequantize), wire_scale=g)
        return self.checked(gather_label(wire, wire_scale) + index, plan, local, partial,
                            counts, make)

    def overlapped(self, op: Op, x, plan, partial, counts, wire, wire_scale
                   ) -> Callable[[Any], Callable[[torch.Tensor], Any]]:
        """``prepare(out)`` of an overlapped gather or reduce_scatter
        (:meth:`dpx_torch.overlap.Overlap.launch`, on the comm stream): its kept prepared
        op found by key (the fast path; form ``"comm"`` on CUDA, whose scratch is the comm
        stream's) or the checked full path's, bound as ``run(out)``."""
        form = "comm" if isinstance(x, torch.Tensor) and x.is_cuda else ""
        name = f"{op.value}_async"

        def prepare(out: Any) -> Callable[[torch.Tensor], Any]:
            found = self.ops.life.fast and self.ops.lookup(
                op._value_, (plan, partial, wire, wire_scale, True), x, counts, out, form)
            if not found:
                found = self.gather(x, plan, partial, counts, out, wire, True, wire_scale,
                                    form=form, refuse_grad=name) if op is Op.GATHER else \
                    self.global_op(op, x, plan, counts, out, form=form, refuse_grad=name,
                                   wire=wire, wire_scale=wire_scale)
            prep, c = found.prep, flat_counts(counts)
            return lambda o: prep.run(x, o, c)
        return prepare

    def overlapped_rows(self, op: Op, plan: Any, counts: Any, out: Any) -> int | None:
        """The rows of an overlapped call's pooled output (:func:`dpx.extents.op_rows`);
        None where the caller gave ``out`` or the plan is not this communicator's (its
        checks name that)."""
        if out is not None or not isinstance(plan, DpPlan) or plan.layout != self.layout:
            return None
        try:
            return op_rows(plan, op, self.rank, device_counts=counts is not None).out
        except DpxError:
            return None

    def gather_with_counts(self, local, plan, partial, n_local, shards, out, wire,
                           dequantize, wire_scale) -> tuple:
        """:meth:`DpComm.gather_with_counts`: ``(result, counts)``, the counts riding the
        gather's world collective."""
        own: list = []

        def make() -> PreparedOp:
            no_grad("gather_with_counts", local, "local")
            self.checks.plan(plan)
            check_ride(plan, Op.GATHER, shards=shards)
            self.checks.n_local(n_local)
            own.append(own_counts(plan, self.rank, n_local))
            w = Wire.parse(wire)
            rows, g = self.gather_checks(local, plan, partial, own[0], out, w,
                                         W.dequantized(w, dequantize), False, wire_scale)
            key = call_key(Op.GATHER._value_, plan, partial, wire, wire_scale, dequantize,
                           local, own[0], out, False, "ride")
            return self._op(key, local, own[0], out, False, rows, {}, wire=w,
                            dequantize=bool(dequantize), wire_scale=g, ride=True)
        op = self.checked(gather_label(wire, wire_scale, "gather+counts"), plan, local,
                          partial, None, make)
        res = op.prep.new_out(local) if out is None else out
        counts, reports = op.prep.run_riding(local, res, flat_counts(own[0]), n_local)
        if self.ops.life.validate:   # every rank holds the same reports: the same error
            check_reports("gather_with_counts", self.layout, reports, counts, shards=shards,
                          plan=plan)
        lay = self.layout
        return (split_wire(res, op.prep.context.wire) if op.prep.out_wire else res,
                counts.view(lay.dp_size, lay.cp_size) if shards else counts)

    def global_op(self, op: Op, x, plan, counts, out, form: Any = "",
                  refuse_grad: str | None = None, wire: Any = Wire.NATIVE,
                  wire_scale: Any = None) -> PreparedOp:
        """The checked scatter, reduce_scatter or scatter_columns: its prepared op
        (``refuse_grad``: see :meth:`gather`; ``wire``, ``wire_scale``: the quantized
        combine's, reduce_scatter only)."""
        def make() -> PreparedOp:
            if refuse_grad:
                no_grad(refuse_grad, x, "shard" if op is Op.SCATTER_COLUMNS else "global_")
            w = Wire.parse(wire)
            rows = self.global_checks(op, x, plan, counts, out)
            g = W.check_wire_scale(w, wire_scale)
            if w is not Wire.NATIVE:
                W.check_wire(w, plan.mode, tuple(x.shape), str(x.dtype).replace("torch.", ""),
                             "global_", op)
            key = call_key(op._value_, plan, True, wire, wire_scale, True, x, counts, out,
                           False, form)
            return self._op(key, x, counts, out, False, rows,
                            {} if w is Wire.NATIVE else dict(wire=wire, wire_scale=wire_scale),
                            wire=w, wire_scale=g)
        return self.checked(gather_label(wire, wire_scale, op._value_), plan, x, True, counts,
                            make)

    def _op(self, key: CallKey, x: torch.Tensor, counts, out, in_place: bool, rows,
            keywords: dict, **flags) -> PreparedOp:
        """The prepared op of ``key`` (kept), made when there is none for this form of the
        call (in place or not)."""
        compiling = _compiling()
        op = None if compiling else self.ops.get(key)
        if op is not None:
            return op
        scratch = "caller" if key.form == "" else key.form
        prep = self.runner.prepare(key.plan, Op(key.op), x, partial=key.partial,
                                   device_counts=key.counts, in_place=in_place,
                                   scratch_key=scratch, rows=rows, **flags)
        return self.ops.make(key, prep, x, counts=counts, out=out, in_place=in_place,
                             keywords=keywords, keep=not compiling)

    # ------------------------------------------------------------ checks
    def gather_checks(self, local, plan, partial, counts, out, wire: Wire, dequantize: bool,
                      in_place: bool, wire_scale: object = None):
        """The gather's input checks: ``(rows, g)``, its :func:`dpx.extents.op_rows` and
        nvfp4's global scale as float32 (None for other wires)."""
        c = self.checks
        if not isinstance(partial, bool):
            c.partial(partial)
        c.tensor("local", local)
        if not isinstance(plan, DpPlan) or plan.layout != self.layout:
            c.plan(plan)
        g = W.check_wire_scale(wire, wire_scale)
        if wire is not Wire.NATIVE:
            W.check_wire(wire, plan.mode, tuple(local.shape),
                         str(local.dtype).replace("torch.", ""))
            no_grad(f"gather(wire='{wire.value}')", local, "local",
                    "gather in the native dtype to differentiate")
            if out is not None and not dequantize:
                raise DpxValueError("out= takes the dequantized result; with dequantize="
                                    "False the gather returns views of its own wire buffer")
        if counts is not None:
            c.counts(plan, counts, local)
        rows = op_rows(plan, Op.GATHER, self.rank, device_counts=counts is not None)
        if local.shape[0] < rows.need:
            c.tensor("local", local, min_rows=rows.need)
        grad = local.requires_grad and torch.is_grad_enabled()
        if in_place and grad:
            raise DpxValueError("an in-place gather records no autograd graph; gather from "
                                "a separate input to differentiate")
        if grad and out is not None and not in_place:
            raise DpxValueError("out= cannot be used when local requires grad")
        c.out(out, local, rows.out, compiling=_compiling(), in_place=in_place)
        return rows, g

    def global_checks(self, op: Op, global_, plan, counts, out):
        """The input checks of an op taking a gathered buffer: its op rows."""
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
        if out is not None and global_.requires_grad and torch.is_grad_enabled():
            raise DpxValueError(f"out= cannot be used when {name} requires grad")
        c.out(out, global_, rows.out, compiling=_compiling(),
              rest=(self.layout.world_size * global_.shape[1],) if columns else None)
        return rows

    def in_place(self, local: Any, out: Any, plan: Any, counts: Any) -> bool:
        """:func:`in_place` for this rank."""
        return in_place(self.layout, self.rank, local, out, plan, counts)

    def mask_pad_rows(self, t: Any, plan: Any, counts: Any, fill: int | float) -> Any:
        """:meth:`DpComm.mask_pad_rows`: the communicator's device tables, and with device
        counts their check (the overflow flag)."""
        self.checks.plan(plan)
        runner = self.runner
        passes = runner.passes_for(t.device) if isinstance(t, torch.Tensor) else None
        out = mask_pad_rows(t, plan, counts=counts, fill=fill, tables=runner.tables,
                            passes=passes)
        if counts is not None:
            runner.flags.check(flat_counts(counts), plan.count_rule, passes)
        return out

    def slot_of(self, out: Any, plan: Any, counts: Any) -> torch.Tensor:
        """This rank's rows of a gather's output ``out`` (:meth:`DpComm.local_slot_for`)."""
        self.checks.plan(plan)
        if not isinstance(out, torch.Tensor) or out.dim() < 1 \
                or out.shape[0] != plan.global_rows:
            raise DpxValueError(f"out must be a tensor of plan.global_rows={plan.global_rows} "
                                f"rows, got shape {tuple(getattr(out, 'shape', ()))}")
        first, rows = local_rows(plan, self.rank, device_counts=counts is not None)
        return out[first:first + rows]

    # ------------------------------------------------------------ running
    def run(self, op: PreparedOp, plan: DpPlan, kind: Op, x: torch.Tensor, counts,
            out) -> Any:
        """Run a checked call: through autograd when ``x`` requires grad (the backward is
        the adjoint op's prepared call), else its bound steps."""
        if x.requires_grad and torch.is_grad_enabled():   # (its checks refused out=)
            return OpFunction.apply(x, self, Call(plan, kind, flat_counts(counts),
                                                  x.shape[0], op.out_rows, op.prep))
        return op.run(x, counts, out)

    def adjoint(self, call: Call, grad: torch.Tensor) -> Call:
        """The call computing ``call``'s backward for the output gradient ``grad``: its
        op's adjoint, from the output's rows to the input's (a kept prepared op). Refused
        once the communicator was destroyed; exchanged first under ``validate=True``, as
        every call."""
        self.ops.life.check()
        kind = call.op.adjoint
        key = call_key(kind._value_, call.plan, True, Wire.NATIVE, None, True, grad,
                       call.counts, None, False, ("adjoint", call.in_rows))

        def make() -> PreparedOp:
            op = None if _compiling() else self.ops.get(key)
            if op is None:
                prep = self.runner.prepare(call.plan, kind, grad, partial=True,
                                           device_counts=call.counts is not None,
                                           out_rows=call.in_rows)
                op = self.ops.make(key, prep, grad, counts=None, out=None, in_place=False,
                                   keywords={}, keep=not _compiling())
            return op
        op = self.checked(kind._value_, call.plan, grad, True, call.counts, make)
        return Call(call.plan, kind, call.counts, call.out_rows, call.in_rows, op.prep)

    def execute(self, call: Call, x: torch.Tensor) -> torch.Tensor:
        """Run a differentiable call (forward or backward) into a new output."""
        return self.runner.execute(call, x)

    def gather_many(self, tensors: Tensors, plan: DpPlan, partial, counts, out, wire,
                    dequantize: bool, wire_scale=None) -> tuple:
        """``gather`` of several tensors: each as if gathered alone, the collectives
        batched (:mod:`dpx.batch`). Under ``validate=True`` the call's own arguments are
        exchanged first, then each tensor's (named ``gather#i/n``)."""
        n = len(tensors)

        def arguments() -> tuple:
            if n == 0:
                raise DpxValueError("gather of a tuple needs at least one tensor")
            if out is not None:
                raise DpxValueError("out= is for one tensor; gather of a tuple allocates "
                                    "its results")
            wires = per_tensor("wire", wire, n)
            if isinstance(wire_scale, (tuple, list)):
                scales = per_tensor("wire_scale", wire_scale, n)
            else:  # one scale for the nvfp4 tensors
                scales = tuple(wire_scale if Wire.parse(w) is Wire.NVFP4 else None
                               for w in wires)
            return per_tensor("partial", partial, n), wires, scales
        # with autograd each tensor is gathered alone (other collectives than the batch):
        # part of the call's name, so that validate=True refuses ranks that differ
        grad = any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors) \
            and torch.is_grad_enabled()
        partials, wires, scales = self.checked(
            f"gather of {n} tensors" + (" (autograd: one by one)" if grad else ""), plan,
            tensors[0] if n else None, None, counts, arguments)
        if grad:
            return tuple(self.run(self.gather(t, plan, p, counts, None, w, dequantize, g,
                                              index=f"#{i}/{n}"), plan, Op.GATHER, t,
                                  counts, None)
                         for i, (t, p, w, g) in enumerate(zip(tensors, partials, wires,
                                                              scales)))
        preps = [self.gather(t, plan, p, counts, None, w, dequantize, g, form=f"caller#{i}",
                             index=f"#{i}/{n}").prep
                 for i, (t, p, w, g) in enumerate(zip(tensors, partials, wires, scales))]
        batch = self.runner.batch(tuple(preps))
        c = flat_counts(counts)
        res = batch(preps, [(t, p.new_out(t), c) for p, t in zip(preps, tensors)])
        return tuple(split_wire(r, p.context.wire) if p.out_wire else r
                     for r, p in zip(res, preps))


def own_counts(plan: DpPlan, rank: int, n_local: torch.Tensor) -> torch.Tensor:
    """Device counts shaped like the plan's (``[dp]``, or ``[dp, cp]`` shards) holding only
    this rank's own count ``n_local`` (its replica's, or its CP shard's), zeros elsewhere:
    what the passes before a riding gather's collective read."""
    lay = plan.layout
    c = lay.coords(rank)
    entries = lay.dp_size * (lay.cp_size if plan.sharded else 1)
    i = own_entry(c.attn_dp_rank, c.attn_cp_rank, lay.cp_size, shards=plan.sharded)
    own = torch.zeros(entries, dtype=torch.int32, device=n_local.device)
    own[i:i + 1].copy_(n_local)
    return own.view(lay.dp_size, lay.cp_size) if plan.sharded else own


def in_place(layout: DpLayout, rank: int, local: Any, out: Any, plan: Any, counts: Any) -> bool:
    """Whether ``local`` is rank ``rank``'s slot view of ``out`` (an in-place gather); a
    dpx error when it overlaps ``out`` anywhere else."""
    if out is None or _compiling() or not isinstance(local, torch.Tensor) \
            or not isinstance(out, torch.Tensor) or not overlaps(local, out):
        return False
    if isinstance(plan, DpPlan) and plan.layout == layout and out.dim() >= 1 \
            and out.shape[0] == plan.global_rows and local.shape[1:] == out.shape[1:]:
        try:
            first, rows = local_rows(plan, rank, device_counts=counts is not None)
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


def per_tensor(name: str, value, n: int) -> tuple:
    """One value per tensor of a several-tensor call: ``value`` itself when it is a
    sequence of ``n``, else ``n`` copies of it."""
    if isinstance(value, (tuple, list)):
        if len(value) != n:
            raise DpxValueError(f"{name} has {len(value)} entries for {n} tensors; give "
                                f"one per tensor or one for all")
        return tuple(value)
    return (value,) * n


def no_grad(form: str, x: Any, arg: str,
            hint: str = "differentiate through the plain call") -> None:
    """A dpx error when ``x`` (the argument ``arg``) requires grad under a call ``form``
    that records no autograd graph (a prepared op, an overlapped call, a quantized
    wire)."""
    if isinstance(x, torch.Tensor) and x.requires_grad and torch.is_grad_enabled():
        raise DpxValueError(f"{form}: {arg} requires grad; {form} records no autograd "
                            f"graph ({hint}, or pass a detached tensor)")


def gather_label(wire: Any, wire_scale: object, op: str = "gather") -> str:
    """A call's name in a ``validate=True`` exchange: its op (``gather`` unless given), its
    wire and nvfp4's scale (so that a wire or scale that differs between ranks raises on
    every rank)."""
    try:
        name = Wire.parse(wire).value
    except DpxError:   # raised by the checks, inside the exchange
        name = repr(wire)
    if name == Wire.NATIVE.value:
        return op
    if isinstance(wire_scale, (int, float)) and not isinstance(wire_scale, bool):
        wire_scale = float(wire_scale)   # 2 and 2.0 are one scale
    return f"{op}/{name}" + ("" if wire_scale is None else f" scale={wire_scale!r}")

