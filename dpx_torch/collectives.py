"""The collectives a schedule issues, bound once per process group.

``bind_all_gather(group)(out, inp)``, ``bind_reduce_scatter(group)(out, inp)`` (sum) and
``bind_all_reduce(group)(buf)`` (sum, in place) do what ``torch.distributed``'s
``all_gather_into_tensor`` / ``reduce_scatter_tensor`` / ``all_reduce`` do, synchronously
(``wait()`` on the work: on NCCL the current stream waits, the host does not). They call
the process group's own method with options made once: the public functions re-check
their arguments and build their options on every call -- microseconds of host time that a
prepared call has already spent once (its tensors are checked by the communicator). Inside
a ``_coalescing_manager`` block, under torch.compile tracing, for tensor subclasses, and
where the process group lacks the method, they call the public function instead (which
handles those).

``all_gather_single`` / ``reduce_scatter_single``: the public single-tensor functions
(torch >= 2.12 renamed them; older releases have only the old names).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

__all__ = ["all_gather_single", "bind_all_gather", "bind_all_reduce", "bind_all_to_all",
           "bind_reduce_scatter", "reduce_scatter_single"]

all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

Pair = Callable[[torch.Tensor, torch.Tensor], None]
_T = torch.Tensor


def _options(cls_name: str, *, reduce: bool) -> object | None:
    from torch.distributed import distributed_c10d as c10d

    cls = getattr(c10d, cls_name, None)
    if cls is None:
        return None
    opts = cls()
    if reduce:
        opts.reduceOp = dist.ReduceOp.SUM
    if hasattr(opts, "asyncOp"):
        opts.asyncOp = False   # what the public functions set for a synchronous call
    return opts


def _coalescing() -> dict:
    """The groups inside a ``_coalescing_manager`` block (torch's own table), or an empty
    dict where this torch keeps none."""
    from torch.distributed import distributed_c10d as c10d

    state = getattr(getattr(c10d, "_world", None), "pg_coalesce_state", None)
    return state if isinstance(state, dict) else {}


def _direct(group, method_name: str, opts_name: str, *, reduce: bool):
    if torch.compiler.is_compiling():
        return None, None
    method = getattr(group, method_name, None)
    opts = _options(opts_name, reduce=reduce)
    if method is None or opts is None:
        return None, None
    return method, opts


def _bind_pair(group, method_name: str, opts_name: str, public, *, reduce: bool) -> Pair:
    """``fn(out, inp)`` of an out-of-place single-tensor collective (see the module
    docstring)."""
    method, opts = _direct(group, method_name, opts_name, reduce=reduce)
    if method is None:
        return lambda out, inp: public(out, inp, group=group)
    coalescing = _coalescing()

    def go(out: torch.Tensor, inp: torch.Tensor) -> None:
        if group in coalescing or type(out) is not _T or type(inp) is not _T:
            public(out, inp, group=group)
            return
        work = method(out, inp, opts)
        if work is not None:
            work.wait()
    return go


def bind_all_gather(group: dist.ProcessGroup) -> Pair:
    """``fn(out, inp)``: the equal all-gather of ``inp`` blocks into ``out`` over
    ``group``."""
    return _bind_pair(group, "_allgather_base", "AllgatherOptions", all_gather_single,
                      reduce=False)


def bind_reduce_scatter(group: dist.ProcessGroup) -> Pair:
    """``fn(out, inp)``: this rank's block of the sum over ``group`` of ``inp``."""
    return _bind_pair(group, "_reduce_scatter_base", "ReduceScatterOptions",
                      reduce_scatter_single, reduce=True)


def bind_all_reduce(group: dist.ProcessGroup) -> Callable[[torch.Tensor], None]:
    """``fn(buf)``: ``buf`` summed over ``group``, in place."""
    method, opts = _direct(group, "allreduce", "AllreduceOptions", reduce=True)
    public = dist.all_reduce
    if method is None:
        return lambda buf: public(buf, group=group)
    coalescing = _coalescing()

    def go(buf: torch.Tensor) -> None:
        if group in coalescing or type(buf) is not _T:
            public(buf, group=group)
            return
        work = method([buf], opts)
        if work is not None:
            work.wait()
    return go


def bind_all_to_all(group: dist.ProcessGroup) -> Pair:
    """``fn(out, inp)``: block ``k`` of ``inp`` to the group's rank ``k``, block ``k`` of
    ``out`` from it (equal blocks; the public function: one call a step)."""
    return lambda out, inp: dist.all_to_all_single(out, inp, group=group)
