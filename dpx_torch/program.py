"""Runs a schedule variant (:class:`dpx.schedule.Variant`) on torch tensors: one small
compiler per step kind (:data:`COMPILERS`), each turning a step into a function of one
call's buffers and values.

The planner says which rows move where; this module only maps each step onto a row
kernel (``dpx.kernels`` through :mod:`dpx_torch.rows`) or a ``torch.distributed``
collective. A variant's values come in two kinds: host values of the call (one tuple,
computed by the variant's generated function from the plan's counts and the call's
sizes) and values that read device counts, evaluated here on the counts tensor with
:class:`DeviceValues` (int32, no host sync, so a captured CUDA graph replays with new
counts). A program is compiled once per variant and serves every call of it.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.distributed as dist

from dpx import expr as X
from dpx.batch import Stage, lockstep
from dpx.errors import DpxValueError
from dpx.modes import Group
from dpx.schedule import Variant
from dpx.steps import (IN, OUT, AllGather, AllReduce, BroadcastV, CheckCounts, Dequantize,
                       Move, Pack, Quantize, ReduceScatter, ReduceV, Ref, Step, Unpack, Zero)
from dpx.wire import wire_row_bytes
from dpx_torch.rows import move_into, pack_into, unpack_into, zero_into
from dpx_torch.wire import dequantize_into, quantize_into

__all__ = [
    "all_gather_single", "BatchProgram", "COMPILERS", "DeviceTables", "DeviceValues",
    "FreshTables", "Getter", "Program", "reduce_scatter_single", "StepFn", "tables_for_call"
]

if TYPE_CHECKING:
    from dpx_torch.runner import Runner

# torch >= 2.12 renamed the single-tensor collectives; older releases have only the old names
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class DeviceTables:
    """Device int32 copies of host tuples (index vectors, chunk tables), per device: least
    recently used first out beyond ``max_entries``. A tuple that a captured graph reads
    must have been made before the capture (a warm-up call makes it)."""

    def __init__(self, *, max_entries: int = 512) -> None:
        self.max_entries = max_entries
        self._tables: OrderedDict[tuple, torch.Tensor] = OrderedDict()

    def get(self, values: tuple, device: torch.device) -> torch.Tensor:
        key = (values, device)
        t = self._tables.get(key)
        if t is None:
            t = self._tables[key] = torch.tensor(values, dtype=torch.int32, device=device)
            if len(self._tables) > self.max_entries:
                self._tables.popitem(last=False)
        else:
            self._tables.move_to_end(key)
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


def tables_for_call(tables: DeviceTables) -> DeviceTables | FreshTables:
    return FreshTables() if torch.compiler.is_compiling() else tables


class DeviceValues(X.ArrayOps):
    """:class:`dpx.expr.ArrayOps` on an int32 device counts tensor: vectors are 1-d int32
    tensors, scalars 1-element int32 tensors (what the row kernels read), int constants
    stay Python ints; constant vectors come from the communicator's :class:`DeviceTables`.
    One instance per call: common subexpressions are evaluated once."""

    __slots__ = ("_counts", "_tables", "_params", "memo")

    def __init__(self, counts: torch.Tensor, tables: DeviceTables | FreshTables,
                 params: tuple[int | None, int]) -> None:
        self._counts, self._tables, self._params = counts, tables, params
        self.memo: dict = {}

    def __call__(self, v: Any) -> Any:
        return X.evaluate(v, self, self.memo)

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


#: ``fn(env, host values, device values)``: one compiled step.
StepFn = Callable[[dict, tuple, Any], None]
Getter = Callable[[tuple, Any], Any]


class _Compiler:
    """What a step compiler needs: the variant (for its host values), the runner (groups,
    tables, flags)."""

    def __init__(self, variant: Variant, runner: "Runner") -> None:
        self.variant, self.runner = variant, runner

    def value(self, v: Any) -> Getter:
        """A function giving ``v`` for a call: the int itself, its host value, or its
        evaluation on the device counts."""
        if v is None or isinstance(v, int):
            return lambda hv, dv: v
        i = self.variant.host_index.get(id(v))
        if i is not None:
            return lambda hv, dv: hv[i]
        if isinstance(v, tuple):
            return lambda hv, dv: v
        return lambda hv, dv: dv(v)

    def ref(self, r: Ref) -> Callable[[dict, tuple, Any], torch.Tensor]:
        """A function reading ref ``r`` (a whole buffer or a row range) from a call."""
        name = r.buf
        if isinstance(r.first, int) and r.first == 0 and r.rows is None:
            return lambda env, hv, dv: env[name]
        first, rows = self.value(r.first), self.value(r.rows)
        if r.rows is None:
            return lambda env, hv, dv: env[name][first(hv, dv):]

        def view(env, hv, dv):
            lo = first(hv, dv)
            return env[name][lo:lo + rows(hv, dv)]
        return view

    def table(self, v: Any) -> Callable[[dict, tuple, Any], torch.Tensor]:
        """A chunk-table vector as an int32 tensor on the data's device (host tuples from
        the communicator's tables; device values evaluated per call)."""
        get, runner = self.value(v), self.runner
        if isinstance(v, tuple) or self.variant.host_index.get(id(v)) is not None:
            return lambda env, hv, dv: tables_for_call(runner.tables).get(tuple(get(hv, dv)),
                                                                          env[IN].device)
        return lambda env, hv, dv: get(hv, dv).reshape(-1)

    def group(self, g: Group) -> dist.ProcessGroup:
        return self.runner.groups.process_group(g)


