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
from dpx.schedule import Place, Take, ZeroFrom
from reference import global_inputs, local_inputs, ref_gather, ref_reduce_scatter, ref_scatter
from schedule_sim import simulate

LAYOUTS = [(1, 1), (2, 2), (2, 1), (3, 3), (3, 1), (4, 4), (4, 2), (4, 1), (6, 3), (6, 2),
           (8, 2), (8, 4), (8, 8)]
MODES = list(PaddingMode)
TRANSPORTS = list(Transport)
REST = (2,)


def _count_sets(dp: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randint(1, 9) for _ in range(dp)],
            [0 if i % 2 else rng.randint(1, 11) for i in range(dp)],
            [13] + [0] * (dp - 1),
            [0] * dp,
            [rng.choice([0, 1, 4, 8]) for _ in range(dp)]]


def _schedules(plan, op, *, partial, transport, symbolic, device, in_rows):
    W = plan.layout.world_size
    if symbolic:
        s = build_schedule(plan, op, rank=None, partial=partial, transport=transport,
                           device_counts=device, in_rows=in_rows[0])
        return [s] * W
    return [build_schedule(plan, op, rank=r, partial=partial, transport=transport,
                           device_counts=device, in_rows=in_rows[r]) for r in range(W)]


def check_plan(plan, *, run_counts=None, seed=0) -> int:
    """Simulate every op of ``plan`` on every transport, known and symbolic rank; compare
    with the reference. ``run_counts``: device counts for a capacity plan."""
    lay = plan.layout
    W = lay.world_size
    device = run_counts is not None
    eff = tuple(run_counts) if device else plan.num_tokens
    eff_plan = plan.with_counts(eff) if plan.is_static else plan
    checks = 0
    for partial, exact in itertools.product((True, False), (True, False)):
        # exact: every rank's input has as many rows as it needs (the no-pass shortcuts)
        if plan.is_static:
            rows = [plan.slot_rows[lay.coords(r).attn_dp_rank] for r in range(W)]
        else:
            rows = [eff[lay.coords(r).attn_dp_rank] + (0 if exact else 2) for r in range(W)]
        locs = [x[:n] for x, n in zip(
            local_inputs(seed, eff_plan, REST, partial=partial, extra_rows=2 + max(rows)),
            rows)]
        want_g = ref_gather(locs, plan, partial=partial, counts=eff)
        globs = global_inputs(seed, plan, REST)
        for transport, symbolic in itertools.product(TRANSPORTS, (False, True)):
            kw = dict(transport=transport, symbolic=symbolic, device=device)
            sched = _schedules(plan, Op.GATHER, partial=partial, in_rows=rows, **kw)
            for r, got in enumerate(simulate(sched, locs, eff if device else None)):
                np.testing.assert_array_equal(got, want_g, err_msg=f"gather rank {r} {kw}")
            if not partial or not exact:
                continue  # the ops below take no partial flag and no local rows
            g_rows = [plan.global_rows] * W
            sc = simulate(_schedules(plan, Op.SCATTER, partial=True, in_rows=g_rows, **kw),
                          [want_g] * W, eff if device else None)
            rs = simulate(_schedules(plan, Op.REDUCE_SCATTER, partial=True, in_rows=g_rows,
                                     **kw), globs, eff if device else None)
            for r in range(W):
                d = lay.coords(r).attn_dp_rank
                k = plan.slot_rows[d]
                for name, got, want in (("scatter", sc[r], ref_scatter(want_g, plan, d, eff)),
                                        ("reduce_scatter", rs[r],
                                         ref_reduce_scatter(globs, plan, d, eff))):
                    np.testing.assert_array_equal(got[:k], want, err_msg=f"{name} r{r} {kw}")
                    assert not got[k:].any(), f"{name} rank {r}: rows past the slot"
            # scatter's adjoint: the slot back at its offset, zeros elsewhere
            slots = [s[:plan.slot_rows[lay.coords(r).attn_dp_rank]] if not symbolic else s
                     for r, s in enumerate(sc)]
            adj = simulate(_schedules(plan, Op.SCATTER_ADJOINT, partial=True,
                                      in_rows=[s.shape[0] for s in slots], **kw),
                           slots, eff if device else None)
            for r in range(W):
                d = lay.coords(r).attn_dp_rank
                want = np.zeros_like(want_g)
                off = ref_offsets(plan, eff)[d]
                want[off:off + eff[d]] = want_g[off:off + eff[d]]
                np.testing.assert_array_equal(adj[r], want, err_msg=f"scatter_adjoint r{r}")
            checks += 1
    return checks


def ref_offsets(plan, counts):
    from reference import offsets_of

    return offsets_of(plan, counts)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: f"w{l[0]}dp{l[1]}")
def test_host_plans(layout):
    lay = dpx.DpLayout(*layout)
    for i, counts in enumerate(_count_sets(lay.dp_size, sum(layout))):
        for mode in MODES:
            for ext in (False, True):
                check_plan(dpx.plan_step(counts, lay, mode=mode, is_extend=ext), seed=i)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: f"w{l[0]}dp{l[1]}")
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
                       run_counts=other, seed=4)                       # device counts


