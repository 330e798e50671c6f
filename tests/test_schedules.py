"""Planner-only: every schedule dpx emits, run on NumPy arrays for every rank in lockstep
(tests/schedule_sim.py), equals the plain reference -- for many layouts (attn_tp 1-4),
counts (idle replicas, one replica with everything, all idle), every mode, partial and
replicated, host and capacity plans (host or device counts), every transport, and both
a known rank (torch) and one symbolic program for every rank (JAX). No devices."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

import dpx
from dpx import Op, PaddingMode, Transport, build_schedule
from dpx import expr as X
from dpx import values as V
from dpx.steps import CheckCounts, Move, Zero
from reference import (dequantize_fp8, global_inputs, held, local_inputs, quantize_fp8,
                       real_rows, ref_gather, ref_reduce_scatter_rank,
                       ref_scatter_rank)
from schedule_sim import fp8_round_trip, simulate

LAYOUTS = [(1, 1), (2, 2), (2, 1), (3, 3), (3, 1), (4, 4), (4, 2), (4, 1), (6, 3), (6, 2),
           (8, 2), (8, 4), (8, 8)]
#: (world, dp, cp): context parallel inside the replicas
CP_LAYOUTS = [(4, 1, 2), (4, 2, 2), (3, 1, 3), (8, 2, 2), (8, 1, 4), (8, 2, 4), (6, 1, 3)]
MODES = list(PaddingMode)
#: the partial flags an op's schedules differ by: only a gather reads it
#: (``test_only_a_gather_reads_partial``)
PARTIALS = {op: (True, False) if op is Op.GATHER else (True,) for op in Op}
TRANSPORTS = list(Transport)
REST = (2,)
#: One template cache for the module's schedules (a server keeps one the same way).
CACHE = dpx.ScheduleCache(max_templates=4096)


def _ids(layout) -> str:
    return f"w{layout[0]}dp{layout[1]}" + (f"cp{layout[2]}" if len(layout) > 2 else "")


def _count_sets(dp: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randint(1, 9) for _ in range(dp)],
            [0 if i % 2 else rng.randint(1, 11) for i in range(dp)],
            [13] + [0] * (dp - 1),
            [0] * dp,
            [rng.choice([0, 1, 4, 8]) for _ in range(dp)]]


def _shards_for(counts, cp: int, rng: random.Random, kind: int) -> list[tuple[int, ...]]:
    """A shard table for ``counts``: random splits, everything on the last CP rank, or
    an even split (empty shards and idle replicas come from the counts)."""
    out = []
    for n in counts:
        if kind == 0:
            cuts = sorted(rng.randint(0, n) for _ in range(cp - 1))
            row = [b - a for a, b in zip([0, *cuts], [*cuts, n])]
        elif kind == 1:
            row = [0] * (cp - 1) + [n]
        else:
            row = [n // cp + (c < n % cp) for c in range(cp)]
        out.append(tuple(row))
    return out


def _schedules(plan, op, *, partial, transport, symbolic, device, in_rows, wire="native",
               ride=False):
    W = plan.layout.world_size
    if symbolic:
        s = build_schedule(plan, op, rank=None, partial=partial, transport=transport,
                           device_counts=device, in_rows=in_rows[0], wire=wire,
                           counts_ride=ride, cache=CACHE)
        return [s] * W
    return [build_schedule(plan, op, rank=r, partial=partial, transport=transport,
                           device_counts=device, in_rows=in_rows[r], wire=wire,
                           counts_ride=ride, cache=CACHE)
            for r in range(W)]


def check_plan(plan, *, run=None, seed=0) -> int:
    """Simulate every op of ``plan`` on every transport, known and symbolic rank; compare
    with the reference. ``run``: the device counts (a shard table for a sharded plan)
    a capacity plan is called with."""
    lay = plan.layout
    W = lay.world_size
    device = run is not None
    eff = (tuple(tuple(x) for x in run) if plan.sharded else tuple(run)) if device else None
    dev_vec = None
    if device:
        dev_vec = [x for row in eff for x in row] if plan.sharded else list(eff)
    checks = 0
    for partial, exact in itertools.product((True, False), (True, False)):
        # exact: every rank's input has as many rows as it needs (the no-pass shortcuts)
        if plan.is_static:
            rows = [plan.slot_rows[lay.coords(r).attn_dp_rank] for r in range(W)]
        else:
            rows = [held(plan, r, eff)[1] + (0 if exact else 2) for r in range(W)]
        locs = [x[:n] for x, n in zip(
            local_inputs(seed, plan, REST, partial=partial, extra_rows=2 + max(rows),
                         eff=eff), rows)]
        want_g = ref_gather(locs, plan, partial=partial, counts=eff)
        globs = global_inputs(seed, plan, REST)
        for transport, symbolic in itertools.product(TRANSPORTS, (False, True)):
            if symbolic and transport is Transport.PEER:
                continue   # the peer transport serves torch, whose schedules are per rank
            kw = dict(transport=transport, symbolic=symbolic, device=device)
            sched = _schedules(plan, Op.GATHER, partial=partial, in_rows=rows, **kw)
            for r, got in enumerate(simulate(sched, locs, dev_vec)):
                np.testing.assert_array_equal(got, want_g, err_msg=f"gather rank {r} {kw}")
            if not symbolic and exact:
                checks += _check_in_place(plan, locs, want_g, partial, transport, device,
                                          dev_vec, eff)
            if device and transport is TRANSPORTS[0] and plan.mode is not PaddingMode.SUM_LEN:
                # the counts ride the world collective: every pass before it sees only the
                # rank's own count (the others are -1 until they arrive)
                sched = _schedules(plan, Op.GATHER, partial=partial, in_rows=rows, ride=True,
                                   **kw)
                for r, got in enumerate(simulate(sched, locs, dev_vec)):
                    np.testing.assert_array_equal(got, want_g, err_msg=f"ride r{r} {kw}")
                checks += 1
            if exact and plan.mode is not dpx.PaddingMode.SUM_LEN:
                # the fp8 wire: every real row arrives as its quantize round trip
                locs8 = [x[:n] for x, n in zip(local_inputs(
                    seed, plan, (128,), partial=partial, extra_rows=2 + max(rows), eff=eff,
                    floats=not partial), rows)]
                want8 = ref_gather(locs8, plan, partial=partial, counts=eff)
                payload, scales = quantize_fp8(want8.astype(np.float32), real_rows(plan, eff))
                sched = _schedules(plan, Op.GATHER, partial=partial, in_rows=rows, wire="fp8",
                                   **kw)
                for r, got in enumerate(simulate(sched, locs8, dev_vec)):
                    np.testing.assert_array_equal(got, dequantize_fp8(payload, scales),
                                                  err_msg=f"fp8 gather rank {r} {kw}")
            if not partial or not exact:
                continue  # the ops below take no partial flag and no local rows
            # gather_sum: every rank of a replica adds its rows (the CP copies of these
            # inputs are equal, so that is cp times the gather)
            copies = 1 if plan.sharded else lay.cp_size
            sched = _schedules(plan, Op.GATHER_SUM, partial=True, in_rows=rows, **kw)
            for r, got in enumerate(simulate(sched, locs, dev_vec)):
                np.testing.assert_array_equal(got, copies * want_g, err_msg=f"gather_sum r{r}")
            g_rows = [plan.global_rows] * W
            sc = simulate(_schedules(plan, Op.SCATTER, partial=True, in_rows=g_rows, **kw),
                          [want_g] * W, dev_vec)
            rs = simulate(_schedules(plan, Op.REDUCE_SCATTER, partial=True, in_rows=g_rows,
                                     **kw), globs, dev_vec)
            for r in range(W):
                k = plan.slot_rows[lay.coords(r).attn_dp_rank]
                for name, got, want in (
                        ("scatter", sc[r], ref_scatter_rank(want_g, plan, r, eff)),
                        ("reduce_scatter", rs[r], ref_reduce_scatter_rank(globs, plan, r, eff))):
                    np.testing.assert_array_equal(got[:k], want, err_msg=f"{name} r{r} {kw}")
                    assert not got[k:].any(), f"{name} rank {r}: rows past the slot"
            if transport is TRANSPORTS[0]:   # its route is the same on every transport
                checks += _check_quantized_combine(plan, kw, dev_vec, eff, seed)
            # scatter's adjoint: the rank's rows back at their place, zeros elsewhere
            slots = [s[:plan.slot_rows[lay.coords(r).attn_dp_rank]] if not symbolic else s
                     for r, s in enumerate(sc)]
            adj = simulate(_schedules(plan, Op.SCATTER_ADJOINT, partial=True,
                                      in_rows=[s.shape[0] for s in slots], **kw),
                           slots, dev_vec)
            for r in range(W):
                want = np.zeros_like(want_g)
                first, n = held(plan, r, eff)
                want[first:first + n] = want_g[first:first + n]
                np.testing.assert_array_equal(adj[r], want, err_msg=f"scatter_adjoint r{r}")
            checks += _check_scatter_columns(plan, globs, kw, dev_vec, eff)
    return checks


def _check_quantized_combine(plan, kw, dev_vec, eff, seed) -> int:
    """The fp8 combine: every rank's rows (pad rows too) as their quantize round trip,
    summed over the ranks in rank order, then each rank's slot (the simulator sums the
    values in float64: the float32 rounding is the frontends' tests')."""
    lay, W = plan.layout, plan.layout.world_size
    globs8 = global_inputs(seed, plan, (128,), floats=True)
    got = simulate(_schedules(plan, Op.REDUCE_SCATTER, partial=True,
                              in_rows=[plan.global_rows] * W, wire="fp8", **kw),
                   globs8, dev_vec)
    total = np.zeros_like(globs8[0])
    for g in globs8:
        total = total + fp8_round_trip(g)
    for r in range(W):
        k = plan.slot_rows[lay.coords(r).attn_dp_rank]
        np.testing.assert_array_equal(got[r][:k], ref_scatter_rank(total, plan, r, eff),
                                      err_msg=f"fp8 reduce_scatter r{r} {kw}")
        assert not got[r][k:].any(), f"fp8 reduce_scatter rank {r}: rows past the slot"
    return 1


def _check_scatter_columns(plan, globs, kw, dev_vec, eff) -> int:
    """The LM-head scatter: rank s holds columns s of the gathered rows (pad rows
    included, whatever they hold); every rank gets its scatter of the full-width rows.
    Its adjoint puts each rank's gradient back at its rows, summed over the ranks sharing
    them, each rank keeping its columns."""
    lay, W = plan.layout, plan.layout.world_size
    full = np.concatenate(globs, axis=1)  # [G, W * 2]: every rank's columns side by side
    C = globs[0].shape[1]
    g_rows = [plan.global_rows] * W
    out = simulate(_schedules(plan, Op.SCATTER_COLUMNS, partial=True, in_rows=g_rows, **kw),
                   globs, dev_vec)
    for r in range(W):
        k = plan.slot_rows[lay.coords(r).attn_dp_rank]
        np.testing.assert_array_equal(out[r][:k], ref_scatter_rank(full, plan, r, eff),
                                      err_msg=f"scatter_columns r{r} {kw}")
        assert not out[r][k:].any(), f"scatter_columns rank {r}: rows past the slot"
    grads = [np.arange(o.size, dtype=np.float64).reshape(o.shape) % 7 + r
             for r, o in enumerate(out)]
    adj = simulate(_schedules(plan, Op.SCATTER_COLUMNS_ADJOINT, partial=True,
                              in_rows=[g.shape[0] for g in grads], **kw), grads, dev_vec)
    want = np.zeros_like(full)
    for r in range(W):
        first, n = held(plan, r, eff)
        want[first:first + n] += grads[r][:n]
    for s in range(W):
        np.testing.assert_array_equal(adj[s], want[:, s * C:(s + 1) * C],
                                      err_msg=f"scatter_columns_adjoint rank {s} {kw}")
    return 1


def _check_in_place(plan, locs, want, partial, transport, device, dev_vec, eff) -> int:
    """The in-place gather: each rank's rows already at their place in ``out`` (its slot,
    pad rows NaN: whatever the caller's buffer held), the same result as from a separate
    input. Plans whose slot position is device data are refused by ``local_rows``."""
    lay = plan.layout
    inputs, scheds = [], []
    for r in range(lay.world_size):
        try:
            _, rows = dpx.local_rows(plan, r, device_counts=device)
        except dpx.DpxValueError:
            assert device and (plan.mode is not PaddingMode.MAX_LEN or plan.sharded)
            return 0
        n = held(plan, r, eff)[1]
        x = np.full((rows, *locs[r].shape[1:]), np.nan)
        x[:n] = locs[r][:n]
        inputs.append(x)
        scheds.append(build_schedule(plan, Op.GATHER, rank=r, partial=partial,
                                     transport=transport, device_counts=device,
                                     in_rows=rows, in_place=True, cache=CACHE))
    for r, got in enumerate(simulate(scheds, inputs, dev_vec)):
        np.testing.assert_array_equal(got, want, err_msg=f"in-place gather rank {r} "
                                                         f"{transport}")
    return 1


@pytest.mark.parametrize("layout", LAYOUTS, ids=_ids)
def test_host_plans(layout):
    lay = dpx.DpLayout(*layout)
    for i, counts in enumerate(_count_sets(lay.dp_size, sum(layout))):
        for mode in MODES:
            for ext in (False, True):
                check_plan(dpx.plan_step(counts, lay, mode=mode, is_extend=ext), seed=i)


@pytest.mark.parametrize("layout", LAYOUTS, ids=_ids)
def test_capacity_plans_host_and_device_counts(layout):
    lay = dpx.DpLayout(*layout)
    tp = lay.attn_tp_size
    rng = random.Random(sum(layout))
    for mode in MODES:
        cap = 8 if mode is PaddingMode.MAX_LEN else 8 * lay.dp_size
        for run in _count_sets(lay.dp_size, rng.randint(0, 99)):
            per = cap if mode is PaddingMode.MAX_LEN else (cap // lay.dp_size) // tp * tp
            run = [min(c, per) for c in run]
            plan = dpx.plan_step(run, lay, mode=mode, capacity=cap)
            check_plan(plan, seed=3)                                   # host counts
            other = [rng.randint(0, per) for _ in range(lay.dp_size)]
            check_plan(dpx.plan_step([0] * lay.dp_size, lay, mode=mode, capacity=cap),
                       run=other, seed=4)                              # device counts


def test_every_rank_issues_the_same_collectives():
    """A schedule's collectives (kind, group, sizes, chunk tables) are identical on every
    rank, whatever each rank's input looks like; local passes may differ."""
    rng = random.Random(3)
    for layout in LAYOUTS + CP_LAYOUTS:
        lay = dpx.DpLayout(*layout)
        for counts, mode, sharded in itertools.product(_count_sets(lay.dp_size, 1), MODES,
                                                       (False, True)):
            if sharded and lay.cp_size == 1:
                continue
            shards = _shards_for(counts, lay.cp_size, rng, 0) if sharded else None
            plan = dpx.plan_step(counts, lay, mode=mode, cp_shards=shards)
            for op, transport in itertools.product(list(Op), TRANSPORTS):
                for partial in PARTIALS[op]:
                    sigs = {build_schedule(plan, op, rank=r, partial=partial,
                                           transport=transport, in_rows=held(plan, r)[1]
                                           ).collective_signature()
                            for r in range(lay.world_size)}
                    assert len(sigs) == 1, (layout, counts, mode, op, partial, transport, sigs)