# ---------------------------------------------------------------- local passes
# (module-level functions are looked up when a step runs, not when it is compiled)
def _check(s: CheckCounts, c: _Compiler) -> StepFn:
    flags = c.runner.flags
    return lambda env, hv, dv: flags.check(dv.counts(), s)


def _move(s: Move, c: _Compiler) -> StepFn:
    src, dst = c.ref(s.src), c.ref(s.dst)
    a, b, n = c.value(s.src_start), c.value(s.dst_start), c.value(s.count)
    return lambda env, hv, dv: move_into(src(env, hv, dv), a(hv, dv), b(hv, dv), n(hv, dv),
                                         dst(env, hv, dv))


def _zero(s: Zero, c: _Compiler) -> StepFn:
    buf, a, n = c.ref(s.buf), c.value(s.keep_start), c.value(s.keep_count)
    return lambda env, hv, dv: zero_into(buf(env, hv, dv), a(hv, dv), n(hv, dv))


def _quantize(s: Quantize, c: _Compiler) -> StepFn:
    src, dst, a, n = c.ref(s.src), c.ref(s.dst), c.value(s.start), c.value(s.count)
    return lambda env, hv, dv: quantize_into(src(env, hv, dv), a(hv, dv), n(hv, dv),
                                             dst(env, hv, dv))


def _dequantize(s: Dequantize, c: _Compiler) -> StepFn:
    src, dst = c.ref(s.src), c.ref(s.dst)
    return lambda env, hv, dv: dequantize_into(src(env, hv, dv), dst(env, hv, dv))


def _pack(s: Pack, c: _Compiler) -> StepFn:
    src, dst, firsts, lens, block = (c.ref(s.src), c.ref(s.dst), c.table(s.firsts),
                                     c.table(s.lens), c.value(s.block))
    return lambda env, hv, dv: pack_into(src(env, hv, dv), firsts(env, hv, dv),
                                         lens(env, hv, dv), block(hv, dv), dst(env, hv, dv))


def _unpack(s: Unpack, c: _Compiler) -> StepFn:
    src, dst, firsts, lens, block = (c.ref(s.src), c.ref(s.dst), c.table(s.firsts),
                                     c.table(s.lens), c.value(s.block))
    return lambda env, hv, dv: unpack_into(src(env, hv, dv), firsts(env, hv, dv),
                                           lens(env, hv, dv), block(hv, dv), dst(env, hv, dv))


# ---------------------------------------------------------------- collectives
def _all_gather(s: AllGather, c: _Compiler) -> StepFn:
    src, dst, group = c.ref(s.src), c.ref(s.dst), c.group(s.group)
    return lambda env, hv, dv: all_gather_single(dst(env, hv, dv), src(env, hv, dv),
                                                 group=group)


def _reduce_scatter(s: ReduceScatter, c: _Compiler) -> StepFn:
    src, dst, group = c.ref(s.src), c.ref(s.dst), c.group(s.group)
    return lambda env, hv, dv: reduce_scatter_single(dst(env, hv, dv), src(env, hv, dv),
                                                     group=group)


def _all_reduce(s: AllReduce, c: _Compiler) -> StepFn:
    buf, group = c.ref(s.buf), c.group(s.group)
    return lambda env, hv, dv: dist.all_reduce(buf(env, hv, dv), group=group)


def _per_root(fn_name: str, key: str) -> Callable[[BroadcastV | ReduceV, _Compiler], StepFn]:
    def compile_(s: BroadcastV | ReduceV, c: _Compiler) -> StepFn:
        buf, group = c.ref(s.buf), c.group(s.group)
        firsts, lens = c.value(s.firsts), c.value(s.lens)
        roots = c.runner.groups.global_ranks
        runner = c.runner

        def ungrouped(env, hv, dv):
            b = buf(env, hv, dv)
            fn = getattr(dist, fn_name)
            for root, (f, n) in enumerate(zip(firsts(hv, dv), lens(hv, dv))):
                if n:  # every rank skips the same roots: the table is the same everywhere
                    fn(b[f:f + n], **{key: roots[root]}, group=group)

        def run(env, hv, dv):
            with runner.coalesced(s.group, buf(env, hv, dv).device):
                ungrouped(env, hv, dv)
        run.ungrouped = ungrouped  # type: ignore[attr-defined]
        return run
    return compile_


