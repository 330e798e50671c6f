"""What every rank does: the ordered steps of one op, derived from a plan.

:func:`build_schedule` turns ``(plan, op, rank, ...)`` into a :class:`Schedule`. Every rank's
schedule has the same collectives in the same order with the same sizes
(:meth:`Schedule.collective_signature`); no step writes ``"in"`` except in an in-place
gather. A template is the schedule of a plan :class:`~dpx.geometry.Structure` with row
numbers as expressions over the counts; it holds one :class:`Variant` per outcome of the
emitter's guards (docs/semantics.md, "Transports and routes"). A :class:`ScheduleCache`
keeps templates; without one every call builds afresh without generating code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpx import expr as X
from dpx import values as V
from dpx.emit import Emitter
from dpx.errors import DpxValueError, check_bool, check_int
from dpx.extents import op_rows
from dpx.lru import LRU
from dpx.modes import Op, PaddingMode, Transport, Wire
from dpx.plan import DpPlan, check_plan
from dpx.routes import RankRef, Route, TemplateKey
from dpx.steps import IN, OUT, AllToAllV, Ref, Step, moved_buffer
from dpx.steps import _Variable as _VariableStep
from dpx.wire import dequantized, in_place_schedule

__all__ = ["IN", "OUT", "Schedule", "ScheduleCache", "Variant", "build_schedule"]


@dataclass(eq=False, slots=True)
class Schedule:
    """The steps one rank runs for one op, filled in for ``plan`` (a value)."""

    plan: DpPlan
    op: Op
    partial: bool
    rank: RankRef
    device_counts: bool
    transport: Transport
    in_rows: int | None
    out_rows: int
    steps: tuple[Step, ...]
    scratch: tuple[tuple[str, Any], ...]
    notes: tuple[str, ...]
    wire: Wire = Wire.NATIVE
    wire_bufs: frozenset = frozenset()
    route: Route = Route.LOCAL
    in_place: bool = False
    wide_bufs: frozenset = frozenset()

    def collective_signature(self) -> tuple:
        """What every rank must agree on: each collective's kind, group and sizes."""
        sig = []
        for s in self.steps:
            if not s.collective:
                continue
            # (a variable all-to-all's rows are each rank's own share of its lens)
            rows = s.lens if isinstance(s, AllToAllV) else s.rows
            item: list = [s.kind, s.group, X.render(rows), self.is_wire(moved_buffer(s))]
            if isinstance(s, _VariableStep):
                item += [X.render(s.firsts), X.render(s.lens), X.render(s.block)]
            sig.append(tuple(item))
        return tuple(sig)

    def is_wire(self, buf: str) -> bool:
        """Whether buffer ``buf`` holds quantized wire rows (else the input's dtype)."""
        return buf in self.wire_bufs

    def is_wide(self, buf: str) -> bool:
        """Whether buffer ``buf``'s rows are ``world_size`` narrow rows side by side."""
        return buf in self.wide_bufs


