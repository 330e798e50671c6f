"""Runs a :class:`dpx.Schedule` on torch tensors: one small handler per step kind.

The schedule says which rows move where; this module only maps each step onto a row
kernel (``dpx.kernels`` through :mod:`dpx_torch.rows`) or a ``torch.distributed``
collective. Values that depend on device counts are :mod:`dpx.expr` expressions, evaluated
here on the counts tensor with :class:`DeviceValues` (int32, no host sync, so a captured
CUDA graph replays with new counts).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
import torch.distributed as dist

from dpx import expr as X
from dpx.errors import DpxValueError
from dpx.modes import Group
from dpx.batch import Stage, lockstep
from dpx.schedule import (IN, OUT, AllGather, AllReduce, BroadcastV, Copy, Dequantize, Pack,
                          Place, Quantize, ReduceScatter, ReduceV, Ref, Schedule, Take, Unpack,
                          ZeroFrom)
from dpx.wire import wire_row_bytes
from dpx_torch.groups import DpGroups
from dpx_torch.pool import BufferPool
from dpx_torch.rows import pack_into, place_into, take_into, unpack_into, zero_from_
from dpx_torch.wire import dequantize_into, quantize_into

# torch >= 2.12 renamed the single-tensor collectives; older releases have only the old names
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def copy_rows(dst: torch.Tensor, src: torch.Tensor) -> None:
    """A staging copy (one pass)."""
    dst.copy_(src)


class DeviceValues(X.ArrayOps):
    """:class:`dpx.expr.ArrayOps` on an int32 device counts tensor: vectors are 1-d int32
    tensors, scalars 1-element int32 tensors (what the row kernels read), int constants
    stay Python ints. ``consts`` caches vector constants per device (made once, outside
    any graph capture, on the first call)."""

    def __init__(self, counts: torch.Tensor, consts: dict) -> None:
        self._counts = counts
        self._consts = consts

    def counts(self) -> torch.Tensor:
        return self._counts

    def coord(self, name: str) -> Any:
        raise DpxValueError(f"a torch schedule is built for a known rank; it has no {name!r} "
                            f"coordinate to evaluate")

    def const(self, value: int | tuple) -> Any:
        if isinstance(value, int):
            return value
        key = (value, self._counts.device)
        t = self._consts.get(key)
        if t is None:
            t = self._consts[key] = torch.tensor(value, dtype=torch.int32,
                                                 device=self._counts.device)
        return t

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



Getter = Callable[[dict], torch.Tensor]


def _getter(r: Ref) -> Getter:
    """A function reading ref ``r`` (a whole buffer or a row range) from a call's buffers."""
    name, lo = r.buf, r.first
    if lo == 0 and r.rows is None:
        return lambda env: env[name]
    hi = None if r.rows is None else lo + r.rows
    return lambda env: env[name][lo:hi]


class Program:
    """A schedule compiled once into bound step functions: a call only looks buffers up
    and runs them (no per-step dispatch)."""

    __slots__ = ("schedule", "_steps", "_scratch", "_interp", "by_step")

    def __init__(self, interp: "Interpreter", sched: Schedule) -> None:
        self.schedule = sched
        self._interp = interp
        self._scratch = tuple((name, rows, sched.is_wire(name)) for name, rows in sched.scratch)
        self._steps = [interp._compile(step) for step in sched.steps]
        self.by_step = dict(zip(sched.steps, self._steps))

    def bind(self, inp: torch.Tensor, out: torch.Tensor, counts: torch.Tensor | None,
             scratch_key: str) -> tuple[dict, Any]:
        """One call's buffers (``inp`` as ``"in"``, ``out`` as ``"out"``, scratch from the
        pool under ``(name, scratch_key)``: valid until the next call with the same key,
        which stream order makes safe) and its expression evaluator."""
        env: dict = {IN: inp, OUT: out}
        if self._scratch:
            pool, rest = self._interp.pool, inp.shape[1:]
            for name, rows, wire in self._scratch:
                if wire:
                    env[name] = pool.get((name, scratch_key), (rows, wire_row_bytes(rest[0])),
                                         torch.uint8, inp.device)
                else:
                    env[name] = pool.get((name, scratch_key), (rows, *rest), inp.dtype,
                                         inp.device)
        vals = None if counts is None else _Values(DeviceValues(counts, self._interp.consts))
        return env, vals

    def __call__(self, inp: torch.Tensor, out: torch.Tensor, counts: torch.Tensor | None,
                 scratch_key: str) -> torch.Tensor:
        """Every step, in order (see :meth:`bind`)."""
        env, vals = self.bind(inp, out, counts, scratch_key)
        for step in self._steps:
            step(env, vals)
        return out


