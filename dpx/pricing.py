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

from dpx.cost_model import CostModel
from dpx.ints import INTS
from dpx.layout import DpLayout
from dpx.modes import PaddingMode, Transport
from dpx.routes import Route, host_sizes, route_of

__all__ = ["cheaper", "cheapest", "cheapest_index", "MODE_ORDER", "price_key"]

#: Tie-break order of the modes (an earlier mode wins an exact tie).
MODE_ORDER = {PaddingMode.MAX_LEN: 0, PaddingMode.SUM_LEN: 1, PaddingMode.GATHERV: 2}


def price_key(seconds: float, mode: PaddingMode) -> tuple[float, int]:
    """The policy's one tie-break, as a sort key: the seconds, then a tie to the earlier of
    MAX_LEN, SUM_LEN, GATHERV."""
    return seconds, MODE_ORDER[mode]


def cheaper(seconds: float, mode: PaddingMode, than: float, than_mode: PaddingMode) -> bool:
    """Whether ``mode`` at ``seconds`` beats ``than_mode`` at ``than`` (:func:`price_key`)."""
    return price_key(seconds, mode) < price_key(than, than_mode)


def cheapest_index(modes: Sequence[PaddingMode], seconds: Sequence[float]) -> int:
    """The index of the cheapest of ``modes`` priced ``seconds`` (:func:`price_key`; the first
    of equals)."""
    return min(range(len(modes)), key=lambda i: price_key(seconds[i], modes[i]))


#: :func:`dpx.routes.route_of` by transport and whether every chunk is a full block, then by
#: mode, for a plan without CP ranks on a known rank with host counts (the policy's case).
_ROUTES = {(t.value, full): {m.value: route_of(m, t, equal=full or m is PaddingMode.MAX_LEN,
                                               host_sizes=host_sizes(t, rank_known=True,
                                                                     device_counts=False))
                             for m in PaddingMode}
           for t in Transport for full in (False, True)}


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
    a = n if tp == 1 else INTS.ceil_align(n, tp)
    S, G = -(-mx // tp) * tp, sum(a)  # the largest slot (aligning is monotone); all rows
    B = S // tp
    rs_tp = coll(S * rb, tp, (tp - 1) / tp)[1] if tp > 1 else 0.0  # the attn-tp sum
    full = -(-mn // tp) * tp == S  # every slot full: every chunk a full block
    blocks = -1.0  # an equal world collective of every rank's block (any mode's)
    routes = _ROUTES[transport._value_, full]
    colls: list[tuple[float, Route]] = []
    order: list[tuple[float, int]] = []
    for i, mode in enumerate(modes):  # the collectives: the same on every rank
        route = routes[mode._value_]
        if route is Route.SUM_SLOTS:
            c = coll(G * rb, W, 2 * (W - 1) / W)[1]
        elif route is Route.EQUAL_BLOCKS or route is Route.BLOCKS_UNPACK:
            if blocks < 0:
                blocks = coll(W * B * rb, W, (W - 1) / W)[1]
            c = rs_tp + blocks
        elif route is Route.PEER:  # each chunk's real rows
            c = rs_tp + coll(sum(n) * rb, W, (W - 1) / W, peer=True)[1]
        else:  # a variable-size collective: a root per chunk that is not empty
            roots = W - n.count(0) if tp == 1 else sum([(y + B - 1) // B for y in a])
            c = rs_tp + coll(G * rb, W, (W - 1) / W, roots)[1]
        colls.append((c, route))
        order.append((c, i))
    # gather and reduce_scatter run the same collectives: a mode costs at least 2 * c
    out: list[tuple[float, bool]] = [(2 * c, False) for c, _ in colls]
    best, least, mem = -1, 0.0, cost_model.memory_bandwidth
    if prune:
        order.sort()
    for c, i in order:
        if prune and best >= 0 and 2 * c > least:
            continue
        if W == 1 and colls[i][1] is not Route.PEER:
            g = r = 2 * mx   # each op one copy of the rows (dpx.steps.Step.alone, dpx.fold)
        else:
            g, r = _local_rows(colls[i][1], modes[i], n, a, mx, mn, S, G, B, tp, W)
        t = (c + (g * rb) / mem) + (c + (r * rb) / mem)
        out[i] = (t, True)
        if best < 0 or cheaper(t, modes[i], least, modes[best]):
            best, least = i, t
    return best, out


def _local_rows(route: Route, mode: PaddingMode, n: Sequence[int], a: Sequence[int],
                mx: int, mn: int, S: int, G: int, B: int, tp: int, W: int) -> tuple[int, int]:
    """``(gather rows, reduce_scatter rows)`` read + written by the slowest rank's local
    passes on ``route`` in ``mode``."""
    if route is Route.SUM_SLOTS:  # place the rows; take the slot from the all-reduced copy
        return G + mx, 2 * G + S + mx
    # the own-block pass: a slot (tp blocks) plus the largest count under it, 0 if full
    rest = [x for x in n if x != S]
    below = S + max(rest) if rest else 0
    if route is Route.EQUAL_BLOCKS:
        return below, (S - mn if mn != S else 0)
    # the slot from the replica's blocks: full slots zero their tail, others take (a
    # MAX_LEN slot, which only the peer route takes this way, is always full)
    slot = [S] * len(a) if mode is PaddingMode.MAX_LEN else a
    fin = 2 * mx if tp == 1 else max([(y - x if x != y else 0) if y == S else y + x
                                      for x, y in zip(n, slot)])
    if route is Route.BLOCKS_UNPACK:
        return below + 2 * G, fin + W * B + G
    if route is Route.RAGGED or route is Route.PEER:
        if tp == 1:  # a one-block slot straight from the collective (dpx.emit's rs_ragged)
            fin = max([0 if y == S else y + x for x, y in zip(n, slot)])
        return below, fin
    if tp == 1:  # per-root: each chunk is the rank's rows
        return 2 * mx, 2 * G + fin
    parts = [y % B for y in a]
    g = max([(0 if x == S else S + x) + (2 * q if q else 0) for x, q in zip(n, parts)])
    r = 2 * G + max([(B + q if q else (B if y < S else 0))
                     + ((y - x if x != y else 0) if y == S else y + x)
                     for x, y, q in zip(n, a, parts)])
    return g, r
