"""The cost model's estimate of a mode in closed form, from the counts: what
:func:`dpx.cost.estimate` computes by pricing every rank's schedules, without building
them (what the cost policy runs every step; ``tests/test_pricing.py`` checks on a fuzz of
plans that both give the same numbers exactly).

For each op of a step (``gather(partial=True)`` on inputs of the real rows, then
``reduce_scatter`` of the global buffer) the route (:func:`dpx.routes.choose_route`)
fixes the collectives (the same on every rank) and, per rank, the local passes; the
estimate keeps the most local bytes of any rank. Without context parallelism every sum
below is one builtin reduction over the replicas; with CP ranks every rank is priced in
turn, as its schedule would be.
"""

from __future__ import annotations

from typing import Sequence

from dpx.cost import CostModel, ModeEstimate, OpEstimate, op_estimate
from dpx.layout import DpLayout
from dpx.modes import Op, PaddingMode, Transport
from dpx.routes import Route

__all__ = ["cheapest", "estimate_counts", "MODE_ORDER", "mode_seconds"]

_SUM, _EQUAL, _UNPACK, _RAGGED, _PER_ROOT = (Route.SUM_SLOTS, Route.EQUAL_BLOCKS,
                                             Route.BLOCKS_UNPACK, Route.RAGGED, Route.PER_ROOT)


def _clip(x: int, hi: int) -> int:
    return 0 if x < 0 else (hi if x > hi else x)


