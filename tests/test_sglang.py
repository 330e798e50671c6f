"""dpx_torch.sglang, sglang's DP-attention functions by their names: each equal to the
dpx-native call on gloo worlds 1-4 (attn-tp and CP layouts, every mode, host and device
counts), the attn-tp / attn-cp helpers against stock ops, and a layer written only
against these names against the dense reference."""

from __future__ import annotations

import inspect

import pytest

pytestmark = pytest.mark.multiproc

LAYOUTS = [(1, 1), (2, 2), (2, 1), (3, 1), (4, 2), (4, 4), (4, 1), (4, 1, 2), (4, 2, 2)]
IDS = lambda l: f"w{l[0]}dp{l[1]}" + (f"cp{l[2]}" if len(l) > 2 else "")  # noqa: E731


def _cases(dp: int, m: int) -> list[dict]:
    """Host counts with idle replicas in both sglang modes (SUM_LEN also as GATHERV), and
    capacity steps with device counts; ``m`` = cp * attn_tp (capacities aligned to it)."""
    idle = [0] * dp
    ragged = [(3 * e + 2) % 7 for e in range(dp)]
    busy = [5] * dp
    cases = []
    for counts in (ragged, busy, idle, [9] + [0] * (dp - 1)):
        cases.append(dict(counts=counts, mode="MAX_LEN"))
        cases.append(dict(counts=counts, mode="SUM_LEN"))
        cases.append(dict(counts=counts, mode="SUM_LEN", gatherv=True))
    cap = 8 * m
    cases.append(dict(counts=[min(c, cap) for c in ragged], mode="MAX_LEN", device=True,
                      capacity=cap))
    cases.append(dict(counts=ragged, mode="SUM_LEN", device=True, capacity=cap * dp))
    cases.append(dict(counts=[0] * dp, mode="MAX_LEN", device=True, capacity=cap))
    return cases


@pytest.mark.parametrize("layout", LAYOUTS, ids=IDS)
def test_each_function_equals_the_dpx_call(gloo_worlds, layout):
    dp = layout[1]
    m = layout[0] // dp
    cases = _cases(dp, m)
    res = gloo_worlds(layout[0]).run("sglang_jobs:dropin_matches_native", layout, cases,
                                     timeout=300)
    assert res == [len(cases)] * layout[0]


@pytest.mark.parametrize("layout", [(2, 2), (4, 2), (4, 4), (4, 1, 2)], ids=IDS)
def test_combine_wire_runs_the_quantized_combine(gloo_worlds, layout):
    """``setup(..., combine_wire=...)`` (fp8, nvfp4, mxfp4): the drop-in's combines are the
    quantized combine of the same plan, host counts in every mode, device counts, GATHERV's
    async form."""
    dp = layout[1]
    ragged = [3 + 2 * e if e % 2 == 0 else 0 for e in range(dp)]
    cases = [dict(counts=ragged, mode="MAX_LEN", wire="fp8"),
             dict(counts=ragged, mode="SUM_LEN", wire="nvfp4", scale=0.75),
             dict(counts=ragged, mode="SUM_LEN", wire="mxfp4", gatherv=True),
             dict(counts=[min(c, 8) for c in ragged], mode="MAX_LEN", wire="fp8",
                  device=True, capacity=8)]
    done = gloo_worlds(layout[0]).run("sglang_jobs:dropin_combine_wire", layout, cases,
                                      timeout=300)
    gv = 1 if layout[0] == dp else 0   # GATHERV where attn_tp is 1 (no CP)
    assert [n for n, _ in done] == [len(cases) + gv] * layout[0]
    assert done[0][1] == len(cases)   # replica 0 is busy: its quantized sums differ


