"""Planner tests: pure Python, no devices."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dpx
from dpx import (CostModel, DpLayout, DpxCapacityError, DpxError, DpxTypeError, DpxValueError,
                 PaddingMode, Policy, ceil_align, plan_step)


def test_import_dpx_pulls_no_framework():
    code = ("import sys, dpx, dpx.plan, dpx.cli, dpx.explain; "
            "bad = [m for m in ('torch', 'jax', 'triton') if m in sys.modules]; "
            "print(','.join(bad)); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, f"import dpx pulled in: {res.stdout} {res.stderr}"


# ------------------------------------------------------------------ layout
@pytest.mark.parametrize("world,dp,cp", [(8, 8, 1), (8, 4, 1), (8, 2, 2), (8, 1, 1), (12, 3, 2),
                                         (6, 3, 1), (1, 1, 1)])
def test_layout_algebra(world, dp, cp):
    lay = DpLayout(world, dp, cp)
    tp = lay.attn_tp_size
    assert tp * dp * cp == world
    seen = set()
    for r in range(world):
        c = lay.coords(r)
        assert r == (c.attn_dp_rank * cp + c.attn_cp_rank) * tp + c.attn_tp_rank
        assert lay.rank_of(c.attn_dp_rank, c.attn_cp_rank, c.attn_tp_rank) == r
        seen.add((c.attn_dp_rank, c.attn_cp_rank, c.attn_tp_rank))
    assert len(seen) == world
    for groups, size in ((lay.attn_tp_groups(), tp), (lay.attn_cp_groups(), cp)):
        flat = sorted(r for g in groups for r in g)
        assert flat == list(range(world)), "groups must partition the world"
        assert all(len(g) == size for g in groups)
    for g in lay.attn_tp_groups():
        coords = [lay.coords(r) for r in g]
        assert len({(c.attn_dp_rank, c.attn_cp_rank) for c in coords}) == 1
        assert [c.attn_tp_rank for c in coords] == list(range(tp))
    for g in lay.attn_cp_groups():
        coords = [lay.coords(r) for r in g]
        assert len({(c.attn_dp_rank, c.attn_tp_rank) for c in coords}) == 1
    for d in range(dp):
        assert all(lay.coords(r).attn_dp_rank == d for r in lay.replica_ranks(d))


def test_layout_bad_values():
    with pytest.raises(DpxValueError, match=r"world_size=6.*dp_size\*cp_size=4\*1"):
        DpLayout(6, 4)
    with pytest.raises(DpxValueError, match=r"world_size=8.*3\*1"):
        DpLayout(8, 3)
    with pytest.raises(DpxValueError, match="world_size=0"):
        DpLayout(0, 1)
    with pytest.raises(DpxValueError, match="dp_size=-1"):
        DpLayout(4, -1)
    with pytest.raises(DpxTypeError, match="dp_size=2.0"):
        DpLayout(4, 2.0)
    with pytest.raises(DpxValueError, match="rank=8"):
        DpLayout(8, 4).coords(8)
    with pytest.raises(DpxValueError, match="tp=2"):
        DpLayout(8, 4).rank_of(0, 0, 2)
    assert issubclass(DpxValueError, ValueError) and issubclass(DpxValueError, DpxError)


# ------------------------------------------------------------------ sglang rule
def _sglang_reference(global_num_tokens, dp_size, is_extend):
    """sglang's get_dp_padding_mode, restated from its documented behaviour."""
    if is_extend and dp_size > 1:
        return PaddingMode.SUM_LEN
    if sum(global_num_tokens) * 2 >= max(global_num_tokens) * dp_size:
        return PaddingMode.MAX_LEN
    return PaddingMode.SUM_LEN


@settings(max_examples=400, deadline=None)
@given(st.sampled_from([(1, 1), (2, 2), (4, 4), (4, 2), (8, 8), (8, 4), (8, 2), (8, 1), (6, 3)]),
       st.data(), st.booleans())
def test_sglang_rule_matches(layout_args, data, is_extend):
    lay = DpLayout(*layout_args)
    counts = data.draw(st.lists(st.integers(0, 5000), min_size=lay.dp_size,
                                max_size=lay.dp_size))
    plan = plan_step(counts, lay, is_extend=is_extend)
    aligned = [ceil_align(n, lay.attn_tp_size) for n in counts]
    assert plan.mode is _sglang_reference(aligned, lay.dp_size, is_extend)
    assert plan.aligned_tokens == tuple(aligned)


