"""What every rank does: the ordered steps of one op, derived from a plan.

:func:`build_schedule` turns ``(plan, op, rank, ...)`` into a :class:`Schedule`: local passes
(:class:`Place`, :class:`Take`, :class:`ZeroFrom`, :class:`Copy`, :class:`Pack`,
:class:`Unpack`) and collectives
(:class:`AllGather`, :class:`ReduceScatter`, :class:`AllReduce`, and the variable-size
:class:`BroadcastV` / :class:`ReduceV` / :class:`AllGatherV` / :class:`ReduceScatterV`) over
named buffers, in the order the rank issues them. Every rank's schedule has the same
collectives in the same order with the same sizes (``Schedule.collective_signature``), so
no rank waits in a collective its peers skip. Row numbers come from :mod:`dpx.geometry`:
ints for host counts, :mod:`dpx.expr` expressions for device counts (capacity plans) or a
symbolic rank (one SPMD program for every rank).

Buffers: ``"in"`` (the caller's input), ``"out"`` (the result) and scratch buffers whose
static row counts the schedule lists (``Schedule.scratch``); every buffer has the input's
trailing shape and dtype, except those ``Schedule.wire_bufs`` names, whose rows are fp8
wire rows (:mod:`dpx.wire`: ``wire_row_bytes(H)`` bytes each): an fp8 gather
(``wire="fp8"``) quantizes its chunk into one (:class:`Quantize`), moves bytes, and
dequantizes the gathered rows (:class:`Dequantize`) unless the caller keeps them. A :class:`Ref` names rows ``[first, first + rows)`` of a buffer.
No step writes ``"in"``: no op modifies its input.

The frontends interpret the steps; they hold no layout arithmetic. The cost model prices
the same steps (:mod:`dpx.cost`), and ``python -m dpx plan --rank R`` prints them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from dpx import expr as X
from dpx.errors import DpxValueError
from dpx.geometry import Geometry, RankRef, concrete_rank, geometry, symbolic_rank
from dpx.modes import Group, Op, PaddingMode, Transport, Wire

IN, OUT = "in", "out"


@dataclass(frozen=True)
class Ref:
    """Rows ``[first, first + rows)`` of buffer ``buf`` (``rows=None``: from ``first`` to
    the end). ``first`` is a static int."""

    buf: str
    first: int = 0
    rows: int | None = None

    def __str__(self) -> str:
        if self.first == 0 and self.rows is None:
            return self.buf
        end = "" if self.rows is None else self.first + self.rows
        return f"{self.buf}[{self.first}:{end}]"


class Step:
    """Base of every step. ``collective`` is True for steps every rank must issue together."""

    collective = False
    kind = "step"


def _v(value: Any) -> str:
    return X.render(value)


@dataclass(frozen=True, eq=False)
class _RowPass(Step):
    """A one-pass kernel over ``dst``'s ``rows`` moving ``count`` rows at ``start``."""

    src: Ref
    dst: Ref
    rows: int
    start: Any
    count: Any



@dataclass(frozen=True, eq=False)
class Place(_RowPass):
    """``dst[:rows] = 0; dst[start + j] = src[j]`` for ``j < count`` (one pass over dst)."""

    kind = "place"

    def __str__(self) -> str:
        return (f"place   {self.src}[0:{_v(self.count)}] -> {self.dst}[{self.rows} rows] at "
                f"row {_v(self.start)}, zeros elsewhere")


@dataclass(frozen=True, eq=False)
class Take(_RowPass):
    """``dst[:rows] = 0; dst[j] = src[start + j]`` for ``j < count`` (one pass over dst)."""

    kind = "take"

    def __str__(self) -> str:
        return (f"take    {self.src}[{_v(self.start)} : +{_v(self.count)}] -> "
                f"{self.dst}[{self.rows} rows], zeros after")


@dataclass(frozen=True, eq=False)
class Quantize(_RowPass):
    """``dst[j] = fp8_wire(src[start + j])`` for ``j < count``; rows ``count..rows`` of
    ``dst`` are zero bytes (one pass: reads the rows once, writes payload and scales;
    ``dst`` is a wire buffer)."""

    kind = "quantize"

    def __str__(self) -> str:
        return (f"quantize {self.src}[{_v(self.start)} : +{_v(self.count)}] -> "
                f"{self.dst}[{self.rows} fp8 rows], zero rows after")


