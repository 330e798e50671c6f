"""Autograd for every DpComm op: the backward of an op is the schedule of its adjoint op
(``dpx.Op.adjoint``): gather (partial or replicated) <-> reduce_scatter, scatter <->
scatter's adjoint. For a replicated gather every attn-tp copy receives the whole slot's
gradient, which is what the backward of a replicated activation expects."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from dpx_torch.comm import DpComm, _Call


class OpFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: "DpComm", call: "_Call") -> torch.Tensor:
        ctx.comm, ctx.call = comm, call
        return comm._execute(call, x, None)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        adj = ctx.comm._adjoint(ctx.call)
        return ctx.comm._execute(adj, grad.contiguous(), None), None, None
