"""A NumPy executor of dpx schedules: every rank's steps run in lockstep, collectives
combine the ranks' buffers, and every rule a frontend relies on is checked on the way.

It is strict where the frontends are lenient: every start/count must lie inside its
buffers (the kernels would mask, the planner must not rely on it), scratch and output
buffers start as NaN (a row nobody wrote shows up), inputs are read-only (no op may modify
its input), rows that a per-root reduce leaves undefined become NaN, and at every
collective all ranks must be at a collective of the same kind, group and sizes.

Expressions are evaluated with :class:`NumpyValues`, a NumPy table of array operations
written here, independent of dpx's own host evaluator.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

import dpx
from dpx import expr as X
from dpx.modes import Group
from dpx.schedule import (IN, OUT, AllGather, AllGatherV, AllReduce, BroadcastV, Copy, Pack,
                          Place, Quantize, Dequantize, ReduceScatter, ReduceScatterV, ReduceV,
                          Ref, Schedule, Take,
                          Unpack, ZeroFrom)


class NumpyValues(X.ArrayOps):
    """``dpx.expr.ArrayOps`` on NumPy int64 arrays for one rank (its own table: ``+ - *
    //`` from NumPy's operators, the rest below)."""

    def __init__(self, counts: Sequence[int] | None, coords: dict[str, int]) -> None:
        self._counts = None if counts is None else np.asarray(counts, np.int64)
        self._coords = coords

    def counts(self):
        assert self._counts is not None, "schedule reads device counts none were given"
        return self._counts

    def coord(self, name):
        return np.int64(self._coords[name])

    def const(self, value):
        return np.asarray(value, np.int64)

    def minimum(self, a, b):
        return np.minimum(a, b)

    def maximum(self, a, b):
        return np.maximum(a, b)

    def eq(self, a, b):
        return (np.asarray(a) == np.asarray(b)).astype(np.int64)

    def clip(self, a, lo, hi):
        return np.clip(a, lo, hi)

    def cumsum_excl(self, v):
        return np.cumsum(v) - v

    def group_sum(self, v, k):
        return np.asarray(v).reshape(-1, k).sum(axis=1)

    def group_cumsum_excl(self, v, k):
        g = np.asarray(v).reshape(-1, k)
        return (np.cumsum(g, axis=1) - g).reshape(-1)


    def gather(self, v, indices):
        return v[np.asarray(indices)]

    def index(self, v, i):
        return v[int(i)]



def _int(v: Any) -> int:
    return int(np.asarray(v))


class _Rank:
    def __init__(self, sched: Schedule, x: np.ndarray, ops: NumpyValues) -> None:
        self.sched, self.ops, self.pc = sched, ops, 0
        x = np.array(x, dtype=np.float64)
        x.flags.writeable = False
        self.env: dict[str, np.ndarray] = {IN: x}
        rest = x.shape[1:]
        self.env[OUT] = np.full((sched.out_rows, *rest), np.nan)
        for name, rows in sched.scratch:
            self.env[name] = np.full((rows, *rest), np.nan)

    def val(self, v: Any) -> Any:
        return v if isinstance(v, int) else X.evaluate(v, self.ops)

    def ref(self, r: Ref) -> np.ndarray:
        t = self.env[r.buf]
        end = t.shape[0] if r.rows is None else r.first + r.rows
        assert 0 <= r.first <= end <= t.shape[0], f"view {r} outside {r.buf}[{t.shape[0]}]"
        return t[r.first:end]

    def write(self, r: Ref, value: np.ndarray) -> None:
        view = self.ref(r)
        assert view.shape == value.shape, f"{r}: writing {value.shape} into {view.shape}"
        view[...] = value  # raises for "in" (read-only)

    @property
    def current(self):
        return self.sched.steps[self.pc] if self.pc < len(self.sched.steps) else None


def _fp8_round_trip(x: np.ndarray) -> np.ndarray:
    """Wire rows as values: each real row quantized and dequantized (docs/semantics.md)."""
    from reference import dequantize_fp8, quantize_fp8

    if not x.shape[0]:
        return x.copy()
    payload, scales = quantize_fp8(x.astype(np.float32), np.ones(x.shape[0], bool))
    return dequantize_fp8(payload, scales).astype(np.float64)


def _local(rank: _Rank, s) -> None:
    if isinstance(s, Quantize):  # a take whose rows travel as fp8 (values: the round trip)
        src, start, count = rank.ref(s.src), _int(rank.val(s.start)), _int(rank.val(s.count))
        assert 0 <= count <= s.rows and 0 <= start and start + count <= src.shape[0], str(s)
        out = np.zeros((s.rows, *src.shape[1:]))
        out[:count] = _fp8_round_trip(src[start:start + count])
        rank.write(s.dst, out)
    elif isinstance(s, Dequantize):
        rank.write(s.dst, rank.ref(s.src).copy())
    elif isinstance(s, (Place, Take)):
        src, start, count = rank.ref(s.src), _int(rank.val(s.start)), _int(rank.val(s.count))
        out = np.zeros((s.rows, *src.shape[1:]))
        if isinstance(s, Place):
            assert 0 <= count <= src.shape[0] and 0 <= start and start + count <= s.rows, \
                f"{s}: start={start} count={count} src rows={src.shape[0]}"
            out[start:start + count] = src[:count]
        else:
            assert 0 <= count <= s.rows and 0 <= start and start + count <= src.shape[0], \
                f"{s}: start={start} count={count} src rows={src.shape[0]}"
            out[:count] = src[start:start + count]
        rank.write(s.dst, out)
    elif isinstance(s, ZeroFrom):
        buf, start = rank.ref(s.buf), _int(rank.val(s.start))
        assert buf.shape[0] == s.rows and 0 <= start <= s.rows, f"{s}: start={start}"
        buf[start:] = 0
    elif isinstance(s, Copy):
        src = rank.ref(s.src)
        assert src.shape[0] == s.rows
        rank.write(s.dst, src.copy())
    elif isinstance(s, (Pack, Unpack)):
        src = rank.ref(s.src)
        firsts = np.asarray(rank.val(s.firsts)).reshape(-1)
        lens = np.asarray(rank.val(s.lens)).reshape(-1)
        out = np.zeros((s.rows, *src.shape[1:]))
        for r, (f, n) in enumerate(zip(firsts, lens)):
            assert 0 <= n <= s.block, f"{s}: chunk {r} has {n} rows, block {s.block}"
            if isinstance(s, Unpack):
                assert src.shape[0] == len(lens) * s.block and f + n <= s.rows, str(s)
                assert not out[f:f + n].any(), f"{s}: chunks overlap at rank {r}"
                out[f:f + n] = src[r * s.block:r * s.block + n]
            else:
                assert s.rows == len(lens) * s.block and f + n <= src.shape[0], str(s)
                out[r * s.block:r * s.block + n] = src[f:f + n]
        rank.write(s.dst, out)
    else:
        raise AssertionError(f"unknown local step {s!r}")


def _members(layout: dpx.DpLayout, group: Group) -> list[tuple[int, ...]]:
    if group is Group.WORLD:
        return [tuple(range(layout.world_size))]
    if group is Group.ATTN_TP:
        return list(layout.attn_tp_groups())
    return [layout.replica_ranks(d) for d in range(layout.dp_size)]


def _signature(rank: _Rank, s) -> tuple:
    sig = [s.kind, s.group, s.rows]
    if isinstance(s, (BroadcastV, ReduceV, AllGatherV, ReduceScatterV)):
        sig += [tuple(np.asarray(rank.val(s.firsts)).tolist()),
                tuple(np.asarray(rank.val(s.lens)).tolist()), s.block]
    return tuple(sig)


def _collective(ranks: list[_Rank], layout: dpx.DpLayout) -> None:
    steps = [r.current for r in ranks]
    sigs = {_signature(r, s) for r, s in zip(ranks, steps)}
    assert len(sigs) == 1, f"ranks disagree at a collective: {sigs}"
    s0 = steps[0]
    for members in _members(layout, s0.group):
        group = [(ranks[m], steps[m]) for m in members]
        if isinstance(s0, AllGather):
            srcs = [r.ref(s.src) for r, s in group]
            assert all(x.shape[0] == s0.rows for x in srcs)
            full = np.concatenate(srcs)
            for r, s in group:
                r.write(s.dst, full.copy())
        elif isinstance(s0, ReduceScatter):
            total = sum(r.ref(s.src) for r, s in group)
            for k, (r, s) in enumerate(group):
                r.write(s.dst, total[k * s0.rows:(k + 1) * s0.rows].copy())
        elif isinstance(s0, AllReduce):
            total = sum(r.ref(s.buf) for r, s in group)
            for r, s in group:
                r.write(s.buf, total.copy())
        elif isinstance(s0, (BroadcastV, ReduceV)):
            firsts = np.asarray(group[0][0].val(s0.firsts))
            lens = np.asarray(group[0][0].val(s0.lens))
            bufs = [r.ref(s.buf) for r, s in group]
            assert all(b.shape[0] == s0.rows for b in bufs)
            if isinstance(s0, BroadcastV):
                for root, (f, n) in enumerate(zip(firsts, lens)):
                    for b in bufs:
                        b[f:f + n] = bufs[root][f:f + n]
            else:
                sums = [sum(b[f:f + n] for b in bufs) for f, n in zip(firsts, lens)]
                owned = np.zeros(s0.rows, bool)
                for f, n in zip(firsts, lens):
                    owned[f:f + n] = True
                for me, b in enumerate(bufs):
                    b[~owned] = np.nan
                    for root, (f, n) in enumerate(zip(firsts, lens)):
                        b[f:f + n] = sums[root] if root == me else np.nan
        elif isinstance(s0, AllGatherV):
            firsts = np.asarray(group[0][0].val(s0.firsts))
            lens = np.asarray(group[0][0].val(s0.lens))
            srcs = [r.ref(s.src) for r, s in group]
            out = np.zeros((s0.rows, *srcs[0].shape[1:]))
            for root, (f, n) in enumerate(zip(firsts, lens)):
                assert n <= s0.block and srcs[root].shape[0] == s0.block
                out[f:f + n] = srcs[root][:n]
            for r, s in group:
                r.write(s.dst, out.copy())
        elif isinstance(s0, ReduceScatterV):
            firsts = np.asarray(group[0][0].val(s0.firsts))
            lens = np.asarray(group[0][0].val(s0.lens))
            total = sum(r.ref(s.src) for r, s in group)
            for me, (r, s) in enumerate(group):
                out = np.zeros((s0.block, *total.shape[1:]))
                f, n = firsts[me], lens[me]
                out[:n] = total[f:f + n]
                r.write(s.dst, out)
        else:
            raise AssertionError(f"unknown collective {s0!r}")
    for r in ranks:
        r.pc += 1


def simulate(schedules: Sequence[Schedule], inputs: Sequence[np.ndarray],
             counts: Sequence[int] | None) -> list[np.ndarray]:
    """Run rank ``r``'s ``schedules[r]`` on ``inputs[r]`` (device ``counts`` when the
    schedules read them); returns every rank's output."""
    layout = schedules[0].plan.layout
    ranks = []
    for r, (sched, x) in enumerate(zip(schedules, inputs)):
        c = layout.coords(r)
        coords = {X.Coord.RANK: r, X.Coord.DP: c.attn_dp_rank, X.Coord.TP: c.attn_tp_rank,
                  X.Coord.CP: c.attn_cp_rank}
        ranks.append(_Rank(sched, x, NumpyValues(counts, coords)))
    while True:
        for r in ranks:
            while r.current is not None and not r.current.collective:
                _local(r, r.current)
                r.pc += 1
        done = [r.current is None for r in ranks]
        if all(done):
            break
        assert not any(done), "some ranks finished while others wait in a collective"
        _collective(ranks, layout)
    return [r.env[OUT] for r in ranks]