@dataclass(frozen=True, eq=False)
class Dequantize(Step):
    """``dst[:rows] = dequantize(src[:rows])``: fp8 wire rows back to the input's dtype
    (zero rows stay exact zeros)."""

    src: Ref
    dst: Ref
    rows: int
    kind = "dequantize"

    def __str__(self) -> str:
        return f"dequantize {self.src}[{self.rows} fp8 rows] -> {self.dst}"


@dataclass(frozen=True, eq=False)
class ZeroFrom(Step):
    """``buf[start:rows] = 0`` in place (the pad tail after a collective wrote a slot)."""

    buf: Ref
    rows: int
    start: Any
    kind = "zero"


    def __str__(self) -> str:
        return f"zero    {self.buf}[{_v(self.start)}:{self.rows}]"


@dataclass(frozen=True, eq=False)
class Copy(Step):
    """``dst[:rows] = src[:rows]``: a staging copy before an in-place collective, so the
    input is never modified."""

    src: Ref
    dst: Ref
    rows: int
    kind = "copy"

    def __str__(self) -> str:
        return f"copy    {self.src} -> {self.dst}[{self.rows} rows]"


@dataclass(frozen=True, eq=False)
class _ChunkPass(Step):
    """A one-pass kernel over ``dst``'s ``rows`` moving the chunks of a chunk table between
    their rows and ``block``-row pieces."""

    src: Ref
    dst: Ref
    rows: int
    firsts: Any
    lens: Any
    block: int



@dataclass(frozen=True, eq=False)
class Unpack(_ChunkPass):
    """``dst[:rows] = 0; dst[firsts[r] + j] = src[r*block + j]`` for ``j < lens[r]``: every
    rank's ``block``-row piece of an equal all-gather moved to its chunk's rows (one pass
    over dst)."""

    kind = "unpack"

    def __str__(self) -> str:
        return (f"unpack  {self.src}[{len_of(self.lens)} x {self.block}] -> {self.dst}"
                f"[{self.rows} rows], chunks firsts={_v(self.firsts)} lens={_v(self.lens)}")


@dataclass(frozen=True, eq=False)
class Pack(_ChunkPass):
    """``dst[r*block + j] = src[firsts[r] + j]`` for ``j < lens[r]``, zeros elsewhere:
    every rank's chunk moved to a ``block``-row piece of an equal reduce-scatter's input
    (one pass over dst; the adjoint of :class:`Unpack`)."""

    kind = "pack"

    def __str__(self) -> str:
        return (f"pack    {self.src} -> {self.dst}[{len_of(self.lens)} x {self.block}], "
                f"chunks firsts={_v(self.firsts)} lens={_v(self.lens)}")


def len_of(v: Any) -> int:
    return len(v) if isinstance(v, tuple) else v.size


@dataclass(frozen=True, eq=False)
class AllGather(Step):
    """Equal all-gather over ``group``: ``dst`` (``group_size * rows``) is the group's
    ``src`` blocks (``rows`` each) in group-rank order."""

    group: Group
    src: Ref
    dst: Ref
    rows: int
    collective = True
    kind = "all_gather"

    def __str__(self) -> str:
        return f"all_gather     {self.group.value}: {self.src}[{self.rows}] -> {self.dst}"


@dataclass(frozen=True, eq=False)
class ReduceScatter(Step):
    """Equal reduce-scatter over ``group``: ``dst`` (``rows``) is this rank's block of the
    sum over the group of ``src`` (``group_size * rows``)."""

    group: Group
    src: Ref
    dst: Ref
    rows: int
    collective = True
    kind = "reduce_scatter"

    def __str__(self) -> str:
        return f"reduce_scatter {self.group.value}: {self.src} -> {self.dst}[{self.rows}]"


@dataclass(frozen=True, eq=False)
class AllReduce(Step):
    """In-place sum over ``group`` of ``buf`` (``rows``)."""

    group: Group
    buf: Ref
    rows: int
    collective = True
    kind = "all_reduce"

    def __str__(self) -> str:
        return f"all_reduce     {self.group.value}: {self.buf}[{self.rows}] in place"


@dataclass(frozen=True, eq=False)
class _Variable(Step):
    """Base of the variable-size collectives: rank ``r``'s chunk is rows ``[firsts[r],
    firsts[r] + lens[r])`` of the ``rows``-row global buffer; ``block`` is the static
    chunk buffer size (every ``lens[r] <= block``)."""

    group: Group
    rows: int
    firsts: Any
    lens: Any
    block: int
    collective = True


    def _table(self) -> str:
        return f"chunks firsts={_v(self.firsts)} lens={_v(self.lens)}"


