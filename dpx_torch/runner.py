"""What a :class:`dpx_torch.DpComm` runs its calls with: the schedules, compiled programs,
device tables, scratch pool, overflow flags and the comm stream -- every piece of state
a communicator keeps, with one bound each (:class:`CacheLimits`) and one ``clear()``.

A call is looked up in two levels. The *call cache* keys on the plan object and the
call's flags (a layer loop that gathers with one plan per step hits it from the second
layer on). On a miss, the plan's *structure* (:func:`dpx.geometry.structure_of`) selects a
schedule template in the :class:`dpx.ScheduleCache`; the template's generated function
computes the call's host values from the new counts (and picks the variant whose guards
they meet); the variant's compiled :class:`~dpx_torch.program.Program` runs them. New
counts of a known structure therefore cost one generated function call, never a new
schedule.

Every cache is least recently used first out. The bounds are entries; the host bytes they
hold were measured (benchmarks/soak.py; docs/semantics.md, "Memory"), and
:meth:`Runner.host_bytes` estimates them at run time.
"""

from __future__ import annotations

import contextlib
import sys
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from dpx.extents import op_rows
from dpx.geometry import host_counts, structure_of
from dpx.modes import Group, Op, Transport, Wire
from dpx.plan import DpPlan
from dpx.schedule import ScheduleCache, TemplateKey, Variant
from dpx_torch.flags import OverflowFlags
from dpx_torch.groups import DpGroups
from dpx_torch.overlap import Overlap
from dpx_torch.pool import BufferPool
from dpx_torch.program import BatchProgram, DeviceTables, Program

__all__ = ["CacheLimits", "Call", "Prepared", "Runner"]


@dataclass(frozen=True)
class CacheLimits:
    """The bounds of a communicator's caches, in entries (each least recently used first
    out). ``calls``: (plan, op, flags) -> program and host values; ``templates`` /
    ``variants``: schedule templates by plan structure, and variants per template;
    ``programs``: compiled programs (one per variant in use); ``batches``: programs of
    several-tensor gathers; ``tables``: device copies of host index tables."""

    calls: int = 64
    templates: int = 64
    variants: int = 4
    programs: int = 128
    batches: int = 32
    tables: int = 256


class Prepared(NamedTuple):
    """One call, ready to run: its program, host values and sizes."""

    program: Program
    values: tuple
    params: tuple[int | None, int]
    out_rows: int
    need: int
    exact: bool


class Call(NamedTuple):
    """One differentiable call: its plan, op, device counts (or None), the input's rows
    (the rows of the gradient the backward returns) and its prepared program."""

    plan: DpPlan
    op: Op
    counts: torch.Tensor | None
    in_rows: int
    prep: Prepared


class _LRU(OrderedDict):
    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def put(self, key: Any, value: Any) -> Any:
        self[key] = value
        if len(self) > self.limit:
            self.popitem(last=False)
        return value

    def hit(self, key: Any) -> Any:
        v = self.get(key)
        if v is not None:
            self.move_to_end(key)
        return v


