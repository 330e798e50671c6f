"""Schedules priced step by step with a :class:`~dpx.cost_model.CostModel`: each step's
:class:`~dpx.cost_model.StepCost` (:func:`price`; a handler per step kind, :data:`PRICERS`),
the bytes the peer transport moves (:func:`peer_bytes`), and an op's and a mode's estimate:
its collectives (the same on every rank) plus its slowest rank's local bytes
(:func:`estimate_op`, :func:`estimate`); :mod:`dpx.pricing` computes the same in closed
form (tested equal). :func:`compare_modes`: every candidate mode's estimate for a step's
counts (the cost policy's prices with CP ranks, and :func:`dpx.explain`'s table).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

from dpx import expr as X
from dpx import values as V
from dpx.cost_model import CostModel, StepCost
from dpx.errors import DpxValueError, check_int
from dpx.extents import op_rows
from dpx.layout import DpLayout
from dpx.modes import Group, Op, PaddingMode, Transport
from dpx.plan import DpPlan, check_counts, check_plan, check_shards, make_plan
from dpx.schedule import Schedule, ScheduleCache, build_schedule
from dpx.steps import (AllGather, AllGatherCounts, AllGatherV, AllReduce, AllToAll,
                       AllToAllV, BroadcastV, CheckCounts, Dequantize, DequantizeSum, JoinColumns,
                       Move, Pack, Quantize, ReduceScatter, ReduceScatterV, ReduceV,
                       SplitColumns, Step, Unpack, Zero, moved_buffer)

__all__ = ["ALL_MODES", "compare_modes", "estimate", "estimate_op", "group_size", "mode_estimates",
           "ModeEstimate", "op_estimate", "OpEstimate", "peer_bytes", "price", "PRICERS"]


def group_size(layout: Any, group: Group) -> int:
    return {Group.WORLD: layout.world_size, Group.ATTN_TP: layout.attn_tp_size,
            Group.REPLICA: layout.replica_size}[group]


class _Pricing(NamedTuple):
    """One schedule's pricing context: its expressions' values, row bytes per buffer."""

    schedule: Schedule
    row_bytes: int
    wire_row_bytes: int
    model: CostModel
    ops: V.HostOps

    def val(self, v: Any) -> Any:
        return v if type(v) is int else V.evaluate(v, self.ops)

    def rb(self, buf: str) -> int:
        """Bytes of a row of ``buf`` (``row_bytes``: a narrow row of the input's dtype)."""
        if self.schedule.is_wire(buf):
            return self.wire_row_bytes
        return self.row_bytes * (self.schedule.plan.layout.world_size
                                 if self.schedule.is_wide(buf) else 1)

    def collective(self, s: Any, rows: Any, buf: str, factor: int, lens: Any = None) -> StepCost:
        """``s`` over its group: ``rows`` per rank (``factor`` 1: all-gather and
        reduce-scatter; 2: all-reduce of ``rows``), or the rows of its chunks ``lens``."""
        g = group_size(self.schedule.plan.layout, s.group)
        rb = self.rb(buf)
        # the peer transport carries the world steps itself, the groups' backend the rest
        peer = self.schedule.transport is Transport.PEER and s.group is Group.WORLD
        if lens is not None:
            lens = self.val(lens)
            return self.model.collective(s, sum(lens) * rb, g, (g - 1) / g,
                                         roots=sum(1 for x in lens if x > 0), peer=peer)
        size = self.val(rows) * rb * (g if factor == 1 else 1)
        return self.model.collective(s, size, g, factor * (g - 1) / g, peer=peer)

    def local(self, s: Any, rows: Any, buf: str) -> StepCost:
        return self.model.local_pass(s, self.val(rows) * self.rb(buf))


def _pricing(schedule: Schedule, row_bytes: int, wire_row_bytes: int | None,
             model: CostModel, counts: tuple[int, ...] | None) -> _Pricing:
    """The context pricing ``schedule`` for ``counts`` (default: the plan's); quantized
    wire buffers count ``wire_row_bytes`` a row (default ``row_bytes``)."""
    c = schedule.plan.leaf_counts if counts is None else tuple(counts)
    r = schedule.rank  # a symbolic rank priced at rank 0's coordinates
    known = (0, 0, 0, 0) if r.is_symbolic else (r.rank, r.dp, r.cp, r.tp)
    coords = dict(zip((X.Coord.RANK, X.Coord.DP, X.Coord.CP, X.Coord.TP), known))
    return _Pricing(schedule, row_bytes, row_bytes if wire_row_bytes is None else wire_row_bytes,
                    model, V.HostOps(c, coords))


def _zero(s: Zero, p: _Pricing) -> StepCost:
    rows, first, n = p.val(s.rows), p.val(s.keep_start), max(p.val(s.keep_count), 0)
    return p.local(s, rows - max(min(first + n, rows) - max(first, 0), 0), s.buf.buf)


#: The cost model's handler of every step kind.
PRICERS: dict[type[Step], Callable[[Any, _Pricing], StepCost]] = {
    CheckCounts: lambda s, p: p.model.local_pass(s, 0),
    Move: lambda s, p: p.local(s, p.val(s.rows) + max(p.val(s.count), 0), s.dst.buf),
    Zero: _zero,
    Quantize: lambda s, p: p.model.local_pass(
        s, max(p.val(s.count), 0) * p.row_bytes + p.val(s.rows) * p.wire_row_bytes),
    Dequantize: lambda s, p: p.model.local_pass(
        s, p.val(s.rows) * (p.wire_row_bytes + p.row_bytes)),
    DequantizeSum: lambda s, p: p.model.local_pass(
        s, p.val(s.rows) * (s.parts * p.wire_row_bytes + p.row_bytes)),
    Pack: lambda s, p: p.local(s, p.val(s.rows) + sum(p.val(s.lens)), s.dst.buf),
    Unpack: lambda s, p: p.local(s, p.val(s.rows) + sum(p.val(s.lens)), s.dst.buf),
    # collectives of rows-row blocks (AllGatherCounts: its counts add 4 bytes a rank to the
    # same launch), then variable ones: the rows of their chunks ``lens``
    **dict.fromkeys((AllGather, AllGatherCounts, ReduceScatter, AllToAll),
                    lambda s, p: p.collective(s, s.rows, moved_buffer(s), 1)),
    AllReduce: lambda s, p: p.collective(s, s.rows, s.buf.buf, 2),
    **dict.fromkeys((AllToAllV, BroadcastV, ReduceV, AllGatherV, ReduceScatterV),
                    lambda s, p: p.collective(s, None, moved_buffer(s), 1, s.lens)),
    JoinColumns: lambda s, p: p.model.local_pass(
        s, (p.val(s.count) * s.parts + p.val(s.rows) * s.parts) * p.row_bytes),
    SplitColumns: lambda s, p: p.model.local_pass(
        s, (p.val(s.count) + p.val(s.block)) * s.parts * p.row_bytes),
}


def price(schedule: Schedule, *, row_bytes: int, cost_model: CostModel,
          counts: tuple[int, ...] | None = None,
          wire_row_bytes: int | None = None) -> tuple[StepCost, ...]:
    """Every step of ``schedule`` priced for ``counts`` (default: the plan's); quantized wire
    buffers count ``wire_row_bytes`` a row (default ``row_bytes``)."""
    p = _pricing(schedule, row_bytes, wire_row_bytes, cost_model, counts)
    return tuple(PRICERS[type(s)](s, p) for s in schedule.steps)


def peer_bytes(schedule: Schedule, *, row_bytes: int, wire_row_bytes: int | None = None,
               counts: tuple[int, ...] | None = None) -> tuple[int, int]:
    """``(put, pulled)``: the bytes a rank's schedule on the peer transport writes into the
    other ranks' workspaces and reads from theirs (``counts``: the step's, default the
    plan's; rows of ``row_bytes``, wire rows of ``wire_row_bytes``). Only real rows move: a
    gather puts this rank's chunk's real rows into each other rank's workspace, a combine
    pulls this rank's chunk's real rows from each; the equal world steps (counts that ride
    a gather, the LM-head scatter) move whole blocks."""
    if schedule.transport is not Transport.PEER or schedule.rank.is_symbolic:
        raise DpxValueError("peer_bytes prices a known rank's schedule on the peer transport")
    r = schedule.rank
    p = _pricing(schedule, row_bytes, wire_row_bytes, CostModel(), counts)
    others = schedule.plan.layout.world_size - 1
    put = pulled = 0
    for s in schedule.steps:
        if not s.collective or s.group is not Group.WORLD:
            continue
        rb = p.rb(moved_buffer(s))
        if type(s) is ReduceScatterV:   # this rank's chunk's real rows from every other
            pulled += p.val(s.lens)[r.rank] * rb * others
        else:   # its chunk's real rows, or a whole block, to every other rank
            put += (p.val(s.lens)[r.rank] if type(s) is AllGatherV else p.val(s.rows)) * rb * others
    return put, pulled


@dataclass(frozen=True)
class OpEstimate:
    """One op's estimate: its collectives' seconds (the same on every rank), the local
    bytes of its slowest ``rank`` (the first with the most), the bytes each rank sends."""

    op: Op
    rank: int
    collective_seconds: float
    local_bytes: int
    moved: int
    seconds: float
    steps: tuple[StepCost, ...] = ()


@dataclass(frozen=True)
class ModeEstimate:
    """The estimated cost of one plan's step: ``gather(partial=True)`` then
    ``reduce_scatter``, each on its slowest rank."""

    mode: PaddingMode
    global_rows: int
    ops: tuple[OpEstimate, ...]

    @property
    def seconds(self) -> float:
        return sum(o.seconds for o in self.ops)

    @property
    def moved(self) -> int:
        """Bytes each rank sends over the step's collectives."""
        return sum(o.moved for o in self.ops)


def op_estimate(schedule: Schedule, *, row_bytes: int, cost_model: CostModel,
                wire_row_bytes: int | None = None) -> OpEstimate:
    """A known rank's ``schedule`` priced (:func:`price`): its collectives' seconds, its
    local bytes and the bytes it sends; its seconds, both together."""
    costs = price(schedule, row_bytes=row_bytes, cost_model=cost_model,
                  wire_row_bytes=wire_row_bytes)
    coll, local, moved = 0.0, 0, 0
    for c in costs:
        if c.collective:
            coll += c.seconds
            moved += c.moved
        else:
            local += c.size
    return OpEstimate(schedule.op, schedule.rank.rank, coll, local, moved,
                      coll + local / cost_model.memory_bandwidth, costs)


def estimate_op(plan: DpPlan, op: Op, *, row_bytes: int, cost_model: CostModel,
                transport: Transport = Transport.PER_ROOT, partial: bool = True,
                device_counts: bool = False, cache: ScheduleCache | None = None) -> OpEstimate:
    """``op``'s schedule priced on every rank (inputs as large as the plan needs); the
    slowest rank's kept (the first with the most local bytes)."""
    estimates = []
    for rank in range(check_plan(plan).layout.world_size):
        in_rows = op_rows(plan, op, rank, device_counts=device_counts).need
        sched = build_schedule(plan, op, rank=rank, partial=partial, device_counts=device_counts,
                               transport=transport, in_rows=in_rows, cache=cache)
        estimates.append(op_estimate(sched, row_bytes=row_bytes, cost_model=cost_model))
    return max(estimates, key=lambda e: e.local_bytes)


def estimate(plan: DpPlan, *, row_bytes: int, cost_model: CostModel,
             transport: Transport = Transport.PER_ROOT,
             cache: ScheduleCache | None = None) -> ModeEstimate:
    """``plan``'s step (partial gather, then reduce_scatter) priced from its schedules."""
    ops = tuple(estimate_op(plan, op, row_bytes=row_bytes, cost_model=cost_model,
                            transport=transport, cache=cache)
                for op in (Op.GATHER, Op.REDUCE_SCATTER))
    return ModeEstimate(plan.mode, plan.global_rows, ops)


ALL_MODES: tuple[PaddingMode, ...] = tuple(PaddingMode)   # MAX_LEN, SUM_LEN, GATHERV


def mode_estimates(counts: tuple[int, ...], layout: DpLayout, modes: Sequence[PaddingMode], *,
                   row_bytes: int, cost_model: CostModel, transport: Transport,
                   cp_shards: tuple[tuple[int, ...], ...] | None,
                   cache: ScheduleCache | None = None) -> list[ModeEstimate]:
    """Each of ``modes``' :func:`estimate` for these checked counts (no capacity)."""
    return [estimate(make_plan(counts, layout, m, is_extend=False, capacity=None,
                               cp_shards=cp_shards, why=""),
                     row_bytes=row_bytes, cost_model=cost_model, transport=transport,
                     cache=cache)
            for m in modes]


def compare_modes(num_tokens: Sequence[int], layout: DpLayout, *, row_bytes: int,
                  cost_model: CostModel, transport: Transport | str = Transport.PER_ROOT,
                  candidates: Sequence[PaddingMode | str] = ALL_MODES, is_extend: bool = False,
                  cp_shards: Sequence[Sequence[int]] | None = None) -> tuple[ModeEstimate, ...]:
    """Every candidate mode's estimate for these counts: a partial gather then a
    reduce_scatter (slowest rank each), as :func:`dpx.cost.estimate` prices their
    schedules. ``is_extend`` does not change a price (it is accepted for symmetry with
    plan_step)."""
    counts = check_counts(num_tokens, layout)
    shards = check_shards(cp_shards, counts, layout)
    check_int("row_bytes", row_bytes, minimum=1)
    return tuple(mode_estimates(counts, layout, [PaddingMode.parse(c) for c in candidates],
                                row_bytes=row_bytes, cost_model=cost_model,
                                transport=Transport.parse(transport), cp_shards=shards))
