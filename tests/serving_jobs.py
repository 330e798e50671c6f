"""Serving features on every rank of a gloo world (see harness.py), against reference.py:
the quantized wire gathers (fp8, nvfp4, mxfp4), several tensors in one gather, pad-row
masking and counts exchanged on the device."""

from __future__ import annotations

import numpy as np
import torch

import dpx
import dpx_torch
from reference import (as_dtype, bits_of, dequantize_fp4, dequantize_fp8, local_inputs,
                       quantize_fp4, quantize_fp8, real_rows, ref_gather)
from harness import raised
import torch_jobs
from torch_jobs import DTYPES, _eq, _plan_of, _t

_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def _bitwise(name: str, got: torch.Tensor, want: torch.Tensor, case) -> None:
    got, want = got.cpu(), want.cpu()
    if got.shape != want.shape or got.dtype != want.dtype or not torch.equal(
            got.view(_BITS.get(got.dtype, got.dtype)), want.view(_BITS.get(want.dtype,
                                                                           want.dtype))):
        diff = (got.double() - want.double()).abs().max().item() if got.shape == want.shape \
            else "n/a"
        raise AssertionError(f"{name} differs bitwise for case {case}: max abs diff {diff}")


def fp8_reference(plan, locs, partial, dtype, eff):
    """(input-dtype gathered rows as float32, payload, scales, dequantized in dtype)."""
    want = _t(ref_gather(locs, plan, partial=partial, counts=eff), dtype).float().cpu().numpy()
    payload, scales = quantize_fp8(want, real_rows(plan, eff))
    deq = torch.from_numpy(dequantize_fp8(payload, scales)).to(dtype)
    return want, payload, scales, deq


#: The fp4 wires a serving job gathers on, with nvfp4's global scale.
FP4 = (("nvfp4", 0.75), ("mxfp4", None))


def check_fp4(comm, x, ids, plan, partial, counts_t, want, real, dtype, case) -> int:
    """nvfp4 and mxfp4 gathers of ``x`` (``want``: the gathered rows in float32): the wire
    rows and the dequantized rows (called plainly and through ``gather_async``) bit for bit
    against the NumPy reference, and an fp4 + native pair in one call."""
    for wire, g in FP4:
        payload, scales = quantize_fp4(want, real, wire, g)
        p_got, s_got = comm.gather(x, plan, partial=partial, counts=counts_t, wire=wire,
                                   wire_scale=g, dequantize=False)
        assert p_got.dtype == torch.uint8 and s_got.dtype == torch.uint8, case
        assert np.array_equal(p_got.cpu().numpy(), payload), (wire, case)
        assert np.array_equal(s_got.cpu().numpy(), scales), (wire, case)
        deq = torch.from_numpy(dequantize_fp4(payload, scales, wire, g)).to(dtype)
        g_out = comm.gather(x, plan, partial=partial, counts=counts_t, wire=wire,
                            wire_scale=g)
        _bitwise(f"gather(wire={wire})", g_out, deq, case)
        a_out, work = comm.gather_async(x, plan, partial=partial, counts=counts_t, wire=wire,
                                        wire_scale=g, key=wire)
        work.wait()
        _bitwise(f"gather_async(wire={wire})", a_out, deq, case)
        pair = comm.gather((x, ids), plan, partial=(partial, False), counts=counts_t,
                           wire=(wire, "native"), wire_scale=g)
        _bitwise(f"gather(({wire}, native))[0]", pair[0], deq, case)
        if wire == "nvfp4":   # one wire_scale each, or one for both
            y = (x * 3).contiguous()
            each = comm.gather((x, y), plan, partial=partial, counts=counts_t,
                               wire=(wire, wire), wire_scale=(g, 2 * g))
            both = comm.gather((x, y), plan, partial=partial, counts=counts_t, wire=wire,
                               wire_scale=g)
            for name, got, ref in (
                    ("each[0]", each[0], deq), ("both[0]", both[0], deq),
                    ("each[1]", each[1], comm.gather(y, plan, partial=partial,
                                                     counts=counts_t, wire=wire,
                                                     wire_scale=2 * g)),
                    ("both[1]", both[1], comm.gather(y, plan, partial=partial,
                                                     counts=counts_t, wire=wire,
                                                     wire_scale=g))):
                _bitwise(f"gather((nvfp4, nvfp4)) {name}", got, ref, case)
    return 2 * len(FP4)


