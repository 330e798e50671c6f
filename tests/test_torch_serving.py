"""Serving features of dpx_torch on gloo worlds 1-4 (attn-tp and CP layouts, capacity plans
with device counts, idle replicas), against the NumPy reference: fp8 wire gather, several
tensors in one gather, pad-row masking, counts exchanged on the device."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz_cases import case_for

pytestmark = pytest.mark.multiproc
SETTINGS = settings(max_examples=2, deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))
LAYOUTS = [(1, 1), (2, 1), (2, 2), (3, 3), (4, 2), (4, 1), (4, 1, 2), (4, 2, 2)]


def _fixed_cases(dp: int, cp: int) -> list[dict]:
    idle = [0 if i % 2 else 3 + i for i in range(dp)]
    cases = []
    for mode in ("max_len", "gatherv", "sum_len"):
        for partial in (True, False):
            for dtype in ("bfloat16", "float32", "float16"):
                cases.append(dict(counts=idle, mode=mode, partial=partial, dtype=dtype,
                                  seed=len(cases)))
            cases.append(dict(counts=[0] * dp, mode=mode, capacity=12,
                              run_counts=[min(5 + i, 12 // dp if mode != "max_len" else 12)
                                          for i in range(dp)],
                              partial=partial, dtype="bfloat16", seed=len(cases)))
    if cp > 1:
        cases += [dict(counts=[5] * dp, shards=[[5 - i] + [i] + [0] * (cp - 2)
                                                 for i in range(dp)],
                       mode=m, partial=p, dtype="bfloat16", seed=90 + j)
                  for j, (m, p) in enumerate([("max_len", True), ("gatherv", False)])]
    return cases


@pytest.mark.parametrize("layout", LAYOUTS,
                         ids=lambda l: f"w{l[0]}dp{l[1]}" + (f"cp{l[2]}" if len(l) > 2 else ""))
def test_serving_features(gloo_worlds, layout):
    cp = layout[2] if len(layout) > 2 else 1
    cases = _fixed_cases(layout[1], cp)
    done = gloo_worlds(layout[0]).run("serving_jobs:check_serving", layout, cases,
                                      timeout=300)
    assert done[0] >= 5 * len(cases) and len(set(done)) == 1


@pytest.mark.parametrize("layout", [(4, 2), (4, 1, 2), (4, 2, 2)],
                         ids=lambda l: f"w{l[0]}dp{l[1]}" + (f"cp{l[2]}" if len(l) > 2 else ""))
def test_serving_features_fuzzed(gloo_worlds, layout):
    """Random counts, modes, policies, capacity plans and shard tables (float dtypes)."""
    cp = layout[2] if len(layout) > 2 else 1

    @SETTINGS
    @given(st.lists(case_for(layout[1], cp), min_size=10, max_size=10))
    def run(cases):
        for c in cases:
            if c["dtype"] not in ("float32", "bfloat16", "float16"):
                c["dtype"] = "bfloat16"
        gloo_worlds(layout[0]).run("serving_jobs:check_serving", layout, cases, timeout=300)

    run()


@pytest.mark.parametrize("layout", [(1, 1), (4, 2), (4, 4), (4, 1, 2), (4, 2, 2)],
                         ids=lambda l: f"w{l[0]}dp{l[1]}" + (f"cp{l[2]}" if len(l) > 2 else ""))
def test_exchange_counts(gloo_worlds, layout):
    dp = layout[1]
    cp = layout[2] if len(layout) > 2 else 1
    count_sets = [[0] * dp, [3 + 2 * i for i in range(dp)], [0 if i % 2 else 9 for i in range(dp)]]
    shard_sets = [[[c + d for c in range(cp)] for d in range(dp)]]
    res = gloo_worlds(layout[0]).run("serving_jobs:check_exchange_counts", layout, count_sets,
                                     shard_sets)
    msgs = {r["counts"] for r in res}
    assert all(r["good"] == [4] * dp for r in res)
    assert all("int32 tensor of shape (1,)" in r["dtype"] for r in res)
    if layout[0] // dp > 1:  # the last rank disagrees with its replica: one error everywhere
        assert len(msgs) == 1 and msgs.pop().startswith("DpxMismatchError: exchange_counts")
    else:  # one rank per replica: nothing to disagree on
        assert msgs == {"no error"}
