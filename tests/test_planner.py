"""Planner tests: pure Python, no devices."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dpx
from dpx import (CostModel, DpLayout, DpxCapacityError, DpxError, DpxTypeError, DpxValueError,
                 PaddingMode, Policy, build_schedule, ceil_align, plan_step)


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
def _sglang_reference(global_num_tokens, dp_size, is_extend, max_len_with_idle=False):
    """sglang's get_dp_padding_mode, restated from its documented behaviour."""
    if is_extend and dp_size > 1:
        if max_len_with_idle and min(global_num_tokens) == 0:
            return PaddingMode.MAX_LEN
        return PaddingMode.SUM_LEN
    if sum(global_num_tokens) * 2 >= max(global_num_tokens) * dp_size:
        return PaddingMode.MAX_LEN
    return PaddingMode.SUM_LEN


@settings(max_examples=400, deadline=None)
@given(st.sampled_from([(1, 1), (2, 2), (4, 4), (4, 2), (8, 8), (8, 4), (8, 2), (8, 1), (6, 3)]),
       st.data(), st.booleans(), st.booleans())
def test_sglang_rule_matches(layout_args, data, is_extend, idle_option):
    lay = DpLayout(*layout_args)
    counts = data.draw(st.lists(st.one_of(st.just(0), st.integers(0, 5000)),
                                min_size=lay.dp_size, max_size=lay.dp_size))
    plan = plan_step(counts, lay, is_extend=is_extend, max_len_with_idle=idle_option)
    aligned = [ceil_align(n, lay.attn_tp_size) for n in counts]
    assert plan.mode is _sglang_reference(aligned, lay.dp_size, is_extend, idle_option)
    assert plan.aligned_tokens == tuple(aligned)


def test_sglang_max_len_with_idle():
    """sglang's hybrid-model branch: an extend batch with an idle replica takes MAX_LEN
    when asked; without an idle replica, or without extend, the usual rule applies."""
    lay = DpLayout(4, 4)
    assert plan_step([5, 0, 3, 2], lay, is_extend=True).mode is PaddingMode.SUM_LEN
    with_idle = plan_step([5, 0, 3, 2], lay, is_extend=True, max_len_with_idle=True)
    assert with_idle.mode is PaddingMode.MAX_LEN and "max_len_with_idle" in with_idle.reason
    assert plan_step([5, 1, 3, 2], lay, is_extend=True,
                     max_len_with_idle=True).mode is PaddingMode.SUM_LEN
    assert plan_step([8, 0, 0, 0], lay, max_len_with_idle=True).mode is PaddingMode.SUM_LEN
    assert plan_step([0], DpLayout(2, 1), is_extend=True,
                     max_len_with_idle=True).mode is PaddingMode.MAX_LEN  # dp 1: the rule
    with pytest.raises(DpxValueError, match="max_len_with_idle=True is an option of"):
        plan_step([5, 0, 3, 2], lay, policy="cost", max_len_with_idle=True)
    with pytest.raises(DpxTypeError, match="max_len_with_idle=1 must be a bool"):
        plan_step([5, 0, 3, 2], lay, max_len_with_idle=1)


def test_build_schedule_takes_its_flags_as_bools_only():
    """A flag given as a truthy number or string is a DpxTypeError naming it, as in the
    frontends (a gather's ``partial=1`` was built as ``partial=True`` before); bools and
    the flags' defaults build."""
    lay = DpLayout(4, 2)
    cap = plan_step([3, 5], lay, mode="max_len", capacity=8)
    for flag, value in (("partial", 1), ("partial", "no"), ("partial", None),
                        ("device_counts", 1), ("in_place", 0), ("counts_ride", "yes"),
                        ("dequantize", 1)):
        with pytest.raises(DpxTypeError, match=f"{flag}={value!r} must be a bool"):
            build_schedule(cap, "gather", rank=1, **{flag: value})
    for partial in (True, False):
        for dc in (True, False):
            assert build_schedule(cap, "gather", rank=1, partial=partial, device_counts=dc,
                                  in_place=False, counts_ride=False).steps


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


def test_a_capacity_plan_applies_no_policy():
    """docs/semantics.md, mode choice: the options that pick a mode from host counts --
    either policy, an extend batch, sglang's decode rule -- where each picks SUM_LEN for
    these counts without a capacity, leave a capacity plan MAX_LEN (and ``mode=`` still
    forces one)."""
    lay = DpLayout(8, 8)
    skew = [100] + [0] * 7
    for kw in (dict(policy="cost"), dict(is_extend=True),
               dict(sum_len_allreduce_bytes=1 << 30, row_bytes=16, counts=[2] * 8)):
        counts = kw.pop("counts", skew)
        assert plan_step(counts, lay, **kw).mode is PaddingMode.SUM_LEN, kw
        plan = plan_step(counts, lay, capacity=128, **kw)
        assert plan.mode is PaddingMode.MAX_LEN and "capacity plan" in dpx.explain(plan), kw
        assert plan_step(counts, lay, capacity=128, mode="sum_len", **kw).mode is \
            PaddingMode.SUM_LEN


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