class Runner:
    """Runs schedules for one communicator's groups (see the module docstring).
    ``transport``: what torch.distributed's collectives can do (per-root broadcasts /
    reduces with host sizes), which decides how GATHERV plans move their rows."""

    transport = Transport.PER_ROOT

    def __init__(self, groups: DpGroups, limits: CacheLimits) -> None:
        self.groups, self.limits = groups, limits
        self.rank = groups.rank
        self.schedules = ScheduleCache(max_templates=limits.templates,
                                       max_variants=limits.variants)
        self.tables = DeviceTables(max_entries=limits.tables)
        self.pool = BufferPool()
        self.flags = OverflowFlags()
        self.overlap = Overlap(self.pool)
        self._calls = _LRU(limits.calls)
        self._programs = _LRU(limits.programs)
        self._batches = _LRU(limits.batches)

    # ------------------------------------------------------------ preparing a call
    def prepare(self, plan: DpPlan, op: Op, *, partial: bool, device_counts: bool,
                in_rows: int, wire: Wire = Wire.NATIVE, dequantize: bool = True,
                in_place: bool = False, out_rows: int | None = None) -> Prepared:
        """The call's program and values (cached; see the module docstring). Under
        torch.compile tracing nothing is cached: the schedule is built and evaluated
        afresh, in plain Python the tracer follows."""
        compiling = torch.compiler.is_compiling()
        key = (plan, op, partial, device_counts, in_rows, wire, dequantize, in_place,
               out_rows)
        if not compiling:
            hit = self._calls.hit(key)
            if hit is not None:
                return hit
        rows = op_rows(plan, op, self.rank, device_counts=device_counts)
        out = rows.out if out_rows is None else out_rows
        tkey = TemplateKey(structure_of(plan), op._value_, partial, self.rank, device_counts,
                           self.transport._value_, wire._value_,
                           dequantize or wire is Wire.NATIVE, in_place, True)
        counts = host_counts(plan)
        if compiling:
            variant, values = ScheduleCache(max_templates=1).variant(tkey, counts, in_rows,
                                                                      out, compiled=False)
            program = Program(self, variant)
        else:
            variant, values = self.schedules.variant(tkey, counts, in_rows, out)
            program = self._program(variant)
        prep = Prepared(program, values, (in_rows, out), out, rows.need, rows.exact)
        if not compiling:
            self._calls.put(key, prep)
        return prep

    def _program(self, variant: Variant) -> Program:
        p = self._programs.hit(variant)
        if p is None:
            p = self._programs.put(variant, Program(self, variant))
        return p

    def batch(self, programs: tuple[Program, ...]) -> BatchProgram:
        """The lockstep program of several tensors' programs (cached by the programs)."""
        if torch.compiler.is_compiling():
            return BatchProgram(self, programs)
        b = self._batches.hit(programs)
        if b is None:
            b = self._batches.put(programs, BatchProgram(self, programs))
        return b

    # ------------------------------------------------------------ running
    @property
    def scratch_key(self) -> str:
        return "comm" if self.overlap.on_comm_stream else "caller"

    def run(self, prep: Prepared, x: torch.Tensor, out: torch.Tensor,
            counts: torch.Tensor | None) -> torch.Tensor:
        return prep.program(x, out, counts, prep.values, prep.params, self.scratch_key)

    def execute(self, call: Call, x: torch.Tensor) -> torch.Tensor:
        """Run a differentiable call (forward or backward) into a new output."""
        out = x.new_empty((call.prep.out_rows, *x.shape[1:]))
        return self.run(call.prep, x, out, call.counts)

    def adjoint(self, call: Call) -> Call:
        """The call computing ``call``'s backward: its op's adjoint, from the output's rows
        to the input's."""
        op = call.op.adjoint
        prep = self.prepare(call.plan, op, partial=True, device_counts=call.counts is not None,
                            in_rows=call.prep.out_rows, out_rows=call.in_rows)
        return Call(call.plan, op, call.counts, call.prep.out_rows, prep)

    def coalesced(self, group: Group, device: torch.device, *, collected: bool = False):
        """One grouped launch of the collectives issued inside, on ``group``, where the
        backend for ``device`` coalesces (NCCL); a plain sequence elsewhere.
        ``collected``: every operation inside is an all-gather, a reduce-scatter or an
        all-reduce (one kind), which torch collects and issues as one ``*_coalesced``
        collective; other operations are grouped by the backend between its start and
        end of coalescing."""
        if self.groups.coalesces(device.type):
            from torch.distributed.distributed_c10d import _coalescing_manager

            return _coalescing_manager(self.groups.process_group(group),
                                       None if collected else device)
        return contextlib.nullcontext()

    # ------------------------------------------------------------ state
    def sizes(self) -> dict[str, int]:
        """Entries in each cache (and the pool's buffers)."""
        return {"calls": len(self._calls), "templates": len(self.schedules),
                "variants": self.schedules.variants(), "programs": len(self._programs),
                "batches": len(self._batches), "tables": len(self.tables),
                "pool_buffers": len(self.pool), "events": len(self.overlap.events)}

    def host_bytes(self) -> int:
        """An estimate of the host memory the caches hold: Python objects reachable from
        them, counted once (``sys.getsizeof``; code objects included). Slow: for tests and
        the soak benchmark."""
        seen: set[int] = set()
        total = 0
        stack: list = [self._calls, self._programs, self._batches, self.schedules._templates,
                       self.tables._tables]
        while stack:
            obj = stack.pop()
            if id(obj) in seen or isinstance(obj, (type, torch.Tensor, torch.device)):
                continue
            seen.add(id(obj))
            total += sys.getsizeof(obj)
            if isinstance(obj, dict):
                stack.extend(obj.keys())
                stack.extend(obj.values())
            elif isinstance(obj, (list, tuple, set, frozenset)):
                stack.extend(obj)
            elif callable(obj) and hasattr(obj, "__code__"):
                stack.append(obj.__code__)
                stack.extend(c.cell_contents for c in (obj.__closure__ or ())
                             if _filled(c))
                if obj.__defaults__:
                    stack.extend(obj.__defaults__)
            elif hasattr(obj, "co_code"):
                stack.extend((obj.co_code, obj.co_consts))
            elif hasattr(obj, "__dict__") or hasattr(obj, "__slots__"):
                if hasattr(obj, "__dict__"):
                    stack.append(obj.__dict__)
                for cls in type(obj).__mro__:
                    for name in getattr(cls, "__slots__", ()):
                        if hasattr(obj, name):
                            stack.append(getattr(obj, name))
        return total

    def clear(self) -> None:
        """Empty every cache and the scratch pool (buffers a captured CUDA graph reads are
        freed only when the graph is: recapture graphs after this)."""
        self._calls.clear()
        self._programs.clear()
        self._batches.clear()
        self.schedules.clear()
        self.tables.clear()
        self.pool.clear()


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True