_COLLECTED = (AllGather, ReduceScatter, AllReduce)


class BatchProgram:
    """Several programs run in lockstep (:func:`dpx.batch.lockstep`): each stage's local
    passes, then each batch of collectives as one grouped launch (NCCL coalescing)."""

    __slots__ = ("programs", "stages", "_interp")

    def __init__(self, interp: "Interpreter", programs: tuple[Program, ...]) -> None:
        self._interp = interp
        self.programs = programs
        self.stages: tuple[Stage, ...] = lockstep([p.schedule for p in programs])

    def __call__(self, inps, outs, counts: torch.Tensor | None, scratch_key: str) -> tuple:
        bound = [p.bind(x, o, counts, f"{scratch_key}#{i}")
                 for i, (p, x, o) in enumerate(zip(self.programs, inps, outs))]
        progs = self.programs
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
                with self._interp.coalesced(first.group, inps[0].device,
                                            collected=isinstance(first, _COLLECTED)):
                    for fn, args in items:
                        getattr(fn, "ungrouped", fn)(*args)
        return tuple(outs)


class _Values:
    """One call's evaluated expressions (shared subexpressions computed once)."""

    __slots__ = ("ops", "memo")

    def __init__(self, ops: DeviceValues) -> None:
        self.ops, self.memo = ops, {}

    def __call__(self, v: Any) -> Any:
        return X.evaluate(v, self.ops, self.memo)


def _value(v: Any) -> Callable[[Any], Any]:
    """A function giving ``v`` for a call: the int itself, or its evaluation."""
    if isinstance(v, int):
        return lambda vals: v
    return lambda vals: vals(v)