@pytest.mark.parametrize("layout", [(2, 2), (4, 2), (2, 1, 2), (4, 2, 2), (4, 1, 2)], ids=IDS)
def test_todays_sglang_surface(gloo_worlds, layout):
    """cp_shard_counts, the decode rule (padding mode, CUDA-graph default, plan_step's
    sglang policy), set_local_dp_buffer_len / get_dp_global_num_tokens_gpu, and a graph
    step's combine with pad rows zero (the job checks each against the dpx-native call)."""
    world, dp = layout[0], layout[1]
    res = gloo_worlds(world).run("sglang_jobs:newer_surface", layout, timeout=300)
    # one replica: a gather of width 1 keeps MAX_LEN
    want_rule = ["SUM_LEN" if dp > 1 else "MAX_LEN", "MAX_LEN", "MAX_LEN"]
    m = world // dp
    for r, got in enumerate(res):
        d = r // m
        assert got["rule"] == want_rule and got["graph"] == want_rule, got
        assert got["graph_default"] == "MAX_LEN" and got["plan_step"] == want_rule[0], got
        assert got["lens"] == (5, True), got
        assert got["local_buffer"] == ((5, 16), True, True, (5, 16)), got
        assert got["extend"] == (True, False) and got["async_event"], got
        n = 1 + d % 3  # the replica's device count: its rows sum over the world, pad rows 0
        assert got["combine_rows"] == [float(world)] * n + [0.0] * (4 * m - n), got
        if len(layout) > 2:
            assert got["cp_cases"] == 3 and got["changed_split"] == 2, got
            assert "replica 0's ranks pass different cp_shard_counts" in got["disagree"], got
            assert "sum to" in got["wrong_sum"], got
            cp = layout[2]
            assert f"rank 0 passed cp_shard_counts {[5, -1] + [0] * (cp - 2)}: not {cp} " \
                "ints >= 0" in got["negative"], got
            assert f"rank 0 passed cp_shard_counts that are not {cp} ints" in got["huge"], got
    for key in ("disagree", "wrong_sum", "negative", "huge"):
        assert len({got.get(key) for got in res}) == 1, f"{key}: ranks raised differently"


@pytest.mark.parametrize("layout", [(1, 1), (4, 2), (4, 1, 2), (4, 1, 4), (2, 1, 2)], ids=IDS)
def test_attn_helpers_and_world_info(gloo_worlds, layout):
    res = gloo_worlds(layout[0]).run("sglang_jobs:helpers_match_stock_ops", layout)
    assert [x["rank"] for x in res] == list(range(layout[0]))


STEPS = [dict(counts=None, mode="MAX_LEN"), dict(counts=None, mode="SUM_LEN", extend=True),
         dict(counts=None, mode="MAX_LEN", replicate=True),
         dict(counts=None, mode="SUM_LEN", extend=True, replicate=True),
         dict(counts=None, bucket=12)]  # buckets aligned to attn_tp, as sglang's


@pytest.mark.parametrize("layout", [(1, 1), (2, 2), (2, 1), (3, 1), (4, 2), (4, 4)], ids=IDS)
def test_a_layer_written_against_sglang_names(gloo_worlds, layout):
    dp = layout[1]
    steps = []
    for s in STEPS:
        s = dict(s)
        if s.get("bucket"):
            s["counts"] = [(5 * e + 3) % 13 for e in range(dp)]
        elif s["mode"] == "MAX_LEN":
            s["counts"] = [4 + e for e in range(dp)]     # 2*sum >= dp*max
        else:
            s["counts"] = [7] + [0] * (dp - 1)           # an extend batch, idle replicas
        steps.append(s)
    worst = gloo_worlds(layout[0]).run("sglang_jobs:layer_matches_dense", layout, steps,
                                       timeout=300)
    assert max(worst) < 1e-4, worst