def test_cost_model_prices_the_schedules_that_run():
    """The estimate is the priced steps of the schedules: no place pass where a full slot
    is sent as is, and the staging copy of a SUM_LEN reduce_scatter is charged."""
    from dpx import Op, build_schedule, estimate
    from dpx.cost import estimate_op, price

    model, rb = CostModel(), 7168 * 2
    full = plan_step([5, 5], DpLayout(2, 2), mode="max_len")
    g = estimate_op(full, Op.GATHER, row_bytes=rb, cost_model=model)
    assert [s.ranks for s in g.steps] == [2] and g.steps[0].name.startswith("all_gather")
    part = plan_step([5, 3], DpLayout(2, 2), mode="max_len")
    g = estimate_op(part, Op.GATHER, row_bytes=rb, cost_model=model)
    assert g.rank == 1 and g.steps[0].name.startswith("place") and len(g.steps) == 2
    rs = estimate_op(plan_step([5, 3], DpLayout(2, 2), mode="sum_len"), Op.REDUCE_SCATTER,
                     row_bytes=rb, cost_model=model)
    # the slowest rank's slot is full: its final take is a plain copy of its rows
    assert [s.name.split()[0] for s in rs.steps] == ["copy", "all_reduce", "copy"]
    assert rs.steps[0].size == 2 * 8 * rb  # read + write of the 8-row global buffer
    # every estimate is exactly the sum of its schedules' priced steps
    for mode in PaddingMode:
        plan = plan_step([7, 0, 3, 12], DpLayout(8, 4), mode=mode)
        est = estimate(plan, row_bytes=rb, cost_model=model)
        for op_est in est.ops:
            sched = build_schedule(plan, op_est.op, rank=op_est.rank,
                                   in_rows=plan.num_tokens[op_est.rank // 2]
                                   if op_est.op is Op.GATHER else plan.global_rows)
            priced = price(sched, row_bytes=rb, cost_model=model)
            assert [p.name for p in priced] == [str(s) for s in sched.steps]
            assert op_est.steps == priced


def test_explain_mentions_every_mode():
    plan = plan_step([3, 0, 7, 5], DpLayout(8, 4))
    text = dpx.explain(plan)
    for word in ("MAX_LEN", "SUM_LEN", "GATHERV", "slot  1", "0 real", "chosen", "attn_tp=2"):
        assert word in text
    assert "* MAX_LEN" in text
    # a world collective that moves no bytes among 8 ranks is not a group without peers
    idle = dpx.explain(plan_step([0], DpLayout(8, 1)))
    assert "sends nothing" in idle and "no peers" not in idle, idle


def test_cli_plan_runs():
    res = subprocess.run([sys.executable, "-m", "dpx", "plan", "--world", "8", "--dp", "4",
                          "--tokens", "3,0,7,5", "--policy", "cost"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "fingerprint" in res.stdout and "slot  3" in res.stdout
    assert "rank 0 gather(partial=True)" in res.stdout


def test_cli_prints_each_ranks_schedule():
    """--rank R prints exactly the steps build_schedule gives that rank, priced."""
    from dpx import Op, build_schedule

    args = ["--world", "8", "--dp", "4", "--tokens", "3,0,7,5", "--mode", "gatherv"]
    res = subprocess.run([sys.executable, "-m", "dpx", "plan", *args, "--rank", "5"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    plan = plan_step([3, 0, 7, 5], DpLayout(8, 4), mode="gatherv")
    for op, partial, in_rows in ((Op.GATHER, True, 7), (Op.REDUCE_SCATTER, True, 18)):
        for step in build_schedule(plan, op, rank=5, partial=partial, in_rows=in_rows).steps:
            assert str(step) in res.stdout, str(step)
    assert "rank 4" not in res.stdout
    every = subprocess.run([sys.executable, "-m", "dpx", "plan", *args, "--rank", "all",
                            "--capacity", "32", "--device-counts"], capture_output=True,
                           text=True)
    assert every.returncode == 0, every.stderr
    assert all(f"rank {r} reduce_scatter" in every.stdout for r in range(8))
    assert "cumsum_excl(align(n, 2))" in every.stdout
    assert "note: GATHERV moves every rank's block in an equal all-gather" in every.stdout
    bad = subprocess.run([sys.executable, "-m", "dpx", "plan", *args, "--rank", "8"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "rank=8 must be < world_size=8" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "dpx", "plan", "--world", "6", "--dp", "4"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "world_size=6" in bad.stderr


def test_cli_prints_a_sharded_plan_and_another_transport(capsys):
    """docs/semantics.md: ``--shards`` gives each replica's CP shards (the counts their
    sums), ``--transport`` the transport the schedules are built and priced for."""
    from dpx import Op, build_schedule
    from dpx.cli import main

    main(["plan", "--world", "8", "--dp", "2", "--cp", "2", "--shards", "2,3;0,4", "--rank",
          "3"])
    out = capsys.readouterr().out
    plan = plan_step([5, 4], DpLayout(8, 2, 2), cp_shards=[(2, 3), (0, 4)])
    assert "shards : [[2, 3], [0, 4]]" in out and "counts : [5, 4]" in out
    steps = build_schedule(plan, Op.GATHER, rank=3, partial=True, in_rows=3).steps
    assert all(str(step) in out for step in steps) and "rank 2" not in out
    main(["plan", "--world", "4", "--dp", "4", "--tokens", "3,0,7,5", "--transport", "peer"])
    peer = capsys.readouterr().out
    assert "transport peer" in peer and "peer   : a phase of >=" in peer
    assert "peer   :" not in out and "transport per_root" in out


@pytest.mark.parametrize("args,message", [
    (["--wire", "nvfp4", "--hidden", "40"], "H=40 must be a positive multiple of 16"),
    (["--wire", "fp8", "--hidden", "100"], "H=100 must be a positive multiple of 128"),
    (["--wire", "mxfp4", "--dtype", "int32"], "has dtype int32"),
    (["--hidden", "0"], "--hidden 0: must be > 0"),
])
def test_cli_refuses_rows_the_frontends_refuse(capsys, args, message):
    """The CLI prices only what a frontend would run: one ``dpx: error:`` line, exit 2."""
    from dpx.cli import main

    with pytest.raises(SystemExit) as info:
        main(["plan", "--world", "8", "--dp", "4", "--tokens", "3,0,7,5", *args])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.startswith("dpx: error: ") and message in err
    assert err.count("\n") == 1, err


def test_demo_refuses_a_bad_layout_in_one_line():
    res = subprocess.run([sys.executable, "-m", "dpx", "demo", "--world", "3", "--dp", "2"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and res.stderr == (
        "dpx demo: error: world_size=3 must be divisible by dp_size*cp_size=2*1=2\n"), res.stderr


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


def test_every_test_module_is_ordered():
    """The suite runs cheapest first by the order in conftest.ORDER: every test module
    must have a place in it (a new one would otherwise run last, unnoticed)."""
    from pathlib import Path

    from conftest import ORDER

    here = Path(__file__).resolve().parent
    stems = {p.stem for p in here.rglob("test_*.py")}
    assert stems == set(ORDER), (f"not ordered: {sorted(stems - set(ORDER))}; "
                                 f"stale: {sorted(set(ORDER) - stems)}")


@pytest.mark.parametrize("layout", [(8, 8), (8, 2), (8, 1), (8, 2, 2), (6, 3)],
                         ids=lambda t: "w{}dp{}".format(*t) + (f"cp{t[2]}" if len(t) > 2 else ""))
def test_lm_head_scatter_moves_one_slot_a_rank(layout):
    """The cost model's price of scatter_columns: each rank sends (world - 1) blocks of
    max_slot_rows rows of its columns (the largest CP shard rounded up to attn_tp with CP
    shards) -- max_slot_rows / global_rows of an all-gather of the columns, 1 / dp in
    MAX_LEN; where every rank's rows are its own and tile the input (SUM_LEN and GATHERV,
    one rank a replica) only the real rows travel, in a variable all-to-all; explain(plan,
    vocab=) prints both."""
    from dpx import Op
    from dpx.cost import estimate_op

    lay = dpx.DpLayout(*layout)
    W, rb = lay.world_size, 3 * 2
    for counts in ([5, 0, 7, 1, 2, 9, 4, 3][:lay.dp_size], [6] * lay.dp_size):
        for mode in ("max_len", "sum_len", "gatherv"):
            plan = dpx.plan_step(counts, lay, mode=mode)
            got = estimate_op(plan, Op.SCATTER_COLUMNS, row_bytes=rb,
                              cost_model=CostModel()).moved
            if mode != "max_len" and lay.replica_size == 1:
                assert got == round(sum(counts) * rb * (W - 1) / W), (counts, mode)
            else:
                assert got == (W - 1) * plan.max_slot_rows * rb, (counts, mode)
            if mode == "max_len":
                assert got * lay.dp_size == (W - 1) * plan.global_rows * rb
            text = dpx.explain(plan, vocab=3 * W)
            assert "lm head: vocab" in text and "all-gather of the columns" in text


def test_a_non_plan_is_named_where_a_plan_is_taken():
    """The planner's functions that take a plan name a non-plan first
    (:func:`dpx.plan.check_plan`), not an AttributeError from inside."""
    from dpx.errors import DpxTypeError
    from dpx.extents import held_rows

    calls = [lambda p: dpx.explain(p), lambda p: dpx.build_schedule(p, "gather", rank=0),
             lambda p: dpx.estimate(p, row_bytes=2, cost_model=dpx.CostModel()),
             lambda p: dpx.local_rows(p, 0, device_counts=False),
             lambda p: dpx.op_rows(p, dpx.Op.GATHER, 0, device_counts=False),
             lambda p: dpx.op_rows(p, dpx.Op.SCATTER, None, device_counts=True),
             lambda p: held_rows(p, 0)]
    for call in calls:
        with pytest.raises(DpxTypeError, match="plan must be a dpx.DpPlan, got str"):
            call("x")
    plan = dpx.plan_step([3, 1], dpx.DpLayout(2, 2), mode="max_len")
    assert dpx.local_rows(plan, 1, device_counts=False) == (plan.offsets[1], plan.slot_rows[1])
