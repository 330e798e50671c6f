"""dpx_torch.sglang on every rank of a gloo world (see harness.py): each function against
the dpx-native call it stands for, the attn-tp / attn-cp helpers against stock-op sums and
concatenations of every rank's (seeded) input, and the sglang-style layer against the
dense reference."""

from __future__ import annotations

import torch
import torch.distributed as dist

import dpx
import dpx_torch
import dpx_torch.sglang as sg
from harness import raised
from sglang_layer import ForwardBatch

HID = 16


def _rows(seed: int, rows: int) -> torch.Tensor:
    return torch.randn(rows, HID, generator=torch.Generator().manual_seed(seed))


def _nan(rows: int) -> torch.Tensor:
    return torch.full((rows, HID), float("nan"))


def _same(name: str, got: torch.Tensor, want: torch.Tensor, case) -> None:
    if got.shape != want.shape or not torch.equal(got, want):
        raise AssertionError(f"{name} differs from the dpx-native call for {case}")


def dropin_matches_native(ctx, layout_args, cases) -> int:
    """Per case (counts, sglang mode, use_gatherv, device counts or host): the gathers, the
    scatter, the reduce-scatter, their async forms, the local info and slice, and the
    buffers, each equal to the dpx-native call on the same plan; inputs unchanged."""
    layout = dpx.DpLayout(*layout_args)
    comm = ctx.comm(layout)
    r = ctx.rank
    c = layout.coords(r)
    d, dp = c.attn_dp_rank, layout.dp_size
    done = 0
    for i, case in enumerate(cases):
        st = sg.setup(comm, hidden_size=HID, dtype=torch.float32, device="cpu",
                      use_gatherv=case.get("gatherv", False))
        counts = case["counts"]
        pmode = sg.DpPaddingMode[case["mode"]]
        # sglang's SGLANG_DP_USE_GATHERV: SUM_LEN steps go GATHERV where attn_tp is 1, no CP
        gv = st.use_gatherv and layout.attn_tp_size == 1 and layout.cp_size == 1
        native_mode = "max_len" if pmode.is_max_len() else ("gatherv" if gv else "sum_len")
        if case.get("device"):
            cap = case["capacity"]
            plan = dpx.plan_step([0] * dp, layout, mode=native_mode, capacity=cap)
            ct = torch.tensor(counts, dtype=torch.int32)
            fb = ForwardBatch(None, ct, pmode)
            local_len = plan.slot_rows[d]
            sg.set_dp_buffer_len(plan.global_rows, local_len, pmode.is_max_len(), None)
            if pmode.is_max_len():
                assert sg.get_global_dp_buffer_len() == plan.global_rows
        else:
            plan = dpx.plan_step(counts, layout, mode=native_mode)
            ct = None
            fb = ForwardBatch(list(counts), torch.tensor(counts, dtype=torch.int32), pmode)
            local_len = plan.slot_rows[d]
            sg.set_dp_buffer_len(plan.global_rows, local_len, pmode.is_max_len(),
                                 list(counts))
            assert sg.is_dp_gatherv_active() is (plan.mode is dpx.PaddingMode.GATHERV)
            with sg.disable_dp_size():   # sglang's tp_size == dp_size condition
                assert sg.is_dp_gatherv_active() is (
                    plan.mode is dpx.PaddingMode.GATHERV and layout.world_size == 1)
        assert sg.is_dp_max_padding() is pmode.is_max_len()
        # gathers: partial (every rank its own rows) and replicated (a replica's ranks alike)
        for partial in (True, False):
            seed = 1000 * i + (r if partial else 100 + d)
            local = _rows(seed, local_len + 2)
            keep = local.clone()
            g = sg.get_global_dp_buffer()
            assert g.shape == (plan.global_rows, HID)
            g.fill_(float("nan"))
            (sg.dp_gather_partial if partial else sg.dp_gather_replicate)(g, local, fb)
            want = comm.gather(local, plan, partial=partial, counts=ct)
            _same("dp_gather_" + ("partial" if partial else "replicate"), g, want, case)
            # rows past the counts are zero, whatever the local buffer held there
            assert not g[dpx_torch.pad_row_mask(plan, counts=ct)].any(), case
            _same("the local input", local, keep, case)
            if partial:
                g2 = _nan(plan.global_rows)
                ev = sg.dp_gather_partial_async(g2, local, fb, ("gather", i % 2))
                assert ev is None  # CPU: the call has completed
                _same("dp_gather_partial_async", g2, want, case)
        # scatter of a reduced buffer into a longer (graph-padded) local buffer
        glob = _rows(5000 + i, plan.global_rows)
        out = _nan(local_len + 3)
        sg.dp_scatter(out, glob, fb)
        want = comm.scatter(glob, plan, counts=ct)
        _same("dp_scatter", out[:local_len], want, case)
        assert not out[local_len:].any(), case
        # reduce-scatter (planned from set_dp_buffer_len)
        if not case.get("device"):
            glob = _rows(7000 + 10 * i + r, plan.global_rows)
            keep = glob.clone()
            out = _nan(local_len)
            sg.dp_reduce_scatter_tensor(out, glob)
            _same("dp_reduce_scatter_tensor", out, comm.reduce_scatter(glob, plan), case)
            _same("the reduce-scatter input", glob, keep, case)
            if plan.mode is dpx.PaddingMode.GATHERV:
                out = _nan(local_len)
                sg.dp_reduce_scatterv_async(out, glob, list(plan.aligned_tokens),
                                            ("combine", i % 2))
                _same("dp_reduce_scatterv_async", out, comm.reduce_scatter(glob, plan), case)
            # local info and slices
            start, num = sg.get_dp_local_info(fb)
            assert (int(start), int(num)) == (plan.offsets[d], counts[d]), case
            assert fb.dp_local_start_pos is start and fb.dp_local_num_tokens is num
            assert sg.get_dp_local_slice_cpu(fb, False, None) == (plan.offsets[d], counts[d])
            assert sg.get_dp_local_slice_cpu(fb, True, 8) == (8 * d, counts[d])
        else:
            start, num = sg.get_dp_local_info(fb)
            held = int(sum(-(-x // layout.replica_size) * layout.replica_size
                           for x in counts[:d]))
            assert int(start) == (d * plan.slot_rows[0] if pmode.is_max_len() else held), case
            assert int(num) == counts[d], case
        buf = sg.get_tbo_persistent_buffer(("x", i % 2), 3, HID, torch.float32, "cpu")
        assert buf.shape == (3, HID)
        done += 1
    sg.teardown()
    return done


def helpers_match_stock_ops(ctx, layout_args) -> dict:
    """The attn-tp / attn-cp helpers and the world info against sums and concatenations of
    every rank's seeded input over the layout's groups; the getters; disable_dp_size."""
    layout = dpx.DpLayout(*layout_args)
    comm = ctx.comm(layout)
    r = ctx.rank
    st = sg.setup(comm, hidden_size=HID, dtype=torch.float32, device="cpu")
    c = layout.coords(r)
    tp, cp = layout.attn_tp_size, layout.cp_size
    inputs = [_rows(300 + q, 2 * tp * cp) for q in range(layout.world_size)]
    mine = inputs[r]
    tp_group = next(g for g in layout.attn_tp_groups() if r in g)
    cp_group = next(g for g in layout.attn_cp_groups() if r in g)
    total = sum(inputs[q] for q in tp_group)
    got = sg.attn_tp_all_reduce(mine)
    assert torch.allclose(got, total, atol=1e-5) and torch.equal(mine, inputs[r])
    out = _nan(2 * cp)
    sg.attn_tp_reduce_scatter_tensor(out, mine)
    blk = 2 * cp
    assert torch.allclose(out, total[c.attn_tp_rank * blk:(c.attn_tp_rank + 1) * blk], atol=1e-5)
    out = _nan(2 * tp * cp * tp)
    sg.attn_tp_all_gather_into_tensor(out, mine)
    assert torch.equal(out, torch.cat([inputs[q] for q in tp_group]))
    cp_total = sum(inputs[q] for q in cp_group)
    out = _nan(2 * tp)
    sg.attn_cp_reduce_scatter_tensor(out, mine)
    blk = 2 * tp
    assert torch.allclose(out, cp_total[c.attn_cp_rank * blk:(c.attn_cp_rank + 1) * blk],
                          atol=1e-5)
    out = _nan(2 * tp * cp * cp)
    sg.attn_cp_all_gather_into_tensor(out, mine)
    assert torch.equal(out, torch.cat([inputs[q] for q in cp_group]))
    info = sg.compute_dp_attention_world_info(True, r, layout.world_size, layout.dp_size,
                                              layout.cp_size)
    # sglang's arithmetic, (dp, cp, tp) with tp fastest
    a_tp = layout.world_size // layout.dp_size // cp
    assert info == (r % a_tp, a_tp, r // (a_tp * cp), layout.dp_size), info
    assert (sg.get_attention_tp_rank(), sg.get_attention_tp_size(), sg.get_attention_dp_rank(),
            sg.get_attention_dp_size(), sg.get_attention_cp_rank(),
            sg.get_attention_cp_size()) == (c.attn_tp_rank, tp, c.attn_dp_rank,
                                            layout.dp_size, c.attn_cp_rank, cp)
    with sg.disable_dp_size():
        inside = sg.get_attention_dp_size()
    assert inside == 1 and sg.get_attention_dp_size() == layout.dp_size
    assert sg.is_dp_attention_enabled() and st is sg.current()
    sg.teardown()
    assert not sg.is_dp_attention_enabled()
    return {"rank": r}


def layer_matches_dense(ctx, layout_args, steps) -> float:
    """The sglang-style layer (tests/sglang_layer.py) over several steps -- host counts
    with idle replicas in both padding modes, partial and replicated gathers, and a
    capacity step with device counts -- against the dense reference. Returns the worst
    error."""
    import sglang_layer as L

    layout = dpx.DpLayout(*layout_args)
    comm = ctx.comm(layout)
    sg.setup(comm, hidden_size=L.H, dtype=torch.float32, device="cpu",
             use_gatherv=layout.attn_tp_size == 1)
    w = L.weights()
    d = sg.get_attention_dp_rank()
    worst = 0.0
    for k, step in enumerate(steps):
        n = step["counts"]
        xs = [torch.randn(m, L.H, generator=torch.Generator().manual_seed(10 * k + e))
              for e, m in enumerate(n)]
        if step.get("bucket"):
            fb = L.graph_batch(step["bucket"], torch.tensor(n, dtype=torch.int32))
            rows = step["bucket"]
        else:
            fb, rows = L.prepare(n, step.get("extend", False), "cpu")
            # sglang's rule: MAX_LEN at dp 1 whatever the batch
            want_max = step["mode"] == "MAX_LEN" or layout.dp_size == 1
            assert fb.dp_padding_mode.is_max_len() is want_max, (step, fb)
        x = torch.zeros(rows, L.H)
        x[:n[d]] = xs[d]
        y = L.layer(x, w, fb, replicate=step.get("replicate", False))
        want = L.dense(xs[d], w)
        worst = max(worst, float((y[:n[d]] - want).abs().max()) if n[d] else 0.0)
        if step.get("bucket") or fb.dp_padding_mode.is_sum_len():
            assert not y[n[d]:].any(), step  # pad rows stay zero where dpx defines them
    dist.barrier()
    sg.teardown()
    return worst


def newer_surface(ctx, layout_args) -> dict:
    """What sglang's module grew since the reference: ``cp_shard_counts`` on the gathers
    and the scatter (equal to the dpx-native calls on a plan with those CP shards; bad
    counts raise the same error on every rank), the decode rule of the padding mode and of
    the CUDA-graph default, ``set_local_dp_buffer_len`` / ``get_dp_global_num_tokens_gpu``,
    and the combine of a graph step planned from the step's device counts (pad rows zero,
    as all_reduce + dp_scatter give)."""
    layout = dpx.DpLayout(*layout_args)
    comm = ctx.comm(layout)
    r, c = ctx.rank, layout.coords(ctx.rank)
    d, dp, cp, m = c.attn_dp_rank, layout.dp_size, layout.cp_size, layout.replica_size
    out: dict = {}
    # the decode rule: SUM_LEN when no replica is idle and the summed rows fit one
    # all-reduce of the limit; the graph default follows it for the captured counts
    limit = 10 * HID * 4
    sg.setup(comm, hidden_size=HID, dtype=torch.float32, device="cpu",
             sum_len_allreduce_bytes=limit)
    fits, idle, over = [2] * dp, [0] + [2] * (dp - 1), [11] + [1] * (dp - 1)
    P = sg.DpPaddingMode
    out["rule"] = [P.get_dp_padding_mode(False, x).name for x in (fits, idle, over)]
    out["graph"] = [P.get_default_mode_in_cuda_graph(x).name for x in (fits, idle, over)]
    out["graph_default"] = P.get_default_mode_in_cuda_graph().name
    plan = dpx.plan_step(fits, layout, sum_len_allreduce_bytes=limit, row_bytes=HID * 4)
    out["plan_step"] = plan.mode.name
    # the buffer lengths and device counts of a forward
    gpu = torch.tensor(fits, dtype=torch.int32)
    sg.set_dp_buffer_len(8 * dp, 8, True, None, gpu)
    sg.set_local_dp_buffer_len(5)
    out["lens"] = (sg.get_local_dp_buffer_len(), sg.get_dp_global_num_tokens_gpu() is gpu)
    # new buffers of those lengths (group accepted and unused); the extend flag
    a, b = sg.get_local_dp_buffer(), sg.get_local_dp_buffer(group=object())
    out["local_buffer"] = (tuple(a.shape), a.dtype == torch.float32,
                           a.data_ptr() != b.data_ptr(), tuple(b.shape))
    sg.set_is_extend_in_batch(True)
    extend = sg.get_is_extend_in_batch()
    sg.set_is_extend_in_batch(False)
    out["extend"] = (extend, sg.get_is_extend_in_batch())
    # the async combine on CPU: done when it returns, no event
    ev = sg.dp_reduce_scatterv_async(torch.zeros(m, HID), torch.ones(m * dp, HID),
                                     [m] * dp, ("combine", 0))
    out["async_event"] = ev is None
    # a graph step of bucket 4 with device counts only: the combine uses the step's counts
    bucket = 4 * m
    counts = [1 + e % 3 for e in range(dp)]
    fb = ForwardBatch(None, torch.tensor(counts, dtype=torch.int32), P.MAX_LEN)
    sg.set_dp_buffer_len(bucket * dp, bucket, True, [bucket] * dp)
    g = sg.get_global_dp_buffer()
    sg.dp_gather_partial(g, torch.ones(bucket, HID), fb)
    via_rs = _nan(bucket)
    sg.dp_reduce_scatter_tensor(via_rs, torch.ones(bucket * dp, HID))
    summed = torch.ones(bucket * dp, HID)
    dist.all_reduce(summed)
    via_scatter = _nan(bucket)
    sg.dp_scatter(via_scatter, summed, fb)
    _same("dp_reduce_scatter_tensor of a graph step", via_rs, via_scatter, counts)
    out["combine_rows"] = via_rs[:, 0].tolist()
    sg.teardown()
    if cp == 1:
        return out
    # CP shards: replica e's rows split over its CP ranks as cp_shard_counts say
    sg.setup(comm, hidden_size=HID, dtype=torch.float32, device="cpu")
    done = 0
    for i, (nums, mode) in enumerate([([5 + e for e in range(dp)], "MAX_LEN"),
                                      ([3 * e for e in range(dp)], "SUM_LEN"),
                                      ([0] * dp, "SUM_LEN")]):
        nums = list(nums)
        shards = [[n - n // cp * (cp - 1) if k == 0 else n // cp for k in range(cp)][::-1]
                  if e % 2 else [n] + [0] * (cp - 1) for e, n in enumerate(nums)]
        fb = ForwardBatch(nums, torch.tensor(nums, dtype=torch.int32), P[mode])
        plan = dpx.plan_step(nums, layout, mode=mode.lower(), cp_shards=shards)
        sg.set_dp_buffer_len(plan.global_rows, plan.slot_rows[d], mode == "MAX_LEN", nums)
        mine = shards[d][c.attn_cp_rank]
        for partial in (True, False):
            seed = 100 * i + (r if partial else 50 + d * cp + c.attn_cp_rank)
            local = _rows(seed, mine + 2)
            g = _nan(plan.global_rows)
            (sg.dp_gather_partial if partial else sg.dp_gather_replicate)(
                g, local, fb, cp_shard_counts=shards[d])
            _same("gather with cp_shard_counts", g,
                  comm.gather(local, plan, partial=partial), (nums, shards, partial))
        glob = _rows(900 + i, plan.global_rows)
        res = _nan(plan.slot_rows[d] + 2)
        sg.dp_scatter(res, glob, fb, cp_shard_counts=shards[d])
        _same("dp_scatter with cp_shard_counts", res[:plan.slot_rows[d]],
              comm.scatter(glob, plan), (nums, shards))
        assert not res[plan.slot_rows[d]:].any()
        small = _nan(mine)   # an output of this CP rank's shard's rows only
        sg.dp_scatter(small, glob, fb, cp_shard_counts=shards[d])
        _same("dp_scatter into a shard's rows", small, comm.scatter(glob, plan)[:mine],
              (nums, shards))
        # the combine gives every CP rank its replica's whole slot, as sglang's does
        rs = _nan(plan.slot_rows[d])
        sg.dp_reduce_scatter_tensor(rs, glob)
        _same("dp_reduce_scatter_tensor after sharded gathers", rs,
              comm.reduce_scatter(glob, dpx.plan_step(nums, layout, mode=mode.lower())),
              (nums, shards))
        done += 1
    out["cp_cases"] = done
    # one batch, two gathers: replica 0 keeps its split, the others change theirs -- every
    # rank exchanges on each call, so each gather is the native one of its shard table
    nums = [4] * dp
    fb = ForwardBatch(nums, torch.tensor(nums, dtype=torch.int32), P.SUM_LEN)
    plan = dpx.plan_step(nums, layout, mode="sum_len")
    sg.set_dp_buffer_len(plan.global_rows, plan.slot_rows[d], False, nums)
    splits = ([[4] + [0] * (cp - 1)] * dp,
              [[4] + [0] * (cp - 1)] + [[0] * (cp - 1) + [4]] * (dp - 1))
    for i, table in enumerate(splits):
        local = _rows(700 + 10 * i + r, 4)
        g = _nan(plan.global_rows)
        sg.dp_gather_partial(g, local, fb, cp_shard_counts=table[d])
        want = comm.gather(local, dpx.plan_step(nums, layout, mode="sum_len",
                                                cp_shards=table), partial=True)
        _same("a gather after another replica changed its cp_shard_counts", g, want, table)
    out["changed_split"] = len(splits)
    nums = [4] * dp
    fb = ForwardBatch(nums, torch.tensor(nums, dtype=torch.int32), P.SUM_LEN)
    bad = [4] + [0] * (cp - 1) if r == 0 else [0] * (cp - 1) + [4]  # rank 0 disagrees
    out["disagree"] = raised(lambda: sg.dp_gather_partial(
        _nan(4 * dp), _rows(1, 4), fb, cp_shard_counts=bad))
    out["wrong_sum"] = raised(lambda: sg.dp_scatter(
        _nan(4), _rows(2, 4 * dp), fb, cp_shard_counts=[1] * cp))
    # rank 0 alone passes a negative count, then one past int64: every rank names it alike
    good = [4] + [0] * (cp - 1)
    out["negative"] = raised(lambda: sg.dp_gather_partial(
        _nan(4 * dp), _rows(1, 4), fb, cp_shard_counts=[5, -1] + [0] * (cp - 2) if r == 0
        else good))
    out["huge"] = raised(lambda: sg.dp_gather_partial(
        _nan(4 * dp), _rows(1, 4), fb, cp_shard_counts=[1 << 70] + [0] * (cp - 1) if r == 0
        else good))
    sg.teardown()
    return out


def dropin_combine_wire(ctx, layout_args, cases) -> int:
    """``setup(..., combine_wire=...)``: ``dp_reduce_scatter_tensor`` (host counts in every
    mode, a graph step's device counts) and ``dp_reduce_scatterv_async`` equal the quantized
    combine of the dpx-native call on the same plan, bit for bit; a hidden size the wire
    cannot take and nvfp4 without a scale are refused at set-up. Returns ``(checks, how
    many combines differ from the native one)``."""
    layout = dpx.DpLayout(*layout_args)
    comm = ctx.comm(layout)
    r, dp = ctx.rank, layout.dp_size
    d = layout.coords(r).attn_dp_rank
    H = 128
    done = changed = 0
    for i, case in enumerate(cases):
        wire, g = case["wire"], case.get("scale")
        sg.setup(comm, hidden_size=H, dtype=torch.bfloat16, device="cpu",
                 use_gatherv=case.get("gatherv", False), combine_wire=wire,
                 combine_wire_scale=g)
        counts, pmode = case["counts"], sg.DpPaddingMode[case["mode"]]
        gv = case.get("gatherv") and layout.attn_tp_size == 1 and layout.cp_size == 1
        mode = "max_len" if pmode.is_max_len() else ("gatherv" if gv else "sum_len")
        if case.get("device"):
            plan = dpx.plan_step([0] * dp, layout, mode=mode, capacity=case["capacity"])
            ct = torch.tensor(counts, dtype=torch.int32)
            sg.set_dp_buffer_len(plan.global_rows, plan.slot_rows[d], pmode.is_max_len(),
                                 None, ct)
        else:
            plan, ct = dpx.plan_step(counts, layout, mode=mode), None
            sg.set_dp_buffer_len(plan.global_rows, plan.slot_rows[d], pmode.is_max_len(),
                                 list(counts))
        glob = (_rows(300 + 7 * i + r, plan.global_rows).repeat(1, H // HID) * 3).to(
            torch.bfloat16)
        want = comm.reduce_scatter(glob, plan, counts=ct, wire=wire, wire_scale=g)
        changed += not torch.equal(want, comm.reduce_scatter(glob, plan, counts=ct))
        out = torch.full((plan.slot_rows[d], H), float("nan"), dtype=torch.bfloat16)
        sg.dp_reduce_scatter_tensor(out, glob)
        _same("dp_reduce_scatter_tensor(combine_wire)", out.view(torch.int16),
              want.view(torch.int16), case)
        done += 1
        if plan.mode is dpx.PaddingMode.GATHERV:
            out = torch.full_like(out, float("nan"))
            sg.dp_reduce_scatterv_async(out, glob, list(plan.aligned_tokens), ("combine", 0))
            _same("dp_reduce_scatterv_async(combine_wire)", out.view(torch.int16),
                  want.view(torch.int16), case)
            done += 1
    bad = {"width": raised(lambda: sg.setup(comm, hidden_size=100, dtype=torch.bfloat16,
                                              device="cpu", combine_wire="fp8")),
           "scale": raised(lambda: sg.setup(comm, hidden_size=H, dtype=torch.bfloat16,
                                              device="cpu", combine_wire="nvfp4"))}
    assert "H=100 must be a positive multiple of 128" in bad["width"], bad
    assert "needs wire_scale=" in bad["scale"], bad
    sg.teardown()
    return done, changed