def test_signatures_lead_with_sglangs_parameters():
    """Each function's leading parameters are sglang's, in sglang's order."""
    import dpx_torch.sglang as sg

    want = {
        "dp_gather_partial": ["global_tokens", "local_tokens", "forward_batch",
                              "cp_shard_counts"],
        "dp_gather_replicate": ["global_tokens", "local_tokens", "forward_batch",
                                "cp_shard_counts"],
        "dp_scatter": ["local_tokens", "global_tokens", "forward_batch", "cp_shard_counts"],
        "dp_reduce_scatter_tensor": ["output", "input"],
        "dp_gather_partial_async": ["global_tokens", "local_tokens", "forward_batch",
                                    "event_key"],
        "dp_reduce_scatterv_async": ["output_local", "global_tokens", "sizes", "event_key"],
        "get_tbo_persistent_buffer": ["key", "rows", "hidden", "dtype", "device"],
        "set_dp_buffer_len": ["global_dp_buffer_len", "local_dp_buffer_len",
                              "dp_max_padding", "global_num_tokens", "global_num_tokens_gpu"],
        "set_local_dp_buffer_len": ["local_dp_buffer_len"],
        "get_dp_local_info": ["forward_batch"],
        "get_dp_local_slice_cpu": ["forward_batch", "can_run_graph", "cuda_graph_batch"],
        "compute_dp_attention_world_info": ["enable_dp_attention", "tp_rank", "tp_size",
                                            "dp_size", "attn_cp_size"],
        "attn_tp_reduce_scatter_tensor": ["output", "input"],
        "attn_cp_reduce_scatter_tensor": ["output", "input"],
        "attn_tp_all_reduce": ["input"],
        "attn_tp_all_gather_into_tensor": ["output", "input"],
        "attn_cp_all_gather_into_tensor": ["output", "input"],
        "get_global_dp_buffer": ["group"], "get_local_dp_buffer": ["group"],
    }
    for name, params in want.items():
        got = list(inspect.signature(getattr(sg, name)).parameters)
        assert got[:len(params)] == params, (name, got)
    for name in ("get_attention_dp_rank", "get_attention_dp_size", "get_attention_tp_rank",
                 "get_attention_tp_size", "is_dp_attention_enabled", "disable_dp_size",
                 "get_global_dp_buffer_len", "get_local_dp_buffer_len", "is_dp_max_padding",
                 "get_dp_global_num_tokens_gpu"):
        assert not inspect.signature(getattr(sg, name)).parameters, name
    assert [m.name for m in sg.DpPaddingMode] == ["MAX_LEN", "SUM_LEN"]


def test_not_set_up_is_a_clear_error():
    import dpx
    import dpx_torch.sglang as sg

    sg.teardown()
    with pytest.raises(dpx.DpxValueError, match="dpx_torch.sglang is not set up"):
        sg.get_attention_dp_rank()
    assert not sg.is_dp_attention_enabled()


@pytest.mark.parametrize("enabled", [True, False])
def test_world_info_is_sglangs_arithmetic(enabled):
    import dpx_torch.sglang as sg

    for tp_size, dp_size, cp in [(8, 4, 1), (8, 2, 2), (16, 8, 2), (4, 4, 1), (8, 1, 4)]:
        for rank in range(tp_size):
            a_dp = dp_size if enabled else 1
            a_tp = tp_size // a_dp // cp
            want = (rank % a_tp, a_tp, rank // (a_tp * cp) if enabled else 0, a_dp)
            assert sg.compute_dp_attention_world_info(enabled, rank, tp_size, dp_size,
                                                      cp) == want


def test_gatherv_switch_reads_the_environment_only_when_asked(comm1, monkeypatch):
    import torch

    import dpx_torch.sglang as sg

    monkeypatch.setenv("SGLANG_DP_USE_GATHERV", "1")
    try:
        assert not sg.setup(comm1, hidden_size=4, dtype=torch.float32, device="cpu").use_gatherv
        assert sg.setup(comm1, hidden_size=4, dtype=torch.float32, device="cpu",
                        use_gatherv_from_env=True).use_gatherv
        monkeypatch.setenv("SGLANG_DP_USE_GATHERV", "0")
        assert not sg.setup(comm1, hidden_size=4, dtype=torch.float32, device="cpu",
                            use_gatherv=True, use_gatherv_from_env=True).use_gatherv
    finally:
        sg.teardown()
