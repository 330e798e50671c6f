"""Collectives through a process group's own methods, with their options made once.

Layer: shims. Imports dpx and the modules before it in its own row (docs/semantics.md,
"Where things live").

``torch.distributed``'s public functions re-check their arguments and build their options
on every call -- microseconds of host time that a prepared call has already spent once.
Private: ``ProcessGroup._allgather_base(out, inp, AllgatherOptions)``,
``_reduce_scatter_base(out, inp, ReduceScatterOptions)`` and ``allreduce([buf],
AllreduceOptions)`` with ``distributed_c10d``'s options classes, checked on torch 2.11
(CUDA) and 2.13 (CPU). Public fallback, per bound collective: ``all_gather_into_tensor`` /
``reduce_scatter_tensor`` / ``all_reduce`` when the method or its options class is missing
or the method's first call raises ``TypeError`` / ``AttributeError`` (a changed
signature: :class:`~dpx_torch.shims.first_use.FirstUse`). A collective's own errors
after a first call that worked propagate unchanged.
"""

from __future__ import annotations

from typing import Any, Callable

import torch.distributed as dist

from dpx_torch.shims.first_use import FirstUse

__all__ = ["method_call"]


def _options(cls_name: str, *, reduce: bool) -> Any:
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


def method_call(group: Any, method_name: str, opts_name: str, public: Callable[..., Any], *,
                reduce: bool, listed: bool = False) -> FirstUse:
    """``.fn(*tensors) -> work``: the collective ``method_name`` of ``group`` with its
    options (``listed``: the method takes its one tensor in a list), whose work the caller
    waits on, or ``public(*tensors, group=group)``, synchronous (``None``). The first use
    covers the call alone: a failing ``wait()`` is the collective's own error, never
    retried through the public function."""
    method = getattr(group, method_name, None)
    opts = _options(opts_name, reduce=reduce)

    def by_public(*tensors: Any) -> None:
        public(*tensors, group=group)

    if method is None or opts is None:
        return FirstUse(None, by_public)

    if listed:
        def private(buf: Any) -> Any:
            return method([buf], opts)
    else:
        def private(out: Any, inp: Any) -> Any:
            return method(out, inp, opts)
    return FirstUse(private, by_public)
