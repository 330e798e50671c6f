"""torch.compile(fullgraph=True) over gather -> matmul -> reduce_scatter (gloo, world 1; and
one gloo world of 2 ranks, where the collectives run)."""

from __future__ import annotations

import pytest
import torch

import dpx
import dpx_torch


@pytest.mark.parametrize("mode", ["max_len", "sum_len"])
def test_step_compiles_fullgraph(comm1, mode):
    torch._dynamo.reset()
    plan = dpx.plan_step([5], comm1.layout, mode=mode)
    w = torch.randn(8, 8)

    def step(x):
        g = comm1.gather(x, plan, partial=True)
        return comm1.reduce_scatter(torch.relu(g @ w), plan)

    x = torch.randn(7, 8)
    eager = step(x)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(x)
    ref = torch.zeros(plan.slot_rows[0], 8)
    ref[:5] = torch.relu(x[:5] @ w)
    assert torch.equal(eager, ref)
    torch.testing.assert_close(compiled, ref, rtol=0, atol=0)


def test_autograd_through_world1(comm1):
    plan = dpx.plan_step([3], comm1.layout, mode="max_len")
    x = torch.randn(4, 6, requires_grad=True)
    w = torch.randn(plan.global_rows, 6)
    (comm1.gather(x, plan, partial=True) * w).sum().backward()
    expect = torch.zeros(4, 6)
    expect[:3] = w[:3]
    assert torch.equal(x.grad, expect)


def _compiled_equals_eager(fn, *args):
    torch._dynamo.reset()
    eager = fn(*args)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(*args)
    flat = lambda x: x if isinstance(x, tuple) else (x,)  # noqa: E731
    for a, b in zip(flat(eager), flat(compiled)):
        assert torch.equal(a, b)
    return eager


def test_capacity_gather_then_mask_compiles(comm1):
    """A capacity plan's gather with device counts, then its pad rows masked: one graph."""
    plan = dpx.plan_step([0], comm1.layout, mode="max_len", capacity=6)
    counts = torch.tensor([4], dtype=torch.int32)

    def step(x, ids):
        g = comm1.gather(x, plan, partial=True, counts=counts)
        m = dpx_torch.mask_pad_rows(ids.clone(), plan, counts=counts, fill=-1)
        mask = dpx_torch.pad_row_mask(plan, counts=counts)
        return g, m, mask

    x, ids = torch.randn(6, 8), torch.arange(12).reshape(6, 2)
    g, m, mask = _compiled_equals_eager(step, x, ids)
    assert torch.equal(g[:4], x[:4]) and not g[4:].any()
    assert (m[4:] == -1).all() and torch.equal(m[:4], ids[:4])
    assert mask.tolist() == [False] * 4 + [True] * 2


def test_several_tensors_and_exchange_counts_compile(comm1):
    plan = dpx.plan_step([0], comm1.layout, mode="sum_len", capacity=8)

    def step(h, ids, n):
        counts = comm1.exchange_counts(n)
        gh, gi = comm1.gather((h, ids), plan, partial=(True, False), counts=counts)
        return gh, comm1.mask_pad_rows(gi, plan, counts=counts), counts

    h, ids = torch.randn(8, 4), torch.arange(16).reshape(8, 2)
    gh, gi, counts = _compiled_equals_eager(step, h, ids, torch.tensor([3], dtype=torch.int32))
    assert counts.tolist() == [3] and torch.equal(gh[:4], torch.cat([h[:3], torch.zeros(1, 4)]))
    assert (gi[4:] == -1).all()


def test_host_count_gathers_compile_every_mode(comm1):
    for mode in ("max_len", "sum_len", "gatherv"):
        plan = dpx.plan_step([3], comm1.layout, mode=mode)
        x = torch.randn(5, 6)
        got = _compiled_equals_eager(lambda t: comm1.gather(t, plan, partial=False), x)
        assert torch.equal(got[:3], x[:3])


