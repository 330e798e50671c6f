"""Runs a :class:`dpx.Schedule` on torch tensors: one small handler per step kind.

The schedule says which rows move where; this module only maps each step onto a row
kernel (``dpx.kernels`` through :mod:`dpx_torch.rows`) or a ``torch.distributed``
collective. Values that depend on device counts are :mod:`dpx.expr` expressions, evaluated
here on the counts tensor with :class:`DeviceValues` (int32, no host sync, so a captured
CUDA graph replays with new counts).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from dpx import expr as X
from dpx.errors import DpxValueError
from dpx.modes import Group
from dpx.schedule import (IN, OUT, AllGather, AllReduce, BroadcastV, Copy, Place, ReduceScatter,
                          ReduceV, Ref, Schedule, Take, ZeroFrom)
from dpx_torch.groups import DpGroups
from dpx_torch.pool import BufferPool
from dpx_torch.rows import place_into, take_into, zero_from_

# torch >= 2.12 renamed the single-tensor collectives; older releases have only the old names
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def copy_rows(dst: torch.Tensor, src: torch.Tensor) -> None:
    """A staging copy (one pass)."""
    dst.copy_(src)


class DeviceValues:
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

    def binary(self, op: str, a: Any, b: Any) -> Any:
        if op == "add":
            return a + b
        if op == "sub":
            return a - b
        if op == "mul":
            return a * b
        if op == "floordiv":
            return a // b
        if op == "eq":
            return (a == b).to(torch.int32)
        if isinstance(b, int):
            return a.clamp(max=b) if op == "minimum" else a.clamp(min=b)
        if isinstance(a, int):
            return b.clamp(max=a) if op == "minimum" else b.clamp(min=a)
        return torch.minimum(a, b) if op == "minimum" else torch.maximum(a, b)

    def clip(self, a: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        return a.clamp(lo, hi)

    def cumsum_excl(self, v: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(v, 0, dtype=torch.int32) - v

    def sum(self, v: torch.Tensor) -> torch.Tensor:
        return v.sum(dtype=torch.int32).reshape(1)

    def gather(self, v: torch.Tensor, indices: tuple[int, ...]) -> torch.Tensor:
        return v[self.const(indices)]

    def index(self, v: torch.Tensor, i: Any) -> torch.Tensor:
        if not isinstance(i, int):
            raise DpxValueError("a torch schedule indexes with known ints")
        return v[i:i + 1]

    def stack(self, values: Sequence[Any]) -> torch.Tensor:
        return torch.cat([self.const(x) if isinstance(x, int) else x.reshape(1)
                          for x in values])


class Interpreter:
    """Runs schedules over one :class:`DpGroups` with scratch from one :class:`BufferPool`."""

    def __init__(self, groups: DpGroups, pool: BufferPool) -> None:
        self.groups = groups
        self.pool = pool
        self.consts: dict = {}
        self._handlers: dict[type, Callable[..., None]] = {
            Place: self._place, Take: self._take, ZeroFrom: self._zero, Copy: self._copy,
            AllGather: self._all_gather, ReduceScatter: self._reduce_scatter,
            AllReduce: self._all_reduce, BroadcastV: self._broadcast_v, ReduceV: self._reduce_v,
        }

    def run(self, sched: Schedule, inp: torch.Tensor, out: torch.Tensor,
            counts: torch.Tensor | None, scratch_key: str) -> torch.Tensor:
        """Every step of ``sched`` with ``inp`` as ``"in"`` and ``out`` as ``"out"``.
        Scratch buffers come from the pool under ``(name, scratch_key)``: valid until the
        next call with the same key, which stream order makes safe."""
        env: dict[str, torch.Tensor] = {IN: inp, OUT: out}
        rest = inp.shape[1:]
        for name, rows in sched.scratch:
            env[name] = self.pool.get((name, scratch_key), (rows, *rest), inp.dtype, inp.device)
        run = _Run(env, None if counts is None else DeviceValues(counts, self.consts))
        for step in sched.steps:
            self._handlers[type(step)](step, run)
        return out

    # ------------------------------------------------------------ local passes
    def _place(self, s: Place, run: "_Run") -> None:
        place_into(run.ref(s.src), run.value(s.start), run.value(s.count), run.ref(s.dst))

    def _take(self, s: Take, run: "_Run") -> None:
        take_into(run.ref(s.src), run.value(s.start), run.value(s.count), run.ref(s.dst))

    def _zero(self, s: ZeroFrom, run: "_Run") -> None:
        zero_from_(run.ref(s.buf), run.value(s.start))

    def _copy(self, s: Copy, run: "_Run") -> None:
        copy_rows(run.ref(s.dst), run.ref(s.src))

    # ------------------------------------------------------------ collectives
    def _group(self, g: Group) -> dist.ProcessGroup:
        return self.groups.world if g is Group.WORLD else self.groups.attn_tp

    def _all_gather(self, s: AllGather, run: "_Run") -> None:
        all_gather_single(run.ref(s.dst), run.ref(s.src), group=self._group(s.group))

    def _reduce_scatter(self, s: ReduceScatter, run: "_Run") -> None:
        reduce_scatter_single(run.ref(s.dst), run.ref(s.src), group=self._group(s.group))

    def _all_reduce(self, s: AllReduce, run: "_Run") -> None:
        dist.all_reduce(run.ref(s.buf), group=self._group(s.group))

    def _broadcast_v(self, s: BroadcastV, run: "_Run") -> None:
        buf, group, glob = run.ref(s.buf), self._group(s.group), self.groups.global_ranks
        with self._grouped(buf.device):
            for root, (f, n) in enumerate(zip(s.firsts, s.lens)):
                if n:
                    dist.broadcast(buf[f:f + n], src=glob[root], group=group)

    def _reduce_v(self, s: ReduceV, run: "_Run") -> None:
        buf, group, glob = run.ref(s.buf), self._group(s.group), self.groups.global_ranks
        with self._grouped(buf.device):
            for root, (f, n) in enumerate(zip(s.firsts, s.lens)):
                if n:
                    dist.reduce(buf[f:f + n], dst=glob[root], group=group)

    def _grouped(self, device: torch.device):
        """Group per-root NCCL operations into one launch; a plain sequence elsewhere."""
        if self.groups.backend == "nccl":
            from torch.distributed.distributed_c10d import _coalescing_manager

            return _coalescing_manager(self.groups.world, device)
        return contextlib.nullcontext()


class _Run:
    """One call's buffers and evaluated values."""

    __slots__ = ("env", "ops", "memo")

    def __init__(self, env: dict[str, torch.Tensor], ops: DeviceValues | None) -> None:
        self.env, self.ops, self.memo = env, ops, {}

    def ref(self, r: Ref) -> torch.Tensor:
        t = self.env[r.buf]
        if r.first == 0 and r.rows is None:
            return t
        return t[r.first:] if r.rows is None else t[r.first:r.first + r.rows]

    def value(self, v: Any) -> Any:
        if isinstance(v, int):
            return v
        return X.evaluate(v, self.ops, self.memo)