class Interpreter:
    """Compiles schedules of one :class:`DpGroups` into :class:`Program` s; scratch comes
    from one :class:`BufferPool`."""

    def __init__(self, groups: DpGroups, pool: BufferPool) -> None:
        self.groups = groups
        self.pool = pool
        self.consts: dict = {}
        self._compilers: dict[type, Callable[[Any], Callable]] = {
            Place: self._place, Take: self._take, ZeroFrom: self._zero, Copy: self._copy,
            Pack: self._pack, Unpack: self._unpack,
            AllGather: self._all_gather, ReduceScatter: self._reduce_scatter,
            AllReduce: self._all_reduce, BroadcastV: self._broadcast_v, ReduceV: self._reduce_v,
            Quantize: self._quantize, Dequantize: self._dequantize,
        }

    def compile(self, sched: Schedule) -> Program:
        return Program(self, sched)

    def run(self, sched: Schedule, inp: torch.Tensor, out: torch.Tensor,
            counts: torch.Tensor | None, scratch_key: str) -> torch.Tensor:
        """Compile and run ``sched`` once (see :class:`Program`)."""
        return Program(self, sched)(inp, out, counts, scratch_key)

    def _compile(self, step: Any) -> Callable[[dict, Any], None]:
        compiler = self._compilers.get(type(step))
        if compiler is None:
            raise DpxValueError(f"dpx_torch cannot run a {step.kind} step (its schedules use "
                                f"the per_root transport)")
        return compiler(step)

    # ------------------------------------------------------------ local passes
    # (module-level functions are looked up when a step runs, not when it is compiled)
    def _place(self, s: Place):
        src, dst, start, count = _getter(s.src), _getter(s.dst), _value(s.start), _value(s.count)
        return lambda env, vals: place_into(src(env), start(vals), count(vals), dst(env))

    def _take(self, s: Take):
        src, dst, start, count = _getter(s.src), _getter(s.dst), _value(s.start), _value(s.count)
        return lambda env, vals: take_into(src(env), start(vals), count(vals), dst(env))

    def _quantize(self, s: Quantize):
        src, dst, start, count = _getter(s.src), _getter(s.dst), _value(s.start), _value(s.count)
        return lambda env, vals: quantize_into(src(env), start(vals), count(vals), dst(env))

    def _dequantize(self, s: Dequantize):
        src, dst = _getter(s.src), _getter(s.dst)
        return lambda env, vals: dequantize_into(src(env), dst(env))

    def _zero(self, s: ZeroFrom):
        buf, start = _getter(s.buf), _value(s.start)
        return lambda env, vals: zero_from_(buf(env), start(vals))

    def _copy(self, s: Copy):
        src, dst = _getter(s.src), _getter(s.dst)
        return lambda env, vals: copy_rows(dst(env), src(env))

    def _table(self, v: Any) -> Callable[[dict, Any], torch.Tensor]:
        """A chunk-table vector as an int32 tensor on the data's device: a host tuple is
        made once per device and kept; an expression is evaluated per call."""
        if isinstance(v, tuple):
            consts = self.consts

            def const(env, vals):
                dev = env[IN].device
                t = consts.get((v, dev))
                if t is None:
                    t = consts[(v, dev)] = torch.tensor(v, dtype=torch.int32, device=dev)
                return t
            return const
        return lambda env, vals: vals(v)

    def _pack(self, s: Pack):
        src, dst, firsts, lens, block = (_getter(s.src), _getter(s.dst), self._table(s.firsts),
                                         self._table(s.lens), s.block)
        return lambda env, vals: pack_into(src(env), firsts(env, vals), lens(env, vals),
                                           block, dst(env))

    def _unpack(self, s: Unpack):
        src, dst, firsts, lens, block = (_getter(s.src), _getter(s.dst), self._table(s.firsts),
                                         self._table(s.lens), s.block)
        return lambda env, vals: unpack_into(src(env), firsts(env, vals), lens(env, vals),
                                             block, dst(env))

    # ------------------------------------------------------------ collectives
    def _group(self, g: Group) -> dist.ProcessGroup:
        return {Group.WORLD: self.groups.world, Group.ATTN_TP: self.groups.attn_tp,
                Group.REPLICA: self.groups.replica}[g]

    def _all_gather(self, s: AllGather):
        src, dst, group = _getter(s.src), _getter(s.dst), self._group(s.group)
        return lambda env, vals: all_gather_single(dst(env), src(env), group=group)

    def _reduce_scatter(self, s: ReduceScatter):
        src, dst, group = _getter(s.src), _getter(s.dst), self._group(s.group)
        return lambda env, vals: reduce_scatter_single(dst(env), src(env), group=group)

    def _all_reduce(self, s: AllReduce):
        buf, group = _getter(s.buf), self._group(s.group)
        return lambda env, vals: dist.all_reduce(buf(env), group=group)

    def _per_root(self, s: BroadcastV | ReduceV, fn_name: str, key: str):
        buf, group = _getter(s.buf), self._group(s.group)
        chunks = [(self.groups.global_ranks[root], f, n)
                  for root, (f, n) in enumerate(zip(s.firsts, s.lens)) if n]

        def ungrouped(env, vals):
            b = buf(env)
            fn = getattr(dist, fn_name)
            for root, f, n in chunks:
                fn(b[f:f + n], **{key: root}, group=group)

        def run(env, vals):
            with self._grouped(buf(env).device):
                ungrouped(env, vals)
        run.ungrouped = ungrouped  # type: ignore[attr-defined]
        return run

    def _broadcast_v(self, s: BroadcastV):
        return self._per_root(s, "broadcast", "src")

    def _reduce_v(self, s: ReduceV):
        return self._per_root(s, "reduce", "dst")

    def _grouped(self, device: torch.device):
        """Group per-root NCCL operations into one launch; a plain sequence elsewhere."""
        return self.coalesced(Group.WORLD, device)

    def coalesced(self, group: Group, device: torch.device, *, collected: bool = False):
        """One grouped launch of the NCCL operations issued inside, on ``group``; a plain
        sequence on other backends. ``collected``: every operation inside is an
        all-gather, a reduce-scatter or an all-reduce (one kind), which torch collects
        and issues as one ``*_coalesced`` collective; other operations are grouped by the
        backend between its start and end of coalescing."""
        if self.groups.backend == "nccl":
            from torch.distributed.distributed_c10d import _coalescing_manager

            return _coalescing_manager(self._group(group), None if collected else device)
        return contextlib.nullcontext()