def test_only_a_gather_reads_partial():
    """Every op but gather has the same schedule whatever ``partial`` says (the frontends
    pass True; the tests of those ops run True alone, :data:`PARTIALS`): every layout,
    host counts (CP shards too) and a capacity plan's device counts, every mode and
    transport, the fp8 combine, the symbolic program and the first and last rank."""
    def steps(s):
        return repr((s.steps, s.scratch, s.notes, s.route, s.wire_bufs, s.wide_bufs))

    rng = random.Random(5)
    checked = 0
    for layout, mode in itertools.product(LAYOUTS + CP_LAYOUTS, MODES):
        lay = dpx.DpLayout(*layout)
        W = lay.world_size
        calls = [(dpx.plan_step(c, lay, mode=mode), False)
                 for c in _count_sets(lay.dp_size, 2)[1:3]]
        calls.append((dpx.plan_step([0] * lay.dp_size, lay, mode=mode, capacity=16), True))
        if lay.cp_size > 1:
            counts = _count_sets(lay.dp_size, 2)[0]
            calls.append((dpx.plan_step(counts, lay, mode=mode, cp_shards=_shards_for(
                counts, lay.cp_size, rng, 0)), False))
        for (plan, device), op, transport, rank in itertools.product(
                calls, Op, TRANSPORTS, sorted({None, 0, W - 1}, key=str)):
            if op is Op.GATHER or (rank is None and transport is Transport.PEER):
                continue
            for wire in ("native", "fp8") if op is Op.REDUCE_SCATTER else ("native",):
                a, b = (build_schedule(plan, op, rank=rank, partial=p, transport=transport,
                                       device_counts=device, wire=wire,
                                       in_rows=None if rank is None or device else
                                       held(plan, rank)[1]) for p in (True, False))
                assert steps(a) == steps(b), (layout, plan.num_tokens, mode, op, rank,
                                              transport, device, wire)
                checked += 1
        # and a gather's does (the check can fail): attn-tp ranks sum their rows or one of
        # them writes (the last attn-tp rank of the first CP rank, which writes or not)
        plan = dpx.plan_step([3] * lay.dp_size, lay, mode=mode)
        a, b = (build_schedule(plan, Op.GATHER, rank=lay.attn_tp_size - 1, partial=p,
                               in_rows=3) for p in (True, False))
        assert (steps(a) == steps(b)) == (lay.attn_tp_size == 1), layout
    assert checked > 5000, checked