class _Shape:
    """The numbers of one mode for given counts: slots, blocks, the route."""

    __slots__ = ("lay", "mode", "n", "a", "shards", "S", "G", "B", "route", "transport")

    def __init__(self, lay: DpLayout, mode: PaddingMode, n: Sequence[int],
                 a: Sequence[int], shards: Sequence[Sequence[int]] | None,
                 transport: Transport) -> None:
        self.lay, self.mode, self.n, self.a, self.shards = lay, mode, n, a, shards
        self.transport = transport
        m, tp = lay.replica_size, lay.attn_tp_size
        top = max(a, default=0)
        if mode is PaddingMode.MAX_LEN:
            self.S, self.G = top, top * lay.dp_size
        else:
            self.S, self.G = top, sum(a)
        if shards is None:
            self.B = top // m
        else:
            self.B = -(-max((x for row in shards for x in row), default=0) // tp)
        self.route = self._route()

    def _route(self) -> Route:
        mode, B = self.mode, self.B
        if mode is PaddingMode.SUM_LEN:
            return _SUM
        lay = self.lay
        if self.shards is None:
            equal = mode is PaddingMode.MAX_LEN or all(x == lay.replica_size * B
                                                       for x in self.a)
        else:
            full = lay.attn_tp_size * B
            equal = all(x == full for row in self.shards for x in row) and (
                mode is PaddingMode.GATHERV or all(x == self.S for x in self.n))
        if equal:
            return _EQUAL
        if mode is PaddingMode.GATHERV:
            if self.transport is Transport.RAGGED:
                return _RAGGED
            if self.transport is Transport.PER_ROOT:
                return _PER_ROOT
        return _UNPACK

    # ------------------------------------------------------------ per-rank geometry
    def slot(self, d: int) -> int:
        return self.S if self.mode is PaddingMode.MAX_LEN else self.a[d]

    def held(self, d: int, c: int) -> int:
        return self.n[d] if self.shards is None else self.shards[d][c]

    def chunk_len(self, d: int, c: int, t: int) -> int:
        """Rows of rank (d, c, t)'s chunk (:meth:`dpx.geometry.Geometry.chunk`)."""
        lay, B = self.lay, self.B
        if self.shards is None:
            return _clip(self.slot(d) - (c * lay.attn_tp_size + t) * B, B)
        return _clip(self.shards[d][c] - t * B, B)

    def chunk_lens(self) -> tuple[int, int]:
        """``(sum of chunk rows, chunks that are not empty)`` over every rank."""
        lay, B = self.lay, self.B
        if B == 0:
            return 0, 0
        if self.shards is None:
            m = lay.replica_size
            return self.G, sum(min(m, -(-x // B)) for x in self.a)
        tp = lay.attn_tp_size
        return (sum(self.n),
                sum(min(tp, -(-x // B)) for row in self.shards for x in row))


# ---------------------------------------------------------------- one rank, any layout
def _produce_chunk(sh: _Shape, d: int, c: int, t: int, dst_rows: int | None) -> int:
    """Local rows read + written by rank (d, c, t)'s chunk production (partial=True,
    an input of exactly its real rows), into a scratch chunk (``dst_rows is None``) or
    into ``dst_rows`` rows of the output (per-root)."""
    lay, B = sh.lay, sh.B
    tp, cp = lay.attn_tp_size, lay.cp_size
    held = sh.held(d, c)
    sharded = sh.shards is not None
    rows = 0
    if tp > 1:  # the attn-tp group sums its span first
        start = 0 if sharded else c * tp * B
        span = tp * B
        if start == 0:
            count = held if (sharded or cp == 1) else min(held, span)
        else:
            count = _clip(held - start, span)
        if not (start == 0 and count == span and held == span):
            rows += span + count
        if dst_rows is not None and dst_rows != B and dst_rows != 0:
            rows += 2 * dst_rows
        return rows
    start = 0 if sharded else c * B
    if start == 0:
        real = held if (sharded or cp == 1) else min(held, B)
    else:
        real = _clip(held - start, B)
    if dst_rows is None:
        return 0 if real == B else B + real
    return 0 if dst_rows == 0 else dst_rows + real


def _finish_slot(sh: _Shape, d: int, c: int, mine_rows: int) -> int:
    lay, B = sh.lay, sh.B
    size = lay.attn_tp_size if sh.shards is not None else lay.replica_size
    held, R = sh.held(d, c), sh.slot(d)
    rows = 0
    if size > 1:
        if mine_rows != B:
            rows += B + mine_rows
        if R == size * B:
            return rows + (R - held if held != R else 0)
    return rows + R + held


def _gather_rank(sh: _Shape, d: int, c: int, t: int) -> int:
    route = sh.route
    if route is _SUM:
        return sh.G + sh.held(d, c)
    if route is _PER_ROOT:
        gaps = sh.shards is not None and any(x != y for x, y in zip(sh.n, sh.a))
        length = sh.chunk_len(d, c, t)
        return (sh.G - length if gaps else 0) + _produce_chunk(sh, d, c, t, length)
    return _produce_chunk(sh, d, c, t, None)


def _rs_rank(sh: _Shape, d: int, c: int, t: int) -> int:
    route, lay, B = sh.route, sh.lay, sh.B
    if route is _SUM:
        return 2 * sh.G + sh.slot(d) + sh.held(d, c)
    if route is _EQUAL and lay.replica_size == 1 and sh.slot(d) == B:
        held = sh.held(d, c)
        return B - held if held != B else 0
    if route is _PER_ROOT:
        return 2 * sh.G + _finish_slot(sh, d, c, sh.chunk_len(d, c, t))
    return _finish_slot(sh, d, c, B)


def _max_by_rank(sh: _Shape, fn) -> tuple[int, int]:
    """``(most local rows, the first rank with them)``."""
    lay = sh.lay
    best, who = -1, 0
    for r in range(lay.world_size):
        co = lay.coords(r)
        v = fn(sh, co.attn_dp_rank, co.attn_cp_rank, co.attn_tp_rank)
        if v > best:
            best, who = v, r
    return best, who


# ---------------------------------------------------------------- cp == 1, no shards
def _first_max(values: Sequence[int], tp: int) -> tuple[int, int]:
    """Most rows over the replicas, and the first rank of the first replica with them."""
    best = max(values)
    return best, values.index(best) * tp


def _gather_fast(sh: _Shape) -> tuple[int, int]:
    """:func:`_gather_rank` maximised over the ranks, one replica at a time (every attn-tp
    rank of a replica costs the same, except the per-root take of a partial block)."""
    lay, B, n, a = sh.lay, sh.B, sh.n, sh.a
    tp, route = lay.attn_tp_size, sh.route
    if route is _SUM:
        return _first_max([sh.G + x for x in n], tp)
    if tp == 1:
        if route is _PER_ROOT:
            return _first_max([2 * x if x else 0 for x in n], 1)
        return _first_max([0 if x == B else B + x for x in n], 1)
    span = tp * B
    per = [0 if x == span else span + x for x in n]
    if route is not _PER_ROOT or B == 0:
        return _first_max(per, tp)
    best, who = -1, 0
    for d, (p, x) in enumerate(zip(per, a)):
        part = x % B
        v = p + (2 * part if part else 0)
        if v > best:
            best = v
            who = d * tp + (x // B if part else 0)
    return best, who


def _rs_fast(sh: _Shape) -> tuple[int, int]:
    lay, B, n, a = sh.lay, sh.B, sh.n, sh.a
    tp, route, S = lay.attn_tp_size, sh.route, sh.S
    if route is _SUM:
        return _first_max([2 * sh.G + y + x for x, y in zip(n, a)], tp)
    slots = [S] * len(n) if sh.mode is PaddingMode.MAX_LEN else a
    if tp == 1:
        if route is _EQUAL:
            return _first_max([B - x if x != B else 0 for x in n], 1)
        base = 2 * sh.G if route is _PER_ROOT else 0
        return _first_max([base + y + x for x, y in zip(n, slots)], 1)
    # finish_slot over the replica's tp blocks: full slot -> zero its tail, else take
    fin = [(y - x if x != y else 0) if y == tp * B else y + x for x, y in zip(n, slots)]
    if route is not _PER_ROOT:
        return _first_max(fin, tp)
    best, who = -1, 0
    for d, (f, y) in enumerate(zip(fin, slots)):
        if B == 0:
            v, t = 2 * sh.G + f, 0
        else:
            part = y % B
            if part:
                v, t = B + part, y // B
            elif -(-y // B) < tp:  # an empty block
                v, t = B, -(-y // B)
            else:
                v, t = 0, 0
            v += 2 * sh.G + f
        if v > best:
            best, who = v, d * tp + t
    return best, who


# ---------------------------------------------------------------- the estimate
def _collectives(sh: _Shape, op: Op, model: CostModel, rb: int) -> tuple[float, int]:
    """``(seconds, bytes sent)`` of the op's collectives, summed in the schedule's order."""
    lay, B, route = sh.lay, sh.B, sh.route
    W, tp = lay.world_size, lay.attn_tp_size
    seconds, moved = 0.0, 0
    steps: list[tuple[int, int, float, int]] = []  # (size bytes, ranks, factor, roots)
    if op is Op.GATHER:
        if tp > 1 and route is not _SUM:
            steps.append((tp * B * rb, tp, (tp - 1) / tp, 0))
        if route is _SUM:
            steps.append((sh.G * rb, W, 2 * (W - 1) / W, 0))
        elif route in (_EQUAL, _UNPACK):
            steps.append((W * B * rb, W, (W - 1) / W, 0))
        else:
            total, roots = sh.chunk_lens()
            steps.append((total * rb, W, (W - 1) / W, roots))
    else:
        size = tp if sh.shards is not None else lay.replica_size
        if route is _SUM:
            steps.append((sh.G * rb, W, 2 * (W - 1) / W, 0))
            size = 1
        elif route in (_EQUAL, _UNPACK):
            steps.append((W * B * rb, W, (W - 1) / W, 0))
        else:
            total, roots = sh.chunk_lens()
            steps.append((total * rb, W, (W - 1) / W, roots))
        if size > 1:
            steps.append((size * B * rb, size, (size - 1) / size, 0))
    for size_b, ranks, factor, roots in steps:
        m, s = model.collective_seconds(size_b, ranks, factor, roots)
        seconds += s
        moved += m
    return seconds, moved


def _local_extra(sh: _Shape, op: Op) -> int:
    """Local rows every rank pays alike (the unpack / pack passes)."""
    if sh.route is not _UNPACK:
        return 0
    W, B = sh.lay.world_size, sh.B
    total = sh.chunk_lens()[0]
    return sh.G + total if op is Op.GATHER else W * B + total


def estimate_counts(counts: Sequence[int], layout: DpLayout, mode: PaddingMode, *,
                    row_bytes: int, cost_model: CostModel,
                    transport: Transport = Transport.PER_ROOT,
                    cp_shards: Sequence[Sequence[int]] | None = None,
                    aligned: Sequence[int] | None = None) -> ModeEstimate:
    """The :class:`~dpx.cost.ModeEstimate` of ``mode`` for these (checked) counts: equal
    to :func:`dpx.cost.estimate` of the plan ``plan_step(counts, layout, mode=mode,
    cp_shards=...)`` on ``transport``."""
    m = layout.replica_size
    a = aligned if aligned is not None else [-(-x // m) * m for x in counts]
    sh = _Shape(layout, mode, counts, a, cp_shards, transport)
    ops: list[OpEstimate] = []
    fast = layout.cp_size == 1
    for op, fn, slow in ((Op.GATHER, _gather_fast, _gather_rank),
                         (Op.REDUCE_SCATTER, _rs_fast, _rs_rank)):
        local, rank = fn(sh) if fast else _max_by_rank(sh, slow)
        local += _local_extra(sh, op)
        coll, moved = _collectives(sh, op, cost_model, row_bytes)
        ops.append(op_estimate(op, rank, coll, local * row_bytes, moved, cost_model))
    return ModeEstimate(mode, sh.G, tuple(ops))


# ---------------------------------------------------------------- the policy's fast path
#: Tie-break order of the modes (an earlier mode wins an exact tie).
MODE_ORDER = {PaddingMode.MAX_LEN: 0, PaddingMode.SUM_LEN: 1, PaddingMode.GATHERV: 2}


def mode_seconds(counts: Sequence[int], aligned: Sequence[int], layout: DpLayout,
                 modes: Sequence[PaddingMode], *, row_bytes: int, cost_model: CostModel,
                 transport: Transport, prune: bool = False) -> list[tuple[float, bool]]:
    """``estimate_counts(...).seconds`` of each of ``modes``, without building the
    estimates: what the cost policy compares every step, as ``(seconds, exact)``. Without
    CP ranks the aggregates every mode needs are computed once, by builtin reductions over
    the replicas; with CP it prices each mode in full.

    ``prune``: a mode whose collectives alone already cost more than a priced mode's whole
    step cannot be the cheapest (local passes only add); its local passes are not priced,
    and its entry is that lower bound with ``exact=False``."""
    return cheapest(counts, aligned, layout, modes, row_bytes=row_bytes,
                    cost_model=cost_model, transport=transport, prune=prune)[1]


def cheapest(counts: Sequence[int], aligned: Sequence[int], layout: DpLayout,
             modes: Sequence[PaddingMode], *, row_bytes: int, cost_model: CostModel,
             transport: Transport, prune: bool = True) -> tuple[int, list[tuple[float, bool]]]:
    """``(index of the cheapest of modes, mode_seconds(...))``: ties go to the earlier of
    MAX_LEN, SUM_LEN, GATHERV (:data:`MODE_ORDER`)."""
    if layout.cp_size > 1:
        priced = [(estimate_counts(counts, layout, m, row_bytes=row_bytes,
                                   cost_model=cost_model, transport=transport,
                                   aligned=aligned).seconds, True) for m in modes]
        best_i = 0
        for i, (t, _) in enumerate(priced):
            tb = priced[best_i][0]
            if t < tb or t == tb and MODE_ORDER[modes[i]] < MODE_ORDER[modes[best_i]]:
                best_i = i
        return best_i, priced
    n, a, rb = counts, aligned, row_bytes
    lat, prl = cost_model.latency, cost_model.per_root_latency
    bus, mem = cost_model.bus_bandwidth, cost_model.memory_bandwidth
    tp = layout.attn_tp_size
    dp, W = layout.dp_size, layout.world_size
    mx = max(n)
    S = -(-mx // tp) * tp  # max(a): aligning is monotone
    B = S // tp
    span = tp * B  # == S: the rows an attn-tp group sums, one slot
    G = sum(a)
    mn: int | None = None  # min(n), when a mode needs it

    # CostModel.collective_seconds, inline below (the same arithmetic, the same floats):
    # 0.0 on one rank, else latency + roots * per_root_latency + round(size * factor) / bus
    ag = (W - 1) / W
    rs_tp = (lat + 0 * prl + round(span * rb * ((tp - 1) / tp)) / bus) if tp > 1 else 0.0
    totals: list[float] = []
    colls: list[tuple[float, float, str]] = []
    for mode in modes:  # the collectives: the same on every rank
        if mode is PaddingMode.SUM_LEN:
            c = lat + 0 * prl + round(G * rb * (2 * (W - 1) / W)) / bus if W > 1 else 0.0
            colls.append((c, c, "sum"))
            totals.append(c + c)
            continue
        if mode is not PaddingMode.MAX_LEN and mn is None:
            mn = min(n)
        if mode is PaddingMode.MAX_LEN or -(-mn // tp) * tp == S:  # every slot full
            route = "equal"
        elif transport is Transport.EQUAL:
            route = "unpack"
        else:
            route = "variable"
        if W <= 1:
            main = 0.0
        elif route == "variable":
            roots = dp - n.count(0) if tp == 1 else sum([(y + B - 1) // B for y in a])
            main = lat + roots * prl + round(G * rb * ag) / bus
        else:
            main = lat + 0 * prl + round(W * B * rb * ag) / bus
        g_coll, r_coll = rs_tp + main, (main + rs_tp if tp > 1 else main)
        colls.append((g_coll, r_coll, route))
        totals.append(g_coll + r_coll)

    def below_slot() -> int:
        """The slowest rank's own-block pass: the slot plus the largest count under it
        (0 when every count fills the slot)."""
        if mx != S:
            return span + mx
        rest = set(n)
        rest.discard(S)
        return span + max(rest) if rest else 0

    out: list[tuple[float, bool] | None] = [None] * len(modes)
    best, best_i = None, 0
    order = sorted(range(len(modes)), key=totals.__getitem__) if prune else range(len(modes))
    for i in order:
        g_coll, r_coll, route = colls[i]
        if prune and best is not None and totals[i] > best:
            out[i] = (totals[i], False)
            continue
        if route == "sum":  # the largest count has the largest aligned count
            g, r = G + mx, 2 * G + S + mx
        elif route == "equal":
            if mn is None:
                mn = min(n)
            g, r = below_slot(), (S - mn if mn != S else 0)
        else:
            if tp == 1:
                fin = 2 * mx  # a replica's slot is its count: take it, zeros after
            else:
                fin = max([(y - x if x != y else 0) if y == S else y + x
                           for x, y in zip(n, a)])
            if route == "unpack":
                g, r = below_slot() + 2 * G, fin + W * B + G
            elif transport is Transport.RAGGED:
                g, r = below_slot(), fin
            elif tp == 1:
                g, r = 2 * mx, 2 * G + fin
            else:
                parts = [y % B for y in a]
                g = max([(0 if x == span else span + x) + (2 * q if q else 0)
                         for x, q in zip(n, parts)])
                r = 2 * G + max([(B + q if q else (B if y < span else 0))
                                 + ((y - x if x != y else 0) if y == S else y + x)
                                 for x, y, q in zip(n, a, parts)])
        total = (g_coll + (g * rb) / mem) + (r_coll + (r * rb) / mem)
        out[i] = (total, True)
        if best is None or total < best or (total == best and MODE_ORDER[modes[i]]
                                            < MODE_ORDER[modes[best_i]]):
            best, best_i = total, i
    return best_i, out  # type: ignore[return-value]
