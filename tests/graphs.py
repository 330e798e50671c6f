"""CUDA-graph capture for the GPU tests: warm a step up on a side stream (kernels compiled,
pools sized), then capture one call of it."""

from __future__ import annotations

from typing import Any, Callable

import torch


def warm_up(fn: Callable[[], Any]) -> None:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)


def capture(fn: Callable[[], Any], *, warm: bool = True) -> tuple[torch.cuda.CUDAGraph, Any]:
    """``(graph, what the captured call returned)``; ``warm=False`` when the caller already
    ran :func:`warm_up`."""
    if warm:
        warm_up(fn)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out