def test_dequantize_matters_only_on_a_quantized_wire():
    """``dequantize=False`` on the native wire is the native gather (one template in a
    shared cache, the same steps: :func:`dpx.wire.dequantized`); on a quantized wire it
    keeps the wire rows (no dequantize step, another template). Every copy mode, host and
    device counts, every rank."""
    def steps(s):
        return repr((s.steps, s.scratch, s.notes, s.route, s.wire_bufs))

    for layout, mode in itertools.product([(2, 2), (4, 2), (4, 4)],
                                          (PaddingMode.MAX_LEN, PaddingMode.GATHERV)):
        lay = dpx.DpLayout(*layout)
        plans = [(dpx.plan_step([5, 0, 3, 1][:lay.dp_size], lay, mode=mode), False),
                 (dpx.plan_step([0] * lay.dp_size, lay, mode=mode, capacity=8), True)]
        for (plan, device), rank in itertools.product(plans, range(lay.world_size)):
            cache = dpx.ScheduleCache()
            native = [build_schedule(plan, Op.GATHER, rank=rank, partial=True, wire="native",
                                     dequantize=d, device_counts=device, cache=cache)
                      for d in (True, False)]
            assert len(cache) == 1 and steps(native[0]) == steps(native[1]), (layout, rank)
            fp8 = [build_schedule(plan, Op.GATHER, rank=rank, partial=True, wire="fp8",
                                  dequantize=d, device_counts=device, cache=cache)
                   for d in (True, False)]
            assert len(cache) == 3, (layout, rank)
            kinds = [[type(t).__name__ for t in s.steps] for s in fp8]
            assert "Dequantize" in kinds[0] and "Dequantize" not in kinds[1], kinds


