"""The collectives a schedule issues, bound once per process group.

Layer: transports. Imports dpx, the shims and passes layers and the modules before it in
its own row (docs/semantics.md, "Where things live").

``bind_all_gather(group)(out, inp)``, ``bind_reduce_scatter(group)(out, inp)`` (sum) and
``bind_all_reduce(group)(buf)`` (sum, in place) do what ``torch.distributed``'s
``all_gather_into_tensor`` / ``reduce_scatter_tensor`` / ``all_reduce`` do, synchronously
(``wait()`` on the work: on NCCL the current stream waits, the host does not). They call
the process group's own method with options made once (:mod:`dpx_torch.shims.pg_methods`,
which falls back to the public functions where the private methods are missing or
changed); inside a ``_coalescing_manager`` block, under torch.compile tracing and for
tensor subclasses they call the public function (which handles those).

``bind_broadcast(group)(buf, root)`` / ``bind_reduce(group)(buf, root)`` (sum onto the root):
the per-root collectives (GATHERV's rows, one call per root with rows; the public
functions, which a ``_coalescing_manager`` block groups).

``all_gather_single`` / ``reduce_scatter_single``: the public single-tensor functions
(torch >= 2.12 renamed them; older releases have only the old names).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from dpx_torch.shims.coalescing import coalescing_state
from dpx_torch.shims.pg_methods import method_call

__all__ = ["all_gather_single", "bind_all_gather", "bind_all_reduce", "bind_all_to_all",
           "bind_all_to_all_v", "bind_broadcast", "bind_reduce", "bind_reduce_scatter",
           "reduce_scatter_single"]

all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

Pair = Callable[[torch.Tensor, torch.Tensor], None]
_T = torch.Tensor


def _bind(group, method_name: str, opts_name: str, public, *, reduce: bool,
          listed: bool = False) -> Callable[..., None]:
    """``fn(*tensors)`` of a single-tensor collective (see the module docstring)."""
    if torch.compiler.is_compiling():
        return lambda *tensors: public(*tensors, group=group)
    call = method_call(group, method_name, opts_name, public, reduce=reduce, listed=listed)
    coalescing = coalescing_state()
    if listed:
        def go_one(buf: torch.Tensor) -> None:
            if group in coalescing or type(buf) is not _T:
                public(buf, group=group)
                return
            work = call.fn(buf)
            if work is not None:
                work.wait()
        return go_one

    def go(out: torch.Tensor, inp: torch.Tensor) -> None:
        if group in coalescing or type(out) is not _T or type(inp) is not _T:
            public(out, inp, group=group)
            return
        work = call.fn(out, inp)
        if work is not None:
            work.wait()
    return go


def bind_all_gather(group: dist.ProcessGroup) -> Pair:
    """``fn(out, inp)``: the equal all-gather of ``inp`` blocks into ``out`` over
    ``group``."""
    return _bind(group, "_allgather_base", "AllgatherOptions", all_gather_single,
                 reduce=False)


def bind_reduce_scatter(group: dist.ProcessGroup) -> Pair:
    """``fn(out, inp)``: this rank's block of the sum over ``group`` of ``inp``."""
    return _bind(group, "_reduce_scatter_base", "ReduceScatterOptions",
                 reduce_scatter_single, reduce=True)


def bind_all_reduce(group: dist.ProcessGroup) -> Callable[[torch.Tensor], None]:
    """``fn(buf)``: ``buf`` summed over ``group``, in place."""
    return _bind(group, "allreduce", "AllreduceOptions", dist.all_reduce, reduce=True,
                 listed=True)


def bind_all_to_all(group: dist.ProcessGroup) -> Pair:
    """``fn(out, inp)``: block ``k`` of ``inp`` to the group's rank ``k``, block ``k`` of
    ``out`` from it (equal blocks; the public function: one call a step)."""
    return lambda out, inp: dist.all_to_all_single(out, inp, group=group)


def bind_all_to_all_v(group: dist.ProcessGroup) -> Callable[..., None]:
    """``fn(out, inp, out_rows, in_rows)``: rows of ``inp`` in pieces of ``in_rows[k]`` to
    the group's rank ``k``, ``out`` in pieces of ``out_rows[k]`` from it (host sizes)."""
    return lambda out, inp, outs, ins: dist.all_to_all_single(
        out, inp, output_split_sizes=outs, input_split_sizes=ins, group=group)


def bind_broadcast(group: dist.ProcessGroup) -> Callable[[torch.Tensor, int], None]:
    """``fn(buf, root)``: ``buf`` as the global rank ``root`` holds it, on every rank of
    ``group``."""
    return lambda buf, root: dist.broadcast(buf, src=root, group=group)


def bind_reduce(group: dist.ProcessGroup) -> Callable[[torch.Tensor, int], None]:
    """``fn(buf, root)``: the sum over ``group`` of ``buf`` on the global rank ``root``
    (the other ranks' ``buf`` is left as the backend leaves it)."""
    return lambda buf, root: dist.reduce(buf, dst=root, group=group)
