"""The step kinds a schedule is made of: local passes over buffers and collectives.

Buffers: ``"in"`` (the caller's input), ``"out"`` (the result) and scratch buffers whose
rows a schedule lists; every buffer has the input's trailing shape and dtype, except the
fp8 *wire* buffers a schedule names (:mod:`dpx.wire`: ``wire_row_bytes(H)`` bytes a row).
A :class:`Ref` names rows ``[first, first + rows)`` of a buffer. Row numbers are ints, or
:mod:`dpx.expr` values a frontend evaluates for the call (host-known ones on the host, the
rest on its arrays); ``rows`` of a pass and ``block`` of a chunk table are host-known.

:data:`STEP_KINDS` lists every kind; :func:`kinds_for` the kinds a transport's schedules
can hold. Each interpreter (torch, JAX, the cost model, the test simulator) keeps a
registry from kind to handler, and a test checks that none lacks one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from dpx import expr as X
from dpx.modes import Group, Transport
from dpx.plan import CountRule

__all__ = [
    "AllGather", "AllGatherV", "AllReduce", "BroadcastV", "CheckCounts", "Dequantize",
    "kinds_for", "len_of", "Move", "moved_buffer", "Pack", "Quantize", "ReduceScatter",
    "ReduceScatterV", "ReduceV", "Ref", "Step", "STEP_KINDS", "Unpack", "VARIABLE_KINDS",
    "Zero"
]

IN, OUT = "in", "out"


class Ref(NamedTuple):
    """Rows ``[first, first + rows)`` of buffer ``buf`` (``rows=None``: to the end)."""

    buf: str
    first: Any = 0
    rows: Any = None

    def __str__(self) -> str:
        if type(self.first) is int and self.first == 0 and self.rows is None:
            return self.buf
        end = "" if self.rows is None else _v(X.add(self.first, self.rows))
        return f"{self.buf}[{_v(self.first)}:{end}]"


def _v(value: Any) -> str:
    return X.render(value)


class Step:
    """Base of every step. ``collective``: every rank of the group issues it together.
    Steps are values: nothing changes one once it is made."""

    __slots__ = ()
    collective = False
    kind = "step"
    #: how the step prints: a format of its fields, rendered (``n``: the chunk count)
    text = ""

    def fields(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}  # type: ignore

    def __str__(self) -> str:
        shown = {k: v.value if isinstance(v, Group) else v if isinstance(v, Ref) else _v(v)
                 for k, v in self.fields().items()}
        if "lens" in shown:
            shown["n"] = len_of(self.lens)  # type: ignore[attr-defined]
        return self.text.format(**shown)


# ---------------------------------------------------------------- local passes
@dataclass(eq=False, slots=True)
class CheckCounts(Step):
    """Check a step's device counts against the plan's :class:`~dpx.plan.CountRule`
    before any row moves. A frontend records a violation (a sticky device flag in torch, a
    ``checkify`` check in JAX); the passes that follow stay inside their buffers whatever
    the counts (see docs/semantics.md, "Counts are checked")."""

    rule: CountRule
    kind = "check_counts"

    def __str__(self) -> str:
        r = self.rule
        rules = ["counts >= 0"]
        if r.max_each is not None:
            rules.append(f"each <= {r.max_each}")
        if r.max_sum is not None:
            rules.append(f"sum(align(n, {r.align})) <= {r.max_sum}")
        return f"check   device counts: {', '.join(rules)} (flag a violation)"


@dataclass(eq=False, slots=True)
class Move(Step):
    """``dst[:rows] = 0`` except ``dst[dst_start + j] = src[src_start + j]`` for ``j <
    count``: one pass over ``dst`` (a *place* when ``src_start == 0``, a *take* when
    ``dst_start == 0``, a *copy* when both are 0 and ``count == rows``)."""

    src: Ref
    dst: Ref
    rows: Any
    src_start: Any
    dst_start: Any
    count: Any
    kind = "move"

    def __str__(self) -> str:
        s0, d0 = self.src_start, self.dst_start
        if _is0(s0) and _is0(d0) and _same(self.count, self.rows):
            return f"copy    {self.src}[0:{_v(self.rows)}] -> {self.dst}[{_v(self.rows)} rows]"
        if _is0(s0):
            return (f"place   {self.src}[0:{_v(self.count)}] -> {self.dst}[{_v(self.rows)} "
                    f"rows] at row {_v(d0)}, zeros elsewhere")
        if _is0(d0):
            return (f"take    {self.src}[{_v(s0)} : +{_v(self.count)}] -> "
                    f"{self.dst}[{_v(self.rows)} rows], zeros after")
        return (f"move    {self.src}[{_v(s0)} : +{_v(self.count)}] -> {self.dst}"
                f"[{_v(self.rows)} rows] at row {_v(d0)}, zeros elsewhere")


def _is0(v: Any) -> bool:
    return type(v) is int and v == 0


def _same(a: Any, b: Any) -> bool:
    return a == b if type(a) is int and type(b) is int else a is b


@dataclass(eq=False, slots=True)
class Zero(Step):
    """In place: every row of ``buf[:rows]`` outside ``[keep_start, keep_start +
    keep_count)`` becomes 0 (a slot's pad tail after a collective wrote it, or the rows
    around a caller's own rows)."""

    buf: Ref
    rows: Any
    keep_start: Any
    keep_count: Any
    kind = "zero"

    def __str__(self) -> str:
        if _is0(self.keep_start):
            return f"zero    {self.buf}[{_v(self.keep_count)}:{_v(self.rows)}]"
        return (f"zero    {self.buf}[{_v(self.rows)} rows] except "
                f"[{_v(self.keep_start)} : +{_v(self.keep_count)}]")


@dataclass(eq=False, slots=True)
class Quantize(Step):
    """``dst[j] = fp8_wire(src[start + j])`` for ``j < count``; rows ``count..rows`` of
    ``dst`` are zero bytes (one pass: reads the rows once, writes payload and scales;
    ``dst`` is a wire buffer)."""

    src: Ref
    dst: Ref
    rows: Any
    start: Any
    count: Any
    kind = "quantize"

    text = "quantize {src}[{start} : +{count}] -> {dst}[{rows} fp8 rows], zero rows after"


@dataclass(eq=False, slots=True)
class Dequantize(Step):
    """``dst[:rows] = dequantize(src[:rows])``: fp8 wire rows back to the input's dtype
    (zero rows stay exact zeros)."""

    src: Ref
    dst: Ref
    rows: Any
    kind = "dequantize"

    text = "dequantize {src}[{rows} fp8 rows] -> {dst}"


@dataclass(eq=False, slots=True)
class _ChunkPass(Step):
    """A one-pass kernel over ``dst``'s ``rows`` moving the chunks of a chunk table between
    their rows and ``block``-row pieces."""

    src: Ref
    dst: Ref
    rows: Any
    firsts: Any
    lens: Any
    block: Any


@dataclass(eq=False, slots=True)
class Unpack(_ChunkPass):
    """``dst[:rows] = 0`` except ``dst[firsts[r] + j] = src[r*block + j]`` for ``j <
    lens[r]``: every rank's ``block``-row piece of an equal all-gather moved to its
    chunk's rows (one pass over dst)."""

    kind = "unpack"

    text = "unpack  {src}[{n} x {block}] -> {dst}[{rows} rows], chunks firsts={firsts} lens={lens}"


@dataclass(eq=False, slots=True)
class Pack(_ChunkPass):
    """``dst[r*block + j] = src[firsts[r] + j]`` for ``j < lens[r]``, zeros elsewhere:
    every rank's chunk moved to a ``block``-row piece of an equal reduce-scatter's input
    (one pass over dst; the adjoint of :class:`Unpack`)."""

    kind = "pack"

    text = "pack    {src} -> {dst}[{n} x {block}], chunks firsts={firsts} lens={lens}"


def len_of(v: Any) -> int:
    return len(v) if isinstance(v, tuple) else v.size


# ---------------------------------------------------------------- collectives
@dataclass(eq=False, slots=True)
class AllGather(Step):
    """Equal all-gather over ``group``: ``dst`` (``group_size * rows``) is the group's
    ``src`` blocks (``rows`` each) in group-rank order."""

    group: Group
    src: Ref
    dst: Ref
    rows: Any
    collective = True
    kind = "all_gather"

    text = "all_gather     {group}: {src}[{rows}] -> {dst}"


@dataclass(eq=False, slots=True)
class ReduceScatter(Step):
    """Equal reduce-scatter over ``group``: ``dst`` (``rows``) is this rank's block of the
    sum over the group of ``src`` (``group_size * rows``)."""

    group: Group
    src: Ref
    dst: Ref
    rows: Any
    collective = True
    kind = "reduce_scatter"

    text = "reduce_scatter {group}: {src} -> {dst}[{rows}]"


@dataclass(eq=False, slots=True)
class AllReduce(Step):
    """In-place sum over ``group`` of ``buf`` (``rows``)."""

    group: Group
    buf: Ref
    rows: Any
    collective = True
    kind = "all_reduce"

    text = "all_reduce     {group}: {buf}[{rows}] in place"


@dataclass(eq=False, slots=True)
class _Variable(Step):
    """Base of the variable-size collectives: rank ``r``'s chunk is rows ``[firsts[r],
    firsts[r] + lens[r])`` of the ``rows``-row global buffer; ``block`` is the chunk
    buffer size (every ``lens[r] <= block``)."""

    group: Group
    rows: Any
    firsts: Any
    lens: Any
    block: Any
    collective = True


@dataclass(eq=False, slots=True)
class BroadcastV(_Variable):
    """In place in ``buf``: every rank's chunk, already at its rows on its owner, is
    broadcast from that owner (grouped per-root broadcasts; host sizes). Rows outside the
    chunks are left as they are."""

    buf: Ref = Ref(OUT)
    kind = "broadcast_v"

    text = "broadcast_v    {group}: {buf}[{rows}] per root, chunks firsts={firsts} lens={lens}"


@dataclass(eq=False, slots=True)
class ReduceV(_Variable):
    """In place in ``buf``: each owner's chunk rows receive the sum over the group
    (grouped per-root reduces; host sizes). Other rows are left undefined."""

    buf: Ref = Ref(OUT)
    kind = "reduce_v"

    text = "reduce_v       {group}: {buf}[{rows}] per root, chunks firsts={firsts} lens={lens}"


@dataclass(eq=False, slots=True)
class AllGatherV(_Variable):
    """``dst`` (``rows``): every rank's ``src[:lens[r]]`` at ``firsts[r]``; rows outside the
    chunks are 0 (a ragged all-to-all; sizes may be device data)."""

    src: Ref = Ref(IN)
    dst: Ref = Ref(OUT)
    kind = "all_gather_v"

    text = ("all_gather_v   {group}: {src}[{block}] -> {dst}[{rows}], chunks firsts={firsts} "
            "lens={lens}")


@dataclass(eq=False, slots=True)
class ReduceScatterV(_Variable):
    """``dst`` (``block`` rows): row ``j < lens[me]`` is the sum over the group of
    ``src[firsts[me] + j]``; rows past ``lens[me]`` are 0 (a ragged all-to-all)."""

    src: Ref = Ref(IN)
    dst: Ref = Ref(OUT)
    kind = "reduce_scatter_v"

    text = ("reduce_scatter_v {group}: {src}[{rows}] -> {dst}[{block}], chunks "
            "firsts={firsts} lens={lens}")


#: Every step kind, local passes first.
STEP_KINDS: tuple[type[Step], ...] = (
    CheckCounts, Move, Zero, Quantize, Dequantize, Pack, Unpack,
    AllGather, ReduceScatter, AllReduce, BroadcastV, ReduceV, AllGatherV, ReduceScatterV)

VARIABLE_KINDS: tuple[type[Step], ...] = (BroadcastV, ReduceV, AllGatherV, ReduceScatterV)

_TRANSPORT_VARIABLE = {Transport.PER_ROOT: (BroadcastV, ReduceV),
                       Transport.RAGGED: (AllGatherV, ReduceScatterV),
                       Transport.EQUAL: ()}


def kinds_for(transport: Transport) -> frozenset[type[Step]]:
    """The step kinds a schedule for ``transport`` can hold: every fixed-size kind, and the
    transport's own variable-size collectives."""
    fixed = [k for k in STEP_KINDS if k not in VARIABLE_KINDS]
    return frozenset(fixed + list(_TRANSPORT_VARIABLE[transport]))


def moved_buffer(step: Step) -> str:
    """The buffer a collective moves (its source, or its in-place buffer)."""
    ref = getattr(step, "src", None) or getattr(step, "buf")
    return ref.buf