def check_serving(ctx, layout_args, cases, *, width: int = 256, kernels: bool = False) -> int:
    """Each case (as torch_jobs.check_cases; float dtypes): the fp8 gather (wire rows and
    dequantized, plainly and through ``gather_async``, bitwise against the NumPy
    quantizer; SUM_LEN refused in both forms), the nvfp4 and mxfp4 gathers
    (:func:`check_fp4`), a three-tensor gather with a topk-ids and a topk-weights tensor
    (each as gathered alone), an fp8 + native pair, and mask_pad_rows / pad_row_mask on
    the gathered ids. ``kernels``: through the Triton kernels (Triton's interpreter)
    instead of the CPU's torch ops."""
    layout = dpx.DpLayout(*layout_args)
    comm = ctx.kernel_comm(layout) if kernels else ctx.comm(layout)
    r = ctx.rank
    d = layout.coords(r).attn_dp_rank
    done = 0
    for case in cases:
        dtype = DTYPES[case.get("dtype", "float32")]
        partial = case.get("partial", True)
        plan, counts_t, eff = _plan_of(layout, case)
        seed = case.get("seed", 0)
        rows = plan.slot_rows[d] if plan.is_static else None
        # partial sums of random floats depend on the order: small ints then
        locs = local_inputs(seed, plan, (width,), partial=partial, rows=rows, eff=eff,
                            floats=not partial)
        x = _t(locs[r], dtype)
        ids_l = local_inputs(seed + 1, plan, (8,), partial=False, rows=rows, eff=eff)
        w_l = local_inputs(seed + 2, plan, (8,), partial=False, rows=rows, eff=eff,
                           floats=True)
        ids, wts = _t(ids_l[r], torch.int32), _t(w_l[r], torch.float32)
        want_ids = ref_gather(ids_l, plan, partial=False, counts=eff)
        want_w = ref_gather(w_l, plan, partial=False, counts=eff)
        want_x = ref_gather(locs, plan, partial=partial, counts=eff)
        # several tensors in one call
        got = comm.gather((x, ids, wts), plan, partial=(partial, False, False),
                          counts=counts_t)
        assert isinstance(got, tuple) and len(got) == 3
        _eq("gather[0]", got[0], want_x, dtype, case)
        _eq("gather[1]", got[1], want_ids, torch.int32, case)
        _eq("gather[2]", got[2], want_w, torch.float32, case)
        # pad rows
        real = real_rows(plan, eff)
        mask = dpx_torch.pad_row_mask(plan, counts=counts_t)
        assert mask.dtype == torch.bool and np.array_equal(mask.cpu().numpy(), ~real), case
        masked = dpx_torch.mask_pad_rows(got[1], plan, counts=counts_t, fill=-1)
        assert masked is got[1]
        _eq("mask_pad_rows", masked, np.where(real[:, None], want_ids, -1), torch.int32, case)
        wz = dpx_torch.mask_pad_rows(got[2].clone(), plan, counts=counts_t, fill=7.5)
        _eq("mask_pad_rows(float)", wz, np.where(real[:, None], want_w, 7.5), torch.float32,
            case)
        done += 5
        if plan.mode is dpx.PaddingMode.SUM_LEN:
            for wire in ("fp8", "nvfp4", "mxfp4"):
                kw = dict(partial=partial, counts=counts_t, wire=wire,
                          wire_scale=1.0 if wire == "nvfp4" else None)
                for call in (comm.gather, comm.gather_async):
                    err = raised(lambda: call(x, plan, **kw))
                    assert "copy mode" in err, (call.__name__, err)
            continue
        want, payload, scales, deq = fp8_reference(plan, locs, partial, dtype, eff)
        p_got, s_got = comm.gather(x, plan, partial=partial, counts=counts_t, wire="fp8",
                                   dequantize=False)
        assert p_got.dtype == torch.float8_e4m3fn and s_got.dtype == torch.float32
        assert np.array_equal(p_got.view(torch.uint8).cpu().numpy(), payload), case
        assert np.array_equal(s_got.cpu().numpy().view(np.int32), scales.view(np.int32)), case
        g = comm.gather(x, plan, partial=partial, counts=counts_t, wire=dpx.Wire.FP8)
        _bitwise("gather(wire=fp8)", g, deq, case)
        a_out, work = comm.gather_async(x, plan, partial=partial, counts=counts_t, wire="fp8")
        work.wait()
        _bitwise("gather_async(wire=fp8)", a_out, deq, case)
        # the stated error bound, before rounding to the output dtype
        err = np.abs(dequantize_fp8(payload, scales) - want)
        bound = (2.0 ** -4 * np.abs(want) + np.repeat(scales, 128, axis=1) * 2.0 ** -10) \
            * (1 + 1e-6)
        assert (err <= bound).all(), case
        pair = comm.gather((x, ids), plan, partial=(partial, False), counts=counts_t,
                           wire=("fp8", "native"))
        _bitwise("gather((fp8, native))[0]", pair[0], deq, case)
        _eq("gather((fp8, native))[1]", pair[1], want_ids, torch.int32, case)
        done += 4 + check_fp4(comm, x, ids, plan, partial, counts_t, want, real, dtype, case)
    return done


