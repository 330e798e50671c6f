"""Runs a schedule variant (:class:`dpx.schedule.Variant`) on torch tensors.

Layer: runner. Imports dpx, the shims, passes and transports layers and the modules before
it in its own row (docs/semantics.md, "Where things live").

A :class:`Program` is a variant compiled once: one *binder* per step
(:data:`dpx_torch.binders.BINDERS`), each turning a step into a function of one call's
buffers.

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

from typing import Any

import torch

from dpx import expr as X
from dpx import values as V
from dpx.batch import Stage, lockstep
from dpx.errors import DpxValueError
from dpx.lru import LRU
from dpx.schedule import Variant
from dpx.steps import AllGather, AllReduce, ReduceScatter
from dpx_torch.binders import BINDERS, Bind, CallContext, RunnerView, StepFn

__all__ = ["BatchProgram", "DeviceTables", "DeviceValues", "flat_counts", "FreshTables",
           "PreparedCall", "Program", "tables_for_call"]


class DeviceTables:
    """Device int32 copies of host tuples (index vectors, chunk tables), per device: least
    recently used first out beyond ``max_entries``. A tuple that a captured graph reads
    must have been made before the capture (a warm-up call makes it)."""

    def __init__(self, *, max_entries: int = 512) -> None:
        self.max_entries = max_entries
        self._tables = LRU(max_entries)

    def get(self, values: tuple, device: torch.device) -> torch.Tensor:
        key = (values, device)
        t = self._tables.hit(key)
        if t is None:
            t = self._tables.put(key, torch.tensor(values, dtype=torch.int32, device=device))
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

    def prepare(self, hv: tuple, params: tuple[int | None, int], context: CallContext,
                scratch_key: str, need: int, exact: bool) -> "PreparedCall":
        return PreparedCall(self, hv, params, context, scratch_key, need, exact)


class PreparedCall:
    """One call's structure, decided once (see the module docstring): ``run(x, out,
    counts)`` runs its bound steps. ``need`` / ``exact``: the input rows it takes (at
    least, or exactly); ``out_rows``: the output's rows."""

    __slots__ = ("program", "values", "params", "context", "scratch_key", "need", "exact",
                 "out_rows", "steps", "scratch", "_pool_keys")

    def __init__(self, program: Program, hv: tuple, params: tuple[int | None, int],
                 context: CallContext, scratch_key: str, need: int, exact: bool) -> None:
        self.program, self.values, self.params, self.context = program, hv, params, context
        self.scratch_key, self.need, self.exact = scratch_key, need, exact
        self.out_rows = params[1]
        self._bind()

    @property
    def variant(self) -> Variant:
        return self.program.variant

    @property
    def out_wire(self) -> bool:
        return self.context.out_wire

    def _bind(self) -> None:
        cx, prog = self.context, self.program
        scratch: dict[str, torch.Tensor] = {}
        keys = []
        if prog.scratch:
            pool = cx.runner.pool
            hv = self.values
            for name, rows, wire in prog.scratch:
                n = rows if type(rows) is int else hv[prog.variant.host_index[id(rows)]]
                key = (name, self.scratch_key)
                if wire:
                    scratch[name] = pool.get(key, (n, cx.wire_width), torch.uint8, cx.device)
                    keys.append((key, torch.uint8))
                else:
                    scratch[name] = pool.get(key, cx.buffer_shape(
                        n, name in prog.variant.wide_bufs), cx.dtype, cx.device)
                    keys.append((key, cx.dtype))
        self.scratch = scratch
        # a traced call is bound afresh every time: nothing to refresh
        self._pool_keys = tuple(keys) if keys and not torch.compiler.is_compiling() else ()
        b = Bind(prog.variant, self.values, cx, self.params[0], self.params[1], scratch)
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
        cx = self.context
        pool = cx.runner.pool
        if not all(pool.holds(key, dtype, cx.device, self.scratch[name])
                   for (key, dtype), (name, _, _) in zip(self._pool_keys,
                                                         self.program.scratch)):
            self._bind()
        if cx.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            for key, dtype in self._pool_keys:
                pool.capture(key, dtype, cx.device)

    def new_out(self, x: torch.Tensor) -> torch.Tensor:
        """A new output for the input ``x``: wire rows (uint8) or rows of ``x``'s dtype."""
        if self.context.out_wire:
            return x.new_empty((self.out_rows, self.context.out_width), dtype=torch.uint8)
        return x.new_empty((self.out_rows, *self.context.out_rest))

    def device_values(self, counts: torch.Tensor | None) -> DeviceValues | None:
        if counts is None:
            return None
        return DeviceValues(counts, self.context.tables, self.params)

    def one_step(self) -> StepFn | None:
        """The bound step ``step(x, out, None)`` that is the whole of a host-counts run,
        when there is one (one step and no pooled scratch to refresh), else None."""
        return self.steps[0] if len(self.steps) == 1 and not self._pool_keys else None

    def run(self, x: torch.Tensor, out: torch.Tensor,
            counts: torch.Tensor | None) -> torch.Tensor:
        """Every step, in order."""
        if self._pool_keys:
            self.refresh()
        dv = None if counts is None else DeviceValues(counts, self.context.tables, self.params)
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
        dv = DeviceValues(own, self.context.tables, self.params, n_local)
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

    def __init__(self, runner: RunnerView, variants: tuple[Variant, ...]) -> None:
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