@pytest.mark.parametrize("mode", ["max_len", "sum_len", "gatherv"])
def test_lm_head_scatter_compiles(comm1, mode):
    """scatter_columns under torch.compile(fullgraph=True): host counts and a capacity plan
    with device counts, equal to eager and to the reference scatter."""
    plan = dpx.plan_step([5], comm1.layout, mode=mode)
    x = torch.randn(plan.global_rows, 6)
    got = _compiled_equals_eager(lambda s: comm1.scatter_columns(torch.relu(s), plan), x)
    assert torch.equal(got, comm1.scatter(torch.relu(x), plan))
    cap = dpx.plan_step([0], comm1.layout, mode=mode, capacity=8)
    ct = torch.tensor([3], dtype=torch.int32)
    x = torch.randn(cap.global_rows, 6)
    got = _compiled_equals_eager(lambda s, c: comm1.scatter_columns(s, cap, counts=c), x, ct)
    assert torch.equal(got, comm1.scatter(x, cap, counts=ct))


@pytest.mark.parametrize("wire,g", [("fp8", None), ("nvfp4", 0.75), ("mxfp4", None)])
def test_quantized_combine_compiles(comm1, wire, g):
    """reduce_scatter(wire=...) under torch.compile(fullgraph=True), host counts and a
    capacity plan with device counts: the bits of the eager call."""
    from reference import bits_of, ref_combine_rank

    plan = dpx.plan_step([5], comm1.layout, mode="gatherv")
    x = torch.randn(plan.global_rows, 128).to(torch.bfloat16)
    got = _compiled_equals_eager(
        lambda s: comm1.reduce_scatter(s * 2, plan, wire=wire, wire_scale=g), x)
    want = bits_of(ref_combine_rank([(2 * x).float().numpy()], plan, 0, wire, "bfloat16", g))
    assert got.dtype == torch.bfloat16
    assert (got.view(torch.int16).numpy().view(want.dtype) == want).all()
    cap = dpx.plan_step([0], comm1.layout, mode="sum_len", capacity=8)
    ct = torch.tensor([3], dtype=torch.int32)
    x = torch.randn(cap.global_rows, 128)
    got = _compiled_equals_eager(
        lambda s, c: comm1.reduce_scatter(s, cap, counts=c, wire=wire, wire_scale=g), x, ct)
    assert not got[3:].any() and got[:3].abs().sum() > 0


@pytest.mark.parametrize("mode", ["max_len", "gatherv"])
def test_counts_riding_the_gather_compile(comm1, mode):
    """gather_with_counts under torch.compile(fullgraph=True): the rows and counts of the
    eager call, and those of gather(counts=exchange_counts(n_local))."""
    plan = dpx.plan_step([0], comm1.layout, mode=mode, capacity=8)
    n = torch.tensor([3], dtype=torch.int32)
    x = torch.randn(8, 16)
    out, counts = _compiled_equals_eager(
        lambda v, c: comm1.gather_with_counts(v, plan, partial=True, n_local=c), x, n)
    assert counts.tolist() == [3]
    assert torch.equal(out, comm1.gather(x, plan, partial=True,
                                         counts=comm1.exchange_counts(n)))


@pytest.mark.multiproc
def test_steps_compile_on_a_gloo_world(gloo_worlds):
    """torch.compile over gather -> matmul -> combines (native and fp8) -> LM-head scatter
    on torch.distributed's collectives (2 gloo ranks, 2 replicas): fullgraph
    for MAX_LEN with device counts, and a SUM_LEN gather and reduce_scatter (its world
    all-reduces) with host counts;
    GATHERV's per-root collectives have no traceable form, so its step compiles with graph
    breaks around them (``fullgraph=False``); each equal to the eager step bit for bit."""
    world = gloo_worlds(2)
    assert world.run("peer_jobs:compiled_steps", (2, 2), [("max_len", True)],
                     timeout=300) == [1] * 2
    assert world.run("peer_jobs:compiled_ops", (2, 2), ["sum_len"], timeout=300) == [1] * 2
    assert world.run("peer_jobs:compiled_steps", (2, 2), [("gatherv", False)],
                     fullgraph=False, timeout=300) == [1] * 2