@dataclass(frozen=True, eq=False)
class BroadcastV(_Variable):
    """In place in ``buf``: every rank's chunk, already at its rows on its owner, is
    broadcast from that owner (grouped per-root broadcasts; host sizes). Rows outside the
    chunks are left as they are."""

    buf: Ref = Ref(OUT)
    kind = "broadcast_v"

    def __str__(self) -> str:
        return (f"broadcast_v    {self.group.value}: {self.buf}[{self.rows}] per root, "
                f"{self._table()}")


@dataclass(frozen=True, eq=False)
class ReduceV(_Variable):
    """In place in ``buf``: each owner's chunk rows receive the sum over the group
    (grouped per-root reduces; host sizes). Other rows are left undefined."""

    buf: Ref = Ref(OUT)
    kind = "reduce_v"

    def __str__(self) -> str:
        return (f"reduce_v       {self.group.value}: {self.buf}[{self.rows}] per root, "
                f"{self._table()}")


@dataclass(frozen=True, eq=False)
class AllGatherV(_Variable):
    """``dst`` (``rows``): every rank's ``src[:lens[r]]`` at ``firsts[r]``; rows outside the
    chunks are 0 (a ragged all-to-all; sizes may be device data)."""

    src: Ref = Ref(IN)
    dst: Ref = Ref(OUT)
    kind = "all_gather_v"

    def __str__(self) -> str:
        return (f"all_gather_v   {self.group.value}: {self.src}[{self.block}] -> "
                f"{self.dst}[{self.rows}], {self._table()}")


@dataclass(frozen=True, eq=False)
class ReduceScatterV(_Variable):
    """``dst`` (``block`` rows): row ``j < lens[me]`` is the sum over the group of
    ``src[firsts[me] + j]``; rows past ``lens[me]`` are 0 (a ragged all-to-all)."""

    src: Ref = Ref(IN)
    dst: Ref = Ref(OUT)
    kind = "reduce_scatter_v"

    def __str__(self) -> str:
        return (f"reduce_scatter_v {self.group.value}: {self.src}[{self.rows}] -> "
                f"{self.dst}[{self.block}], {self._table()}")


@dataclass(frozen=True, eq=False)
class Schedule:
    """The steps one rank runs for one op (see the module docstring)."""

    plan: Any
    op: Op
    partial: bool
    rank: RankRef
    device_counts: bool
    transport: Transport
    in_rows: int | None
    out_rows: int
    steps: tuple[Step, ...]
    scratch: tuple[tuple[str, int], ...]
    notes: tuple[str, ...]
    wire: Wire = Wire.NATIVE
    wire_bufs: frozenset = frozenset()

    def collective_signature(self) -> tuple:
        """What every rank must agree on: each collective's kind, group and sizes."""
        sig = []
        for s in self.steps:
            if not s.collective:
                continue
            item: list = [s.kind, s.group, s.rows, self.is_wire(_moved(s))]
            if isinstance(s, _Variable):
                item += [X.render(s.firsts), X.render(s.lens), s.block]
            sig.append(tuple(item))
        return tuple(sig)

    def is_wire(self, buf: str) -> bool:
        """Whether buffer ``buf`` holds fp8 wire rows (else the input's dtype)."""
        return buf in self.wire_bufs


def _moved(step: Step) -> str:
    """The buffer a collective moves (its source, or its in-place buffer)."""
    ref = getattr(step, "src", None) or getattr(step, "buf")
    return ref.buf