def test_sglang_rule_examples():
    lay = DpLayout(4, 4)
    assert plan_step([4, 4, 4, 4], lay).mode is PaddingMode.MAX_LEN
    assert plan_step([8, 0, 0, 0], lay).mode is PaddingMode.SUM_LEN   # 16 < 32
    assert plan_step([8, 8, 0, 0], lay).mode is PaddingMode.MAX_LEN   # tie 32 >= 32
    assert plan_step([4, 4, 4, 4], lay, is_extend=True).mode is PaddingMode.SUM_LEN
    # alignment decides: attn_tp=2, counts [1, 0] -> aligned [2, 0]: 4 >= 4 -> MAX_LEN
    assert plan_step([1, 0], DpLayout(4, 2)).mode is PaddingMode.MAX_LEN


# ------------------------------------------------------------------ plan shapes
@settings(max_examples=300, deadline=None)
@given(st.sampled_from([(1, 1), (3, 3), (4, 2), (8, 4), (8, 1), (6, 2)]), st.data(),
       st.sampled_from(list(PaddingMode)))
def test_plan_properties(layout_args, data, mode):
    lay = DpLayout(*layout_args)
    counts = data.draw(st.lists(st.integers(0, 300), min_size=lay.dp_size, max_size=lay.dp_size))
    plan = plan_step(counts, lay, mode=mode)
    tp = lay.attn_tp_size
    assert plan.global_rows == sum(plan.slot_rows)
    spans = sorted(zip(plan.offsets, plan.slot_rows))
    for (o1, s1), (o2, _) in zip(spans, spans[1:]):
        assert o1 + s1 <= o2, "slots overlap"
    for d, n in enumerate(counts):
        assert plan.slot_rows[d] >= n, "a real row has no slot"
        assert plan.slot_rows[d] % tp == 0
        assert plan.offsets[d] + plan.slot_rows[d] <= plan.global_rows
    if mode is PaddingMode.MAX_LEN:
        assert len(set(plan.slot_rows)) == 1
        assert plan.slot_rows[0] == max(ceil_align(n, tp) for n in counts)
    else:
        assert plan.slot_rows == tuple(ceil_align(n, tp) for n in counts)
    assert plan.max_slot_rows == max(plan.slot_rows)
    again = plan_step(list(counts), lay, mode=mode.value)
    assert again == plan and hash(again) == hash(plan)
    assert again.fingerprint() == plan.fingerprint()


def test_fingerprint_distinguishes():
    lay = DpLayout(4, 4)
    a = plan_step([1, 2, 3, 4], lay)
    assert a.fingerprint() != plan_step([1, 2, 3, 5], lay).fingerprint()
    assert a.fingerprint() != plan_step([1, 2, 3, 4], lay, mode="sum_len").fingerprint()
    assert a.fingerprint() != plan_step([1, 2, 3, 4], DpLayout(8, 4)).fingerprint()
    assert -(2**63) <= a.fingerprint64() < 2**63


def test_all_idle_plan_is_empty():
    for mode in PaddingMode:
        plan = plan_step([0, 0, 0], DpLayout(3, 3), mode=mode)
        assert plan.global_rows == 0 and plan.slot_rows == (0, 0, 0)


# ------------------------------------------------------------------ capacity
def test_capacity_max_len():
    lay = DpLayout(8, 4)
    plan = plan_step([3, 0, 7, 5], lay, capacity=7)
    assert plan.mode is PaddingMode.MAX_LEN and plan.is_static
    assert plan.slot_rows == (8, 8, 8, 8) and plan.offsets == (0, 8, 16, 24)
    other = plan_step([1, 1, 1, 1], lay, capacity=7)
    assert (other.slot_rows, other.offsets, other.global_rows) == \
        (plan.slot_rows, plan.offsets, plan.global_rows)
    assert plan.with_counts([1, 1, 1, 1]) == other
    with pytest.raises(DpxCapacityError, match=r"num_tokens\[2\]=9 exceeds capacity=8"):
        plan_step([3, 0, 9, 5], lay, capacity=8)