#: The torch frontend's compiler of every step kind its schedules hold (the per-root
#: transport: :func:`dpx.steps.kinds_for`).
COMPILERS: dict[type[Step], Callable[[Any, _Compiler], StepFn]] = {
    CheckCounts: _check, Move: _move, Zero: _zero, Quantize: _quantize,
    Dequantize: _dequantize, Pack: _pack, Unpack: _unpack,
    AllGather: _all_gather, ReduceScatter: _reduce_scatter, AllReduce: _all_reduce,
    BroadcastV: _per_root("broadcast", "src"), ReduceV: _per_root("reduce", "dst"),
}


class Program:
    """A variant compiled once into bound step functions: a call looks its buffers up
    and runs them (no per-step dispatch)."""

    __slots__ = ("variant", "steps", "by_step", "_scratch", "_runner")

    def __init__(self, runner: "Runner", variant: Variant) -> None:
        self.variant, self._runner = variant, runner
        comp = _Compiler(variant, runner)
        self._scratch = tuple((name, comp.value(rows), name in variant.wire_bufs)
                              for name, rows in variant.scratch)
        fns = []
        for step in variant.steps:
            compiler = COMPILERS.get(type(step))
            if compiler is None:
                raise DpxValueError(f"dpx_torch cannot run a {step.kind} step (its schedules "
                                    f"use the per_root transport)")
            fns.append(compiler(step, comp))
        self.steps = tuple(fns)
        self.by_step = dict(zip(variant.steps, fns))

    def bind(self, inp: torch.Tensor, out: torch.Tensor, counts: torch.Tensor | None,
             hv: tuple, params: tuple[int | None, int], scratch_key: str) -> tuple:
        """One call's buffers (``inp`` as ``"in"``, ``out`` as ``"out"``, scratch from the
        pool under ``(name, scratch_key)``: valid until the next call with the same key,
        which stream order makes safe), host values and device evaluator."""
        env: dict = {IN: inp, OUT: out}
        dv = (None if counts is None else
              DeviceValues(counts, tables_for_call(self._runner.tables), params))
        if self._scratch:
            pool, rest = self._runner.pool, inp.shape[1:]
            for name, rows, wire in self._scratch:
                n = rows(hv, dv)
                if wire:
                    env[name] = pool.get((name, scratch_key), (n, wire_row_bytes(rest[0])),
                                         torch.uint8, inp.device)
                else:
                    env[name] = pool.get((name, scratch_key), (n, *rest), inp.dtype,
                                         inp.device)
        return env, hv, dv

    def __call__(self, inp: torch.Tensor, out: torch.Tensor, counts: torch.Tensor | None,
                 hv: tuple, params: tuple[int | None, int], scratch_key: str) -> torch.Tensor:
        """Every step, in order (see :meth:`bind`)."""
        args = self.bind(inp, out, counts, hv, params, scratch_key)
        for step in self.steps:
            step(*args)
        return out


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
    """Several programs run in lockstep (:func:`dpx.batch.lockstep`): each stage's local
    passes, then each batch of collectives as one grouped launch (NCCL coalescing)."""

    __slots__ = ("programs", "stages", "_runner")

    def __init__(self, runner: "Runner", programs: tuple[Program, ...]) -> None:
        self._runner = runner
        self.programs = programs
        self.stages: tuple[Stage, ...] = lockstep([p.variant for p in programs])

    def __call__(self, calls: list[tuple], scratch_key: str) -> tuple:
        """``calls``: per program ``(inp, out, counts, host values, params)``."""
        bound = [p.bind(*call, f"{scratch_key}#{i}")
                 for i, (p, call) in enumerate(zip(self.programs, calls))]
        progs, device = self.programs, calls[0][0].device
        for stage in self.stages:
            for i, step in stage.local:
                progs[i].by_step[step](*bound[i])
            for batch in stage.batches:
                items = [(progs[i].by_step[step], bound[i]) for i, step in batch.items]
                if len(items) == 1:
                    fn, args = items[0]
                    fn(*args)
                    continue
                first = batch.items[0][1]
                collected = isinstance(first, _COLLECTED)
                for part in (_by_dtype(items, [calls[i][0].dtype for i, _ in batch.items])
                             if isinstance(first, _ONE_DTYPE) else (items,)):
                    if len(part) == 1:
                        part[0][0](*part[0][1])
                        continue
                    with self._runner.coalesced(first.group, device, collected=collected):
                        for fn, args in part:
                            getattr(fn, "ungrouped", fn)(*args)
        return tuple(call[1] for call in calls)