class _Builder:
    def __init__(self, plan, op: Op, partial: bool, rank: RankRef, device_counts: bool,
                 transport: Transport, in_rows: int | None, out_rows: int,
                 wire: Wire = Wire.NATIVE, dequantize: bool = True) -> None:
        self.plan, self.op, self.partial, self.rank = plan, op, partial, rank
        self.wire, self.dequantize = wire, dequantize
        self.wire_bufs: set[str] = set()
        self.device_counts, self.transport = device_counts, transport
        self.in_rows, self.out_rows = in_rows, out_rows
        self.geo: Geometry = geometry(plan, device_counts=device_counts)
        # gather_sum over CP copies: every rank of a replica adds its rows
        self.sum_replica = (op is Op.GATHER_SUM and plan.layout.cp_size > 1
                            and plan.cp_shards is None)
        if op is Op.GATHER_SUM:
            self.partial = True
        self.steps: list[Step] = []
        self.scratch: dict[str, int] = {}
        self.notes: list[str] = []

    def buffer(self, name: str, rows: int, *, wire: bool = False) -> Ref:
        if self.scratch.setdefault(name, rows) != rows:
            raise AssertionError(f"scratch {name} sized twice")
        if wire:
            self.wire_bufs.add(name)
        return Ref(name)

    def add(self, step: Step) -> None:
        self.steps.append(step)

    def done(self) -> Schedule:
        return Schedule(self.plan, self.op, self.partial, self.rank, self.device_counts,
                        self.transport, self.in_rows, self.out_rows, tuple(self.steps),
                        tuple(self.scratch.items()), tuple(self.notes), self.wire,
                        frozenset(self.wire_bufs))

    # ------------------------------------------------------------ shared pieces
    def host_is(self, value: Any, target: int) -> bool:
        return isinstance(value, int) and value == target

    def copy_rows(self, src: Ref, dst: Ref, rows: int, start: Any, count: Any) -> None:
        """``dst[:count] = src[start:start + count]``, zeros after (a place when the
        rows start at 0, else a take: the same pass)."""
        if self.host_is(start, 0):
            self.add(Place(src, dst, rows, 0, count))
        else:
            self.add(Take(src, dst, rows, start, count))

    def equal_chunks(self, firsts: Any, lens: Any) -> bool:
        """Every rank's chunk is a full block at ``rank * block``: plain collectives move
        them (no variable sizes, no unpacking)."""
        g, W = self.geo, self.plan.layout.world_size
        return (X.is_const(lens) and X.is_const(firsts) and W * g.block == g.global_rows
                and all(x == g.block for x in lens)
                and all(f == r * g.block for r, f in enumerate(firsts)))

    def variable_route(self, firsts: Any, lens: Any) -> str:
        """How a GATHERV plan moves its chunks on this transport: ``"equal"`` (every chunk
        a full block in place: plain collectives), ``"per_root"``, ``"ragged"``, or
        ``"all_reduce"`` (no variable collective for these sizes: SUM_LEN's route, same
        result)."""
        if self.equal_chunks(firsts, lens):
            return "equal"
        if self.transport is Transport.RAGGED:
            return "ragged"
        if (self.transport is Transport.PER_ROOT and X.is_const(lens)
                and not self.rank.is_symbolic):
            return "per_root"
        if self.transport is Transport.EQUAL:
            why = "the transport has only equal-size collectives"
        elif self.rank.is_symbolic:
            why = "per-root collectives need a known rank"
        else:
            why = "per-root collectives need host sizes and the counts are device data"
        self.notes.append(f"GATHERV runs as SUM_LEN's place + all_reduce ({why}); same "
                          f"result, more bytes")
        return "all_reduce"

    def produce_chunk(self, dst: Ref | None, dst_rows: int) -> Ref:
        """This rank's chunk (``B`` rows, ``dst_rows`` of them kept) written into ``dst``, or
        into a scratch ``"chunk"`` when ``dst`` is None -- or, when every row of the chunk
        is a real row of the input, that view of the input itself (no pass)."""
        g, r = self.geo, self.rank
        tp, B = g.tp, g.block
        if self.partial and (tp > 1 or self.sum_replica):
            # the attn-tp group (replica, for gather_sum) sums its span of rows; each rank
            # keeps its block
            if self.sum_replica:
                group, k, start, count = Group.REPLICA, g.cp * tp, 0, g.count(r.dp)
            else:
                group, k = Group.ATTN_TP, tp
                start, count = g.group_span(r.dp, r.cp)
            if (self.host_is(start, 0) and self.host_is(count, k * B)
                    and self.in_rows == k * B):
                padded = Ref(IN)
            else:
                padded = self.buffer("padded", k * B)
                self.copy_rows(Ref(IN), padded, k * B, start, count)
            if dst is not None and dst_rows == B:
                self.add(ReduceScatter(group, padded, dst, B))
                return dst
            chunk = self.buffer("chunk", B)
            self.add(ReduceScatter(group, padded, chunk, B))
            if dst is None:
                return chunk
            if dst_rows:
                self.add(Take(chunk, dst, dst_rows, 0, dst_rows))
            return dst
        # otherwise each rank takes its own block from its own copy
        start, real = g.own_block(r.dp, r.cp, r.tp)
        if dst is None and self.host_is(real, B) and isinstance(start, int):
            return Ref(IN) if start == 0 and self.in_rows == B else Ref(IN, start, B)
        if dst is not None and dst_rows == 0:
            return dst
        dst = dst or self.buffer("chunk", B)
        self.copy_rows(Ref(IN), dst, dst_rows, start, real)
        return dst

    def finish_slot(self, mine: Ref, mine_rows: int) -> None:
        """``out`` from this rank's reduced chunk ``mine``: the chunks of the ranks that
        share the rank's rows (its replica, or its CP rank's attn-tp group for a shard)
        all-gathered, then the real rows (rows past them zero)."""
        g, r, R = self.geo, self.rank, self.out_rows
        B = g.block
        group, size = ((Group.ATTN_TP, g.tp) if g.sharded
                       else (Group.REPLICA, self.plan.layout.replica_size))
        held = g.held(r.dp, r.cp)
        if size > 1:
            if mine_rows != B:  # a per-root chunk view: pad it to a full block
                chunk = self.buffer("chunk", B)
                self.add(Take(mine, chunk, B, 0, mine_rows))
                mine = chunk
            if R == size * B:
                self.add(AllGather(group, mine, Ref(OUT), B))
                if not self.host_is(held, R):
                    self.add(ZeroFrom(Ref(OUT), R, held))
                return
            slot = self.buffer("slot", size * B)
            self.add(AllGather(group, mine, slot, B))
            mine = slot
        self.add(Take(mine, Ref(OUT), R, 0, held))

    def slot_start(self) -> Any:
        """First global row of this rank's rows (its shard's, or its replica's slot)."""
        g, r = self.geo, self.rank
        return X.add(g.offset(r.dp), g.held_start(r.dp, r.cp))

    # ------------------------------------------------------------ the ops
    def gather(self) -> None:
        if self.wire is Wire.FP8:
            self.gather_fp8()
            return
        g, r, plan = self.geo, self.rank, self.plan
        G, B = g.global_rows, g.block
        mode = plan.mode
        firsts, lens = g.chunk_table()
        route = self.variable_route(firsts, lens) if mode is PaddingMode.GATHERV else None
        if mode is PaddingMode.SUM_LEN or route == "all_reduce":
            # one rank of each group of identical copies writes; partial sums all write
            writes = 1 if self.partial else X.eq(r.tp, 0)
            if not g.sharded and not self.sum_replica:
                writes = X.mul(writes, X.eq(r.cp, 0))
            self.add(Place(Ref(IN), Ref(OUT), G, self.slot_start(),
                           X.mul(g.held(r.dp, r.cp), writes)))
            self.add(AllReduce(Group.WORLD, Ref(OUT), G))
            return
        if route == "equal" or (mode is PaddingMode.MAX_LEN and not g.sharded):
            chunk = self.produce_chunk(None, B)
            self.add(AllGather(Group.WORLD, chunk, Ref(OUT), B))
            return
        if mode is PaddingMode.MAX_LEN:  # shards: equal pieces, then each to its rows
            chunk = self.produce_chunk(None, B)
            W = plan.layout.world_size
            gathered = self.buffer("gathered", W * B)
            self.add(AllGather(Group.WORLD, chunk, gathered, B))
            self.add(Unpack(gathered, Ref(OUT), G, firsts, lens, B))
            return
        if route == "ragged":
            chunk = self.produce_chunk(None, B)
            self.add(AllGatherV(Group.WORLD, G, firsts, lens, B, chunk, Ref(OUT)))
            return
        # per-root broadcasts in place: this rank's chunk goes straight to its rows of out
        first, length = X.index(firsts, r.rank), X.index(lens, r.rank)
        ends = [f + n for f, n in zip(firsts, lens)]
        contiguous = all(f == (ends[i - 1] if i else 0) for i, f in enumerate(firsts))
        if not contiguous:  # rows between chunks (a slot's pad past its shards) are zero
            self.add(ZeroFrom(Ref(OUT), G, 0))
        self.produce_chunk(Ref(OUT, first, length), length)
        if contiguous and ends[-1] != G:  # rows past the last chunk are zero
            self.add(ZeroFrom(Ref(OUT), G, ends[-1]))
        self.add(BroadcastV(Group.WORLD, G, firsts, lens, B, Ref(OUT)))

    def quantized_chunk(self, dst: Ref | None, dst_rows: int) -> Ref:
        """This rank's chunk as fp8 wire rows in ``dst`` (a scratch ``"wire_chunk"`` when
        None): partial inputs are first summed over the attn-tp group in their dtype."""
        g, r = self.geo, self.rank
        start, real = g.own_block(r.dp, r.cp, r.tp)
        src = Ref(IN)
        if self.partial and g.tp > 1:
            src, start = self.produce_chunk(None, g.block), 0
        if dst is None:
            dst = self.buffer("wire_chunk", g.block, wire=True)
        self.add(Quantize(src, dst, dst_rows, start, real))
        return dst

    def gather_fp8(self) -> None:
        """MAX_LEN / GATHERV with fp8 rows on the world collective: each rank quantizes
        its chunk (one pass), the bytes move as in the native schedule, and the gathered
        rows are dequantized into ``out`` (or ``out`` keeps the wire rows)."""
        g, r, plan = self.geo, self.rank, self.plan
        G, B, W = g.global_rows, g.block, plan.layout.world_size
        if plan.mode is PaddingMode.SUM_LEN:
            raise DpxValueError("wire='fp8' needs a copy mode (max_len or gatherv): sum_len "
                                "adds the slots in an all-reduce, and a sum cannot run on fp8")
        if self.op is not Op.GATHER:
            raise DpxValueError(f"wire='fp8' applies to gather, not {self.op.value}")
        firsts, lens = g.chunk_table()
        if self.dequantize:
            wout = self.buffer("wire_out", G, wire=True)
        else:
            wout = Ref(OUT)
            self.wire_bufs.add(OUT)
        if plan.mode is PaddingMode.MAX_LEN and not g.sharded or self.equal_chunks(firsts,
                                                                                     lens):
            route = "equal"
        elif plan.mode is PaddingMode.MAX_LEN:
            route = "unpack"
        elif self.transport is Transport.RAGGED:
            route = "ragged"
        elif (self.transport is Transport.PER_ROOT and X.is_const(lens)
              and not self.rank.is_symbolic):
            route = "per_root"
        else:
            route = "unpack"
            self.notes.append("GATHERV fp8 moves every rank's block in an equal all-gather, "
                              "then unpacks the chunks (no variable-size collective here)")
        if route == "equal":
            self.add(AllGather(Group.WORLD, self.quantized_chunk(None, B), wout, B))
        elif route == "unpack":
            chunk = self.quantized_chunk(None, B)
            gathered = self.buffer("wire_gathered", W * B, wire=True)
            self.add(AllGather(Group.WORLD, chunk, gathered, B))
            self.add(Unpack(gathered, wout, G, firsts, lens, B))
        elif route == "ragged":
            chunk = self.quantized_chunk(None, B)
            self.add(AllGatherV(Group.WORLD, G, firsts, lens, B, chunk, wout))
        else:
            first, length = X.index(firsts, r.rank), X.index(lens, r.rank)
            self.add(ZeroFrom(wout, G, 0))
            self.quantized_chunk(Ref(wout.buf, first, length), length)
            self.add(BroadcastV(Group.WORLD, G, firsts, lens, B, wout))
        if self.dequantize:
            self.add(Dequantize(wout, Ref(OUT), G))

    def reduce_scatter(self) -> None:
        g, r, plan = self.geo, self.rank, self.plan
        G, B, R = g.global_rows, g.block, self.out_rows
        mode = plan.mode
        firsts, lens = g.chunk_table()
        route = self.variable_route(firsts, lens) if mode is PaddingMode.GATHERV else None
        if mode is PaddingMode.SUM_LEN or route == "all_reduce":
            staged = self.buffer("staged", G)
            self.add(Copy(Ref(IN), staged, G))
            self.add(AllReduce(Group.WORLD, staged, G))
            self.add(Take(staged, Ref(OUT), R, self.slot_start(), g.held(r.dp, r.cp)))
            return
        if route == "equal" or (mode is PaddingMode.MAX_LEN and not g.sharded):
            held = g.held(r.dp, r.cp)
            if self.plan.layout.replica_size == 1 and R == B:
                self.add(ReduceScatter(Group.WORLD, Ref(IN), Ref(OUT), B))
                if not self.host_is(held, B):
                    self.add(ZeroFrom(Ref(OUT), R, held))
                return
            chunk = self.buffer("chunk", B)
            self.add(ReduceScatter(Group.WORLD, Ref(IN), chunk, B))
            self.finish_slot(chunk, B)
            return
        if mode is PaddingMode.MAX_LEN:  # shards: each chunk to an equal piece first
            W = plan.layout.world_size
            packed = self.buffer("packed", W * B)
            self.add(Pack(Ref(IN), packed, W * B, firsts, lens, B))
            chunk = self.buffer("chunk", B)
            self.add(ReduceScatter(Group.WORLD, packed, chunk, B))
            self.finish_slot(chunk, B)
            return
        if route == "ragged":
            chunk = self.buffer("chunk", B)
            self.add(ReduceScatterV(Group.WORLD, G, firsts, lens, B, Ref(IN), chunk))
            self.finish_slot(chunk, B)
            return
        staged = self.buffer("staged", G)
        self.add(Copy(Ref(IN), staged, G))  # per-root reduces work in place
        self.add(ReduceV(Group.WORLD, G, firsts, lens, B, staged))
        first, length = X.index(firsts, r.rank), X.index(lens, r.rank)
        self.finish_slot(Ref("staged", first, length), length)

    def scatter(self) -> None:
        g, r = self.geo, self.rank
        self.add(Take(Ref(IN), Ref(OUT), self.out_rows, self.slot_start(),
                      g.held(r.dp, r.cp)))

    def scatter_adjoint(self) -> None:
        g, r = self.geo, self.rank
        self.add(Place(Ref(IN), Ref(OUT), self.out_rows, self.slot_start(),
                       g.held(r.dp, r.cp)))


