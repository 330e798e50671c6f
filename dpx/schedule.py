"""What every rank does: the ordered steps of one op, derived from a plan.

:func:`build_schedule` turns ``(plan, op, rank, ...)`` into a :class:`Schedule`: local passes
(:class:`Place`, :class:`Take`, :class:`ZeroFrom`, :class:`Copy`) and collectives
(:class:`AllGather`, :class:`ReduceScatter`, :class:`AllReduce`, and the variable-size
:class:`BroadcastV` / :class:`ReduceV` / :class:`AllGatherV` / :class:`ReduceScatterV`) over
named buffers, in the order the rank issues them. Every rank's schedule has the same
collectives in the same order with the same sizes (``Schedule.collective_signature``), so
no rank waits in a collective its peers skip. Row numbers come from :mod:`dpx.geometry`:
ints for host counts, :mod:`dpx.expr` expressions for device counts (capacity plans) or a
symbolic rank (one SPMD program for every rank).

Buffers: ``"in"`` (the caller's input), ``"out"`` (the result) and scratch buffers whose
static row counts the schedule lists (``Schedule.scratch``); every buffer has the input's
trailing shape and dtype. A :class:`Ref` names rows ``[first, first + rows)`` of a buffer.
No step writes ``"in"``: no op modifies its input.

The frontends interpret the steps; they hold no layout arithmetic. The cost model prices
the same steps (:mod:`dpx.cost`), and ``python -m dpx plan --rank R`` prints them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from typing import Any

from dpx import expr as X
from dpx.errors import DpxValueError
from dpx.geometry import Geometry, RankRef, concrete_rank, geometry, symbolic_rank
from dpx.modes import Group, Op, PaddingMode, Transport

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

    def values(self) -> tuple:
        """The row values of this step (ints or expressions), for evaluation."""
        return ()


def _v(value: Any) -> str:
    return X.render(value)


@dataclass(frozen=True, eq=False)
class Place(Step):
    """``dst[:rows] = 0; dst[start + j] = src[j]`` for ``j < count`` (one pass over dst)."""

    src: Ref
    dst: Ref
    rows: int
    start: Any
    count: Any
    kind = "place"

    def values(self) -> tuple:
        return (self.start, self.count)

    def __str__(self) -> str:
        return (f"place   {self.src}[0:{_v(self.count)}] -> {self.dst}[{self.rows} rows] at "
                f"row {_v(self.start)}, zeros elsewhere")


@dataclass(frozen=True, eq=False)
class Take(Step):
    """``dst[:rows] = 0; dst[j] = src[start + j]`` for ``j < count`` (one pass over dst)."""

    src: Ref
    dst: Ref
    rows: int
    start: Any
    count: Any
    kind = "take"

    def values(self) -> tuple:
        return (self.start, self.count)

    def __str__(self) -> str:
        return (f"take    {self.src}[{_v(self.start)} : +{_v(self.count)}] -> "
                f"{self.dst}[{self.rows} rows], zeros after")


@dataclass(frozen=True, eq=False)
class ZeroFrom(Step):
    """``buf[start:rows] = 0`` in place (the pad tail after a collective wrote a slot)."""

    buf: Ref
    rows: int
    start: Any
    kind = "zero"

    def values(self) -> tuple:
        return (self.start,)

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

    def values(self) -> tuple:
        return (self.firsts, self.lens)

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

    def collective_signature(self) -> tuple:
        """What every rank must agree on: each collective's kind, group and sizes."""
        sig = []
        for s in self.steps:
            if not s.collective:
                continue
            item: list = [s.kind, s.group, s.rows]
            if isinstance(s, _Variable):
                item += [X.render(s.firsts), X.render(s.lens), s.block]
            sig.append(tuple(item))
        return tuple(sig)

    def render(self) -> list[str]:
        """One line per step."""
        return [str(s) for s in self.steps]