def test_capacity_sum_len():
    lay = DpLayout(4, 2)
    plan = plan_step([3, 5], lay, capacity=20, mode="sum_len")
    assert plan.global_rows == 20 and plan.slot_rows == (20, 20) and plan.dynamic_offsets
    assert plan.offsets == (0, 4)
    with pytest.raises(DpxCapacityError, match="exceeds capacity=9"):
        plan_step([5, 5], lay, capacity=9, mode="sum_len")  # aligned 6+6=12 > 10
    with pytest.raises(DpxValueError, match="capacity plan"):
        plan_step([1, 1], lay).with_counts([2, 2])


# ------------------------------------------------------------------ cost policy
def test_cost_policy_obvious_cases():
    lay = DpLayout(8, 8)
    # one replica holds everything at prefill size: padding costs 8x the bytes
    skew = plan_step([4096, 0, 0, 0, 0, 0, 0, 0], lay, policy="cost")
    assert skew.mode in (PaddingMode.GATHERV, PaddingMode.SUM_LEN)
    assert skew.mode is not PaddingMode.MAX_LEN
    # uniform counts: MAX_LEN moves the same bytes as GATHERV with less latency
    uni = plan_step([512] * 8, lay, policy=Policy.COST)
    assert uni.mode is PaddingMode.MAX_LEN
    # a model with free latency and huge skew: GATHERV (fewest bytes)
    cheap = CostModel(latency=0.0, per_root_latency=0.0)
    assert plan_step([8192, 0, 0, 0, 0, 0, 0, 1], lay, policy="cost",
                     cost_model=cheap).mode is PaddingMode.GATHERV
    # restricting candidates is honoured
    assert plan_step([8192, 0, 0, 0, 0, 0, 0, 1], lay, policy="cost", cost_model=cheap,
                     candidates=["max_len", "sum_len"]).mode is PaddingMode.SUM_LEN
    assert "cost policy" in skew.reason


def test_explain_mentions_every_mode():
    plan = plan_step([3, 0, 7, 5], DpLayout(8, 4))
    text = plan.explain()
    for word in ("MAX_LEN", "SUM_LEN", "GATHERV", "slot  1", "0 real", "chosen", "attn_tp=2"):
        assert word in text
    assert "* MAX_LEN" in text


def test_cli_plan_runs():
    res = subprocess.run([sys.executable, "-m", "dpx", "plan", "--world", "8", "--dp", "4",
                          "--tokens", "3,0,7,5", "--policy", "cost"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "fingerprint" in res.stdout and "slot  3" in res.stdout
    bad = subprocess.run([sys.executable, "-m", "dpx", "plan", "--world", "6", "--dp", "4"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "world_size=6" in bad.stderr


# ------------------------------------------------------------------ bad inputs
@pytest.mark.parametrize("counts,kind,pattern", [
    ([1, -1], DpxValueError, r"num_tokens\[1\]=-1 must be >= 0"),
    ([1, 2.5], DpxTypeError, r"num_tokens\[1\]=2.5 must be an int"),
    ([1, True], DpxTypeError, r"num_tokens\[1\]=True"),
    ([1, 2, 3], DpxValueError, r"3 entries.*dp_size=2"),
    ("12", DpxTypeError, "sequence of ints"),
])
def test_bad_counts(counts, kind, pattern):
    with pytest.raises(kind, match=pattern):
        plan_step(counts, DpLayout(4, 2))


def test_bad_strings_and_capacity():
    lay = DpLayout(4, 2)
    with pytest.raises(DpxValueError, match=r"unknown PaddingMode 'maxlen'.*'max_len'"):
        plan_step([1, 1], lay, mode="maxlen")
    with pytest.raises(DpxValueError, match=r"unknown Policy 'fast'"):
        plan_step([1, 1], lay, policy="fast")
    with pytest.raises(DpxTypeError, match="layout"):
        plan_step([1, 1], (4, 2))
    with pytest.raises(DpxValueError, match="capacity=-1"):
        plan_step([1, 1], lay, capacity=-1)
    with pytest.raises(DpxTypeError, match="capacity=2.0"):
        plan_step([1, 1], lay, capacity=2.0)
    with pytest.raises(DpxValueError, match="bus_bandwidth"):
        CostModel(bus_bandwidth=0)


def test_numpy_counts_accepted():
    np = pytest.importorskip("numpy")
    plan = plan_step(np.array([3, 0, 7, 5]), DpLayout(4, 4))
    assert plan.num_tokens == (3, 0, 7, 5) and all(type(n) is int for n in plan.num_tokens)
    assert dpx.__version__