def default_out_rows(plan, op: Op, rank: int | None) -> int:
    """Rows of the op's output: the global buffer for gather (and scatter's adjoint); the
    replica's slot for scatter / reduce_scatter (``max_slot_rows`` for a symbolic rank)."""
    if op in (Op.GATHER, Op.GATHER_SUM, Op.SCATTER_ADJOINT):
        return plan.global_rows
    if rank is None:
        return plan.max_slot_rows
    return plan.slot_rows[plan.layout.coords(rank).attn_dp_rank]


def build_schedule(plan, op: Op | str, *, rank: int | None, partial: bool = True,
                   device_counts: bool = False, transport: Transport | str = Transport.PER_ROOT,
                   in_rows: int | None = None, out_rows: int | None = None,
                   wire: Wire | str = Wire.NATIVE, dequantize: bool = True,
                   cached: bool = True) -> Schedule:
    """The schedule of ``op`` on ``rank`` (``None``: one symbolic program for every rank).

    ``partial`` applies to gather. ``device_counts`` (capacity plans only): the counts are
    a device int32 vector. ``transport`` names what the frontend's collectives can do.
    ``in_rows`` (the input's rows, when known) lets a rank whose input already is its
    chunk send it without a pass. ``out_rows`` defaults to :func:`default_out_rows`.
    Cached per arguments (plans are hashable); ``cached=False`` builds afresh (what a
    tracer such as torch.compile should call: the build is pure Python on ints).
    """
    op = Op.parse(op)
    transport = Transport.parse(transport)
    wire = Wire.parse(wire)
    if out_rows is None:
        out_rows = default_out_rows(plan, op, rank)
    build = _cached if cached else _build
    return build(plan, op, rank, bool(partial), bool(device_counts), transport, in_rows,
                 out_rows, wire, bool(dequantize) or wire is Wire.NATIVE)


def _build(plan, op: Op, rank: int | None, partial: bool, device_counts: bool,
           transport: Transport, in_rows: int | None, out_rows: int,
           wire: Wire = Wire.NATIVE, dequantize: bool = True) -> Schedule:
    lay = plan.layout
    if device_counts and not plan.is_static:
        raise DpxValueError("counts= needs a capacity plan (plan_step(..., capacity=))")
    ref = symbolic_rank() if rank is None else concrete_rank(lay, rank)
    b = _Builder(plan, op, partial, ref, device_counts, transport, in_rows, out_rows, wire,
                 dequantize)
    {Op.GATHER: b.gather, Op.GATHER_SUM: b.gather, Op.REDUCE_SCATTER: b.reduce_scatter,
     Op.SCATTER: b.scatter, Op.SCATTER_ADJOINT: b.scatter_adjoint}[op]()
    return b.done()


_cached = functools.lru_cache(maxsize=8192)(_build)
