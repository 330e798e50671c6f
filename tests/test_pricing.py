"""The cost policy's prices are the prices of the schedules that run (dpx.cost.estimate:
every rank's schedule built and priced step by step), on a fuzz of plans: layouts with
attn-tp and CP ranks, CP shards, idle replicas, every mode and transport; its closed form
(dpx.pricing) equals them exactly."""

from __future__ import annotations

import random

import pytest

import dpx
from dpx.cost import estimate
from dpx.pricing import cheapest, cheapest_index

LAYOUTS = [(1, 1), (2, 2), (2, 1), (3, 3), (4, 4), (4, 2), (4, 1), (6, 3), (6, 2), (8, 8),
           (8, 4), (8, 2), (8, 1), (4, 1, 2), (4, 2, 2), (8, 2, 2), (8, 1, 4), (6, 1, 3),
           (12, 2, 3), (16, 16), (16, 4)]
CACHE = dpx.ScheduleCache(max_templates=4096)


def _counts(rng: random.Random, dp: int) -> list[int]:
    kind = rng.randrange(6)
    hi = rng.choice([3, 9, 40, 700])
    if kind == 0:
        return [rng.randint(0, hi) for _ in range(dp)]
    if kind == 1:
        return [0 if rng.random() < 0.5 else rng.randint(1, hi) for _ in range(dp)]
    if kind == 2:
        c = [0] * dp
        c[rng.randrange(dp)] = rng.randint(1, hi)
        return c
    if kind == 3:
        v = rng.randint(0, hi)
        return [v] * dp
    if kind == 4:
        return [0] * dp
    return [rng.choice([0, 1, hi, hi - 1]) for _ in range(dp)]


def _shards(rng: random.Random, counts: list[int], cp: int) -> list[list[int]]:
    out = []
    for n in counts:
        kind = rng.randrange(3)
        if kind == 0:
            cuts = sorted(rng.randint(0, n) for _ in range(cp - 1))
            out.append([b - a for a, b in zip([0, *cuts], [*cuts, n])])
        elif kind == 1:
            out.append([0] * (cp - 1) + [n])
        else:
            out.append([n // cp + (c < n % cp) for c in range(cp)])
    return out


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda t: "w{}dp{}".format(*t) +
                         (f"cp{t[2]}" if len(t) > 2 else ""))
def test_policy_prices_are_the_priced_schedules(layout):
    """Every mode's price is its plan's schedules priced step by step on every rank
    (dpx.cost.estimate); without CP ranks the policy's closed form (dpx.pricing.cheapest)
    gives the same seconds, float for float; and the policy takes the cheapest, ties to
    the earlier of MAX_LEN, SUM_LEN, GATHERV."""
    lay = dpx.DpLayout(*layout)
    rng = random.Random(sum(layout) * 31 + len(layout))
    model = dpx.CostModel(bus_bandwidth=rng.choice([50e9, 350e9]), latency=12e-6,
                          per_root_latency=3e-6, memory_bandwidth=3e12)
    modes = list(dpx.PaddingMode)
    cases = 0
    for i in range(12):
        counts = _counts(rng, lay.dp_size)
        shards = _shards(rng, counts, lay.cp_size) if lay.cp_size > 1 and i % 2 else None
        rb = rng.choice([256, 7168 * 2])
        for transport in dpx.Transport:
            want = [estimate(dpx.plan_step(counts, lay, mode=m, cp_shards=shards),
                             row_bytes=rb, cost_model=model, transport=transport,
                             cache=CACHE) for m in modes]
            where = (layout, counts, shards, transport)
            if lay.cp_size == 1:
                best, full = cheapest(tuple(counts), lay, modes, row_bytes=rb,
                                      cost_model=model, transport=transport, prune=False)
                assert full == [(w.seconds, True) for w in want], where
                assert cheapest(tuple(counts), lay, modes, row_bytes=rb, cost_model=model,
                                transport=transport)[0] == best, where
            chosen = dpx.plan_step(counts, lay, policy="cost", cost_model=model, row_bytes=rb,
                                   transport=transport, cp_shards=shards)
            assert dpx.plan_step(counts, lay, policy="cost", cost_model=model, row_bytes=rb,
                                 transport=transport, cp_shards=shards, cache=CACHE) == chosen
            seconds = [w.seconds for w in want]
            assert chosen.mode is modes[cheapest_index(modes, seconds)], (where, chosen.reason)
            assert seconds[modes.index(chosen.mode)] == min(seconds), where
            assert dpx.compare_modes(counts, lay, row_bytes=rb, cost_model=model,
                                     transport=transport, cp_shards=shards)[0].seconds \
                == seconds[0]
            cases += 1
    assert cases == 12 * len(dpx.Transport)


def test_tie_break_prefers_the_earlier_mode():
    M = dpx.PaddingMode
    assert cheapest_index([M.GATHERV, M.SUM_LEN, M.MAX_LEN], [1.0, 1.0, 1.0]) == 2
    assert cheapest_index([M.GATHERV, M.SUM_LEN], [1.0, 1.0]) == 1
    assert cheapest_index([M.MAX_LEN, M.GATHERV], [2.0, 1.0]) == 1
