"""A bandwidth/latency cost model that prices schedules, step by step.

Each collective step is timed the way nccl-tests reports it: with ``S`` the collective's
data size (the full output of an all-gather, the full input of a reduce-scatter or
all-reduce, the rows the chunks cover for a variable-size one) on ``g`` ranks, the time
is ``latency + S * factor / bus_bandwidth`` where ``factor`` is ``(g-1)/g`` for
all-gather and reduce-scatter and ``2(g-1)/g`` for all-reduce. A variable-size collective
made of grouped per-root operations (or a ragged all-to-all) pays ``per_root_latency`` for
every rank whose chunk is not empty. A local pass (place, take, zero, copy) costs the
bytes it reads plus the bytes it writes over ``memory_bandwidth``.

:func:`estimate` prices the schedules that :mod:`dpx.schedule` emits, so the estimate is
of exactly the steps the frontends run. Every parameter is an argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpx import expr as X
from dpx.errors import DpxValueError
from dpx.modes import Group, Op, Transport
from dpx.schedule import (AllGather, AllReduce, Copy, Dequantize, Pack, Place, Quantize,
                          ReduceScatter, Schedule, Step, Take, Unpack, ZeroFrom, _Variable,
                          build_schedule)


@dataclass(frozen=True)
class StepCost:
    """One step's estimate: what it is, over how many ranks, and the bytes and time.

    ``size``: the collective's data size S in bytes (a local pass: bytes read + written);
    ``moved``: bytes each rank sends (0 for a local pass).
    """

    name: str
    ranks: int
    size: int
    moved: int
    seconds: float

    @property
    def is_local(self) -> bool:
        return self.ranks == 1 and self.moved == 0


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

    def collective(self, name: str, size: int, ranks: int, factor: float,
                   roots: int = 0) -> StepCost:
        if ranks <= 1:
            return StepCost(name, ranks, size, 0, 0.0)
        moved = round(size * factor)
        seconds = self.latency + roots * self.per_root_latency + moved / self.bus_bandwidth
        return StepCost(name, ranks, size, moved, seconds)

    def local_pass(self, name: str, nbytes: int) -> StepCost:
        """A kernel pass that reads and writes ``nbytes`` in total."""
        return StepCost(name, 1, nbytes, 0, nbytes / self.memory_bandwidth)


def _group_size(schedule: Schedule, group: Group) -> int:
    lay = schedule.plan.layout
    return {Group.WORLD: lay.world_size, Group.ATTN_TP: lay.attn_tp_size,
            Group.REPLICA: lay.replica_size}[group]


def price_step(step: Step, schedule: Schedule, *, row_bytes: int, model: CostModel,
               counts: tuple[int, ...], wire_row_bytes: int | None = None) -> StepCost:
    """The cost of one step; expressions are evaluated for host ``counts``. Steps on fp8
    wire buffers (``schedule.wire_bufs``) count ``wire_row_bytes`` per row (default
    ``row_bytes``); a quantize reads input rows and writes wire rows, a dequantize the
    reverse."""
    coords = _coords(schedule)

    def val(v: Any) -> Any:
        return X.host_value(v, counts, coords)

    wrb = row_bytes if wire_row_bytes is None else wire_row_bytes
    name = str(step)
    if isinstance(step, Quantize):
        return model.local_pass(name, max(val(step.count), 0) * row_bytes + step.rows * wrb)
    if isinstance(step, Dequantize):
        return model.local_pass(name, step.rows * (wrb + row_bytes))
    moved_buf = getattr(step, "src", None) or getattr(step, "buf", None)
    if moved_buf is not None and schedule.is_wire(moved_buf.buf):
        row_bytes = wrb
    if isinstance(step, (Place, Take)):
        return model.local_pass(name, (step.rows + max(val(step.count), 0)) * row_bytes)
    if isinstance(step, ZeroFrom):
        return model.local_pass(name, max(step.rows - val(step.start), 0) * row_bytes)
    if isinstance(step, Copy):
        return model.local_pass(name, 2 * step.rows * row_bytes)
    if isinstance(step, (Pack, Unpack)):
        return model.local_pass(name, (step.rows + sum(val(step.lens))) * row_bytes)
    g = _group_size(schedule, step.group)
    if isinstance(step, AllGather):
        return model.collective(name, g * step.rows * row_bytes, g, (g - 1) / g)
    if isinstance(step, ReduceScatter):
        return model.collective(name, g * step.rows * row_bytes, g, (g - 1) / g)
    if isinstance(step, AllReduce):
        return model.collective(name, step.rows * row_bytes, g, 2 * (g - 1) / g)
    if isinstance(step, _Variable):
        lens = val(step.lens)
        return model.collective(name, sum(lens) * row_bytes, g, (g - 1) / g,
                                roots=sum(1 for x in lens if x > 0))
    raise TypeError(f"no price for step {step!r}")


def _coords(schedule: Schedule) -> dict[str, int]:
    r = schedule.rank
    if r.is_symbolic:
        return {X.Coord.RANK: 0, X.Coord.DP: 0, X.Coord.CP: 0, X.Coord.TP: 0}
    return {X.Coord.RANK: r.rank, X.Coord.DP: r.dp, X.Coord.CP: r.cp, X.Coord.TP: r.tp}


def price(schedule: Schedule, *, row_bytes: int, cost_model: CostModel,
          counts: tuple[int, ...] | None = None,
          wire_row_bytes: int | None = None) -> tuple[StepCost, ...]:
    """Every step of ``schedule`` priced; device-count expressions are evaluated for
    ``counts`` (default: the plan's ``num_tokens``)."""
    c = schedule.plan.num_tokens if counts is None else tuple(counts)
    return tuple(price_step(s, schedule, row_bytes=row_bytes, model=cost_model, counts=c,
                            wire_row_bytes=wire_row_bytes)
                 for s in schedule.steps)


@dataclass(frozen=True)
class OpEstimate:
    """One op's estimate: the slowest rank's priced steps (collectives are the same on
    every rank; local passes differ)."""

    op: Op
    rank: int
    steps: tuple[StepCost, ...]

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.steps)

    @property
    def moved(self) -> int:
        return sum(s.moved for s in self.steps)


