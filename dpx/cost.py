"""A bandwidth/latency cost model that prices schedules, step by step.

Each collective step is timed the way nccl-tests reports it: with ``S`` the collective's
data size (the full output of an all-gather, the full input of a reduce-scatter or
all-reduce, the rows the chunks cover for a variable-size one) on ``g`` ranks, the time
is ``latency + S * factor / bus_bandwidth`` where ``factor`` is ``(g-1)/g`` for
all-gather and reduce-scatter and ``2(g-1)/g`` for all-reduce. A variable-size collective
made of grouped per-root operations (or a ragged all-to-all) pays ``per_root_latency`` for
every rank whose chunk is not empty. A local pass (move, zero, pack, quantize, ...) costs
the bytes it reads plus the bytes it writes over ``memory_bandwidth``.

An op's estimate is its collectives' times (the same on every rank) plus the local bytes
of its slowest rank (the most, an exact integer) over ``memory_bandwidth``.
:func:`price` prices one schedule step by step (what ``explain`` prints);
:func:`estimate_op` prices every rank's schedule; :mod:`dpx.pricing` computes the same
seconds in closed form from the counts (the cost policy without CP ranks, tested equal).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from dpx import expr as X
from dpx import values as V
from dpx.errors import DpxValueError
from dpx.extents import op_rows
from dpx.modes import Group, Op, PaddingMode, Transport
from dpx.plan import DpPlan
from dpx.schedule import Schedule, ScheduleCache, build_schedule
from dpx.steps import (AllGather, AllGatherV, AllReduce, BroadcastV, CheckCounts,
                       Dequantize, Move, Pack, Quantize, ReduceScatter, ReduceScatterV,
                       ReduceV, Step, Unpack, Zero, moved_buffer)

__all__ = [
    "CostModel", "estimate", "estimate_op", "group_size", "ModeEstimate",
    "OpEstimate", "price", "PRICERS", "split_costs", "StepCost"
]

@dataclass(frozen=True)
class StepCost:
    """One step's estimate: what it is, over how many ranks, and the bytes and time.

    ``what``: the step (or a name); ``size``: the collective's data size S in bytes (a
    local pass: bytes read + written); ``moved``: bytes each rank sends (0 for a local
    pass).
    """

    what: Any = field(compare=False)  # estimates compare by their numbers
    ranks: int
    size: int
    moved: int
    seconds: float
    collective: bool = False

    @property
    def name(self) -> str:
        """The step as it prints (made when read: pricing a schedule formats nothing)."""
        return str(self.what)

    @property
    def is_local(self) -> bool:
        return not self.collective


@dataclass(frozen=True)
class CostModel:
    """Parameters of the estimate. Bandwidth in bytes per second, latency in seconds.

    Defaults are order-of-magnitude figures for NVLink-connected Hopper GPUs (NCCL bus
    bandwidth of a few hundred GB/s, tens of microseconds per collective, device memory
    moving about 4 TB/s counting bytes read and written); fit them to your machine with
    measured runs (``benchmarks/collectives.py``).
    """

    bus_bandwidth: float = 350e9
    latency: float = 15e-6
    per_root_latency: float = 4e-6
    memory_bandwidth: float = 4.0e12

    def __post_init__(self) -> None:
        for name in ("bus_bandwidth", "memory_bandwidth"):
            if not getattr(self, name) > 0:
                raise DpxValueError(f"CostModel.{name}={getattr(self, name)} must be > 0")
        for name in ("latency", "per_root_latency"):
            if not getattr(self, name) >= 0:
                raise DpxValueError(f"CostModel.{name}={getattr(self, name)} must be >= 0")

    def collective_seconds(self, size: int, ranks: int, factor: float,
                           roots: int = 0) -> tuple[int, float]:
        """``(moved bytes, seconds)`` of one collective (0 and 0.0 on one rank)."""
        if ranks <= 1:
            return 0, 0.0
        moved = round(size * factor)
        return moved, self.latency + roots * self.per_root_latency + moved / self.bus_bandwidth

    def collective(self, what: Any, size: int, ranks: int, factor: float,
                   roots: int = 0) -> StepCost:
        moved, seconds = self.collective_seconds(size, ranks, factor, roots)
        return StepCost(what, ranks, size, moved, seconds, True)

    def local_pass(self, what: Any, nbytes: int) -> StepCost:
        """A kernel pass that reads and writes ``nbytes`` in total."""
        return StepCost(what, 1, nbytes, 0, nbytes / self.memory_bandwidth)


def group_size(layout: Any, group: Group) -> int:
    return {Group.WORLD: layout.world_size, Group.ATTN_TP: layout.attn_tp_size,
            Group.REPLICA: layout.replica_size}[group]


class _Pricing:
    """One schedule's pricing context: values of its expressions, row bytes per buffer."""

    def __init__(self, schedule: Schedule, row_bytes: int, wire_row_bytes: int,
                 model: CostModel, counts: tuple[int, ...]) -> None:
        self.schedule, self.model = schedule, model
        self.row_bytes, self.wire_row_bytes = row_bytes, wire_row_bytes
        r = schedule.rank
        coords = ({X.Coord.RANK: 0, X.Coord.DP: 0, X.Coord.CP: 0, X.Coord.TP: 0}
                  if r.is_symbolic else
                  {X.Coord.RANK: r.rank, X.Coord.DP: r.dp, X.Coord.CP: r.cp, X.Coord.TP: r.tp})
        self.ops = V.HostOps(counts, coords)

    def val(self, v: Any) -> Any:
        return v if type(v) is int else V.evaluate(v, self.ops)

    def rb(self, buf: str) -> int:
        return self.wire_row_bytes if self.schedule.is_wire(buf) else self.row_bytes

    def group(self, g: Group) -> int:
        return group_size(self.schedule.plan.layout, g)