def test_a_template_in_place_on_a_quantized_wire_is_the_separate_input_one():
    """The emitter gives a key for a gather from its slot of ``out`` on a quantized wire
    the separate-input schedule (:func:`dpx.wire.in_place_schedule`: its quantize reads
    the rows where they lie), whoever made the key; on the native wire the in-place
    schedule, its own. Copy modes, host counts, every rank, partial and replicated, every
    quantized wire."""
    from dpx.routes import TemplateKey

    def steps(v):
        return repr((v.steps, v.scratch, v.notes, v.route, v.wire_bufs))

    native_differs = 0
    for layout, mode in itertools.product([(2, 2), (4, 2), (4, 4), (4, 1, 2)],
                                          (PaddingMode.MAX_LEN, PaddingMode.GATHERV)):
        lay = dpx.DpLayout(*layout)
        plan = dpx.plan_step([5, 0, 3, 1][:lay.dp_size], lay, mode=mode)
        for rank, partial, wire in itertools.product(range(lay.world_size), (True, False),
                                                     ("native", "fp8", "nvfp4", "mxfp4")):
            first, rows = dpx.local_rows(plan, rank, device_counts=False)
            got = [dpx.ScheduleCache().variant(
                TemplateKey(plan.structure, "gather", partial, rank, False, "per_root", wire,
                            True, in_place, True), plan.leaf_counts, rows,
                plan.global_rows)[0] for in_place in (True, False)]
            if wire == "native":
                native_differs += steps(got[0]) != steps(got[1])
            else:
                assert steps(got[0]) == steps(got[1]), (layout, mode, rank, partial, wire)
    assert native_differs > 0


