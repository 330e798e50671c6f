"""Autograd for every DpComm op: the backward of an op is the schedule of its adjoint op
(``dpx.Op.adjoint``): gather (partial or replicated) -> reduce_scatter; reduce_scatter ->
gather_sum (the partial gather whose sums span every rank of a replica, CP ranks too);
scatter <-> scatter's adjoint. For a replicated gather every attn-tp copy receives the
whole slot's gradient, which is what the backward of a replicated activation expects."""

from __future__ import annotations

from typing import Any

import torch

from dpx_torch.runner import Call, Runner

__all__ = ["OpFunction"]


class OpFunction(torch.autograd.Function):
    """``apply(x, runner, call)``: the call's schedule forward, its adjoint's backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, runner: Runner, call: Call) -> torch.Tensor:
        ctx.runner, ctx.call = runner, call
        return runner.execute(call, x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        grad = grad.contiguous()
        adj = ctx.runner.adjoint(ctx.call, grad)
        return ctx.runner.execute(adj, grad), None, None