def _move(s: Move, p: _Pricing) -> StepCost:
    rows, count = p.val(s.rows), max(p.val(s.count), 0)
    return p.model.local_pass(s, (rows + count) * p.rb(s.dst.buf))


def _zero(s: Zero, p: _Pricing) -> StepCost:
    rows, first, n = p.val(s.rows), p.val(s.keep_start), max(p.val(s.keep_count), 0)
    kept = max(min(first + n, rows) - max(first, 0), 0)
    return p.model.local_pass(s, (rows - kept) * p.rb(s.buf.buf))


def _quantize(s: Quantize, p: _Pricing) -> StepCost:
    return p.model.local_pass(s, max(p.val(s.count), 0) * p.row_bytes
                              + p.val(s.rows) * p.wire_row_bytes)


def _dequantize(s: Dequantize, p: _Pricing) -> StepCost:
    return p.model.local_pass(s, p.val(s.rows) * (p.wire_row_bytes + p.row_bytes))


def _chunks(s: Pack | Unpack, p: _Pricing) -> StepCost:
    return p.model.local_pass(s, (p.val(s.rows) + sum(p.val(s.lens))) * p.rb(s.dst.buf))


def _check(s: CheckCounts, p: _Pricing) -> StepCost:
    return p.model.local_pass(s, 0)


def _gather_like(s: AllGather | ReduceScatter, p: _Pricing) -> StepCost:
    g = p.group(s.group)
    return p.model.collective(s, g * p.val(s.rows) * p.rb(moved_buffer(s)), g,
                              (g - 1) / g)


def _all_reduce(s: AllReduce, p: _Pricing) -> StepCost:
    g = p.group(s.group)
    return p.model.collective(s, p.val(s.rows) * p.rb(s.buf.buf), g, 2 * (g - 1) / g)


def _variable(s: BroadcastV | ReduceV | AllGatherV | ReduceScatterV, p: _Pricing) -> StepCost:
    g = p.group(s.group)
    lens = p.val(s.lens)
    return p.model.collective(s, sum(lens) * p.rb(moved_buffer(s)), g, (g - 1) / g,
                              roots=sum(1 for x in lens if x > 0))