@dataclass(frozen=True)
class ModeEstimate:
    """The estimated cost of one plan's step: ``gather(partial=True)`` then
    ``reduce_scatter``, each on its slowest rank."""

    mode: Any
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


def estimate_op(plan: Any, op: Op, *, row_bytes: int, cost_model: CostModel,
                transport: Transport = Transport.PER_ROOT, partial: bool = True,
                device_counts: bool = False) -> OpEstimate:
    """Price ``op``'s schedule on every rank (inputs as large as the plan needs) and keep
    the slowest rank's."""
    best: OpEstimate | None = None
    for rank in range(plan.layout.world_size):
        in_rows = _in_rows(plan, op, rank)
        sched = build_schedule(plan, op, rank=rank, partial=partial,
                               device_counts=device_counts, transport=transport,
                               in_rows=in_rows)
        est = OpEstimate(op, rank, price(sched, row_bytes=row_bytes, cost_model=cost_model))
        if best is None or est.seconds > best.seconds:
            best = est
    assert best is not None
    return best


def _in_rows(plan: Any, op: Op, rank: int) -> int:
    c = plan.layout.coords(rank)
    d = c.attn_dp_rank
    if op is Op.GATHER:
        if plan.is_static:
            return plan.slot_rows[d]
        return plan.cp_shards[d][c.attn_cp_rank] if plan.sharded else plan.num_tokens[d]
    if op is Op.SCATTER_ADJOINT:
        return plan.slot_rows[d]
    return plan.global_rows


def estimate(plan: Any, *, row_bytes: int, cost_model: CostModel,
             transport: Transport = Transport.PER_ROOT) -> ModeEstimate:
    """``plan``'s step (partial gather, then reduce_scatter) priced from its schedules."""
    ops = tuple(estimate_op(plan, op, row_bytes=row_bytes, cost_model=cost_model,
                            transport=transport)
                for op in (Op.GATHER, Op.REDUCE_SCATTER))
    return ModeEstimate(plan.mode, plan.global_rows, ops)