def test_a_world_of_one_rank_calls_no_collective():
    """World 1: every op, mode, transport, wire (kept or dequantized), in-place gather and
    kind of counts holds no backend collective -- each is a copy or nothing
    (``Step.alone``); what stays is the transports' own variable steps and the counts
    riding a gather. (The results: test_host_plans and the capacity test run world 1
    against the reference.)"""
    from dpx.steps import AllGatherCounts, AllGatherV, ReduceScatterV
    own = (AllGatherV, ReduceScatterV)
    lay = dpx.DpLayout(1, 1)
    seen = 0
    for mode, cap, transport, wire in itertools.product(MODES, (None, 16), TRANSPORTS,
                                                        ("native", "fp8", "nvfp4")):
        plan = dpx.plan_step([5] if cap is None else [0], lay, mode=mode, capacity=cap)
        for op, partial, dev, in_place, keep, ride in itertools.product(
                list(Op), (True, False), (False, True), (False, True), (True, False),
                (False, True)):
            try:
                s = build_schedule(plan, op, rank=0, partial=partial, transport=transport,
                                   device_counts=dev, wire=wire, dequantize=keep,
                                   in_place=in_place, counts_ride=ride)
            except (dpx.DpxError, ValueError):
                continue   # a combination the call refuses (e.g. device counts on host plans)
            kept = [t for t in s.steps if t.collective and not isinstance(t, own)
                    and type(t) is not AllGatherCounts]
            assert not kept, (mode, cap, transport, wire, op, partial, dev, in_place, kept)
            assert ride or not any(type(t) is AllGatherCounts for t in s.steps)
            seen += 1
    assert seen > 500, seen


def test_a_world_of_one_rank_moves_its_rows_once():
    """World 1, host counts, every mode, capacity or not, with the backend's collectives:
    the copies the collectives became fold into the passes around them (``dpx.fold``) --
    a gather, scatter or reduce_scatter is one pass and needs no scratch; a quantized
    one quantizes into the buffer it dequantizes from (two passes, and a capacity's
    reduce_scatter the place of its real rows); the LM-head scatter
    on its variable all-to-all is its join alone. The folded schedules' results are
    checked against the reference by test_host_plans and the capacity test."""
    from dpx.routes import Route
    from dpx.steps import Dequantize, DequantizeSum, JoinColumns, Quantize
    lay = dpx.DpLayout(1, 1)
    for mode, cap, n in itertools.product(MODES, (None, 16), (0, 5)):
        plan = dpx.plan_step([n], lay, mode=mode, capacity=cap)
        for op, partial, wire in itertools.product(
                (Op.GATHER, Op.SCATTER, Op.REDUCE_SCATTER, Op.GATHER_SUM), (True, False),
                ("native", "fp8")):
            if wire != "native" and (op not in (Op.GATHER, Op.REDUCE_SCATTER) or (
                    op is Op.GATHER and mode is PaddingMode.SUM_LEN)):
                continue   # (a quantized gather needs a copy mode)
            rows = plan.global_rows if op in (Op.SCATTER, Op.REDUCE_SCATTER) else n
            s = build_schedule(plan, op, rank=0, partial=partial, in_rows=rows, wire=wire)
            kinds = [type(t) for t in s.steps if type(t) is not CheckCounts]
            want = ([Move] if wire == "native" else
                    [Quantize, Dequantize] if op is Op.GATHER else
                    # (a capacity's pad rows are summed too; a place keeps the real ones)
                    [Quantize, DequantizeSum] + [Move] * (cap is not None))
            if kinds == [Zero] and n == 0:   # no real row: the zeros alone
                kinds = [Move]
            assert kinds == want, (mode, cap, n, op, partial, wire, [str(t) for t in s.steps])
            # one buffer of wire rows (and the sum before its place)
            want_scratch = [] if wire == "native" else [True] + [False] * (len(want) - 2)
            assert [s.is_wire(b) for b, _ in s.scratch] == want_scratch, (mode, cap, op,
                                                                          s.scratch)
        if cap is None and mode is not PaddingMode.MAX_LEN:   # the variable all-to-all
            s = build_schedule(plan, Op.SCATTER_COLUMNS, rank=0, in_rows=plan.global_rows)
            assert [type(t) for t in s.steps] == [JoinColumns] and s.steps[0].src.buf == "in"
            assert s.route is Route.ALL_TO_ALL_V and not s.scratch