class _Builder:
    def __init__(self, plan, op: Op, partial: bool, rank: RankRef, device_counts: bool,
                 transport: Transport, in_rows: int | None, out_rows: int) -> None:
        self.plan, self.op, self.partial, self.rank = plan, op, partial, rank
        self.device_counts, self.transport = device_counts, transport
        self.in_rows, self.out_rows = in_rows, out_rows
        self.geo: Geometry = geometry(plan, device_counts=device_counts)
        self.steps: list[Step] = []
        self.scratch: dict[str, int] = {}
        self.notes: list[str] = []

    def buffer(self, name: str, rows: int) -> Ref:
        if self.scratch.setdefault(name, rows) != rows:
            raise AssertionError(f"scratch {name} sized twice")
        return Ref(name)

    def add(self, step: Step) -> None:
        self.steps.append(step)

    def done(self) -> Schedule:
        return Schedule(self.plan, self.op, self.partial, self.rank, self.device_counts,
                        self.transport, self.in_rows, self.out_rows, tuple(self.steps),
                        tuple(self.scratch.items()), tuple(self.notes))

    # ------------------------------------------------------------ shared pieces
    def variable_route(self) -> str:
        """How a GATHERV plan moves its chunks on this transport: ``"per_root"``,
        ``"ragged"``, ``"equal"`` (every chunk is a full block: plain collectives) or
        ``"all_reduce"`` (no variable collective for these sizes: SUM_LEN's route, same
        result)."""
        g = self.geo
        firsts, lens = g.chunk_table()
        W = self.plan.layout.world_size
        if (X.is_const(lens) and all(x == g.block for x in lens)
                and W * g.block == g.global_rows):
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

    def host_is(self, value: Any, target: int) -> bool:
        return isinstance(value, int) and value == target

    def produce_chunk(self, dst: Ref | None, dst_rows: int) -> Ref:
        """This rank's chunk of its replica's slot (``B`` rows of which ``dst_rows`` are
        kept), written into ``dst`` (or a scratch ``"chunk"`` when ``dst`` is None, in
        which case a rows-exact view of the input may be returned without any pass)."""
        g, r = self.geo, self.rank
        tp, B = g.tp, g.block
        n_d = g.count(r.dp)
        if tp == 1:
            if dst is None and self.host_is(n_d, B) and self.in_rows == B:
                return Ref(IN)  # the input already is its zero-padded slot: no pass
            if dst is not None and dst_rows == 0:
                return dst
            dst = dst or self.buffer("chunk", B)
            self.add(Place(Ref(IN), dst, dst_rows, 0, n_d))
            return dst
        if self.partial:
            if self.host_is(n_d, tp * B) and self.in_rows == tp * B:
                padded = Ref(IN)
            else:
                padded = self.buffer("padded", tp * B)
                self.add(Place(Ref(IN), padded, tp * B, 0, n_d))
            if dst is not None and dst_rows == B:
                self.add(ReduceScatter(Group.ATTN_TP, padded, dst, B))
                return dst
            chunk = self.buffer("chunk", B)
            self.add(ReduceScatter(Group.ATTN_TP, padded, chunk, B))
            if dst is None:
                return chunk
            if dst_rows:
                self.add(Take(chunk, dst, dst_rows, 0, dst_rows))
            return dst
        # replicated: each attn-tp rank takes its own block from its own copy
        real, start = g.real_in_chunk(r.dp, r.tp), g.real_start(r.dp, r.tp)
        if dst is None and self.host_is(real, B) and isinstance(start, int):
            return Ref(IN, start, B)  # every row of the chunk is real: send it as is
        if dst is not None and dst_rows == 0:
            return dst
        dst = dst or self.buffer("chunk", B)
        self.add(Take(Ref(IN), dst, dst_rows, start, real))
        return dst

    def finish_slot(self, mine: Ref, mine_rows: int) -> None:
        """``out`` from this rank's reduced chunk ``mine``: the attn-tp all-gather of the
        chunks (tp > 1), then the real rows (rows past ``n_d`` zero)."""
        g, r, R = self.geo, self.rank, self.out_rows
        tp, B = g.tp, g.block
        n_d = g.count(r.dp)
        if tp > 1:
            if mine_rows != B:  # a per-root chunk view: pad it to a full block
                chunk = self.buffer("chunk", B)
                self.add(Take(mine, chunk, B, 0, mine_rows))
                mine = chunk
            if R == tp * B:
                self.add(AllGather(Group.ATTN_TP, mine, Ref(OUT), B))
                if not self.host_is(n_d, R):
                    self.add(ZeroFrom(Ref(OUT), R, n_d))
                return
            slot = self.buffer("slot", tp * B)
            self.add(AllGather(Group.ATTN_TP, mine, slot, B))
            mine = slot
        self.add(Take(mine, Ref(OUT), R, 0, n_d))

    # ------------------------------------------------------------ the ops
    def gather(self) -> None:
        g, r, plan = self.geo, self.rank, self.plan
        G = g.global_rows
        n_d = g.count(r.dp)
        mode = plan.mode
        route = self.variable_route() if mode is PaddingMode.GATHERV else None
        if mode is PaddingMode.SUM_LEN or route == "all_reduce":
            # partial: every attn-tp rank adds its share; replicated: attn-tp rank 0 writes
            written = n_d if self.partial else X.mul(n_d, X.eq(r.tp, 0))
            self.add(Place(Ref(IN), Ref(OUT), G, g.offset(r.dp), written))
            self.add(AllReduce(Group.WORLD, Ref(OUT), G))
            return
        if mode is PaddingMode.MAX_LEN or route == "equal":
            chunk = self.produce_chunk(None, g.block)
            self.add(AllGather(Group.WORLD, chunk, Ref(OUT), g.block))
            return
        firsts, lens = g.chunk_table()
        if route == "ragged":
            chunk = self.produce_chunk(None, g.block)
            self.add(AllGatherV(Group.WORLD, G, firsts, lens, g.block, chunk, Ref(OUT)))
            return
        # per-root broadcasts in place: this rank's chunk goes straight to its rows of out
        first, length = X.index(firsts, r.rank), X.index(lens, r.rank)
        self.produce_chunk(Ref(OUT, first, length), length)
        if g.end != G:
            self.add(ZeroFrom(Ref(OUT), G, g.end))
        self.add(BroadcastV(Group.WORLD, G, firsts, lens, g.block, Ref(OUT)))

    def reduce_scatter(self) -> None:
        g, r, plan = self.geo, self.rank, self.plan
        G, B, R = g.global_rows, g.block, self.out_rows
        n_d = g.count(r.dp)
        mode = plan.mode
        route = self.variable_route() if mode is PaddingMode.GATHERV else None
        if mode is PaddingMode.SUM_LEN or route == "all_reduce":
            staged = self.buffer("staged", G)
            self.add(Copy(Ref(IN), staged, G))
            self.add(AllReduce(Group.WORLD, staged, G))
            self.add(Take(staged, Ref(OUT), R, g.offset(r.dp), n_d))
            return
        if mode is PaddingMode.MAX_LEN or route == "equal":
            if g.tp == 1 and R == B:
                self.add(ReduceScatter(Group.WORLD, Ref(IN), Ref(OUT), B))
                if not self.host_is(n_d, B):
                    self.add(ZeroFrom(Ref(OUT), R, n_d))
                return
            chunk = self.buffer("chunk", B)
            self.add(ReduceScatter(Group.WORLD, Ref(IN), chunk, B))
            self.finish_slot(chunk, B)
            return
        firsts, lens = g.chunk_table()
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
        self.add(Take(Ref(IN), Ref(OUT), self.out_rows, g.offset(r.dp), g.count(r.dp)))

    def scatter_adjoint(self) -> None:
        g, r = self.geo, self.rank
        self.add(Place(Ref(IN), Ref(OUT), self.out_rows, g.offset(r.dp), g.count(r.dp)))


