"""Autograd for every DpComm op: the backward of an op is the schedule of its adjoint op
(``dpx.Op.adjoint``): gather (partial or replicated) -> reduce_scatter; reduce_scatter ->
gather_sum (the partial gather whose sums span every rank of a replica, CP ranks too);
scatter <-> scatter's adjoint. For a replicated gather every attn-tp copy receives the
whole slot's gradient, which is what the backward of a replicated activation expects.

Layer: call paths. Imports dpx, the shims, passes, transports and runner layers and the
modules before it in its own row (docs/semantics.md, "Where things live").

A graph keeps its communicator's calls weakly and no prepared program: a graph held past
``DpComm.destroy()`` holds no process group, and its backward raises that the
communicator was destroyed."""

from __future__ import annotations

import weakref
from typing import Any, Protocol

import torch

from dpx_torch.lifecycle import destroyed
from dpx_torch.runner import Call

__all__ = ["Calls", "OpFunction"]


class Calls(Protocol):
    """What an autograd call runs with (:class:`dpx_torch.fullpath.FullPath`): a call into
    a new output, and the call computing a call's backward."""

    def execute(self, call: Call, x: torch.Tensor) -> torch.Tensor: ...

    def adjoint(self, call: Call, grad: torch.Tensor) -> Call: ...


class OpFunction(torch.autograd.Function):
    """``apply(x, calls, call)``: the call's schedule forward, its adjoint's backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, calls: Calls, call: Call) -> torch.Tensor:
        ctx.calls, ctx.call = weakref.ref(calls), call._replace(prep=None)
        return calls.execute(call, x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        calls = ctx.calls()
        if calls is None:
            raise destroyed()
        grad = grad.contiguous()
        adj = calls.adjoint(ctx.call, grad)
        return calls.execute(adj, grad), None, None
