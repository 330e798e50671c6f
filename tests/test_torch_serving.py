"""Serving features of dpx_torch on gloo worlds 1-4 (attn-tp and CP layouts, capacity plans
with device counts, idle replicas), against the NumPy reference: fp8 wire gather, several
tensors in one gather, pad-row masking, counts exchanged on the device, counts riding the
gather."""

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


@pytest.mark.parametrize("layout", [(2, 2), (4, 1, 2)],
                         ids=lambda l: f"w{l[0]}dp{l[1]}" + (f"cp{l[2]}" if len(l) > 2 else ""))
def test_serving_features_through_the_kernels(gloo_worlds, layout):
    """The same through the Triton kernels (Triton's interpreter on CPU tensors): every
    launch the GPU path binds -- shapes, dtypes of wire buffers, device indices -- checked
    on a machine without one."""
    cp = layout[2] if len(layout) > 2 else 1
    cases = [c for c in _fixed_cases(layout[1], cp)
             if c["dtype"] == "bfloat16" and (c.get("capacity") or c.get("shards")
                                              or c["mode"] == "max_len")]
    done = gloo_worlds(layout[0]).run("serving_jobs:check_serving", layout, cases,
                                      kernels=True, timeout=300)
    assert done[0] >= 5 * len(cases) and len(set(done)) == 1


@pytest.mark.parametrize("layout", [(1, 1), (4, 2), (4, 4), (4, 2, 2)],
                         ids=lambda l: f"w{l[0]}dp{l[1]}" + (f"cp{l[2]}" if len(l) > 2 else ""))
def test_quantized_wires_carry_nan_and_inf_by_their_rules(gloo_worlds, layout):
    """NaN, +-inf and huge finite values in the rows of an fp8 gather, every copy mode,
    host and device counts, partial and replicated, every float dtype: bit for bit the
    format's rule (a group's scale from its finite values, non-finite as NaN)."""
    dp = layout[1]
    cp = layout[2] if len(layout) > 2 else 1
    counts = [6 if i % 2 == 0 else 0 for i in range(dp)]
    cases = []
    for mode in ("max_len", "gatherv"):
        for partial, dtype in ((True, "bfloat16"), (False, "float32"), (False, "float16")):
            cases.append(dict(counts=counts, mode=mode, partial=partial, dtype=dtype,
                              seed=len(cases)))
        cases.append(dict(counts=[0] * dp, mode=mode, capacity=12,
                          run_counts=[6 if i % 2 == 0 else 0 for i in range(dp)],
                          partial=True, dtype="bfloat16", seed=len(cases)))
    if cp > 1:
        cases.append(dict(counts=[6] * dp, shards=[[6] + [0] * (cp - 1)] * dp,
                          mode="gatherv", partial=False, dtype="bfloat16", seed=50))
    done = gloo_worlds(layout[0]).run("serving_jobs:check_wire_nonfinite", layout, cases)
    assert done == [len(cases)] * layout[0]


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


def ride_cases(dp: int, cp: int) -> list[dict]:
    """MAX_LEN and GATHERV capacity plans, idle replicas, counts over the capacity (the
    flag), partial and replicated, fp8, CP shard tables."""
    idle = [5 + d if d % 2 == 0 else 0 for d in range(dp)]
    cases = []
    for i, mode in enumerate(("max_len", "gatherv")):
        cap = 8 if mode == "max_len" else 8 * dp
        cases += [dict(counts=[0] * dp, mode=mode, capacity=cap, run_counts=idle,
                       partial=True, seed=10 * i),
                  dict(counts=[0] * dp, mode=mode, capacity=cap, run_counts=idle,
                       partial=False, wire="fp8", seed=10 * i + 1),
                  dict(counts=[0] * dp, mode=mode, capacity=cap, partial=True, seed=10 * i + 2,
                       run_counts=[cap + 3 if d == 0 else 1 for d in range(dp)])]  # overflow
        if cp > 1:
            cases.append(dict(counts=[0] * dp, mode=mode, capacity=cap, partial=True,
                              shards=[[0] * cp] * dp, seed=10 * i + 3,
                              run_counts=[[2 + d] + [d % 2] * (cp - 1) for d in range(dp)]))
    return cases


def check_ride_results(res: list[dict], layout: tuple, cases: list[dict]) -> None:
    """Every rank's ``serving_jobs:check_ride`` result: every case bit for bit, the two
    overflows flagged, the rules' errors the same on every rank."""
    dp = layout[1]
    assert all(r["done"] == len(cases) and r["overflows"] == 2 for r in res), res[0]
    for key, needle in (("sum_len", "max_len or gatherv"), ("host", "capacity plan"),
                        ("shards", "cp_shards is None"),
                        ("n_local", "n_local must be an int32 tensor"),
                        ("in_place", "out overlaps the input in memory"),
                        ("destroyed", "destroyed")):
        msgs = {r[key] for r in res}
        assert len(msgs) == 1 and needle in msgs.pop(), (key, res[0][key])
    msgs = {r["validate"] for r in res}
    if layout[0] // dp > 1:   # the last rank's replica has other ranks: they disagree
        assert len(msgs) == 1 and msgs.pop().startswith(
            "DpxMismatchError: gather_with_counts: replica"), res[0]["validate"]
    else:
        assert msgs == {"no error"}
    msgs = {r["validate_capacity"] for r in res}
    assert len(msgs) == 1 and msgs.pop().startswith(
        "DpxCapacityError: gather_with_counts: replica 0 has count 9 > capacity 8"), res[0]


@pytest.mark.parametrize("layout", [(1, 1), (4, 2), (4, 4), (4, 1, 2), (4, 2, 2)],
                         ids=lambda l: f"w{l[0]}dp{l[1]}" + (f"cp{l[2]}" if len(l) > 2 else ""))
def test_counts_ride_the_gather(gloo_worlds, layout):
    """gather_with_counts against gather(counts=exchange_counts(n_local)) (:func:`ride_cases`);
    the rules raise the same error on every rank."""
    cases = ride_cases(layout[1], layout[2] if len(layout) > 2 else 1)
    res = gloo_worlds(layout[0]).run("serving_jobs:check_ride", layout, cases)
    check_ride_results(res, layout, cases)