def check_exchange_counts(ctx, layout_args, count_sets, shard_sets) -> dict:
    """exchange_counts on every rank equals the counts (and shard tables) every rank
    reported; a validating communicator names disagreeing replicas on every rank."""
    layout = dpx.DpLayout(*layout_args)
    comm = ctx.comm(layout)
    c = layout.coords(ctx.rank)
    for counts in count_sets:
        got = comm.exchange_counts(torch.tensor([counts[c.attn_dp_rank]], dtype=torch.int32))
        assert got.dtype == torch.int32 and got.tolist() == list(counts), (got, counts)
    for table in shard_sets:
        n = table[c.attn_dp_rank][c.attn_cp_rank]
        got = comm.exchange_counts(torch.tensor([n], dtype=torch.int32), shards=True)
        assert got.shape == (layout.dp_size, layout.cp_size)
        assert got.tolist() == [list(row) for row in table], (got, table)
    checked = ctx.comm(layout, validate=True)
    bad = 5 + (ctx.rank == layout.world_size - 1)
    errs = {"counts": raised(lambda: checked.exchange_counts(
        torch.tensor([bad], dtype=torch.int32))),
        "dtype": raised(lambda: comm.exchange_counts(torch.tensor([1], dtype=torch.int64)))}
    good = checked.exchange_counts(torch.tensor([4], dtype=torch.int32))
    errs["good"] = good.tolist()
    return errs


def check_wire_nonfinite(ctx, layout_args, cases) -> int:
    """fp8, nvfp4 and mxfp4 gathers of rows holding NaN, infinities and huge values
    (reference.NONFINITE): wire rows and dequantized rows bit for bit against the NumPy
    reference of each format's non-finite rule; fp8: NaN wherever the gathered value is
    not finite; fp4: NaN wherever it is NaN."""
    from reference import with_nonfinite

    layout = dpx.DpLayout(*layout_args)
    comm = ctx.comm(layout)
    r = ctx.rank
    d = layout.coords(r).attn_dp_rank
    done = 0
    for case in cases:
        dtype = DTYPES[case["dtype"]]
        partial = case["partial"]
        plan, counts_t, eff = _plan_of(layout, case)
        rows = plan.slot_rows[d] if plan.is_static else None
        locs = with_nonfinite(local_inputs(case["seed"], plan, (256,), partial=partial,
                                           rows=rows, eff=eff), plan, eff)
        x = _t(locs[r], dtype)
        want = _t(ref_gather(locs, plan, partial=partial, counts=eff), dtype).float().numpy()
        payload, scales = quantize_fp8(want, real_rows(plan, eff))
        p_got, s_got = comm.gather(x, plan, partial=partial, counts=counts_t, wire="fp8",
                                   dequantize=False)
        assert np.array_equal(p_got.view(torch.uint8).cpu().numpy(), payload), case
        assert np.array_equal(s_got.cpu().numpy().view(np.int32), scales.view(np.int32)), case
        g = comm.gather(x, plan, partial=partial, counts=counts_t, wire="fp8")
        deq = bits_of(as_dtype(dequantize_fp8(payload, scales), case["dtype"]))
        got = g.cpu().view(_BITS.get(g.dtype, g.dtype)).numpy().view(deq.dtype)
        assert np.array_equal(got, deq), case
        gf = g.float().cpu().numpy()
        bad = ~np.isfinite(want)
        assert bad.any() and np.isnan(gf[bad]).all(), case
        for wire, scale in FP4:
            payload, scales = quantize_fp4(want, real_rows(plan, eff), wire, scale)
            p_got, s_got = comm.gather(x, plan, partial=partial, counts=counts_t, wire=wire,
                                       wire_scale=scale, dequantize=False)
            assert np.array_equal(p_got.cpu().numpy(), payload), (wire, case)
            assert np.array_equal(s_got.cpu().numpy(), scales), (wire, case)
            g = comm.gather(x, plan, partial=partial, counts=counts_t, wire=wire,
                            wire_scale=scale)
            deq = bits_of(as_dtype(dequantize_fp4(payload, scales, wire, scale),
                                   case["dtype"]))
            got = g.cpu().view(_BITS.get(g.dtype, g.dtype)).numpy().view(deq.dtype)
            assert np.array_equal(got, deq), (wire, case)
            assert np.isnan(g.float().cpu().numpy()[np.isnan(want)]).all(), (wire, case)
        done += 1
    return done


