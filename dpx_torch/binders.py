"""Each step kind's *binder* (:data:`BINDERS`): a step of a schedule variant mapped onto
one prepared call's buffers, once, as a function ``f(x, out, dv)`` of the call -- a pass
(:mod:`dpx_torch.passes`: the Triton kernels on CUDA, torch ops on CPU, the custom ops
under torch.compile), a ``torch.distributed`` collective (:mod:`dpx_torch.collectives`) or
a world step of the peer transport (the runner's :class:`~dpx_torch.peer.PeerTransport`).
The planner says which rows move where; a binder only maps its step. :class:`CallContext`
is what a class of prepared calls shares, :class:`RunnerView` what binders use of the
runner.

Layer: runner. Imports dpx, the shims, passes and transports layers and the modules before
it in its own row (docs/semantics.md, "Where things live").
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import torch
import torch.distributed as dist

from dpx.counts import sources
from dpx.errors import DpxValueError
from dpx.expr import size_of
from dpx.modes import Group, Wire
from dpx.schedule import Variant
from dpx.steps import (IN, OUT, AllGather, AllGatherCounts, AllGatherV, AllReduce, AllToAll,
                       AllToAllV, BroadcastV, CheckCounts, Dequantize, DequantizeSum,
                       JoinColumns, Move, Pack, Quantize, ReduceScatter, ReduceScatterV,
                       ReduceV, Ref, SplitColumns, Step, Unpack, Zero)
from dpx.wire import wire_row_bytes
from dpx_torch import collectives as C
from dpx_torch.passes import DEVICE, Passes

__all__ = ["BINDERS", "Bind", "Buffer", "CallContext", "RunnerView", "StepFn"]


class RunnerView(Protocol):
    """What bound programs (and :mod:`dpx_torch.prepared`) use of the communicator's runner
    (:class:`dpx_torch.runner.Runner`, which imports this module): its rank, groups,
    scratch pool, overflow flags, schedule cache, compiled programs, bound collectives
    and coalescing, and the peer transport that carries its world steps (None: the
    world group's backend does)."""

    rank: int
    groups: Any
    pool: Any
    flags: Any
    schedules: Any
    peer: Any

    def program(self, variant: Variant) -> Any: ...   # its dpx_torch.program.Program

    def collective(self, bind: Callable[[Any], Any], group: Any) -> Any: ...

    def coalesced(self, group: Group, device: torch.device, *, collected: bool = False): ...


#: ``fn(x, out, dv)``: one bound step of a prepared call.
StepFn = Callable[[torch.Tensor, torch.Tensor, Any], None]
#: ``get(x, out) -> tensor``: a buffer (or rows of one) of a call.
Buffer = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class CallContext:
    """What a class of prepared calls shares besides the host values and rows: the input's
    trailing shape, dtype and device, the wire (and nvfp4's global scale) and whether the
    output is a wire buffer, the passes of the device, the device tables and the
    communicator's runner."""

    __slots__ = ("rest", "width", "dtype", "device", "out_wire", "out_width", "passes",
                 "tables", "runner", "parts", "out_rest", "wire", "wire_scale", "wire_width")

    def __init__(self, x: torch.Tensor, out_wire: bool, passes: Passes, tables,
                 runner: RunnerView, wide: frozenset = frozenset(), parts: int = 1,
                 wire: Wire = Wire.NATIVE, wire_scale: float | None = None) -> None:
        #: ``wide``: the variant's wide buffers (rows of ``parts`` narrow rows side by
        #: side); only whether the input and output are wide is kept here (the same for
        #: every variant of an op: scratch buffers are per variant)
        self.parts = parts
        rest = tuple(x.shape[1:])
        if IN in wide:  # the narrow buffers' rows: the input's columns over the parts
            rest = (rest[0] // parts,)
        self.rest = rest
        w = 1
        for s in self.rest:
            w *= s
        self.width, self.dtype, self.device = w, x.dtype, x.device
        self.out_wire, self.wire, self.wire_scale = out_wire, wire, wire_scale
        #: bytes of a wire row (quantized wires only)
        self.wire_width = 0 if wire is Wire.NATIVE else wire_row_bytes(self.rest[0], wire)
        self.out_width = self.wire_width if out_wire else w * (parts if OUT in wide else 1)
        #: the output's trailing shape (a wire buffer: one byte row)
        self.out_rest = (self.out_width,) if out_wire or OUT in wide else self.rest
        self.passes, self.tables, self.runner = passes, tables, runner

    def buffer_shape(self, rows: int, wide: bool) -> tuple[int, ...]:
        """The shape of ``rows`` rows of a (``wide``) buffer in the input's dtype."""
        return (rows, self.width * self.parts) if wide else (rows, *self.rest)


class Bind:
    """The values of one prepared call: host values of the variant resolved to ints, the
    rest marked :data:`~dpx_torch.passes.DEVICE` with a getter from the call's ``dv``."""

    __slots__ = ("variant", "hv", "context", "in_rows", "out_rows", "scratch")

    def __init__(self, variant: Variant, hv: tuple, context: CallContext, in_rows: int,
                 out_rows: int, scratch: dict[str, torch.Tensor]) -> None:
        self.variant, self.hv, self.context = variant, hv, context
        self.in_rows, self.out_rows, self.scratch = in_rows, out_rows, scratch

    def value(self, v: Any) -> Any:
        """An int (or a constant tuple), or DEVICE (None) when ``v`` reads device
        counts."""
        if v is None or type(v) is int or isinstance(v, tuple):
            return v
        i = self.variant.host_index.get(id(v))
        return DEVICE if i is None else self.hv[i]

    def elem(self, name: str) -> tuple[torch.dtype, int]:
        """The element dtype and row width of buffer ``name``: uint8 wire rows for the
        variant's wire buffers, else the input's."""
        if name in self.variant.wire_bufs:
            return torch.uint8, self.context.wire_width
        cx = self.context
        return cx.dtype, cx.width * (cx.parts if name in self.variant.wide_bufs else 1)

    def index(self, v: Any) -> tuple[int | None, Callable[[Any], Any] | None]:
        """``(value, getter)``: an int and no getter, or DEVICE and ``dv -> tensor``."""
        h = self.value(v)
        if h is DEVICE:
            return DEVICE, (lambda dv: dv(v))
        return h, None

    def buffer(self, r: Ref, rows: Any = None) -> tuple[Buffer, int]:
        """A getter of ``r``'s rows (exactly ``rows`` of them when given) and how many rows
        it gives. Refs are host-known (a view at a device offset would need a host sync)."""
        name, first = r.buf, r.first
        want = r.rows if rows is None else rows
        if type(first) is not int:
            first = self.value(first)
        n = want if want is None or type(want) is int else self.value(want)
        if first is DEVICE or (want is not None and n is DEVICE):
            raise DpxValueError(f"dpx_torch cannot view {r} at a device offset")
        total = self.in_rows if name == IN else self.out_rows if name == OUT \
            else self.scratch[name].shape[0]
        if n is None:
            n = total - first
        if name != IN and name != OUT:
            t = self.scratch[name][first:first + n]
            return (lambda x, out: t), n
        if first == 0 and n == total:
            return (_whole_in if name == IN else _whole_out), n
        if name == IN:
            return (lambda x, out: x[first:first + n]), n
        return (lambda x, out: out[first:first + n]), n

    def table(self, v: Any) -> Callable[[Any], torch.Tensor]:
        """A chunk-table vector as an int32 tensor on the data's device: a host tuple made
        once, or a device value evaluated per call."""
        h = self.value(v)
        if h is DEVICE:
            return lambda dv: dv(v).reshape(-1)
        t = self.context.tables.get(tuple(h), self.context.device)
        return lambda dv: t

    def group(self, g: Group) -> dist.ProcessGroup:
        return self.context.runner.groups.process_group(g)

    def peer(self, s: Step) -> Any:
        """The communicator's peer transport, which carries world step ``s`` of a call on
        its workspace's device (None: the group's backend does)."""
        peer = self.context.runner.peer
        if getattr(s, "group", None) is not Group.WORLD or peer is None \
                or peer.device != self.context.device:
            return None
        return peer

    def host(self, v: Any, what: str) -> int:
        h = self.value(v)
        if h is DEVICE:
            raise DpxValueError(f"{what} takes a host size")
        return h


def _whole_in(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return x


def _whole_out(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return out


def _no_index(dv: Any) -> None:
    """A host index's getter in a step that takes device ones."""
    return None


def _with_indices(go: Callable, a: Buffer, b: Buffer, getters: tuple) -> StepFn:
    """``go(a, b)`` or, when any index is device data, ``go(a, b, *indices)``."""
    if all(g is None for g in getters):
        if a is _whole_in and b is _whole_out:   # (two calls fewer on a hot path)
            return lambda x, out, dv: go(x, out)
        return lambda x, out, dv: go(a(x, out), b(x, out))
    gs = tuple(_no_index if g is None else g for g in getters)
    return lambda x, out, dv: go(a(x, out), b(x, out), *(g(dv) for g in gs))


# ---------------------------------------------------------------- local passes
def _check(s: CheckCounts, b: Bind) -> StepFn:
    flags, passes = b.context.runner.flags, b.context.passes
    return lambda x, out, dv: flags.check(dv.counts(), s.rule, passes)


def _move(s: Move, b: Bind) -> StepFn:
    src, src_rows = b.buffer(s.src)
    dst, rows = b.buffer(s.dst, s.rows)
    (ss, gs), (ds, gd), (n, gn) = b.index(s.src_start), b.index(s.dst_start), b.index(s.count)
    cx = b.context
    dtype, width = b.elem(s.dst.buf)
    go = cx.passes.bind_move(src_rows, rows, width, dtype, cx.device, ss, ds, n)
    return _with_indices(go, src, dst, (gs, gd, gn))


def _zero(s: Zero, b: Bind) -> StepFn:
    buf, rows = b.buffer(s.buf, s.rows)
    (ks, gs), (kn, gn) = b.index(s.keep_start), b.index(s.keep_count)
    cx = b.context
    dtype, width = b.elem(s.buf.buf)
    go = cx.passes.bind_zero(rows, width, dtype, cx.device, ks, kn)
    if gs is None and gn is None:
        return lambda x, out, dv: go(buf(x, out))
    gs = _no_index if gs is None else gs   # (no truth test of a function: dynamo
    gn = _no_index if gn is None else gn   # refuses one on some torch releases)
    return lambda x, out, dv: go(buf(x, out), gs(dv), gn(dv))


def _quantize(s: Quantize, b: Bind) -> StepFn:
    src, src_rows = b.buffer(s.src)
    dst, rows = b.buffer(s.dst, s.rows)
    (st, gs), (n, gn) = b.index(s.start), b.index(s.count)
    cx = b.context
    go = cx.passes.bind_quantize(src_rows, rows, cx.width, cx.dtype, cx.device, st, n,
                                 cx.wire, cx.wire_scale)
    return _with_indices(go, src, dst, (gs, gn))


def _dequantize(s: Dequantize, b: Bind) -> StepFn:
    src, _ = b.buffer(s.src, s.rows)
    dst, rows = b.buffer(s.dst, s.rows)
    cx = b.context
    go = cx.passes.bind_dequantize(rows, cx.width, cx.dtype, cx.device, cx.wire,
                                   cx.wire_scale)
    return lambda x, out, dv: go(src(x, out), dst(x, out))


def _dequantize_sum(s: DequantizeSum, b: Bind) -> StepFn:
    src, _ = b.buffer(s.src)
    dst, rows = b.buffer(s.dst, s.rows)
    cx = b.context
    go = cx.passes.bind_dequantize_sum(rows, s.parts, cx.width, cx.dtype, cx.device,
                                       cx.wire, cx.wire_scale)
    return lambda x, out, dv: go(src(x, out), dst(x, out))


def _chunks(pack: bool) -> Callable[[Pack | Unpack, Bind], StepFn]:
    def bind(s: Pack | Unpack, b: Bind) -> StepFn:
        src, src_rows = b.buffer(s.src)
        dst, rows = b.buffer(s.dst, s.rows)
        firsts, lens, block = b.table(s.firsts), b.table(s.lens), b.value(s.block)
        cx = b.context
        n = size_of(s.firsts)
        binder = cx.passes.bind_pack if pack else cx.passes.bind_unpack
        dtype, width = b.elem(s.dst.buf)
        go = binder(src_rows, rows, width, n, dtype, block, cx.device)
        return lambda x, out, dv: go(src(x, out), firsts(dv), lens(dv), dst(x, out))
    return bind


def _join_columns(s: JoinColumns, b: Bind) -> StepFn:
    src, _ = b.buffer(s.src)
    dst, rows = b.buffer(s.dst, s.rows)
    count, block = b.value(s.count), b.value(s.block)
    if count is DEVICE or block is DEVICE:
        raise DpxValueError("join_columns takes host sizes")
    parts, w = s.parts, b.context.width

    def go(x, out, dv):  # one strided copy: row j of part p to columns p of row j
        d = dst(x, out)
        d[:count].view(count, parts, w).copy_(
            src(x, out).view(parts, block, w)[:, :count].transpose(0, 1))
        if rows > count:
            d[count:rows].zero_()
    return go


def _split_columns(s: SplitColumns, b: Bind) -> StepFn:
    src, _ = b.buffer(s.src)
    dst, _ = b.buffer(s.dst)
    count, block = b.value(s.count), b.value(s.block)
    if count is DEVICE or block is DEVICE:
        raise DpxValueError("split_columns takes host sizes")
    parts, w = s.parts, b.context.width

    def go(x, out, dv):  # one strided copy: columns p of row j to row j of block p
        d = dst(x, out).view(parts, block, w)
        d[:, :count].copy_(src(x, out)[:count].view(count, parts, w).transpose(0, 1))
        if block > count:
            d[:, count:].zero_()
    return go


# ---------------------------------------------------------------- collectives
def _peer_blocks(peer: Any, s: AllToAll | AllGather | AllGatherCounts, b: Bind, src: Buffer,
                 dst: Buffer, *, all_to_all: bool, **reports: Any) -> StepFn:
    """A world all-to-all or all-gather of whole blocks on the peer transport."""
    dtype, width = b.elem(s.src.buf)
    return peer.blocks(src, dst, b.host(s.rows, "all_to_all" if all_to_all else "all_gather"),
                       width, dtype, all_to_all=all_to_all, **reports)


def _all_to_all(s: AllToAll, b: Bind) -> StepFn:
    src, _ = b.buffer(s.src)
    dst, _ = b.buffer(s.dst)
    peer = b.peer(s)
    if peer is not None:
        return _peer_blocks(peer, s, b, src, dst, all_to_all=True)
    go = b.context.runner.collective(C.bind_all_to_all, b.group(s.group))
    return lambda x, out, dv: go(dst(x, out), src(x, out))


def _all_to_all_v(s: AllToAllV, b: Bind) -> StepFn:
    src, _ = b.buffer(s.src)
    dst, _ = b.buffer(s.dst)
    lens, rows = b.value(s.lens), b.value(s.rows)
    if lens is DEVICE or rows is DEVICE:
        raise DpxValueError("all_to_all_v takes host sizes")
    ins, outs = list(lens), [rows] * len(lens)
    go = b.context.runner.collective(C.bind_all_to_all_v, b.group(s.group))
    return lambda x, out, dv: go(dst(x, out), src(x, out), outs, ins)


def _all_gather(s: AllGather, b: Bind) -> StepFn:
    src, _ = b.buffer(s.src, s.rows)
    dst, _ = b.buffer(s.dst)
    peer = b.peer(s)
    if peer is not None:
        return _peer_blocks(peer, s, b, src, dst, all_to_all=False)
    go = b.context.runner.collective(C.bind_all_gather, b.group(s.group))
    if src is _whole_in and dst is _whole_out:
        return lambda x, out, dv: go(out, x)
    return lambda x, out, dv: go(dst(x, out), src(x, out))


def _all_gather_counts(s: AllGatherCounts, b: Bind) -> StepFn:
    """The rows' all-gather and every rank's own count in one grouped launch where the
    backend coalesces (NCCL); then the counts the exchange picks (as
    ``DpComm.exchange_counts``) become the call's."""
    cx = b.context
    src = sources(b.variant.key.structure.layout, cx.runner.rank,
                  shards=b.variant.key.structure.sharded)
    peer = b.peer(s)
    if peer is not None:   # the reports travel in the blocks' headers
        def arrived(dv, every):
            dv.reports = every
            dv.set_counts(every[cx.tables.get(src, every.device)])
        return _peer_blocks(peer, s, b, b.buffer(s.src, s.rows)[0], b.buffer(s.dst)[0],
                            all_to_all=False, report=lambda dv: dv.ride_own,
                            reports=arrived)
    rows = _all_gather(s, b)
    go = cx.runner.collective(C.bind_all_gather, b.group(s.group))
    coalesced, group, world = cx.runner.coalesced, s.group, cx.parts

    def run(x, out, dv):
        own = dv.ride_own
        every = own.new_empty(world)
        with coalesced(group, own.device, collected=True):
            rows(x, out, dv)
            go(every, own)
        dv.reports = every
        dv.set_counts(every[cx.tables.get(src, own.device)])
    return run


def _reduce_scatter(s: ReduceScatter, b: Bind) -> StepFn:
    src, _ = b.buffer(s.src)
    dst, _ = b.buffer(s.dst, s.rows)
    go = b.context.runner.collective(C.bind_reduce_scatter, b.group(s.group))
    if src is _whole_in and dst is _whole_out:
        return lambda x, out, dv: go(out, x)
    return lambda x, out, dv: go(dst(x, out), src(x, out))


def _all_reduce(s: AllReduce, b: Bind) -> StepFn:
    buf, _ = b.buffer(s.buf, s.rows)
    go = b.context.runner.collective(C.bind_all_reduce, b.group(s.group))
    return lambda x, out, dv: go(buf(x, out))


def _per_root(bind_fn: Callable[[Any], Callable[[torch.Tensor, int], None]]
              ) -> Callable[[BroadcastV | ReduceV, Bind], StepFn]:
    def bind(s: BroadcastV | ReduceV, b: Bind) -> StepFn:
        buf, _ = b.buffer(s.buf)
        fn = b.context.runner.collective(bind_fn, b.group(s.group))
        roots = b.context.runner.groups.global_ranks
        firsts, lens = b.value(s.firsts), b.value(s.lens)
        if firsts is DEVICE or lens is DEVICE:
            raise DpxValueError("per-root collectives take host sizes")
        # every rank skips the same roots: the table is the same everywhere
        chunks = tuple((f, f + n, roots[r]) for r, (f, n) in enumerate(zip(firsts, lens)) if n)
        runner, g = b.context.runner, s.group

        def ungrouped(x, out, dv):
            t = buf(x, out)
            for lo, hi, root in chunks:
                fn(t[lo:hi], root)

        def run(x, out, dv):
            with runner.coalesced(g, buf(x, out).device):
                ungrouped(x, out, dv)
        run.ungrouped = ungrouped  # type: ignore[attr-defined]
        return run
    return bind


def _peer_of(s: Step, b: Bind) -> Any:
    peer = b.peer(s)
    if peer is None:
        raise DpxValueError(f"a {s.kind} step runs on the peer transport; this "
                            f"communicator has none (DpComm(..., transport='peer'))")
    return peer


def _all_gather_v(s: AllGatherV, b: Bind) -> StepFn:
    """The peer transport's variable all-gather (:meth:`dpx_torch.peer.PeerTransport.gather_v`)."""
    src, src_rows = b.buffer(s.src)
    dst, rows = b.buffer(s.dst, s.rows)
    dtype, width = b.elem(s.src.buf)
    return _peer_of(s, b).gather_v(src, src_rows, dst, rows, b.table(s.firsts),
                                   b.table(s.lens), b.host(s.block, "all_gather_v"), width,
                                   dtype)


def _reduce_scatter_v(s: ReduceScatterV, b: Bind) -> StepFn:
    """The peer transport's pull and sum (:meth:`dpx_torch.peer.PeerTransport.
    reduce_scatter_v`): native rows, or the quantized combine's wire rows."""
    src, src_rows = b.buffer(s.src)
    block = b.host(s.block, "reduce_scatter_v")
    dst, _ = b.buffer(s.dst, block)
    dtype, width = b.elem(s.src.buf)
    cx = b.context
    wire = cx.wire if s.src.buf in b.variant.wire_bufs else Wire.NATIVE
    return _peer_of(s, b).reduce_scatter_v(src, src_rows, dst, block, b.table(s.firsts),
                                           b.table(s.lens), width, dtype, cx.width, cx.dtype,
                                           wire, cx.wire_scale)


#: The torch frontend's binder of every step kind its schedules hold (the per-root and
#: peer transports: :func:`dpx.steps.kinds_for`).
BINDERS: dict[type[Step], Callable[[Any, Bind], StepFn]] = {
    CheckCounts: _check, Move: _move, Zero: _zero, Quantize: _quantize,
    Dequantize: _dequantize, DequantizeSum: _dequantize_sum, Pack: _chunks(True),
    Unpack: _chunks(False), AllGather: _all_gather, AllGatherCounts: _all_gather_counts,
    ReduceScatter: _reduce_scatter, AllReduce: _all_reduce,
    BroadcastV: _per_root(C.bind_broadcast), ReduceV: _per_root(C.bind_reduce),
    JoinColumns: _join_columns, SplitColumns: _split_columns, AllToAll: _all_to_all,
    AllToAllV: _all_to_all_v, AllGatherV: _all_gather_v, ReduceScatterV: _reduce_scatter_v,
}
