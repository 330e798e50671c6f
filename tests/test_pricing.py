"""The cost policy's closed form (dpx.pricing) equals the price of the schedules that run
(dpx.cost.estimate: every rank's schedule built and priced step by step), exactly, on a
fuzz of plans: layouts with attn-tp and CP ranks, CP shards, idle replicas, every mode and
transport. And the cost policy still chooses the modes it chose on a recorded fuzz set."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

import dpx
from dpx.cost import estimate
from dpx.pricing import estimate_counts, mode_seconds

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
def test_closed_form_equals_priced_schedules(layout):
    lay = dpx.DpLayout(*layout)
    rng = random.Random(sum(layout) * 31 + len(layout))
    model = dpx.CostModel(bus_bandwidth=rng.choice([50e9, 350e9]), latency=12e-6,
                          per_root_latency=3e-6, memory_bandwidth=3e12)
    cases = 0
    for i in range(12):
        counts = _counts(rng, lay.dp_size)
        shards = _shards(rng, counts, lay.cp_size) if lay.cp_size > 1 and i % 2 else None
        rb = rng.choice([256, 7168 * 2])
        for transport in dpx.Transport:  # the policy takes the cheapest, ties to the first
            full = [estimate_counts(counts, lay, m, row_bytes=rb, cost_model=model,
                                    transport=transport,
                                    cp_shards=None if shards is None else
                                    tuple(map(tuple, shards))).seconds
                    for m in dpx.PaddingMode]
            chosen = dpx.plan_step(counts, lay, policy="cost", cost_model=model, row_bytes=rb,
                                   transport=transport, cp_shards=shards)
            assert chosen.mode is list(dpx.PaddingMode)[full.index(min(full))], \
                (layout, counts, transport, full, chosen.reason)
        for mode in dpx.PaddingMode:
            plan = dpx.plan_step(counts, lay, mode=mode, cp_shards=shards)
            for transport in dpx.Transport:
                want = estimate(plan, row_bytes=rb, cost_model=model, transport=transport,
                                cache=CACHE)
                got = estimate_counts(plan.num_tokens, lay, mode, row_bytes=rb,
                                      cost_model=model, transport=transport,
                                      cp_shards=plan.cp_shards)
                assert got.global_rows == want.global_rows
                for g, w in zip(got.ops, want.ops):
                    where = (layout, counts, shards, mode, transport, g.op)
                    assert (g.collective_seconds, g.local_bytes, g.moved, g.rank) == \
                        (w.collective_seconds, w.local_bytes, w.moved, w.rank), where
                    assert g.seconds == w.seconds, where
                assert got.seconds == want.seconds
                if shards is None:  # the policy's fast path: the same seconds
                    fast = mode_seconds(plan.num_tokens, plan.aligned_tokens, lay, [mode],
                                        row_bytes=rb, cost_model=model, transport=transport)
                    assert fast == [(want.seconds, True)], where
                cases += 1
    assert cases == 12 * 3 * 3


def test_cost_policy_chooses_as_recorded():
    """The recorded fuzz set (1500 plans, tests/data/cost_policy_modes.json): the cost
    policy's choice on the per-root and ragged transports, where the routes and their
    prices are what they were when it was recorded. On the equal transport (JAX on CPU)
    a GATHERV plan now runs an all-gather and an unpack instead of an all-reduce, so its
    price, and sometimes the choice, moved."""
    cases = json.loads((Path(__file__).parent / "data" / "cost_policy_modes.json").read_text())
    same = other = 0
    for c in cases:
        plan = dpx.plan_step(c["counts"], dpx.DpLayout(*c["layout"]), policy="cost",
                             is_extend=c["is_extend"], cp_shards=c["shards"],
                             transport=c["transport"], row_bytes=c["row_bytes"])
        if c["transport"] == "equal":
            other += plan.mode.value != c["mode"]
            continue
        assert plan.mode.value == c["mode"], c
        same += 1
    assert same > 900 and other < 100
