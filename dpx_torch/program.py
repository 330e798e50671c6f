"""Runs a schedule variant (:class:`dpx.schedule.Variant`) on torch tensors.

A :class:`Program` is a variant compiled once: one *binder* per step (:data:`BINDERS`),
each turning a step into a function of one call's buffers. The planner says which rows
move where; a binder only maps its step onto a pass (:mod:`dpx_torch.passes`: the Triton
kernels on CUDA, torch ops on CPU, the custom ops under torch.compile) or a
``torch.distributed`` collective.

A :class:`PreparedCall` is the program bound to one call's *structure*: the variant's host
values (computed by its generated function from the plan's counts and the call's sizes),
the input's shape, dtype and device, the scratch buffers, each pass's launch (grid, tile,
compiled kernel) and each collective's process group -- everything decided once. Running
it is straight-line code: one bound function per step, ``f(x, out, dv)``. ``dv`` evaluates
the values that read device counts (:class:`DeviceValues`: int32 tensor ops, no host sync,
so a captured CUDA graph replays with new counts); it exists only for calls with device
counts.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Protocol

import torch
import torch.distributed as dist

from dpx import expr as X
from dpx import values as V
from dpx.batch import Stage, lockstep
from dpx.errors import DpxValueError
from dpx.modes import Group, Wire
from dpx.schedule import Variant
from dpx.counts import sources
from dpx.steps import (IN, OUT, AllGather, AllGatherCounts, AllGatherV, AllReduce, AllToAll,
                       AllToAllV, BroadcastV, CheckCounts, Dequantize, DequantizeSum,
                       JoinColumns, Move, Pack, Quantize, ReduceScatter, ReduceScatterV,
                       ReduceV, Ref, SplitColumns, Step, Unpack, Zero, len_of)
from dpx.wire import wire_row_bytes
from dpx_torch import collectives as C
from dpx_torch.passes import DEVICE, Passes

__all__ = [
    "BatchProgram", "BINDERS", "CallShape", "DeviceTables", "DeviceValues", "flat_counts",
    "FreshTables",
    "Host", "PreparedCall", "Program", "StepFn", "tables_for_call"
]


class Host(Protocol):
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

    def program(self, variant: Variant) -> "Program": ...

    def collective(self, bind: Callable[[Any], Any], group: Any) -> Any: ...

    def coalesced(self, group: Group, device: torch.device, *, collected: bool = False): ...


class DeviceTables:
    """Device int32 copies of host tuples (index vectors, chunk tables), per device: least
    recently used first out beyond ``max_entries``. A tuple that a captured graph reads
    must have been made before the capture (a warm-up call makes it)."""

    def __init__(self, *, max_entries: int = 512) -> None:
        self.max_entries = max_entries
        self._tables: OrderedDict[tuple, torch.Tensor] = OrderedDict()

    def get(self, values: tuple, device: torch.device) -> torch.Tensor:
        key = (values, device)
        t = self._tables.get(key)
        if t is None:
            t = self._tables[key] = torch.tensor(values, dtype=torch.int32, device=device)
            if len(self._tables) > self.max_entries:
                self._tables.popitem(last=False)
        else:
            self._tables.move_to_end(key)
        return t

    def __len__(self) -> int:
        return len(self._tables)

    def nbytes(self) -> int:
        return sum(t.numel() * 4 for t in self._tables.values()) + \
            sum(8 * len(k[0]) for k in self._tables)

    def clear(self) -> None:
        self._tables.clear()


class FreshTables:
    """:class:`DeviceTables` without a cache (what a call traced by torch.compile uses:
    the traced graph holds its constants)."""

    @staticmethod
    def get(values: tuple, device: torch.device) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)


def flat_counts(counts: torch.Tensor | None) -> torch.Tensor | None:
    """Device counts as the schedules read them: a shard table ``[dp, cp]`` row by row."""
    return counts.reshape(-1) if counts is not None and counts.dim() == 2 else counts


def tables_for_call(tables: DeviceTables) -> DeviceTables | FreshTables:
    return FreshTables() if torch.compiler.is_compiling() else tables


class DeviceValues(V.ArrayOps):
    """:class:`dpx.values.ArrayOps` on an int32 device counts tensor: vectors are 1-d int32
    tensors, scalars 1-element int32 tensors (what the row kernels read), int constants
    stay Python ints; constant vectors come from the communicator's :class:`DeviceTables`.
    One instance per call: common subexpressions are evaluated once."""

    __slots__ = ("_counts", "_tables", "_params", "memo", "ride_own", "reports")

    def __init__(self, counts: torch.Tensor, tables: DeviceTables | FreshTables,
                 params: tuple[int | None, int],
                 ride_own: torch.Tensor | None = None) -> None:
        self._counts, self._tables, self._params = counts, tables, params
        self.memo: dict = {}
        #: counts that ride the gather: this rank's own count (int32 ``[1]``), while
        #: ``counts`` holds only it (:class:`~dpx.steps.AllGatherCounts` replaces them),
        #: and every rank's report once they arrived
        self.ride_own = ride_own
        self.reports: torch.Tensor | None = None

    def set_counts(self, counts: torch.Tensor) -> None:
        """The call's counts from here on (what arrived with the collective)."""
        self._counts = counts
        self.memo.clear()

    def __call__(self, v: Any) -> Any:
        return V.evaluate(v, self, self.memo)

    def counts(self) -> torch.Tensor:
        return self._counts

    def coord(self, name: str) -> Any:
        raise DpxValueError(f"a torch schedule is built for a known rank; it has no {name!r} "
                            f"coordinate to evaluate")

    def param(self, name: str) -> int:
        return self._params[X.PARAMS.index(name)]

    def const(self, value: int | tuple) -> Any:
        if isinstance(value, int):
            return value
        return self._tables.get(value, self._counts.device)

    def eq(self, a: Any, b: Any) -> Any:
        return (a == b).to(torch.int32)

    def minimum(self, a: Any, b: Any) -> Any:
        if isinstance(a, int):
            a, b = b, a
        return a.clamp(max=b) if isinstance(b, int) else torch.minimum(a, b)

    def maximum(self, a: Any, b: Any) -> Any:
        if isinstance(a, int):
            a, b = b, a
        return a.clamp(min=b) if isinstance(b, int) else torch.maximum(a, b)

    def clip(self, a: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        return a.clamp(lo, hi)

    def cumsum_excl(self, v: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(v, 0, dtype=torch.int32) - v

    def group_sum(self, v: torch.Tensor, k: int) -> torch.Tensor:
        return v.reshape(-1, k).sum(1, dtype=torch.int32)

    def group_cumsum_excl(self, v: torch.Tensor, k: int) -> torch.Tensor:
        g = v.reshape(-1, k)
        return (torch.cumsum(g, 1, dtype=torch.int32) - g).reshape(-1)

    def gather(self, v: torch.Tensor, indices: tuple[int, ...]) -> torch.Tensor:
        return v[self.const(indices)]

    def index(self, v: torch.Tensor, i: Any) -> torch.Tensor:
        if not isinstance(i, int):
            raise DpxValueError("a torch schedule indexes with known ints")
        return v[i:i + 1]


#: ``fn(x, out, dv)``: one bound step of a prepared call.
StepFn = Callable[[torch.Tensor, torch.Tensor, Any], None]
#: ``get(x, out) -> tensor``: a buffer (or rows of one) of a call.
Buffer = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class CallShape:
    """What a class of prepared calls shares besides the host values and rows: the input's
    trailing shape, dtype and device, the wire (and nvfp4's global scale) and whether the
    output is a wire buffer, the passes of the device, the device tables and the
    communicator's runner."""

    __slots__ = ("rest", "width", "dtype", "device", "out_wire", "out_width", "passes",
                 "tables", "runner", "parts", "out_rest", "wire", "wire_scale", "wire_width")

    def __init__(self, x: torch.Tensor, out_wire: bool, passes: Passes, tables,
                 runner: Host, wide: frozenset = frozenset(), parts: int = 1,
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


class _Bind:
    """The values of one prepared call: host values of the variant resolved to ints, the
    rest marked :data:`~dpx_torch.passes.DEVICE` with a getter from the call's ``dv``."""

    __slots__ = ("variant", "hv", "shape", "in_rows", "out_rows", "scratch")

    def __init__(self, variant: Variant, hv: tuple, shape: CallShape, in_rows: int,
                 out_rows: int, scratch: dict[str, torch.Tensor]) -> None:
        self.variant, self.hv, self.shape = variant, hv, shape
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
            return torch.uint8, self.shape.wire_width
        sh = self.shape
        return sh.dtype, sh.width * (sh.parts if name in self.variant.wide_bufs else 1)

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
        t = self.shape.tables.get(tuple(h), self.shape.device)
        return lambda dv: t

    def group(self, g: Group) -> dist.ProcessGroup:
        return self.shape.runner.groups.process_group(g)

    def peer(self, s: Step) -> Any:
        """The communicator's peer transport, which carries world step ``s`` of a call on
        its workspace's device (None: the group's backend does)."""
        peer = self.shape.runner.peer
        if getattr(s, "group", None) is not Group.WORLD or peer is None \
                or peer.device != self.shape.device:
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


def _with_indices(go: Callable, a: Buffer, b: Buffer, getters: tuple) -> StepFn:
    """``go(a, b)`` or, when any index is device data, ``go(a, b, *indices)``."""
    if all(g is None for g in getters):
        return lambda x, out, dv: go(a(x, out), b(x, out))
    gs = tuple((lambda dv: None) if g is None else g for g in getters)
    return lambda x, out, dv: go(a(x, out), b(x, out), *(g(dv) for g in gs))


# ---------------------------------------------------------------- local passes
def _check(s: CheckCounts, b: _Bind) -> StepFn:
    flags, passes = b.shape.runner.flags, b.shape.passes
    return lambda x, out, dv: flags.check(dv.counts(), s.rule, passes)


def _move(s: Move, b: _Bind) -> StepFn:
    src, src_rows = b.buffer(s.src)
    dst, rows = b.buffer(s.dst, s.rows)
    (ss, gs), (ds, gd), (n, gn) = b.index(s.src_start), b.index(s.dst_start), b.index(s.count)
    sh = b.shape
    dtype, width = b.elem(s.dst.buf)
    go = sh.passes.bind_move(src_rows, rows, width, dtype, sh.device, ss, ds, n)
    return _with_indices(go, src, dst, (gs, gd, gn))


def _zero(s: Zero, b: _Bind) -> StepFn:
    buf, rows = b.buffer(s.buf, s.rows)
    (ks, gs), (kn, gn) = b.index(s.keep_start), b.index(s.keep_count)
    sh = b.shape
    dtype, width = b.elem(s.buf.buf)
    go = sh.passes.bind_zero(rows, width, dtype, sh.device, ks, kn)
    if gs is None and gn is None:
        return lambda x, out, dv: go(buf(x, out))
    gs = gs or (lambda dv: None)
    gn = gn or (lambda dv: None)
    return lambda x, out, dv: go(buf(x, out), gs(dv), gn(dv))


def _quantize(s: Quantize, b: _Bind) -> StepFn:
    src, src_rows = b.buffer(s.src)
    dst, rows = b.buffer(s.dst, s.rows)
    (st, gs), (n, gn) = b.index(s.start), b.index(s.count)
    sh = b.shape
    go = sh.passes.bind_quantize(src_rows, rows, sh.width, sh.dtype, sh.device, st, n,
                                 sh.wire, sh.wire_scale)
    return _with_indices(go, src, dst, (gs, gn))


def _dequantize(s: Dequantize, b: _Bind) -> StepFn:
    src, _ = b.buffer(s.src, s.rows)
    dst, rows = b.buffer(s.dst, s.rows)
    sh = b.shape
    go = sh.passes.bind_dequantize(rows, sh.width, sh.dtype, sh.device, sh.wire,
                                   sh.wire_scale)
    return lambda x, out, dv: go(src(x, out), dst(x, out))


def _dequantize_sum(s: DequantizeSum, b: _Bind) -> StepFn:
    src, _ = b.buffer(s.src)
    dst, rows = b.buffer(s.dst, s.rows)
    sh = b.shape
    go = sh.passes.bind_dequantize_sum(rows, s.parts, sh.width, sh.dtype, sh.device,
                                       sh.wire, sh.wire_scale)
    return lambda x, out, dv: go(src(x, out), dst(x, out))


def _chunks(pack: bool) -> Callable[[Pack | Unpack, _Bind], StepFn]:
    def bind(s: Pack | Unpack, b: _Bind) -> StepFn:
        src, src_rows = b.buffer(s.src)
        dst, rows = b.buffer(s.dst, s.rows)
        firsts, lens, block = b.table(s.firsts), b.table(s.lens), b.value(s.block)
        sh = b.shape
        n = len_of(s.firsts)
        binder = sh.passes.bind_pack if pack else sh.passes.bind_unpack
        dtype, width = b.elem(s.dst.buf)
        go = binder(src_rows, rows, width, n, dtype, block, sh.device)
        return lambda x, out, dv: go(src(x, out), firsts(dv), lens(dv), dst(x, out))
    return bind


def _join_columns(s: JoinColumns, b: _Bind) -> StepFn:
    src, _ = b.buffer(s.src)
    dst, rows = b.buffer(s.dst, s.rows)
    count, block = b.value(s.count), b.value(s.block)
    if count is DEVICE or block is DEVICE:
        raise DpxValueError("join_columns takes host sizes")
    parts, w = s.parts, b.shape.width

    def go(x, out, dv):  # one strided copy: row j of part p to columns p of row j
        d = dst(x, out)
        d[:count].view(count, parts, w).copy_(
            src(x, out).view(parts, block, w)[:, :count].transpose(0, 1))
        if rows > count:
            d[count:rows].zero_()
    return go


def _split_columns(s: SplitColumns, b: _Bind) -> StepFn:
    src, _ = b.buffer(s.src)
    dst, _ = b.buffer(s.dst)
    count, block = b.value(s.count), b.value(s.block)
    if count is DEVICE or block is DEVICE:
        raise DpxValueError("split_columns takes host sizes")
    parts, w = s.parts, b.shape.width

    def go(x, out, dv):  # one strided copy: columns p of row j to row j of block p
        d = dst(x, out).view(parts, block, w)
        d[:, :count].copy_(src(x, out)[:count].view(count, parts, w).transpose(0, 1))
        if block > count:
            d[:, count:].zero_()
    return go


# ---------------------------------------------------------------- collectives
def _all_to_all(s: AllToAll, b: _Bind) -> StepFn:
    src, _ = b.buffer(s.src)
    dst, _ = b.buffer(s.dst)
    peer = b.peer(s)
    if peer is not None:
        dtype, width = b.elem(s.src.buf)
        return peer.blocks(src, dst, b.host(s.rows, "all_to_all"), width, dtype,
                           all_to_all=True)
    go = b.shape.runner.collective(C.bind_all_to_all, b.group(s.group))
    return lambda x, out, dv: go(dst(x, out), src(x, out))


def _all_to_all_v(s: AllToAllV, b: _Bind) -> StepFn:
    src, _ = b.buffer(s.src)
    dst, _ = b.buffer(s.dst)
    lens, rows = b.value(s.lens), b.value(s.rows)
    if lens is DEVICE or rows is DEVICE:
        raise DpxValueError("all_to_all_v takes host sizes")
    ins, outs = list(lens), [rows] * len(lens)
    go = b.shape.runner.collective(C.bind_all_to_all_v, b.group(s.group))
    return lambda x, out, dv: go(dst(x, out), src(x, out), outs, ins)


def _all_gather(s: AllGather, b: _Bind) -> StepFn:
    src, _ = b.buffer(s.src, s.rows)
    dst, _ = b.buffer(s.dst)
    peer = b.peer(s)
    if peer is not None:
        dtype, width = b.elem(s.src.buf)
        return peer.blocks(src, dst, b.host(s.rows, "all_gather"), width, dtype,
                           all_to_all=False)
    go = b.shape.runner.collective(C.bind_all_gather, b.group(s.group))
    if src is _whole_in and dst is _whole_out:
        return lambda x, out, dv: go(out, x)
    return lambda x, out, dv: go(dst(x, out), src(x, out))


def _all_gather_counts(s: AllGatherCounts, b: _Bind) -> StepFn:
    """The rows' all-gather and every rank's own count in one grouped launch where the
    backend coalesces (NCCL); then the counts the exchange picks (as
    ``DpComm.exchange_counts``) become the call's."""
    sh = b.shape
    src = sources(b.variant.key.structure.layout, sh.runner.rank,
                  shards=b.variant.key.structure.sharded)
    peer = b.peer(s)
    if peer is not None:   # the reports travel in the blocks' headers
        def arrived(dv, every):
            dv.reports = every
            dv.set_counts(every[sh.tables.get(src, every.device)])
        rsrc, _ = b.buffer(s.src, s.rows)
        dst, _ = b.buffer(s.dst)
        dtype, width = b.elem(s.src.buf)
        return peer.blocks(rsrc, dst, b.host(s.rows, "all_gather"), width, dtype,
                           all_to_all=False, report=lambda dv: dv.ride_own,
                           reports=arrived)
    rows = _all_gather(s, b)
    go = sh.runner.collective(C.bind_all_gather, b.group(s.group))
    coalesced, group, world = sh.runner.coalesced, s.group, sh.parts

    def run(x, out, dv):
        own = dv.ride_own
        every = own.new_empty(world)
        with coalesced(group, own.device, collected=True):
            rows(x, out, dv)
            go(every, own)
        dv.reports = every
        dv.set_counts(every[sh.tables.get(src, own.device)])
    return run


def _reduce_scatter(s: ReduceScatter, b: _Bind) -> StepFn:
    src, _ = b.buffer(s.src)
    dst, _ = b.buffer(s.dst, s.rows)
    go = b.shape.runner.collective(C.bind_reduce_scatter, b.group(s.group))
    if src is _whole_in and dst is _whole_out:
        return lambda x, out, dv: go(out, x)
    return lambda x, out, dv: go(dst(x, out), src(x, out))


def _all_reduce(s: AllReduce, b: _Bind) -> StepFn:
    buf, _ = b.buffer(s.buf, s.rows)
    go = b.shape.runner.collective(C.bind_all_reduce, b.group(s.group))
    return lambda x, out, dv: go(buf(x, out))


def _per_root(fn_name: str, key: str) -> Callable[[BroadcastV | ReduceV, _Bind], StepFn]:
    def bind(s: BroadcastV | ReduceV, b: _Bind) -> StepFn:
        buf, _ = b.buffer(s.buf)
        group, fn = b.group(s.group), getattr(dist, fn_name)
        roots = b.shape.runner.groups.global_ranks
        firsts, lens = b.value(s.firsts), b.value(s.lens)
        if firsts is DEVICE or lens is DEVICE:
            raise DpxValueError("per-root collectives take host sizes")
        # every rank skips the same roots: the table is the same everywhere
        chunks = tuple((f, f + n, roots[r]) for r, (f, n) in enumerate(zip(firsts, lens)) if n)
        runner, g = b.shape.runner, s.group

        def ungrouped(x, out, dv):
            t = buf(x, out)
            for lo, hi, root in chunks:
                fn(t[lo:hi], **{key: root}, group=group)

        def run(x, out, dv):
            with runner.coalesced(g, buf(x, out).device):
                ungrouped(x, out, dv)
        run.ungrouped = ungrouped  # type: ignore[attr-defined]
        return run
    return bind


def _peer_of(s: Step, b: _Bind) -> Any:
    peer = b.peer(s)
    if peer is None:
        raise DpxValueError(f"a {s.kind} step runs on the peer transport; this "
                            f"communicator has none (DpComm(..., transport='peer'))")
    return peer


def _all_gather_v(s: AllGatherV, b: _Bind) -> StepFn:
    """The peer transport's variable all-gather (:meth:`dpx_torch.peer.PeerTransport.gather_v`)."""
    src, src_rows = b.buffer(s.src)
    dst, rows = b.buffer(s.dst, s.rows)
    dtype, width = b.elem(s.src.buf)
    return _peer_of(s, b).gather_v(src, src_rows, dst, rows, b.table(s.firsts),
                                   b.table(s.lens), b.host(s.block, "all_gather_v"), width,
                                   dtype)


def _reduce_scatter_v(s: ReduceScatterV, b: _Bind) -> StepFn:
    """The peer transport's pull and sum (:meth:`dpx_torch.peer.PeerTransport.
    reduce_scatter_v`): native rows, or the quantized combine's wire rows."""
    src, src_rows = b.buffer(s.src)
    block = b.host(s.block, "reduce_scatter_v")
    dst, _ = b.buffer(s.dst, block)
    dtype, width = b.elem(s.src.buf)
    sh = b.shape
    wire = sh.wire if s.src.buf in b.variant.wire_bufs else Wire.NATIVE
    return _peer_of(s, b).reduce_scatter_v(src, src_rows, dst, block, b.table(s.firsts),
                                           b.table(s.lens), width, dtype, sh.width, sh.dtype,
                                           wire, sh.wire_scale)


#: The torch frontend's binder of every step kind its schedules hold (the per-root and
#: peer transports: :func:`dpx.steps.kinds_for`).
BINDERS: dict[type[Step], Callable[[Any, _Bind], StepFn]] = {
    CheckCounts: _check, Move: _move, Zero: _zero, Quantize: _quantize,
    Dequantize: _dequantize, DequantizeSum: _dequantize_sum, Pack: _chunks(True),
    Unpack: _chunks(False), AllGather: _all_gather, AllGatherCounts: _all_gather_counts,
    ReduceScatter: _reduce_scatter, AllReduce: _all_reduce,
    BroadcastV: _per_root("broadcast", "src"), ReduceV: _per_root("reduce", "dst"),
    JoinColumns: _join_columns, SplitColumns: _split_columns, AllToAll: _all_to_all,
    AllToAllV: _all_to_all_v, AllGatherV: _all_gather_v, ReduceScatterV: _reduce_scatter_v,
}


class Program:
    """A variant compiled once (see the module docstring): its binders and scratch."""

    __slots__ = ("variant", "binders", "scratch")

    def __init__(self, variant: Variant) -> None:
        self.variant = variant
        binders = []
        for step in variant.steps:
            binder = BINDERS.get(type(step))
            if binder is None:
                raise DpxValueError(f"dpx_torch cannot run a {step.kind} step (its schedules "
                                    f"use the per_root and peer transports)")
            binders.append(binder)
        self.binders = tuple(binders)
        self.scratch = tuple((name, rows, name in variant.wire_bufs)
                             for name, rows in variant.scratch)

    def prepare(self, hv: tuple, params: tuple[int | None, int], shape: CallShape,
                scratch_key: str, need: int, exact: bool) -> "PreparedCall":
        return PreparedCall(self, hv, params, shape, scratch_key, need, exact)


class PreparedCall:
    """One call's structure, decided once (see the module docstring): ``run(x, out,
    counts)`` runs its bound steps. ``need`` / ``exact``: the input rows it takes (at
    least, or exactly); ``out_rows``: the output's rows."""

    __slots__ = ("program", "values", "params", "shape", "scratch_key", "need", "exact",
                 "out_rows", "steps", "scratch", "_pool_keys")

    def __init__(self, program: Program, hv: tuple, params: tuple[int | None, int],
                 shape: CallShape, scratch_key: str, need: int, exact: bool) -> None:
        self.program, self.values, self.params, self.shape = program, hv, params, shape
        self.scratch_key, self.need, self.exact = scratch_key, need, exact
        self.out_rows = params[1]
        self._bind()

    @property
    def variant(self) -> Variant:
        return self.program.variant

    @property
    def out_wire(self) -> bool:
        return self.shape.out_wire

    def _bind(self) -> None:
        sh, prog = self.shape, self.program
        scratch: dict[str, torch.Tensor] = {}
        keys = []
        if prog.scratch:
            pool = sh.runner.pool
            hv = self.values
            for name, rows, wire in prog.scratch:
                n = rows if type(rows) is int else hv[prog.variant.host_index[id(rows)]]
                key = (name, self.scratch_key)
                if wire:
                    scratch[name] = pool.get(key, (n, sh.wire_width), torch.uint8, sh.device)
                    keys.append((key, torch.uint8))
                else:
                    scratch[name] = pool.get(key, sh.buffer_shape(
                        n, name in prog.variant.wide_bufs), sh.dtype, sh.device)
                    keys.append((key, sh.dtype))
        self.scratch = scratch
        # a traced call is bound afresh every time: nothing to refresh
        self._pool_keys = tuple(keys) if keys and not torch.compiler.is_compiling() else ()
        b = _Bind(prog.variant, self.values, sh, self.params[0], self.params[1], scratch)
        self.steps = tuple(binder(step, b) for binder, step in
                           zip(prog.binders, prog.variant.steps))

    @property
    def by_step(self) -> dict:
        """Each step's bound function, by step (what a batch runs in lockstep)."""
        return dict(zip(self.program.variant.steps, self.steps))

    def refresh(self) -> None:
        """Rebind when the pool has replaced a scratch buffer since (it grew for another
        call), and mark the scratch as read by a CUDA graph while one is being captured
        (:class:`~dpx_torch.pool.BufferPool`)."""
        sh = self.shape
        pool = sh.runner.pool
        if not all(pool.holds(key, dtype, sh.device, self.scratch[name])
                   for (key, dtype), (name, _, _) in zip(self._pool_keys,
                                                         self.program.scratch)):
            self._bind()
        if sh.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            for key, dtype in self._pool_keys:
                pool.capture(key, dtype, sh.device)

    def new_out(self, x: torch.Tensor) -> torch.Tensor:
        """A new output for the input ``x``: wire rows (uint8) or rows of ``x``'s dtype."""
        if self.shape.out_wire:
            return x.new_empty((self.out_rows, self.shape.out_width), dtype=torch.uint8)
        return x.new_empty((self.out_rows, *self.shape.out_rest))

    def device_values(self, counts: torch.Tensor | None) -> DeviceValues | None:
        if counts is None:
            return None
        return DeviceValues(counts, self.shape.tables, self.params)

    def run(self, x: torch.Tensor, out: torch.Tensor,
            counts: torch.Tensor | None) -> torch.Tensor:
        """Every step, in order."""
        if self._pool_keys:
            self.refresh()
        dv = None if counts is None else DeviceValues(counts, self.shape.tables, self.params)
        for step in self.steps:
            step(x, out, dv)
        return out

    def run_riding(self, x: torch.Tensor, out: torch.Tensor, own: torch.Tensor,
                   n_local: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every step of a schedule whose counts ride its gather: ``own`` holds only this
        rank's count ``n_local``; returns the counts that arrived and every rank's
        report."""
        if self._pool_keys:
            self.refresh()
        dv = DeviceValues(own, self.shape.tables, self.params, n_local)
        for step in self.steps:
            step(x, out, dv)
        return dv.counts(), dv.reports


_COLLECTED = (AllGather, ReduceScatter, AllReduce)
#: Kinds torch collects into one ``*_coalesced`` call only when every tensor has one dtype
#: (``allreduce_coalesced`` refuses mixed ones; all-gathers of mixed dtypes are fine).
_ONE_DTYPE = (AllReduce, ReduceScatter)


def _by_dtype(items: list, dtypes: list) -> list[list]:
    """``items`` split by dtype, in first-seen order (one coalesced launch per dtype)."""
    parts: dict = {}
    for item, dtype in zip(items, dtypes):
        parts.setdefault(dtype, []).append(item)
    return list(parts.values())


class BatchProgram:
    """Several prepared calls run in lockstep (:func:`dpx.batch.lockstep`): each stage's
    local passes, then each batch of collectives as one grouped launch (NCCL
    coalescing)."""

    __slots__ = ("stages", "_runner")

    def __init__(self, runner: Host, variants: tuple[Variant, ...]) -> None:
        self._runner = runner
        self.stages: tuple[Stage, ...] = lockstep(variants)

    def __call__(self, preps: list[PreparedCall], calls: list[tuple]) -> tuple:
        """``calls``: per prepared call ``(inp, out, counts)``."""
        args = []
        for p, (x, out, counts) in zip(preps, calls):
            if p._pool_keys:
                p.refresh()
            args.append((x, out, p.device_values(counts)))
        by_step = [p.by_step for p in preps]
        device = calls[0][0].device
        for stage in self.stages:
            for i, step in stage.local:
                by_step[i][step](*args[i])
            for batch in stage.batches:
                items = [(by_step[i][step], args[i]) for i, step in batch.items]
                if len(items) == 1:
                    fn, a = items[0]
                    fn(*a)
                    continue
                if getattr(items[0][0], "peer", False):   # world steps in shared memory:
                    for fn, a in items:                       # no backend to coalesce them
                        fn(*a)
                    continue
                first = batch.items[0][1]
                collected = isinstance(first, _COLLECTED)
                for part in (_by_dtype(items, [calls[i][0].dtype for i, _ in batch.items])
                             if isinstance(first, _ONE_DTYPE) else (items,)):
                    if len(part) == 1:
                        part[0][0](*part[0][1])
                        continue
                    with self._runner.coalesced(first.group, device, collected=collected):
                        for fn, a in part:
                            getattr(fn, "ungrouped", fn)(*a)
        return tuple(call[1] for call in calls)