def test_no_step_writes_the_input():
    rng = random.Random(4)
    for layout in ((4, 2), (8, 2), (3, 1), (8, 2, 2)):
        lay = dpx.DpLayout(*layout)
        for counts, mode, op, partial, transport, sharded in itertools.product(
                _count_sets(lay.dp_size, 2), MODES, list(Op), (True, False), TRANSPORTS,
                (False, True)):
            shards = _shards_for(counts, lay.cp_size, rng, 0) if sharded else None
            plan = dpx.plan_step(counts, lay, mode=mode, cp_shards=shards)
            for r in range(lay.world_size):
                for step in build_schedule(plan, op, rank=r, partial=partial,
                                           transport=transport).steps:
                    for name in ("dst", "buf"):
                        ref = getattr(step, name, None)
                        assert ref is None or ref.buf != "in", f"{step} writes the input"


def test_gatherv_chunks_tile_the_slots():
    """The one chunking rule: replica d's slot split in blocks of B = max_slot_rows/tp,
    leading attn-tp ranks full; in rank order the chunks tile [0, end)."""
    lay = dpx.DpLayout(8, 2)  # attn_tp 4
    plan = dpx.plan_step([5, 13], lay, mode="gatherv")
    sched = build_schedule(plan, Op.GATHER, rank=5, transport="per_root")
    bv = sched.steps[-1]
    assert plan.aligned_tokens == (8, 16) and plan.max_slot_rows == 16  # B = 4
    assert bv.firsts == (0, 4, 8, 8, 8, 12, 16, 20) and bv.lens == (4, 4, 0, 0, 4, 4, 4, 4)


def test_full_slots_need_no_pass_and_partial_slots_do():
    """MAX_LEN, attn_tp 1: a replica whose count fills its slot sends those rows of its
    input as they are (a view, whatever rows follow them); otherwise it places its rows;
    reduce_scatter zeroes the pad tail only where there is one."""
    lay = dpx.DpLayout(2, 2)
    plan = dpx.plan_step([5, 3], lay, mode="max_len")
    full = build_schedule(plan, Op.GATHER, rank=0, in_rows=5)
    assert [s.kind for s in full.steps] == ["all_gather"] and full.steps[0].src.buf == "in"
    assert [s.kind for s in build_schedule(plan, Op.GATHER, rank=1, in_rows=3).steps] == \
        ["move", "all_gather"]
    longer = build_schedule(plan, Op.GATHER, rank=0, in_rows=7).steps
    assert [s.kind for s in longer] == ["all_gather"] and str(longer[0].src) == "in[0:5]"
    assert [s.kind for s in build_schedule(plan, Op.REDUCE_SCATTER, rank=0).steps] == \
        ["reduce_scatter"]
    assert [s.kind for s in build_schedule(plan, Op.REDUCE_SCATTER, rank=1).steps] == \
        ["reduce_scatter", "zero"]


def test_device_count_values_are_expressions_of_the_counts():
    lay = dpx.DpLayout(4, 2)
    plan = dpx.plan_step([1, 1], lay, mode="sum_len", capacity=16)
    sched = build_schedule(plan, Op.GATHER, rank=2, device_counts=True)
    check, place = sched.steps[:2]
    assert isinstance(check, CheckCounts) and (check.rule.max_sum, check.rule.align) == (16, 2)
    assert isinstance(place, Move) and isinstance(place.dst_start, X.Expr)
    assert X.render(place.dst_start) == "cumsum_excl(align(n, 2))[1]"
    assert V.host_value(place.dst_start, (3, 5)) == 4
    assert V.host_value(place.count, (3, 5)) == 5
    host = build_schedule(plan, Op.GATHER, rank=2)
    assert (host.steps[0].dst_start, host.steps[0].count) == (2, 1)  # the plan's counts