class Variant:
    """One schedule of a template: symbolic steps and the guards that select them;
    ``values(counts, params)`` gives a call's host values (``None`` when a guard fails)."""

    __slots__ = ("key", "guards", "steps", "scratch", "wire_bufs", "wide_bufs", "notes",
                 "route", "host_index", "values", "outputs", "rank_ref", "enums", "_fill")

    def __init__(self, key: TemplateKey, emitter: Emitter, *, compiled: bool = True) -> None:
        self.key = key
        self.guards = tuple(emitter.guards.values())
        self.steps = tuple(emitter.steps)
        self.scratch = tuple(emitter.scratch.items())
        self.wire_bufs = frozenset(emitter.wire_bufs)
        self.wide_bufs = frozenset(emitter.wide_bufs)
        self.notes = tuple(emitter.notes)
        self.route = emitter.route
        outputs: list[Any] = []
        self.host_index: dict[int, int] = {}

        def spec(v: Any) -> tuple:
            """How a call's value of field ``v`` is made: ``(0, constant)``, ``(1, index
            of a host value)``, ``(2, expression read on the device)`` or ``(3, (buffer,
            first, rows))`` for a :class:`Ref`."""
            if isinstance(v, Ref):
                return 3, (v.buf, spec(v.first), spec(v.rows))
            if not isinstance(v, X.Expr):
                return 0, v
            if not emitter.host_known(v):
                return 2, v
            if id(v) not in self.host_index:
                self.host_index[id(v)] = len(outputs)
                outputs.append(v)
            return 1, self.host_index[id(v)]

        self._fill = (tuple((type(s), tuple(spec(v) for v in s.fields().values()))
                            for s in self.steps),
                      tuple((name, spec(rows)) for name, rows in self.scratch))
        self.outputs = tuple(outputs)
        self.rank_ref = emitter.rank
        self.enums = (emitter.op, emitter.transport, emitter.wire)
        #: ``values(counts, params) -> tuple | None`` (see :func:`dpx.values.compile_host`);
        #: a variant built for one call evaluates them without generating code
        self.values = (V.compile_host(outputs, self.guards) if compiled
                       else _interpreter(self.guards, self.outputs))

    def concretize(self, plan: DpPlan, values: tuple, counts: tuple | None,
                   in_rows: int | None, out_rows: int) -> Schedule:
        """The :class:`Schedule` for one call's values (device-read values stay
        expressions)."""
        k = self.key
        params = _named((in_rows, out_rows))
        memo: dict = {}

        def fill(kind: int, x: Any) -> Any:
            if kind == 3:  # a Ref: its first row and rows filled alike (inline: a hot loop)
                buf, (fk, f), (rk, r) = x
                return Ref(buf, f if fk == 0 else values[f] if fk == 1 else fill(fk, f),
                           r if rk == 0 else values[r] if rk == 1 else fill(rk, r))
            if kind == 0:
                return x
            if kind == 1:
                return values[x]
            return V.substitute(x, counts=counts, params=params, memo=memo)

        steps, scratch = self._fill
        op, transport, wire = self.enums
        return Schedule(plan, op, k.partial, self.rank_ref, k.device_counts, transport,
                        in_rows, out_rows,
                        tuple(cls(*[x if kind == 0 else values[x] if kind == 1 else
                                    fill(kind, x) for kind, x in fields])
                              for cls, fields in steps),
                        tuple((name, fill(*rows)) for name, rows in scratch), self.notes,
                        wire, self.wire_bufs, self.route, k.in_place, self.wide_bufs)


def _interpreter(guards: tuple, outputs: tuple) -> Any:
    """``values(counts, params)`` evaluated without generated code (a one-call variant)."""

    def values(counts: tuple, params: tuple) -> tuple | None:
        ops = V.HostOps(counts, params=_named(params))
        memo: dict = {}
        for g, want in guards:
            if int(bool(V.evaluate(g, ops, memo))) != want:
                return None
        return tuple(V.evaluate(v, ops, memo) for v in outputs)
    return values


def _named(params: tuple) -> dict[str, int]:
    """A call's parameters (in :data:`dpx.expr.PARAMS` order) by name, the known ones."""
    return {k: v for k, v in zip(X.PARAMS, params) if v is not None}


class ScheduleCache:
    """Templates by :class:`TemplateKey`, least recently used first out: at most
    ``max_templates`` of at most ``max_variants`` variants each (new counts of a known
    structure then cost one generated function call)."""

    def __init__(self, *, max_templates: int = 64, max_variants: int = 4) -> None:
        self.max_templates = check_int("ScheduleCache(max_templates)", max_templates, minimum=1)
        self.max_variants = check_int("ScheduleCache(max_variants)", max_variants, minimum=1)
        #: per template, its variants, most recently used first
        self._templates = LRU(self.max_templates)
        self.builds = 0

    def __len__(self) -> int:
        return len(self._templates)

    def variants(self) -> int:
        """How many variants the cache holds in all."""
        return sum(map(len, self._templates.values()))

    def clear(self) -> None:
        self._templates.clear()

    def variant(self, key: TemplateKey, counts: tuple, in_rows: int | None,
                out_rows: int, *, compiled: bool = True) -> tuple[Variant, tuple]:
        """The variant of ``key`` for these counts and sizes and its host values (built on
        a miss; ``compiled=False``: without generated code)."""
        params = (in_rows, out_rows)
        found = self._templates.hit(key)
        if found is not None:
            for i, v in enumerate(found):
                values = v.values(counts, params)
                if values is not None:
                    if i:
                        found.insert(0, found.pop(i))
                    return v, values
        else:
            found = self._templates.put(key, [])
        # a miss: the template's steps for these counts and sizes, a new variant
        e = Emitter(key, V.HostOps(() if key.device_counts else counts, params=_named(params)))
        e.emit()
        v = Variant(key, e, compiled=compiled)
        self.builds += 1
        found.insert(0, v)
        del found[self.max_variants:]
        values = v.values(counts, params)
        assert values is not None, "a variant must accept the counts it was built for"
        return v, values