#: The cost model's handler of every step kind.
PRICERS: dict[type[Step], Callable[[Any, _Pricing], StepCost]] = {
    CheckCounts: _check, Move: _move, Zero: _zero, Quantize: _quantize,
    Dequantize: _dequantize, Pack: _chunks, Unpack: _chunks, AllGather: _gather_like,
    ReduceScatter: _gather_like, AllReduce: _all_reduce, BroadcastV: _variable,
    ReduceV: _variable, AllGatherV: _variable, ReduceScatterV: _variable,
}


def price(schedule: Schedule, *, row_bytes: int, cost_model: CostModel,
          counts: tuple[int, ...] | None = None,
          wire_row_bytes: int | None = None) -> tuple[StepCost, ...]:
    """Every step of ``schedule`` priced; device-count expressions are evaluated for
    ``counts`` (default: the plan's counts, as the counts leaf reads them). Steps on fp8
    wire buffers count ``wire_row_bytes`` per row (default ``row_bytes``); a quantize
    reads input rows and writes wire rows, a dequantize the reverse."""
    c = schedule.plan.leaf_counts if counts is None else tuple(counts)
    p = _Pricing(schedule, row_bytes, row_bytes if wire_row_bytes is None else wire_row_bytes,
                 cost_model, c)
    return tuple(PRICERS[type(s)](s, p) for s in schedule.steps)


@dataclass(frozen=True)
class OpEstimate:
    """One op's estimate: its collectives' seconds (the same on every rank, summed in
    step order), the local bytes of its slowest rank (``rank``, the first with the most)
    and the bytes each rank sends. ``steps``: that rank's priced steps."""

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
    def steps(self) -> tuple[StepCost, ...]:
        return tuple(s for o in self.ops for s in o.steps)

    @property
    def seconds(self) -> float:
        return sum(o.seconds for o in self.ops)

    @property
    def moved(self) -> int:
        """Bytes each rank sends over the step's collectives."""
        return sum(o.moved for o in self.ops)


def split_costs(costs: tuple[StepCost, ...]) -> tuple[float, int, int]:
    """``(collective seconds, local bytes, moved bytes)`` of one rank's priced steps."""
    coll, local, moved = 0.0, 0, 0
    for c in costs:
        if c.collective:
            coll += c.seconds
            moved += c.moved
        else:
            local += c.size
    return coll, local, moved


def estimate_op(plan: DpPlan, op: Op, *, row_bytes: int, cost_model: CostModel,
                transport: Transport = Transport.PER_ROOT, partial: bool = True,
                device_counts: bool = False,
                cache: ScheduleCache | None = None) -> OpEstimate:
    """Price ``op``'s schedule on every rank (inputs as large as the plan needs) and keep
    the slowest rank's local bytes (the collectives are the same on every rank)."""
    best: OpEstimate | None = None
    for rank in range(plan.layout.world_size):
        in_rows = op_rows(plan, op, rank, device_counts=device_counts).need
        sched = build_schedule(plan, op, rank=rank, partial=partial,
                               device_counts=device_counts, transport=transport,
                               in_rows=in_rows, cache=cache)
        costs = price(sched, row_bytes=row_bytes, cost_model=cost_model)
        coll, local, moved = split_costs(costs)
        if best is None or local > best.local_bytes:
            best = OpEstimate(op, rank, coll, local, moved,
                              coll + local / cost_model.memory_bandwidth, costs)
    assert best is not None
    return best


def estimate(plan: DpPlan, *, row_bytes: int, cost_model: CostModel,
             transport: Transport = Transport.PER_ROOT,
             cache: ScheduleCache | None = None) -> ModeEstimate:
    """``plan``'s step (partial gather, then reduce_scatter) priced from its schedules."""
    ops = tuple(estimate_op(plan, op, row_bytes=row_bytes, cost_model=cost_model,
                            transport=transport, cache=cache)
                for op in (Op.GATHER, Op.REDUCE_SCATTER))
    return ModeEstimate(plan.mode, plan.global_rows, ops)
