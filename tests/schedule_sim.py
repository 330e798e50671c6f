"""A NumPy executor of dpx schedules: every rank's steps run in lockstep, collectives
combine the ranks' buffers, and every rule a frontend relies on is checked on the way.

It is strict where the frontends are lenient: every start/count must lie inside its
buffers (the kernels would mask, the planner must not rely on it), scratch and output
buffers start as NaN (a row nobody wrote shows up), inputs are read-only (no op may modify
its input; an in-place gather's input is a view of its output), rows that a per-root
reduce leaves undefined become NaN, and at every collective all ranks must be at a
collective of the same kind, group and sizes. Device counts are checked against the
schedule's :class:`~dpx.steps.CheckCounts` rule: a violation fails the simulation.

Expressions are evaluated with :class:`NumpyValues`, a NumPy table of array operations
written here, independent of dpx's own host evaluator. Each step kind has its handler in
:data:`LOCAL` or :data:`COLLECTIVES` (tests/test_registries.py checks none is missing).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

import dpx
from dpx import expr as X
from dpx import values as V
from dpx.counts import own_entry, sources
from dpx.modes import Group
from dpx.steps import (IN, OUT, AllGather, AllGatherCounts, AllGatherV, AllReduce, AllToAll,
                       AllToAllV, BroadcastV, CheckCounts, Dequantize, DequantizeSum,
                       JoinColumns, Move, Pack, Quantize, ReduceScatter, ReduceScatterV,
                       ReduceV, Ref, SplitColumns, Unpack, Zero)
from dpx.schedule import Schedule


class NumpyValues(V.ArrayOps):
    """``dpx.values.ArrayOps`` on NumPy int64 arrays for one rank (its own table: ``+ - *
    //`` from NumPy's operators, the rest below)."""

    def __init__(self, counts: Sequence[int] | None, coords: dict[str, int],
                 own: int | None = None) -> None:
        self._counts = None if counts is None else np.asarray(counts, np.int64)
        self._coords = coords
        #: counts that ride the gather: this rank's own count, and (until they arrive)
        #: a counts vector holding only it, every other entry -1 (a read of one shows)
        self.ride_own = None
        if own is not None:
            self.ride_own = int(self._counts[own])
            self._counts = np.full(self._counts.shape, -1, np.int64)
            self._counts[own] = self.ride_own

    def ride_full(self, counts: np.ndarray) -> None:
        self._counts = counts

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
    def __init__(self, sched: Schedule, x: np.ndarray, ops: NumpyValues, rank: int) -> None:
        self.sched, self.ops, self.pc = sched, ops, 0
        rest = x.shape[1:]
        W = sched.plan.layout.world_size
        if sched.is_wide(IN):  # wide buffers: world_size narrow rows side by side
            rest = (rest[0] // W, *rest[1:])

        def shape(name: str, rows: int) -> tuple:
            return (rows, rest[0] * W, *rest[1:]) if sched.is_wide(name) else (rows, *rest)
        self.env: dict[str, np.ndarray] = {OUT: np.full(shape(OUT, sched.out_rows), np.nan)}
        if sched.in_place:
            first, rows = dpx.local_rows(sched.plan, rank, device_counts=sched.device_counts)
            assert x.shape[0] == rows, f"in-place input of {x.shape[0]} rows, slot {rows}"
            self.env[OUT][first:first + rows] = x
            self.env[IN] = self.env[OUT][first:first + rows]
        else:
            x = np.array(x, dtype=np.float64)
            x.flags.writeable = False
            self.env[IN] = x
        for name, rows in sched.scratch:
            self.env[name] = np.full(shape(name, rows), np.nan)

    def val(self, v: Any) -> Any:
        return v if isinstance(v, int) else V.evaluate(v, self.ops)

    def ref(self, r: Ref) -> np.ndarray:
        t = self.env[r.buf]
        first = self.val(r.first)
        end = t.shape[0] if r.rows is None else first + self.val(r.rows)
        assert 0 <= first <= end <= t.shape[0], f"view {r} outside {r.buf}[{t.shape[0]}]"
        return t[first:end]

    def write(self, r: Ref, value: np.ndarray) -> None:
        view = self.ref(r)
        assert view.shape == value.shape, f"{r}: writing {value.shape} into {view.shape}"
        view[...] = value  # raises for "in" (read-only) unless in place

    @property
    def current(self):
        return self.sched.steps[self.pc] if self.pc < len(self.sched.steps) else None


def fp8_round_trip(x: np.ndarray) -> np.ndarray:
    """Wire rows as values: each real row quantized and dequantized (docs/semantics.md)."""
    from reference import dequantize_fp8, quantize_fp8

    if not x.shape[0]:
        return x.copy()
    payload, scales = quantize_fp8(x.astype(np.float32), np.ones(x.shape[0], bool))
    return dequantize_fp8(payload, scales).astype(np.float64)


def _check(rank: _Rank, s: CheckCounts) -> None:
    c = np.asarray(rank.ops.counts())
    assert c.shape == (s.rule.entries,), f"{s}: counts {c}"
    assert not s.rule.problems(c.tolist()), f"{s}: {s.rule.problems(c.tolist())}"


def _move(rank: _Rank, s: Move) -> None:
    src = rank.ref(s.src)
    rows, a, b, count = (_int(rank.val(v)) for v in (s.rows, s.src_start, s.dst_start,
                                                     s.count))
    assert 0 <= count and 0 <= a and a + count <= src.shape[0] and 0 <= b and \
        b + count <= rows, f"{s}: src_start={a} dst_start={b} count={count} " \
                           f"src rows={src.shape[0]}"
    out = np.zeros((rows, *src.shape[1:]))
    out[b:b + count] = src[a:a + count]
    rank.write(s.dst, out)


def _zero(rank: _Rank, s: Zero) -> None:
    buf = rank.ref(s.buf)
    rows, first, n = (_int(rank.val(v)) for v in (s.rows, s.keep_start, s.keep_count))
    assert buf.shape[0] == rows and 0 <= first and 0 <= n and first + n <= rows, \
        f"{s}: keep [{first}, +{n}) of {buf.shape[0]}"
    keep = buf[first:first + n].copy()
    buf[...] = 0
    buf[first:first + n] = keep


def _quantize(rank: _Rank, s: Quantize) -> None:
    # a take whose rows travel as fp8 (values: the round trip)
    src, start, count = rank.ref(s.src), _int(rank.val(s.start)), _int(rank.val(s.count))
    rows = _int(rank.val(s.rows))
    assert 0 <= count <= rows and 0 <= start and start + count <= src.shape[0], str(s)
    out = np.zeros((rows, *src.shape[1:]))
    out[:count] = fp8_round_trip(src[start:start + count])
    rank.write(s.dst, out)


def _dequantize(rank: _Rank, s: Dequantize) -> None:
    rank.write(s.dst, rank.ref(s.src).copy())


def _dequantize_sum(rank: _Rank, s: DequantizeSum) -> None:
    # the wire copies' values summed in source order
    src, rows = rank.ref(s.src), _int(rank.val(s.rows))
    assert src.shape[0] == s.parts * rows, str(s)
    acc = np.zeros((rows, *src.shape[1:]))
    for p in range(s.parts):
        acc = acc + src[p * rows:(p + 1) * rows]
    rank.write(s.dst, acc)


def _chunks(rank: _Rank, s: Pack | Unpack) -> None:
    src = rank.ref(s.src)
    firsts = np.asarray(rank.val(s.firsts)).reshape(-1)
    lens = np.asarray(rank.val(s.lens)).reshape(-1)
    rows, block = _int(rank.val(s.rows)), _int(rank.val(s.block))
    out = np.zeros((rows, *src.shape[1:]))
    for r, (f, n) in enumerate(zip(firsts, lens)):
        assert 0 <= n <= block, f"{s}: chunk {r} has {n} rows, block {block}"
        if isinstance(s, Unpack):
            assert src.shape[0] == len(lens) * block and f + n <= rows, str(s)
            assert not out[f:f + n].any(), f"{s}: chunks overlap at rank {r}"
            out[f:f + n] = src[r * block:r * block + n]
        else:
            assert rows == len(lens) * block and f + n <= src.shape[0], str(s)
            out[r * block:r * block + n] = src[f:f + n]
    rank.write(s.dst, out)


def _join(rank: _Rank, s: JoinColumns) -> None:
    src = rank.ref(s.src)
    rows, count, block = (_int(rank.val(v)) for v in (s.rows, s.count, s.block))
    assert src.shape[0] == s.parts * block and count <= min(rows, block), str(s)
    out = np.zeros((rows, s.parts * src.shape[1], *src.shape[2:]))
    out[:count] = np.concatenate([src[p * block:p * block + count] for p in range(s.parts)],
                                 axis=1)
    rank.write(s.dst, out)


def _split(rank: _Rank, s: SplitColumns) -> None:
    src = rank.ref(s.src)
    count, block = _int(rank.val(s.count)), _int(rank.val(s.block))
    assert count <= min(src.shape[0], block), str(s)
    w = src.shape[1] // s.parts
    out = np.zeros((s.parts * block, w, *src.shape[2:]))
    for p in range(s.parts):
        out[p * block:p * block + count] = src[:count, p * w:(p + 1) * w]
    rank.write(s.dst, out)


#: The simulator's handler of every local step kind.
LOCAL: dict[type, Callable[[_Rank, Any], None]] = {
    CheckCounts: _check, Move: _move, Zero: _zero, Quantize: _quantize,
    Dequantize: _dequantize, DequantizeSum: _dequantize_sum, Pack: _chunks, Unpack: _chunks,
    JoinColumns: _join, SplitColumns: _split,
}


def _members(layout: dpx.DpLayout, group: Group) -> list[tuple[int, ...]]:
    if group is Group.WORLD:
        return [tuple(range(layout.world_size))]
    if group is Group.ATTN_TP:
        return list(layout.attn_tp_groups())
    return [layout.replica_ranks(d) for d in range(layout.dp_size)]


def _signature(rank: _Rank, s) -> tuple:
    if isinstance(s, AllToAllV):   # each rank receives its own share of the lens
        return s.kind, s.group, tuple(np.asarray(rank.val(s.lens)).reshape(-1).tolist())
    sig = [s.kind, s.group, s.rows]
    if isinstance(s, (BroadcastV, ReduceV, AllGatherV, ReduceScatterV)):
        sig += [tuple(np.asarray(rank.val(s.firsts)).tolist()),
                tuple(np.asarray(rank.val(s.lens)).tolist()), s.block]
    return tuple(sig)


def _all_gather(group, s0) -> None:
    srcs = [r.ref(s.src) for r, s in group]
    assert all(x.shape[0] == s0.rows for x in srcs)
    full = np.concatenate(srcs)
    for r, s in group:
        r.write(s.dst, full.copy())


def _all_gather_counts(group, s0) -> None:
    """The all-gather, and every rank's own count (the one entry of its counts vector it
    held so far): the reports ``dpx.counts.sources`` picks become each rank's counts."""
    _all_gather(group, s0)
    own = [r.ops.ride_own for r, _ in group]
    lay = group[0][0].sched.plan.layout
    for k, (r, _) in enumerate(group):
        src = sources(lay, k, shards=r.sched.plan.sharded)
        r.ops.ride_full(np.asarray([own[j] for j in src], np.int64))


def _reduce_scatter(group, s0) -> None:
    total = sum(r.ref(s.src) for r, s in group)
    for k, (r, s) in enumerate(group):
        r.write(s.dst, total[k * s0.rows:(k + 1) * s0.rows].copy())


def _all_reduce(group, s0) -> None:
    total = sum(r.ref(s.buf) for r, s in group)
    for r, s in group:
        r.write(s.buf, total.copy())


def _all_to_all(group, s0) -> None:
    srcs = [r.ref(s.src) for r, s in group]
    n, k = s0.rows, len(group)
    assert all(x.shape[0] == k * n for x in srcs), str(s0)
    for j, (r, s) in enumerate(group):
        r.write(s.dst, np.concatenate([x[j * n:(j + 1) * n] for x in srcs]))


def _all_to_all_v(group, s0) -> None:
    """Rank k receives, from every rank in order, that rank's rows ``[sum(lens[:k]),
    +lens[k])``; every rank agrees on ``lens`` and receives its own ``lens[k]``."""
    lens = [int(x) for x in np.asarray(group[0][0].val(s0.lens)).reshape(-1)]
    starts = np.concatenate([[0], np.cumsum(lens)])
    srcs = [r.ref(s.src) for r, s in group]
    assert all(x.shape[0] >= starts[-1] for x in srcs), str(s0)
    for k, (r, s) in enumerate(group):
        assert _int(r.val(s.rows)) == lens[k], f"{s0}: rank {k} receives {lens[k]} rows"
        r.write(s.dst, np.concatenate([x[starts[k]:starts[k + 1]] for x in srcs]))


def _table(group, s0) -> tuple[np.ndarray, np.ndarray]:
    return (np.asarray(group[0][0].val(s0.firsts)), np.asarray(group[0][0].val(s0.lens)))


def _broadcast_v(group, s0) -> None:
    firsts, lens = _table(group, s0)
    bufs = [r.ref(s.buf) for r, s in group]
    assert all(b.shape[0] == s0.rows for b in bufs)
    for root, (f, n) in enumerate(zip(firsts, lens)):
        for b in bufs:
            b[f:f + n] = bufs[root][f:f + n]


def _reduce_v(group, s0) -> None:
    firsts, lens = _table(group, s0)
    bufs = [r.ref(s.buf) for r, s in group]
    sums = [sum(b[f:f + n] for b in bufs) for f, n in zip(firsts, lens)]
    owned = np.zeros(s0.rows, bool)
    for f, n in zip(firsts, lens):
        owned[f:f + n] = True
    for me, b in enumerate(bufs):
        b[~owned] = np.nan
        for root, (f, n) in enumerate(zip(firsts, lens)):
            b[f:f + n] = sums[root] if root == me else np.nan


def _all_gather_v(group, s0) -> None:
    firsts, lens = _table(group, s0)
    srcs = [r.ref(s.src) for r, s in group]
    out = np.zeros((s0.rows, *srcs[0].shape[1:]))
    for root, (f, n) in enumerate(zip(firsts, lens)):
        assert n <= s0.block and srcs[root].shape[0] == s0.block
        out[f:f + n] = srcs[root][:n]
    for r, s in group:
        r.write(s.dst, out.copy())


def _reduce_scatter_v(group, s0) -> None:
    firsts, lens = _table(group, s0)
    total = sum(r.ref(s.src) for r, s in group)
    for me, (r, s) in enumerate(group):
        out = np.zeros((s0.block, *total.shape[1:]))
        f, n = firsts[me], lens[me]
        out[:n] = total[f:f + n]
        r.write(s.dst, out)


#: The simulator's handler of every collective kind.
COLLECTIVES: dict[type, Callable[[list, Any], None]] = {
    AllGather: _all_gather, AllGatherCounts: _all_gather_counts,
    ReduceScatter: _reduce_scatter, AllReduce: _all_reduce, AllToAll: _all_to_all,
    AllToAllV: _all_to_all_v,
    BroadcastV: _broadcast_v, ReduceV: _reduce_v, AllGatherV: _all_gather_v,
    ReduceScatterV: _reduce_scatter_v,
}


def _collective(ranks: list[_Rank], layout: dpx.DpLayout) -> None:
    steps = [r.current for r in ranks]
    sigs = {_signature(r, s) for r, s in zip(ranks, steps)}
    assert len(sigs) == 1, f"ranks disagree at a collective: {sigs}"
    s0 = steps[0]
    for members in _members(layout, s0.group):
        COLLECTIVES[type(s0)]([(ranks[m], steps[m]) for m in members], s0)
    for r in ranks:
        r.pc += 1


def simulate(schedules: Sequence[Schedule], inputs: Sequence[np.ndarray],
             counts: Sequence[int] | None) -> list[np.ndarray]:
    """Run rank ``r``'s ``schedules[r]`` on ``inputs[r]`` (device ``counts`` when the
    schedules read them); returns every rank's output. An in-place schedule's input is
    first copied into its output at the rank's rows (``dpx.local_rows``: what the caller
    wrote into ``local_slot``), the rest of the output is NaN."""
    layout = schedules[0].plan.layout
    ranks = []
    for r, (sched, x) in enumerate(zip(schedules, inputs)):
        c = layout.coords(r)
        coords = {X.Coord.RANK: r, X.Coord.DP: c.attn_dp_rank, X.Coord.TP: c.attn_tp_rank,
                  X.Coord.CP: c.attn_cp_rank}
        own = None
        if any(isinstance(s, AllGatherCounts) for s in sched.steps):
            own = own_entry(c.attn_dp_rank, c.attn_cp_rank, layout.cp_size,
                            shards=sched.plan.sharded)
        ranks.append(_Rank(sched, x, NumpyValues(counts, coords, own), r))
    while True:
        for r in ranks:
            while r.current is not None and not r.current.collective:
                LOCAL[type(r.current)](r, r.current)
                r.pc += 1
        done = [r.current is None for r in ranks]
        if all(done):
            break
        assert not any(done), "some ranks finished while others wait in a collective"
        _collective(ranks, layout)
    return [r.env[OUT] for r in ranks]