def test_symbolic_schedule_is_one_program():
    lay = dpx.DpLayout(8, 4)
    plan = dpx.plan_step([3, 0, 7, 5], lay, mode="max_len")
    sched = build_schedule(plan, Op.GATHER, rank=None, partial=False)
    take = sched.steps[0]
    assert isinstance(take, Move) and isinstance(take.count, X.Expr)
    for r in range(8):
        c = lay.coords(r)
        coords = {"rank": r, "dp": c.attn_dp_rank, "cp": c.attn_cp_rank, "tp": c.attn_tp_rank}
        concrete = build_schedule(plan, Op.GATHER, rank=r, partial=False).steps[0]
        if isinstance(concrete, Move):
            assert V.host_value(take.count, plan.num_tokens, coords) == concrete.count


def test_transports_route_gatherv():
    lay = dpx.DpLayout(4, 4)
    plan = dpx.plan_step([3, 0, 7, 5], lay, mode="gatherv")
    kinds = {t: [s.kind for s in build_schedule(plan, Op.GATHER, rank=1, transport=t).steps]
             for t in TRANSPORTS}
    assert kinds[Transport.PER_ROOT][-1] == "broadcast_v"
    assert kinds[Transport.RAGGED][-1] == "all_gather_v"
    assert kinds[Transport.EQUAL] == ["move", "all_gather", "unpack"]
    cap = dpx.plan_step([3, 0, 7, 5], lay, mode="gatherv", capacity=32)
    dev = build_schedule(cap, Op.GATHER, rank=1, device_counts=True)
    assert [s.kind for s in dev.steps] == ["check_counts", "move", "all_gather", "unpack"]
    assert dev.notes and dev.route is dpx.Route.BLOCKS_UNPACK
    rag = build_schedule(cap, Op.GATHER, rank=None, device_counts=True, transport="ragged")
    assert rag.steps[-1].kind == "all_gather_v"
    # equal chunks move with the plain collective on every transport but the peer one
    even = dpx.plan_step([4, 4, 4, 4], lay, mode="gatherv")
    for t in TRANSPORTS:
        assert build_schedule(even, Op.GATHER, rank=0, transport=t).steps[-1].kind == \
            ("all_gather_v" if t is Transport.PEER else "all_gather")
    # the peer transport puts each chunk's real rows, in every mode, device counts too:
    # the table leaves out MAX_LEN's pad rows and the alignment rows
    for mode in ("max_len", "sum_len", "gatherv"):
        p = dpx.plan_step([3, 0, 7, 5], lay, mode=mode)
        for r in range(4):
            last = build_schedule(p, Op.GATHER, rank=r, transport="peer").steps[-1]
            assert last.kind == "all_gather_v" and tuple(last.lens) == (3, 0, 7, 5)
            assert tuple(last.firsts) == tuple(p.offsets)
        peer = build_schedule(cap, Op.REDUCE_SCATTER, rank=1, device_counts=True,
                              transport="peer")
        assert [s.kind for s in peer.steps][:2] == ["check_counts", "reduce_scatter_v"]
        assert peer.route is dpx.Route.PEER


def test_a_chunk_that_is_the_slot_is_summed_into_out():
    """A reduce_scatter on the ragged and peer routes sums straight into ``out`` where the
    rank's chunk is its slot (no other rank holds its rows, ``out`` one block): no chunk
    buffer, no slot pass, no zero step (the collective zeroes past the chunk's real rows).
    Elsewhere the chunk's scratch and the slot pass stay. The results are checked against
    the reference by the host, capacity and fuzz tests."""
    lay = dpx.DpLayout(4, 4)
    counts = [3, 0, 7, 5]

    def kinds(plan, r, **kw):
        s = build_schedule(plan, Op.REDUCE_SCATTER, rank=r, **kw)
        return [t.kind for t in s.steps], s

    gv = dpx.plan_step(counts, lay, mode="gatherv")
    for t in ("peer", "ragged"):
        for r in range(4):
            ks, s = kinds(gv, r, transport=t)
            if counts[r] == max(counts):   # out is the block
                assert ks == ["reduce_scatter_v"] and s.steps[0].dst.buf == "out", (t, r, ks)
                assert not s.scratch
            else:
                assert ks == ["reduce_scatter_v", "move"] and s.steps[0].dst.buf == "chunk"
    ml = dpx.plan_step(counts, lay, mode="max_len")
    for r in range(4):   # every MAX_LEN slot is a block; the pad rows are the collective's
        ks, s = kinds(ml, r, transport="peer")
        assert ks == ["reduce_scatter_v"] and s.steps[0].dst.buf == "out", (r, ks)
        ks, s = kinds(ml, r, transport="peer", wire="fp8")
        assert ks == ["quantize", "reduce_scatter_v"] and s.steps[1].dst.buf == "out"
    # a capacity plan's slots are all one block, device counts too
    cap = dpx.plan_step(counts, lay, mode="gatherv", capacity=16)
    for r, dev, t in itertools.product(range(4), (False, True), ("peer", "ragged")):
        ks, s = kinds(cap, r, transport=t, device_counts=dev)
        assert ks[-1] == "reduce_scatter_v" and s.steps[-1].dst.buf == "out", (r, dev, t, ks)
    # CP shards, attn-tp 1: the ranks holding the largest shard
    sh = dpx.plan_step([4, 6], dpx.DpLayout(4, 2, 2), mode="gatherv", cp_shards=[(4, 0), (3, 3)])
    assert [kinds(sh, r, transport="peer")[0] for r in range(4)] == \
        [["reduce_scatter_v"]] * 2 + [["reduce_scatter_v", "move"]] * 2
    # attn-tp ranks share a slot: each sums its chunk, then the replica's chunks gather
    tp = dpx.plan_step([3, 7], dpx.DpLayout(4, 2), mode="gatherv")
    for r in range(4):
        ks, s = kinds(tp, r, transport="peer")
        assert ks[0] == "reduce_scatter_v" and s.steps[0].dst.buf != "out", (r, ks)