def default_out_rows(plan, op: Op, rank: int | None) -> int:
    """Rows of the op's output: the global buffer for gather (and scatter's adjoint); the
    replica's slot for scatter / reduce_scatter (``max_slot_rows`` for a symbolic rank)."""
    if op in (Op.GATHER, Op.SCATTER_ADJOINT):
        return plan.global_rows
    if rank is None:
        return plan.max_slot_rows
    return plan.slot_rows[plan.layout.coords(rank).attn_dp_rank]


def build_schedule(plan, op: Op | str, *, rank: int | None, partial: bool = True,
                   device_counts: bool = False, transport: Transport | str = Transport.PER_ROOT,
                   in_rows: int | None = None, out_rows: int | None = None,
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
    if out_rows is None:
        out_rows = default_out_rows(plan, op, rank)
    build = _cached if cached else _build
    return build(plan, op, rank, bool(partial), bool(device_counts), transport, in_rows,
                 out_rows)


def _build(plan, op: Op, rank: int | None, partial: bool, device_counts: bool,
           transport: Transport, in_rows: int | None, out_rows: int) -> Schedule:
    lay = plan.layout
    if lay.cp_size != 1:
        raise DpxValueError(f"schedules are defined for cp_size=1; layout has cp_size="
                            f"{lay.cp_size}")
    if device_counts and not plan.is_static:
        raise DpxValueError("counts= needs a capacity plan (plan_step(..., capacity=))")
    ref = symbolic_rank() if rank is None else concrete_rank(lay, rank)
    b = _Builder(plan, op, partial, ref, device_counts, transport, in_rows, out_rows)
    {Op.GATHER: b.gather, Op.REDUCE_SCATTER: b.reduce_scatter, Op.SCATTER: b.scatter,
     Op.SCATTER_ADJOINT: b.scatter_adjoint}[op]()
    return b.done()


_cached = functools.lru_cache(maxsize=8192)(_build)


def step_fields(step: Step) -> dict[str, Any]:
    """A step's fields by name (for printing and tests)."""
    return {f.name: getattr(step, f.name) for f in fields(step)}  # type: ignore[arg-type]
