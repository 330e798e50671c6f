"""The cost policy's price of a mode without building its schedules (``cp_size == 1``).

A mode's price is :func:`dpx.cost.estimate` of its plan: ``gather(partial=True)`` on
inputs of the real rows, then ``reduce_scatter``, each its collectives (the same on every
rank) plus the local bytes of its slowest rank. Building and pricing every rank's schedule
every step is too slow for a policy, so :func:`cheapest` computes the same numbers from
the counts: the route is :func:`dpx.routes.route_of`'s, the collectives are priced by
:meth:`dpx.CostModel.collective_seconds`, and the slowest rank's local rows follow from the
route's passes. ``tests/test_pricing.py`` proves it equal, float for float, to pricing the
built schedules over a fuzz of layouts, counts, modes and transports. With CP ranks the
policy prices the schedules themselves (:func:`dpx.policy.cost_mode`).
"""

from __future__ import annotations

from typing import Sequence

from dpx.cost import CostModel
from dpx.geometry import INTS
from dpx.layout import DpLayout
from dpx.modes import PaddingMode, Transport
from dpx.routes import Route, route_of

__all__ = ["cheaper", "cheapest", "cheapest_index", "MODE_ORDER"]

#: Tie-break order of the modes (an earlier mode wins an exact tie).
MODE_ORDER = {PaddingMode.MAX_LEN: 0, PaddingMode.SUM_LEN: 1, PaddingMode.GATHERV: 2}


def cheaper(seconds: float, mode: PaddingMode, than: float, than_mode: PaddingMode) -> bool:
    """Whether ``mode`` at ``seconds`` beats ``than_mode`` at ``than``: a tie goes to the
    earlier of MAX_LEN, SUM_LEN, GATHERV. The policy's one tie-break."""
    return seconds < than or (seconds == than and MODE_ORDER[mode] < MODE_ORDER[than_mode])


def cheapest_index(modes: Sequence[PaddingMode], seconds: Sequence[float]) -> int:
    """The index of the cheapest of ``modes`` (priced ``seconds``, :func:`cheaper`)."""
    best = 0
    for i in range(1, len(modes)):
        if cheaper(seconds[i], modes[i], seconds[best], modes[best]):
            best = i
    return best


def cheapest(counts: Sequence[int], layout: DpLayout, modes: Sequence[PaddingMode], *,
             row_bytes: int, cost_model: CostModel, transport: Transport,
             prune: bool = True) -> tuple[int, list[tuple[float, bool]]]:
    """``(index of the cheapest of modes, [(seconds, exact)] per mode)`` for checked
    counts of a layout without CP ranks. ``prune``: a mode whose collectives alone cost
    more than a priced mode's whole step cannot be the cheapest (local passes only add);
    its entry is that lower bound with ``exact=False``."""
    n, rb, coll = counts, row_bytes, cost_model.collective_seconds
    tp, W = layout.attn_tp_size, layout.world_size
    mx, mn = max(n), min(n)
    a = INTS.ceil_align(n, tp)
    S, G = -(-mx // tp) * tp, sum(a)  # the largest slot (aligning is monotone); all rows
    B = S // tp
    rs_tp = coll(S * rb, tp, (tp - 1) / tp)[1]  # the attn-tp group's sum (0 on one rank)
    colls: list[tuple[float, Route]] = []
    for mode in modes:  # the collectives: the same on every rank
        if mode is PaddingMode.SUM_LEN:
            colls.append((coll(G * rb, W, 2 * (W - 1) / W)[1], Route.SUM_SLOTS))
            continue
        equal = mode is PaddingMode.MAX_LEN or -(-mn // tp) * tp == S  # every slot full
        route = route_of(mode, transport, equal=equal, host_sizes=True)
        if route in (Route.EQUAL_BLOCKS, Route.BLOCKS_UNPACK):
            main = coll(W * B * rb, W, (W - 1) / W)[1]
        else:  # a variable-size collective: a root per chunk that is not empty
            roots = W - n.count(0) if tp == 1 else sum([(y + B - 1) // B for y in a])
            main = coll(G * rb, W, (W - 1) / W, roots)[1]
        colls.append((rs_tp + main, route))
    totals = [2 * c for c, _ in colls]  # gather and reduce_scatter run the same ones
    out: list[tuple[float, bool]] = [(t, False) for t in totals]
    best = -1
    mem = cost_model.memory_bandwidth
    for i in sorted(range(len(modes)), key=totals.__getitem__) if prune else range(len(modes)):
        if prune and best >= 0 and totals[i] > out[best][0]:
            continue
        g, r = _local_rows(colls[i][1], transport, n, a, mx, mn, S, G, B, tp, W)
        c = colls[i][0]
        out[i] = ((c + (g * rb) / mem) + (c + (r * rb) / mem), True)
        if best < 0 or cheaper(out[i][0], modes[i], out[best][0], modes[best]):
            best = i
    return best, out


def _local_rows(route: Route, transport: Transport, n: Sequence[int], a: Sequence[int],
                mx: int, mn: int, S: int, G: int, B: int, tp: int, W: int) -> tuple[int, int]:
    """``(gather rows, reduce_scatter rows)`` read + written by the slowest rank's local
    passes on ``route``."""
    if route is Route.SUM_SLOTS:  # place the rows; take the slot from the all-reduced copy
        return G + mx, 2 * G + S + mx
    # the own-block pass: a slot (tp blocks) plus the largest count under it, 0 if full
    rest = [x for x in n if x != S]
    below = S + max(rest) if rest else 0
    if route is Route.EQUAL_BLOCKS:
        return below, (S - mn if mn != S else 0)
    # the slot from the replica's blocks: full slots zero their tail, others take
    fin = 2 * mx if tp == 1 else max([(y - x if x != y else 0) if y == S else y + x
                                      for x, y in zip(n, a)])
    if route is Route.BLOCKS_UNPACK:
        return below + 2 * G, fin + W * B + G
    if route is Route.RAGGED:
        return below, fin
    if tp == 1:  # per-root: each chunk is the rank's rows
        return 2 * mx, 2 * G + fin
    parts = [y % B for y in a]
    g = max([(0 if x == S else S + x) + (2 * q if q else 0) for x, q in zip(n, parts)])
    r = 2 * G + max([(B + q if q else (B if y < S else 0))
                     + ((y - x if x != y else 0) if y == S else y + x)
                     for x, y, q in zip(n, a, parts)])
    return g, r
