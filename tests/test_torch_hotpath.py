"""A server's hot path on gloo worlds 1-4 (attn-tp and CP layouts): no token lost without
an error or the overflow flag, the in-place gather, errors a person can act on, and caches
that stay bounded over many distinct steps."""

from __future__ import annotations

import itertools

import pytest

pytestmark = pytest.mark.multiproc

IDS = lambda l: f"w{l[0]}dp{l[1]}" + (f"cp{l[2]}" if len(l) > 2 else "")  # noqa: E731


def _over_cases(dp: int, cp: int) -> list[dict]:
    """Capacity plans and device counts they cannot hold: a count over a MAX_LEN slot, a
    negative count, aligned counts over a SUM_LEN / GATHERV buffer, CP shards whose sum is
    over the slot; with good counts that fit."""
    table = lambda rows: rows if cp == 1 else [[x] + [0] * (cp - 1) for x in rows]  # noqa
    zeros = [0] * dp
    shards = None if cp == 1 else [[0] * cp] * dp
    cases = [dict(mode="max_len", capacity=4, bad=table([6] * dp), good=table([4] * dp)),
             dict(mode="max_len", capacity=4, bad=table([-3] + [2] * (dp - 1)),
                  good=table([2] * dp))]
    for mode in ("sum_len", "gatherv"):
        cases.append(dict(mode=mode, capacity=8 * dp, bad=table([6 * dp + 4] * dp),
                          good=table([2] * dp)))
        cases.append(dict(mode=mode, capacity=8 * dp, bad=table([-1] * dp),
                          good=table([0] * dp)))
    for c in cases:
        c.update(counts=zeros, shards=shards)
    return cases


@pytest.mark.parametrize("layout", [(2, 2), (4, 2), (3, 3), (4, 1, 2), (4, 2, 2)], ids=IDS)
def test_counts_outside_the_capacity_raise_or_flag(gloo_worlds, layout):
    dp, cp = layout[1], (layout[2] if len(layout) > 2 else 1)
    cases = _over_cases(dp, cp)
    res = gloo_worlds(layout[0]).run("hotpath_jobs:over_capacity", layout, cases)
    for i, case in enumerate(cases):
        per_rank = [r[i] for r in res]
        for key in ("gather", "reduce_scatter"):
            msgs = {r[key] for r in per_rank}
            assert len(msgs) == 1, f"{key} {case}: ranks raised different errors: {msgs}"
            msg = msgs.pop()
            assert msg.startswith("DpxCapacityError: validate: device counts"), msg
            assert "replica 0" in msg or "sum to" in msg, msg
            assert f"capacity {case['capacity']}" in msg or "< 0" in msg, msg
        for r in per_rank:
            assert r["untouched"], f"rows moved before the error: {case}"
            assert r["clear_after_good"] and r["flagged"] and r["cleared"] and \
                r["flagged_rs"], (case, r)
            assert r["reason"] != "none"
    negative = [r[1]["reason"] for r in res]
    assert all("a negative count" in n for n in negative), negative


@pytest.mark.parametrize("layout", [(4, 2), (4, 1, 2)], ids=IDS)
def test_exchange_counts_checks_against_a_plan(gloo_worlds, layout):
    dp = layout[1]
    world = gloo_worlds(layout[0])
    args = dict(num_tokens=[0] * dp, mode="max_len", capacity=5)
    over = world.run("hotpath_jobs:exchange_checks", layout, 7, args)
    assert len({r["strict"] for r in over}) == 1
    assert over[0]["strict"].startswith("DpxCapacityError: exchange_counts: replica 0 has "
                                        "count 7 > capacity 5")
    assert all(r["flagged"] and r["counts"] == [7] * dp for r in over)
    fine = world.run("hotpath_jobs:exchange_checks", layout, 5, args)
    assert all(r["strict"] == "no error" and not r["flagged"] for r in fine)


def test_a_destroyed_communicator_refuses_work(gloo_worlds):
    for r in gloo_worlds(2).run("hotpath_jobs:destroyed"):
        assert r.pop("ok") and len(r) == 17, r
        for key, msg in r.items():
            assert msg.startswith("DpxValueError: this DpComm was destroyed"), (key, msg)


def test_sync_counts_names_the_bad_value(gloo_worlds):
    msgs = set(gloo_worlds(2).run("hotpath_jobs:sync_bad"))
    assert msgs == {"DpxMismatchError: sync_counts: rank 1 passed num_tokens=2.5 (it must be "
                    "an int >= 0)"}