def test_every_rank_issues_the_same_collectives():
    """A schedule's collectives (kind, group, sizes, chunk tables) are identical on every
    rank, whatever each rank's input looks like; local passes may differ."""
    for layout in LAYOUTS:
        lay = dpx.DpLayout(*layout)
        for counts, mode, op, partial, transport in itertools.product(
                _count_sets(lay.dp_size, 1), MODES, list(Op), (True, False), TRANSPORTS):
            plan = dpx.plan_step(counts, lay, mode=mode)
            sigs = {build_schedule(plan, op, rank=r, partial=partial, transport=transport,
                                   in_rows=plan.num_tokens[lay.coords(r).attn_dp_rank]
                                   ).collective_signature() for r in range(lay.world_size)}
            assert len(sigs) == 1, (layout, counts, mode, op, partial, transport, sigs)


def test_no_step_writes_the_input():
    for layout in ((4, 2), (8, 2), (3, 1)):
        lay = dpx.DpLayout(*layout)
        for counts, mode, op, partial, transport in itertools.product(
                _count_sets(lay.dp_size, 2), MODES, list(Op), (True, False), TRANSPORTS):
            plan = dpx.plan_step(counts, lay, mode=mode)
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
    """MAX_LEN, attn_tp 1: a replica whose count fills its slot and whose input is that
    slot sends its input as is; otherwise it places its rows; reduce_scatter zeroes the pad
    tail only where there is one."""
    lay = dpx.DpLayout(2, 2)
    plan = dpx.plan_step([5, 3], lay, mode="max_len")
    full = build_schedule(plan, Op.GATHER, rank=0, in_rows=5)
    assert [s.kind for s in full.steps] == ["all_gather"] and full.steps[0].src.buf == "in"
    assert [s.kind for s in build_schedule(plan, Op.GATHER, rank=1, in_rows=3).steps] == \
        ["place", "all_gather"]
    assert [s.kind for s in build_schedule(plan, Op.GATHER, rank=0, in_rows=7).steps] == \
        ["place", "all_gather"]
    assert [s.kind for s in build_schedule(plan, Op.REDUCE_SCATTER, rank=0).steps] == \
        ["reduce_scatter"]
    assert [s.kind for s in build_schedule(plan, Op.REDUCE_SCATTER, rank=1).steps] == \
        ["reduce_scatter", "zero"]


def test_device_count_values_are_expressions_of_the_counts():
    lay = dpx.DpLayout(4, 2)
    plan = dpx.plan_step([1, 1], lay, mode="sum_len", capacity=16)
    sched = build_schedule(plan, Op.GATHER, rank=2, device_counts=True)
    place = sched.steps[0]
    assert isinstance(place, Place) and isinstance(place.start, X.Expr)
    assert X.render(place.start) == "cumsum_excl(align(n, 2))[1]"
    assert X.host_value(place.start, (3, 5)) == 4 and X.host_value(place.count, (3, 5)) == 5
    host = build_schedule(plan, Op.GATHER, rank=2)
    assert (host.steps[0].start, host.steps[0].count) == (2, 1)  # folded from the plan's counts


def test_symbolic_schedule_is_one_program():
    lay = dpx.DpLayout(8, 4)
    plan = dpx.plan_step([3, 0, 7, 5], lay, mode="max_len")
    sched = build_schedule(plan, Op.GATHER, rank=None, partial=False)
    take = sched.steps[0]
    assert isinstance(take, Take)
    for r in range(8):
        c = lay.coords(r)
        coords = {"rank": r, "dp": c.attn_dp_rank, "tp": c.attn_tp_rank}
        concrete = build_schedule(plan, Op.GATHER, rank=r, partial=False).steps[0]
        if isinstance(concrete, Take):
            assert X.host_value(take.count, plan.num_tokens, coords) == concrete.count


def test_transports_route_gatherv():
    lay = dpx.DpLayout(4, 4)
    plan = dpx.plan_step([3, 0, 7, 5], lay, mode="gatherv")
    kinds = {t: [s.kind for s in build_schedule(plan, Op.GATHER, rank=1, transport=t).steps]
             for t in TRANSPORTS}
    assert kinds[Transport.PER_ROOT][-1] == "broadcast_v"
    assert kinds[Transport.RAGGED][-1] == "all_gather_v"
    assert kinds[Transport.EQUAL] == ["place", "all_reduce"]
    cap = dpx.plan_step([3, 0, 7, 5], lay, mode="gatherv", capacity=32)
    dev = build_schedule(cap, Op.GATHER, rank=1, device_counts=True)
    assert [s.kind for s in dev.steps] == ["place", "all_reduce"] and dev.notes
    rag = build_schedule(cap, Op.GATHER, rank=None, device_counts=True, transport="ragged")
    assert rag.steps[-1].kind == "all_gather_v"
    # equal chunks move with the plain collective on every transport
    even = dpx.plan_step([4, 4, 4, 4], lay, mode="gatherv")
    for t in TRANSPORTS:
        assert build_schedule(even, Op.GATHER, rank=0, transport=t).steps[-1].kind == \
            "all_gather"


def test_zero_step_only_where_a_tail_exists():
    lay = dpx.DpLayout(4, 2)
    plan = dpx.plan_step([3, 5], lay, mode="gatherv", capacity=24)
    steps = build_schedule(plan, Op.GATHER, rank=0).steps
    zero = [s for s in steps if isinstance(s, ZeroFrom)]
    assert len(zero) == 1 and zero[0].start == 10  # aligned 4 + 6; rows 10..24 are zero