def check_ride(ctx, layout_args, cases) -> dict:
    """``gather_with_counts``: per case (a capacity plan in MAX_LEN or GATHERV, host count
    runs with idle replicas, CP shard tables, partial and replicated, native and fp8) the
    rows and the counts equal ``gather(counts=exchange_counts(n_local))`` and its counts,
    bit for bit; a count over the capacity sets the overflow flag as ``counts=`` does; the
    rules (SUM_LEN, a plan without capacity, ``shards`` against the plan) raise alike."""
    layout = dpx.DpLayout(*layout_args)
    comm = ctx.comm(layout)
    r = ctx.rank
    c = layout.coords(r)
    done = overflows = 0
    for case in cases:
        plan, _, eff = _plan_of(layout, case)
        sharded = plan.sharded
        mine = eff[c.attn_dp_rank][c.attn_cp_rank] if sharded else eff[c.attn_dp_rank]
        n_local = torch.tensor([mine], dtype=torch.int32).to(torch_jobs.DEVICE)
        seed, partial = case.get("seed", 0), case.get("partial", True)
        locs = local_inputs(seed, plan, (128,), partial=partial, rows=plan.max_slot_rows,
                            eff=None, floats=not partial)
        x = _t(locs[r][:plan.max_slot_rows], torch.bfloat16)
        wire = case.get("wire", "native")
        comm.reset_overflow()
        counts = comm.exchange_counts(n_local, shards=sharded)
        want = comm.gather(x, plan, partial=partial, counts=counts, wire=wire)
        flagged = comm.overflowed()
        comm.reset_overflow()
        got, got_counts = comm.gather_with_counts(x, plan, partial=partial, n_local=n_local,
                                                  shards=sharded, wire=wire)
        _bitwise(f"gather_with_counts {wire}", got, want, case)
        assert torch.equal(got_counts.cpu(), counts.cpu()), (got_counts, counts, case)
        assert comm.overflowed() == flagged, case
        comm.reset_overflow()
        done += 1
        overflows += flagged
    sum_len = dpx.plan_step([0] * layout.dp_size, layout, mode="sum_len", capacity=8)
    n = torch.tensor([1], dtype=torch.int32).to(torch_jobs.DEVICE)
    x = _t(np.zeros((8, 128)), torch.bfloat16)
    errors = {
        "sum_len": raised(lambda: comm.gather_with_counts(x, sum_len, partial=True,
                                                          n_local=n)),
        "host": raised(lambda: comm.gather_with_counts(
            x, dpx.plan_step([1] * layout.dp_size, layout, mode="max_len"), partial=True,
            n_local=n)),
        "shards": raised(lambda: comm.gather_with_counts(
            x, dpx.plan_step([0] * layout.dp_size, layout, mode="max_len", capacity=8),
            partial=True, n_local=n, shards=True)),
        "n_local": raised(lambda: comm.gather_with_counts(
            x, dpx.plan_step([0] * layout.dp_size, layout, mode="max_len", capacity=8),
            partial=True, n_local=n.long())),
    }
    # validate=True: a replica's ranks that report different counts raise the same error
    # on every rank (the last rank reports one more); a destroyed communicator refuses
    cap = dpx.plan_step([0] * layout.dp_size, layout, mode="max_len", capacity=8)
    mine = torch.tensor([3 + (r == layout.world_size - 1)], dtype=torch.int32)
    x8 = _t(np.zeros((8, 128)), torch.bfloat16)
    errors["validate"] = raised(lambda: ctx.comm(layout, validate=True).gather_with_counts(
        x8, cap, partial=True, n_local=mine.to(torch_jobs.DEVICE)))
    # and counts the plan cannot hold (every rank reports 9 > capacity 8) a capacity error
    errors["validate_capacity"] = raised(
        lambda: ctx.comm(layout, validate=True).gather_with_counts(
            x8, cap, partial=True, n_local=torch.tensor([9], dtype=torch.int32,
                                                        device=torch_jobs.DEVICE)))
    # an in-place gather: refused (the counts ride a gather from a separate input)
    o8 = _t(np.zeros((cap.global_rows, 128)), torch.bfloat16)
    errors["in_place"] = raised(lambda: comm.gather_with_counts(
        comm.local_slot(o8, cap), cap, partial=True, n_local=n, out=o8))
    fresh = dpx_torch.DpComm(layout)
    fresh.destroy()
    errors["destroyed"] = raised(lambda: fresh.gather_with_counts(x8, cap, partial=True,
                                                                  n_local=n))
    return {"done": done, "overflows": overflows, **errors}