def _in_place_cases(dp: int, cp: int) -> list[dict]:
    idle = [0 if i % 2 else 3 + 2 * i for i in range(dp)]
    cases = []
    for mode in ("max_len", "sum_len", "gatherv"):
        for partial in (True, False):
            cases.append(dict(counts=idle, mode=mode, partial=partial, seed=len(cases)))
            cases.append(dict(counts=[4] * dp, mode=mode, partial=partial, dtype="int64",
                              seed=len(cases)))
            # a capacity plan: MAX_LEN with device counts; the others with host counts
            run = [min(2 + i, 5) for i in range(dp)]
            if mode == "max_len":
                cases.append(dict(counts=[0] * dp, mode=mode, capacity=6, run_counts=run,
                                  partial=partial, seed=len(cases)))
            else:
                cases.append(dict(counts=run, mode=mode, capacity=6 * dp, partial=partial,
                                  seed=len(cases)))
                cases.append(dict(counts=[0] * dp, mode=mode, capacity=6 * dp,
                                  run_counts=run, partial=partial, refused=True))
            if cp > 1:
                cases.append(dict(counts=[5] * dp, shards=[[5 - i, i] + [0] * (cp - 2)
                                                            for i in range(dp)],
                                  mode=mode, partial=partial, seed=len(cases)))
    return cases


@pytest.mark.parametrize("layout", [(1, 1), (2, 2), (2, 1), (3, 3), (4, 2), (4, 4), (4, 1),
                                    (4, 1, 2), (4, 2, 2)], ids=IDS)
def test_in_place_gather_equals_the_gather(gloo_worlds, layout):
    dp, cp = layout[1], (layout[2] if len(layout) > 2 else 1)
    cases = _in_place_cases(dp, cp)
    done = gloo_worlds(layout[0]).run("hotpath_jobs:in_place", layout, cases, timeout=300)
    assert done == [len(cases)] * layout[0]


@pytest.mark.parametrize("transport", ["per_root", "peer"])
@pytest.mark.parametrize("layout", [(4, 4), (4, 2), (4, 1, 2)], ids=IDS)
def test_in_place_gather_on_a_quantized_wire_equals_the_gather(gloo_worlds, layout,
                                                               transport):
    """A gather from its slot of ``out`` on a quantized wire runs the separate-input
    schedule (its quantize reads the rows where they lie; ``dpx.wire.in_place_schedule``):
    bitwise the gather from a separate input on every wire, MAX_LEN and GATHERV, partial
    and replicated, idle replicas, a capacity plan with device counts."""
    dp = layout[1]
    idle = [0 if i % 2 else 3 + 2 * i for i in range(dp)]
    cases = [dict(counts=idle, mode=mode, partial=partial, wire=wire, wire_scale=scale,
                  seed=i)
             for i, (mode, partial, (wire, scale)) in enumerate(itertools.product(
                 ("max_len", "gatherv"), (True, False),
                 (("fp8", None), ("nvfp4", 2.0), ("mxfp4", None))))]
    cases += [dict(counts=[0] * dp, mode="max_len", capacity=6, run_counts=[2] * dp,
                   partial=p, wire="fp8", seed=len(cases) + p) for p in (True, False)]
    done = gloo_worlds(layout[0]).run("hotpath_jobs:in_place", layout, cases, rest=(128,),
                                      transport=transport, timeout=300)
    assert done == [len(cases)] * layout[0]


@pytest.mark.parametrize("layout", [(2, 2), (4, 2), (4, 1, 2)], ids=IDS)
def test_in_place_gather_moves_no_row(gloo_worlds, layout):
    """The collectives read the rows where the caller wrote them: an in-place gather's
    schedule has no move pass (only zeroing of pad rows) in MAX_LEN and SUM_LEN, partial
    and replicated, host and device counts."""
    dp = layout[1]
    cases = [dict(counts=[3] + [0] * (dp - 1), mode=m, partial=p)
             for m in ("max_len", "sum_len") for p in (True, False)]
    cases += [dict(counts=[0] * dp, mode="max_len", capacity=4, run_counts=[4] * dp,
                   partial=p) for p in (True, False)]
    for kinds in gloo_worlds(layout[0]).run("hotpath_jobs:in_place_steps", layout, cases):
        for k, case in zip(kinds, cases):
            assert "move" not in k, (case, k)


