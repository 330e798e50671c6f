"""The step kinds of a schedule: local passes over buffers and collectives.

Buffers: ``"in"`` (the caller's input), ``"out"`` (the result) and named scratch buffers,
each with the input's trailing shape and dtype except the quantized *wire* buffers a schedule
names (``wire_row_bytes(H)`` bytes a row, :mod:`dpx.wire`) and, for the LM-head scatter,
its *wide* buffers: rows of ``world_size`` times a narrow buffer's columns. Row numbers are ints or
:mod:`dpx.expr` values; ``rows`` of a pass and ``block`` of a chunk table are host-known.
Each interpreter (torch, JAX, the cost model, the test simulator) keeps a handler per kind
in :data:`STEP_KINDS`, and a test checks that none lacks one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, NamedTuple

from dpx import expr as X
from dpx.counts import CountRule
from dpx.modes import Group, Transport

__all__ = ["AllGather", "AllGatherCounts", "AllGatherV", "AllReduce", "AllToAll", "AllToAllV",
           "BroadcastV", "CheckCounts", "Dequantize", "DequantizeSum", "JoinColumns", "kinds_for",
           "SplitColumns", "Move", "moved_buffer", "Pack", "Quantize", "ReduceScatter",
           "ReduceScatterV", "ReduceV", "Ref", "Step", "STEP_KINDS", "Unpack", "VARIABLE_KINDS",
           "Zero"]

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


_v = X.render


class Step:
    """Base of every step (a value). ``collective``: every rank of the group issues it."""

    __slots__ = ()
    collective = False
    kind = "step"  # the class name in snake case (``AllGatherV``: ``all_gather_v``)
    text = ""  # how the step prints: a format of its fields (``n``: the chunk count)

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        cls.kind = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__.lstrip("_")).lower()

    def fields(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}  # type: ignore

    def alone(self) -> tuple[Step, ...]:
        """What the step does where its group is this rank alone, as local steps (none:
        it leaves its buffers as they are, as an in-place collective -- one on a ``buf``
        -- does); a local step, or a step no backend collective carries (the ragged and
        peer transports' variable steps), is itself."""
        return () if self.collective and hasattr(self, "buf") else (self,)

    def __str__(self) -> str:
        shown = {k: v.value if isinstance(v, Group) else v if isinstance(v, Ref) else _v(v)
                 for k, v in self.fields().items()}
        if "lens" in shown:
            shown["n"] = X.size_of(self.lens)  # type: ignore[attr-defined]
        return self.text.format(**shown)


# ---------------------------------------------------------------- local passes
@dataclass(eq=False, slots=True)
class CheckCounts(Step):
    """Device counts checked against the plan's :class:`~dpx.counts.CountRule` before any
    row moves; a violation is recorded (docs/semantics.md, "No row lost without a word")."""

    rule: CountRule

    def __str__(self) -> str:
        r = self.rule
        rules = ["counts >= 0"]
        if r.max_each is not None:
            rules.append(f"each <= {r.max_each}")
        if r.max_sum is not None:
            rules.append(f"sum(align(n, {r.align})) <= {r.max_sum}")
        return f"check   device counts: {', '.join(rules)} (flag a violation)"


@dataclass(eq=False, slots=True)
class _Pass(Step):
    """A local pass reading rows of ``src`` and writing rows of ``dst``."""

    src: Ref
    dst: Ref


@dataclass(eq=False, slots=True)
class Move(_Pass):
    """``dst[:rows] = 0`` except ``dst[dst_start + j] = src[src_start + j]``, ``j < count``
    (a *place* when ``src_start == 0``, a *take* when ``dst_start == 0``)."""

    rows: Any
    src_start: Any
    dst_start: Any
    count: Any

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
    """In place: rows of ``buf[:rows]`` outside ``[keep_start, +keep_count)`` become 0."""

    buf: Ref
    rows: Any
    keep_start: Any
    keep_count: Any

    def __str__(self) -> str:
        if _is0(self.keep_start):
            return f"zero    {self.buf}[{_v(self.keep_count)}:{_v(self.rows)}]"
        return (f"zero    {self.buf}[{_v(self.rows)} rows] except "
                f"[{_v(self.keep_start)} : +{_v(self.keep_count)}]")


@dataclass(eq=False, slots=True)
class Quantize(_Pass):
    """``dst[j] = wire(src[start + j])`` for ``j < count``, zero bytes to ``rows``."""

    rows: Any
    start: Any
    count: Any
    text = "quantize {src}[{start} : +{count}] -> {dst}[{rows} wire rows], zero rows after"


@dataclass(eq=False, slots=True)
class Dequantize(_Pass):
    """``dst[:rows] = dequantize(src[:rows])`` (zero wire rows give exact zeros)."""

    rows: Any
    text = "dequantize {src}[{rows} wire rows] -> {dst}"


@dataclass(eq=False, slots=True)
class DequantizeSum(_Pass):
    """``dst[j]`` for ``j < rows``: the float32 sum, over ``p = 0 .. parts-1`` in that order
    from +0.0, of ``dequantize(src[p*rows + j])``, rounded to ``dst``'s dtype (the
    quantized combine, docs/semantics.md "The quantized combine")."""

    rows: Any
    parts: int
    text = "dequantize_sum {src}[{parts} x {rows} wire rows] -> {dst}[{rows}], float32 in order"


@dataclass(eq=False, slots=True)
class _ChunkPass(_Pass):
    """One pass moving a chunk table's chunks between their rows and ``block``-row pieces."""

    rows: Any
    firsts: Any
    lens: Any
    block: Any


@dataclass(eq=False, slots=True)
class Unpack(_ChunkPass):
    """``dst[:rows] = 0`` except ``dst[firsts[r] + j] = src[r*block + j]``, ``j < lens[r]``."""

    text = "unpack  {src}[{n} x {block}] -> {dst}[{rows} rows], chunks firsts={firsts} lens={lens}"


@dataclass(eq=False, slots=True)
class Pack(_ChunkPass):
    """``dst[r*block + j] = src[firsts[r] + j]``, ``j < lens[r]``, zeros elsewhere."""

    text = "pack    {src} -> {dst}[{n} x {block}], chunks firsts={firsts} lens={lens}"


@dataclass(eq=False, slots=True)
class JoinColumns(_Pass):
    """``dst[:rows] = 0`` except row ``j < count`` of wide ``dst`` is ``src[p*block + j]``
    for ``p < parts`` side by side (``parts`` narrow blocks of ``src`` become columns)."""

    rows: Any
    count: Any
    block: Any
    parts: int
    text = "join    {src}[{parts} x {block}][:{count}] -> {dst}[{rows} rows] side by side"


@dataclass(eq=False, slots=True)
class SplitColumns(_Pass):
    """``dst[p*block + j]`` is the ``p``-th column part of wide ``src[j]`` for ``j <
    count``, zeros to ``block``: the adjoint of :class:`JoinColumns`."""

    count: Any
    block: Any
    parts: int
    text = "split   {src}[:{count}] -> {dst}[{parts} x {block}], column parts as blocks"


# ---------------------------------------------------------------- collectives
@dataclass(eq=False, slots=True)
class _Collective(Step):
    """A collective over ``group``: every rank of the group issues it."""

    group: Group
    collective = True


@dataclass(eq=False, slots=True)
class _Blocks(_Collective):
    """A collective of ``rows``-row blocks over ``group`` from ``src`` into ``dst``; alone,
    a copy of the block."""

    src: Ref
    dst: Ref
    rows: Any

    def alone(self) -> tuple[Step, ...]:
        return (Move(self.src, self.dst, self.rows, 0, 0, self.rows),)


@dataclass(eq=False, slots=True)
class AllGather(_Blocks):
    """``dst`` (``group_size * rows``): the group's ``src`` blocks in group-rank order."""

    text = "all_gather     {group}: {src}[{rows}] -> {dst}"


@dataclass(eq=False, slots=True)
class AllGatherCounts(AllGather):
    """:class:`AllGather`, and beside it every rank's own count (its replica's, or its CP
    shard's: the one device count the steps before it read) exchanged as
    ``exchange_counts`` exchanges them (:func:`dpx.counts.sources`): the step's counts from
    here on (docs/semantics.md, "Counts that ride the gather")."""

    text = "all_gather     {group}: {src}[{rows}] -> {dst}, with every rank's count"

    def alone(self) -> tuple[Step, ...]:
        return (self,)   # the frontend reads the count it carries


@dataclass(eq=False, slots=True)
class ReduceScatter(_Blocks):
    """``dst`` (``rows``): this rank's block of the group's sum of ``src``."""

    text = "reduce_scatter {group}: {src} -> {dst}[{rows}]"


@dataclass(eq=False, slots=True)
class AllReduce(_Collective):
    """In-place sum over ``group`` of ``buf`` (``rows``)."""

    buf: Ref
    rows: Any
    text = "all_reduce     {group}: {buf}[{rows}] in place"


@dataclass(eq=False, slots=True)
class AllToAll(_Blocks):
    """Equal all-to-all over ``group``: block ``k`` (``rows`` rows) of this rank's ``src``
    goes to the group's rank ``k``; block ``k`` of ``dst`` comes from rank ``k``."""

    text = "all_to_all     {group}: {src}[{rows} per rank] -> {dst}"


@dataclass(eq=False, slots=True)
class AllToAllV(_Collective):
    """Variable all-to-all over ``group``, host sizes: rows ``[lens[0] + ... + lens[k-1],
    +lens[k])`` of ``src`` go to the group's rank ``k``; ``dst`` receives ``rows`` rows
    from every rank in rank order (every rank sends rank ``k`` the same ``lens[k]``, and
    ``rows`` is this rank's)."""

    src: Ref
    dst: Ref
    lens: Any
    rows: Any
    text = "all_to_all_v   {group}: {src} -> {dst}[{n} x {rows}], lens={lens}"
    alone = _Blocks.alone   # alone, a copy of its rows


@dataclass(eq=False, slots=True)
class _Variable(_Collective):
    """Rank ``r``'s chunk: rows ``[firsts[r], +lens[r])`` of ``rows``; ``lens <= block``."""

    rows: Any
    firsts: Any
    lens: Any
    block: Any


@dataclass(eq=False, slots=True)
class BroadcastV(_Variable):
    """In place: every chunk broadcast from its owner (other rows left as they are)."""

    buf: Ref = Ref(OUT)
    text = "broadcast_v    {group}: {buf}[{rows}] per root, chunks firsts={firsts} lens={lens}"


@dataclass(eq=False, slots=True)
class ReduceV(_Variable):
    """In place: each owner's chunk receives the group's sum (other rows undefined)."""

    buf: Ref = Ref(OUT)
    text = "reduce_v       {group}: {buf}[{rows}] per root, chunks firsts={firsts} lens={lens}"


@dataclass(eq=False, slots=True)
class AllGatherV(_Variable):
    """``dst`` (``rows``): every rank's ``src[:lens[r]]`` at ``firsts[r]``, zeros elsewhere."""

    src: Ref = Ref(IN)
    dst: Ref = Ref(OUT)
    text = ("all_gather_v   {group}: {src}[{block}] -> {dst}[{rows}], chunks firsts={firsts} "
            "lens={lens}")


@dataclass(eq=False, slots=True)
class ReduceScatterV(_Variable):
    """``dst[j]`` (``j < block``): the group's sum of ``src[firsts[me] + j]`` below ``lens[me]``,
    else 0."""

    src: Ref = Ref(IN)
    dst: Ref = Ref(OUT)
    text = ("reduce_scatter_v {group}: {src}[{rows}] -> {dst}[{block}], chunks "
            "firsts={firsts} lens={lens}")


#: Every step kind, local passes first.
STEP_KINDS: tuple[type[Step], ...] = (
    CheckCounts, Move, Zero, Quantize, Dequantize, DequantizeSum, Pack, Unpack, JoinColumns,
    SplitColumns, AllGather, AllGatherCounts, ReduceScatter, AllReduce, AllToAll, BroadcastV,
    ReduceV, AllGatherV, ReduceScatterV, AllToAllV)

#: Collectives of variable sizes, each in the schedules of the transports that have it.
_TRANSPORT_VARIABLE = {Transport.PER_ROOT: (BroadcastV, ReduceV, AllToAllV),
                       Transport.RAGGED: (AllGatherV, ReduceScatterV), Transport.EQUAL: (),
                       Transport.PEER: (AllGatherV, ReduceScatterV)}
VARIABLE_KINDS = frozenset(k for kinds in _TRANSPORT_VARIABLE.values() for k in kinds)


def kinds_for(transport: Transport) -> frozenset[type[Step]]:
    """The step kinds a schedule for ``transport`` can hold."""
    return frozenset(STEP_KINDS) - VARIABLE_KINDS | set(_TRANSPORT_VARIABLE[transport])


def moved_buffer(step: Step) -> str:
    """The buffer a collective moves (its source, or its in-place buffer)."""
    ref = getattr(step, "src", None) or getattr(step, "buf")
    return ref.buf