def test_zero_step_only_where_a_tail_exists():
    lay = dpx.DpLayout(4, 2)
    plan = dpx.plan_step([3, 5], lay, mode="gatherv", capacity=24)
    steps = build_schedule(plan, Op.GATHER, rank=0).steps
    zero = [s for s in steps if isinstance(s, Zero)]
    assert len(zero) == 1 and (zero[0].keep_start, zero[0].keep_count) == (0, 10)
    # aligned 4 + 6: rows 10..24 are zero


@pytest.mark.parametrize("layout", CP_LAYOUTS, ids=_ids)
def test_context_parallel_plans(layout):
    """CP ranks holding the same rows, and CP ranks holding shards (random splits, all on
    the last CP rank, even splits; empty shards, idle replicas), in every mode, host and
    capacity plans (host or device counts / shards)."""
    lay = dpx.DpLayout(*layout)
    rng = random.Random(sum(layout))
    m = lay.replica_size
    for i, counts in enumerate(_count_sets(lay.dp_size, sum(layout))):
        for mode in MODES:
            check_plan(dpx.plan_step(counts, lay, mode=mode), seed=i)
            check_plan(dpx.plan_step(counts, lay, mode=mode,
                                     cp_shards=_shards_for(counts, lay.cp_size, rng, i % 3)),
                       seed=i)
    for mode in MODES:
        cap = 8 if mode is PaddingMode.MAX_LEN else 8 * lay.dp_size
        per = cap if mode is PaddingMode.MAX_LEN else (cap // lay.dp_size) // m * m
        run = [rng.randint(0, per) for _ in range(lay.dp_size)]
        check_plan(dpx.plan_step([0] * lay.dp_size, lay, mode=mode, capacity=cap), run=run)
        shards = _shards_for(run, lay.cp_size, rng, 0)
        plan = dpx.plan_step(run, lay, mode=mode, capacity=cap, cp_shards=shards)
        check_plan(plan, seed=5)                                        # host shards
        check_plan(plan, run=_shards_for(run[::-1], lay.cp_size, rng, 2), seed=6)  # device


def test_a_full_schedule_cache_holds_a_bounded_few_mib():
    """A ScheduleCache at its default bounds (64 templates x 4 variants), filled with
    templates of a 1024-rank world (dp 128, attn-tp 8: the largest chunk tables), holds
    what tracemalloc measures as well under 16 MiB, and never more than its bounds however
    many structures and counts pass through it."""
    import gc
    import tracemalloc

    lay = dpx.DpLayout(1024, 128)
    cache = dpx.ScheduleCache()
    rng = random.Random(11)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for i in range(90):
        counts = [rng.randrange(0, 64) for _ in range(lay.dp_size)]
        cap = 64 + 8 * (i % 30)  # 30 capacity buckets: many structures
        for mode in MODES:
            if mode is not PaddingMode.MAX_LEN:
                cap *= lay.dp_size  # a SUM_LEN / GATHERV capacity holds every replica
            plan = dpx.plan_step(counts, lay, mode=mode, capacity=cap if i % 2 else None)
            for op in (Op.GATHER, Op.REDUCE_SCATTER):
                build_schedule(plan, op, rank=i % 1024, partial=bool(i % 3), cache=cache)
        assert len(cache) <= 64 and cache.variants() <= 64 * 4
    gc.collect()  # what a step leaves behind, freed (the cache holds no reference cycle)
    held = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename")
               if "/dpx/" in s.traceback[0].filename or "<dpx" in s.traceback[0].filename)
    tracemalloc.stop()
    assert len(cache) == 64 and held < 16 * 2**20, (cache.variants(), held)