@pytest.mark.parametrize("layout", [(2, 2), (4, 1, 2)], ids=IDS)
def test_caches_stay_bounded_and_flat(gloo_worlds, layout):
    """New host counts every step, every mode, CP shards, capacity plans, masks, fp8,
    several tensors, async calls: every cache stays within its bound, the caches hold well
    under 16 MiB and no more at the end than half way, and the process stops growing."""
    res = gloo_worlds(layout[0]).run("hotpath_jobs:soak", layout, 120, 5, timeout=600)
    for r in res:
        lim = r["limits"]
        s = r["sizes"]
        assert s["prepared"] <= lim["calls"] and s["classes"] <= lim["calls"]
        assert s["templates"] <= lim["templates"]
        assert s["variants"] <= lim["templates"] * lim["variants"]
        assert s["programs"] <= lim["programs"] and s["batches"] <= lim["batches"]
        assert s["tables"] <= lim["tables"] and s["events"] <= 2
        assert s["launches"] <= 256
        assert r["host_bytes"] < 16 * 2**20, r
        assert r["host_bytes"] < 1.25 * r["mid_bytes"], r
        assert r["rss_growth"] < 16 * 2**20, r


@pytest.mark.parametrize("spec", ["gloo", "cpu:gloo"])
def test_any_backend_spec_a_launcher_uses(gloo_worlds, spec):
    """The device follows the tensors and what the backends carry, not the backend's name:
    a "cpu:gloo" world takes CPU tensors, serves host exchanges itself, and DpComm creates
    no gloo group besides its attn-tp subgroups."""
    for r in gloo_worlds(4, spec).run("hotpath_jobs:backend_checks", (4, 2), "cpu"):
        assert r["spec"] == spec and r["ok"] and r["device"] == "cpu"
        assert "cpu" in r["devices"] and r["cpu_is_world"]
        assert r["created"] == [None, None], r  # the two attn-tp groups, on the world's spec
        assert r["counts"] == (3, 3)


@pytest.mark.parametrize("layout", [(2, 2), (4, 2)], ids=IDS)
def test_several_tensors_go_out_as_one_grouped_launch_per_kind(gloo_worlds, layout):
    """docs/semantics.md, "Several tensors in one call", on a backend that coalesces (as
    NCCL does; gloo stands in, the runner's grouped blocks recorded): a four-tensor gather
    issues its all-gathers in one block, its attn-tp reduce-scatters in one block per
    dtype (a dtype of one tensor: no block), and equals the tensors gathered alone."""
    for r in gloo_worlds(layout[0]).run("hotpath_jobs:grouped_launches", layout):
        assert r["equal"], r
        gathers = [b for kind, b in r["log"] if kind == "bind_all_gather"]
        assert len(gathers) == 4 and len(set(gathers)) == 1 and gathers[0] is not None, r
        rs = [b for kind, b in r["log"] if kind == "bind_reduce_scatter"]
        if layout[0] == layout[1]:   # attn_tp 1: the partial tensors need no reduce-scatter
            assert rs == [], r
        else:                        # bf16, fp32, bf16: the two bf16 together, fp32 alone
            assert len(rs) == 3 and rs[0] == rs[1] is not None and rs[2] is None, r
            assert rs[0] != gathers[0], r


@pytest.mark.parametrize("layout", [(2, 2), (4, 2)], ids=IDS)
@pytest.mark.parametrize("mode", ["sum_len", "gatherv"])
def test_all_reduces_group_by_dtype_and_per_root_collectives_in_one_block(gloo_worlds,
                                                                           layout, mode):
    """The same four-tensor gather in SUM_LEN (its world all-reduces: one block per dtype,
    the two bf16 together, int32 and fp32 alone) and GATHERV (with attn_tp 1 its
    per-root broadcasts, every tensor's from every root, in one block; with attn_tp > 1 as
    MAX_LEN's), each result equal to the tensor gathered alone."""
    for r in gloo_worlds(layout[0]).run("hotpath_jobs:grouped_launches", layout, mode):
        assert r["equal"], r
        kinds = {kind for kind, _ in r["log"]}
        if mode == "sum_len":
            ars = [b for kind, b in r["log"] if kind == "bind_all_reduce"]
            assert kinds == {"bind_all_reduce"} and len(ars) == 4, r
            assert sorted(ars, key=str) == [ars[0], ars[0], None, None] and ars[0], r
        elif layout[0] == layout[1]:
            casts = [b for kind, b in r["log"] if kind == "bind_broadcast"]
            assert kinds == {"bind_broadcast"} and len(casts) == 4 * layout[1], r
            assert len(set(casts)) == 1 and casts[0] is not None, r
        else:
            gathers = [b for kind, b in r["log"] if kind == "bind_all_gather"]
            rs = [b for kind, b in r["log"] if kind == "bind_reduce_scatter"]
            assert len(gathers) == 4 and len(set(gathers)) == 1 and gathers[0], r
            assert len(rs) == 3 and rs[0] == rs[1] is not None and rs[2] is None, r
