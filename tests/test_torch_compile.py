"""torch.compile(fullgraph=True) over gather -> matmul -> reduce_scatter (gloo, world 1)."""

from __future__ import annotations

import pytest
import torch

import dpx


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