def build_schedule(plan: DpPlan, op: Op | str, *, rank: int | None, partial: bool = True,
                   device_counts: bool = False, transport: Transport | str = Transport.PER_ROOT,
                   in_rows: int | None = None, out_rows: int | None = None,
                   wire: Wire | str = Wire.NATIVE, dequantize: bool = True, in_place: bool = False,
                   counts_ride: bool = False, cache: ScheduleCache | None = None) -> Schedule:
    """The schedule of ``op`` on ``rank`` (``None``: one symbolic program for every rank).

    ``partial`` applies to gather. ``device_counts`` (capacity plans only): the counts are
    a device int32 vector (the schedule starts with a :class:`~dpx.steps.CheckCounts`).
    ``transport`` names what the frontend's collectives can do. ``in_rows`` (the input's
    rows, when known) lets a rank whose input already is its chunk send it without a pass.
    ``out_rows`` defaults to :func:`dpx.extents.op_rows`. ``in_place``: a gather whose
    input is this rank's rows inside ``out`` (:func:`dpx.extents.local_rows`). ``cache``
    keeps the templates (a :class:`ScheduleCache`); without one the schedule is built
    afresh. ``counts_ride``: a gather with device counts whose passes before its world
    collective read only the rank's own count, the others arriving with the collective
    (:class:`~dpx.steps.AllGatherCounts`; MAX_LEN and GATHERV, docs/semantics.md "Counts
    that ride the gather").
    """
    op = op if type(op) is Op else Op.parse(op)
    transport = transport if type(transport) is Transport else Transport.parse(transport)
    wire = wire if type(wire) is Wire else Wire.parse(wire)
    # the rules of the request that do not depend on tensors
    if (check_plan(plan).capacity is None) & check_bool("device_counts", device_counts):
        raise DpxValueError("counts= needs a capacity plan (plan_step(..., capacity=))")
    if check_bool("counts_ride", counts_ride):
        check_ride(plan, op, device_counts=device_counts, in_place=in_place)
    if check_bool("in_place", in_place):
        if op is not Op.GATHER or rank is None:
            raise DpxValueError("in_place applies to a gather on a known rank")
        if not in_place_schedule(wire, in_place):
            raise DpxValueError("in_place gathers move the rows in the input's dtype: "
                                f"wire='{wire.value}' gathers from a separate input")
    if rank is not None and type(rank) is not int:
        check_int("rank", rank)
    if out_rows is None:
        out_rows = op_rows(plan, op, rank, device_counts=device_counts).out
    if in_rows is None and op is Op.SCATTER_COLUMNS_ADJOINT:  # its input is exactly a slot
        in_rows = op_rows(plan, op, rank, device_counts=device_counts).need
    key = TemplateKey(plan.structure, op._value_, check_bool("partial", partial)
                      or op is Op.GATHER_SUM, rank, device_counts, transport._value_,
                      wire._value_, dequantized(wire, dequantize), in_place,
                      in_rows is not None, counts_ride)
    counts = plan.leaf_counts
    one_off = cache is None  # a schedule for one call: evaluated without generated code
    variant, values = (ScheduleCache(max_templates=1) if one_off else cache).variant(
        key, counts, in_rows, out_rows, compiled=not one_off)
    return variant.concretize(plan, values, None if device_counts else counts, in_rows, out_rows)


def check_ride(plan: DpPlan, op: Op, *, device_counts: bool = True, in_place: bool = False,
               shards: bool | None = None) -> None:
    """The rules of counts that ride a gather (raised alike on every rank): a capacity plan
    in MAX_LEN or GATHERV, its counts device data, a gather from a separate input;
    ``shards`` (a call's flag): the plan's ``cp_shards`` set or not alike."""
    if op is not Op.GATHER:
        raise DpxValueError(f"counts ride a gather, not {op.value}")
    if plan.capacity is None:
        raise DpxValueError("counts ride the gather of a capacity plan (plan_step(..., "
                            "capacity=)): other plans know every count on the host")
    if not device_counts:
        raise DpxValueError("counts ride a gather whose counts are device data "
                            "(device_counts=True)")
    if shards is not None and shards != plan.sharded:
        raise DpxValueError(f"gather_with_counts(shards={shards}) with a plan whose "
                            f"cp_shards is {'set' if plan.sharded else 'None'}")
    if plan.mode is PaddingMode.SUM_LEN:
        raise DpxValueError("counts ride a gather in max_len or gatherv: sum_len places "
                            "every replica's rows at offsets of every count before its "
                            "collective (exchange_counts first)")
    if in_place:
        raise DpxValueError("counts ride a gather from a separate input, not an in-place one")
