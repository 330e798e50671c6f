"""Hypothesis round trips (CI-sized: a few hundred plans): for random layouts (context
parallel ones too), counts (idle replicas, one replica with everything, capacity edges),
CP shard tables, modes and dtypes, gather, scatter and reduce_scatter equal the reference on
gloo and on JAX CPU devices; in particular scatter(gather(x, replicated)) returns every
real row exactly."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz_cases import case_for, counts_for

pytestmark = pytest.mark.multiproc
SETTINGS = settings(max_examples=3, deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("layout", [(4, 4), (4, 2), (4, 1), (3, 3), (4, 1, 2), (4, 2, 2),
                                    (3, 1, 3)],
                         ids=lambda l: f"w{l[0]}dp{l[1]}" + (f"cp{l[2]}" if len(l) > 2 else ""))
def test_torch_round_trips(gloo_worlds, layout):
    cp = layout[2] if len(layout) > 2 else 1

    @SETTINGS
    @given(st.lists(case_for(layout[1], cp), min_size=25, max_size=25))
    def run(cases):
        gloo_worlds(layout[0]).run("torch_jobs:check_cases", layout, cases)

    run()


@pytest.mark.parametrize("layout,mode,cap", [((8, 4), "max_len", 6), ((8, 2), "sum_len", 24),
                                             ((8, 8), "gatherv", 32), ((4, 1), "max_len", 8)],
                         ids=str)
def test_jax_round_trips(layout, mode, cap):
    pytest.importorskip("jax")
    import dpx
    from test_jax import run_case

    lay = dpx.DpLayout(*layout)
    plan = dpx.plan_step([0] * lay.dp_size, lay, capacity=cap, mode=mode)
    per = cap if mode == "max_len" else cap // lay.dp_size

    @settings(max_examples=40, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(counts_for(lay.dp_size, cap=per), st.booleans(), st.integers(0, 999))
    def run(counts, partial, seed):
        counts = [min(c, per) for c in counts]
        run_case(plan, partial, counts=counts, seed=seed)

    run()


@pytest.mark.parametrize("mode", ["max_len", "gatherv"])
def test_jax_context_parallel_shards(mode):
    """dp 2 x cp 2 x tp 2 on simulated devices: random device shard tables (empty shards,
    idle replicas) through one compiled capacity plan."""
    pytest.importorskip("jax")
    import dpx
    from fuzz_cases import shards_for
    from test_jax import run_case

    lay = dpx.DpLayout(8, 2, 2)
    cap = 6 if mode == "max_len" else 16
    plan = dpx.plan_step([0, 0], lay, capacity=cap, mode=mode, cp_shards=[(0, 0), (0, 0)])
    per = cap if mode == "max_len" else cap // 2 // 4 * 4

    @settings(max_examples=12, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(counts_for(2, cap=per), st.booleans(), st.data())
    def run(counts, partial, data):
        counts = [min(c, per) for c in counts]
        run_case(plan, partial, counts=data.draw(shards_for(counts, 2)), seed=sum(counts))

    run()
