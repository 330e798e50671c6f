"""sglang's DP-attention data path (``sglang.srt.layers.dp_attention``) on a :class:`DpComm`.

Layer: public. Imports dpx, the shims, passes, transports, runner and call paths layers
and the modules before it in its own row (docs/semantics.md, "Where things live").

Model code written against sglang's module switches by changing one import::

    from dpx_torch.sglang import dp_gather_partial, dp_scatter, ...   # was: sglang's module

The names, positional arguments and in-place writes into the caller's tensors are
sglang's; the work is dpx's (plans, schedules, kernels). All state -- the communicator,
the buffer metadata, the per-forward buffer lengths, the extend flag, the speculative
``disable_dp_size`` override, the attn-CP groups -- lives in one
:class:`~dpx_torch.dp_attention.DpAttention`. That module's sglang names
(``DpPaddingMode``, ``compute_dp_attention_world_info``), ``DpAttention`` and
``current()`` (the installed one) import from this one too, as sglang's model code
imports them.
:func:`setup` builds it (in place of sglang's ``initialize_dp_attention(server_args,
model_config)``) and installs it; the module functions act on the installed one, and each
of them that reads the set-up is also a method of the object, for code that holds it.

**A forward batch** is any object with sglang's attribute names. Read:
``global_num_tokens_cpu`` (host per-replica counts, or None), ``global_num_tokens_gpu``
(device per-replica counts, read when the host ones are None), ``dp_padding_mode`` (a
:class:`DpPaddingMode`, or None: the mode :func:`set_dp_buffer_len` recorded). Written
(by :func:`get_dp_local_info`, as sglang does): ``dp_local_start_pos``,
``dp_local_num_tokens``.

**Per step**, the gather's plan is ``dpx.plan_step(counts, layout, mode=...)`` with the
batch's host counts and padding mode (SUM_LEN becomes GATHERV where sglang's
``SGLANG_DP_USE_GATHERV`` would: ``use_gatherv=True``, attn_tp 1 and no CP). With device
counts only (``global_num_tokens_cpu is None``, e.g. inside a CUDA graph) it is a capacity
plan: each MAX_LEN slot holds ``get_local_dp_buffer_len()`` rows, a SUM_LEN / GATHERV
buffer ``get_global_dp_buffer_len()``; the counts travel as device data and rows past them
are pad rows (zero). ``dp_reduce_scatter_tensor`` has no batch: it plans from
:func:`set_dp_buffer_len`'s ``global_num_tokens`` (equal slots of ``global_len / dp``
rows when None) and its ``dp_max_padding``.

Where sglang's behaviour differs from dpx's, the drop-in keeps dpx's (docs/sglang.md lists
each difference): no input is modified, pad rows are zero, the overlapped calls are right
with attn_tp > 1, and bad input raises a dpx error before any collective.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator, Sequence

import torch
import torch.distributed as dist

from dpx.modes import Wire
from dpx_torch.comm import DpComm
from dpx_torch.dp_attention import (PLAN_CACHE, DpAttention, DpPaddingMode, Installed,
                                    compute_dp_attention_world_info, current)

__all__ = [
    "attn_cp_all_gather_into_tensor",
    "attn_cp_reduce_scatter_tensor", "attn_tp_all_gather_into_tensor", "attn_tp_all_reduce",
    "attn_tp_reduce_scatter_tensor",
    "disable_dp_size", "dp_gather_partial", "dp_gather_partial_async",
    "dp_gather_replicate", "dp_reduce_scatter_tensor", "dp_reduce_scatterv_async",
    "dp_scatter", "get_attention_cp_rank", "get_attention_cp_size", "get_attention_dp_rank",
    "get_attention_dp_size", "get_attention_tp_rank", "get_attention_tp_size",
    "get_dp_device", "get_dp_dtype", "get_dp_global_num_tokens",
    "get_dp_global_num_tokens_gpu", "get_dp_hidden_size",
    "get_dp_local_info", "get_dp_local_slice_cpu", "get_global_dp_buffer",
    "get_global_dp_buffer_len", "get_is_extend_in_batch", "get_local_dp_buffer",
    "get_local_dp_buffer_len", "get_tbo_persistent_buffer", "is_allocation_symmetric",
    "is_dp_attention_enabled", "is_dp_gatherv_active", "is_dp_max_padding",
    "set_dp_buffer_len", "set_is_extend_in_batch", "set_local_dp_buffer_len", "setup",
    "teardown",
]

def setup(comm: DpComm, *, hidden_size: int, dtype: torch.dtype, device: torch.device | str,
          use_gatherv: bool = False, max_len_with_idle: bool = False,
          attn_cp_group: dist.ProcessGroup | None = None,
          use_gatherv_from_env: bool = False,
          sum_len_allreduce_bytes: int | None = None,
          combine_wire: Wire | str | None = None,
          combine_wire_scale: float | None = None) -> DpAttention:
    """Build a :class:`DpAttention` on ``comm`` and install it for the module functions
    (replacing any installed one). ``use_gatherv_from_env=True`` reads sglang's
    ``SGLANG_DP_USE_GATHERV`` ("1"/"true" turn GATHERV on) instead of ``use_gatherv``.
    ``sum_len_allreduce_bytes``: the decode rule's all-reduce limit (None: off).
    ``combine_wire`` / ``combine_wire_scale``: the combine on a quantized wire (None: off;
    see :class:`DpAttention`). Collective when the layout has CP and no ``attn_cp_group``
    is given."""
    if use_gatherv_from_env:
        use_gatherv = os.environ.get("SGLANG_DP_USE_GATHERV", "").lower() in ("1", "true")
    state = DpAttention(comm, hidden_size=hidden_size, dtype=dtype, device=device,
                        use_gatherv=use_gatherv, max_len_with_idle=max_len_with_idle,
                        attn_cp_group=attn_cp_group,
                        sum_len_allreduce_bytes=sum_len_allreduce_bytes,
                        combine_wire=combine_wire, combine_wire_scale=combine_wire_scale)
    Installed.state = state
    return state


def teardown() -> None:
    """Uninstall the installed set-up (destroying the attn-CP groups it created)."""
    state, Installed.state = Installed.state, None
    if state is not None:
        state.destroy()


# sglang's module functions, each acting on the installed set-up ------------------------
def is_dp_attention_enabled() -> bool:
    return Installed.state is not None


def get_attention_dp_rank() -> int:
    return current().get_attention_dp_rank()


def get_attention_dp_size() -> int:
    return current().get_attention_dp_size()


def get_attention_tp_rank() -> int:
    return current().get_attention_tp_rank()


def get_attention_tp_size() -> int:
    return current().get_attention_tp_size()


def get_attention_cp_rank() -> int:
    return current().get_attention_cp_rank()


def get_attention_cp_size() -> int:
    return current().get_attention_cp_size()


@contextlib.contextmanager
def disable_dp_size() -> Iterator[None]:
    with current().disable_dp_size():
        yield


def set_dp_buffer_len(global_dp_buffer_len: int, local_dp_buffer_len: int,
                      dp_max_padding: bool,
                      global_num_tokens: Sequence[int] | None = None,
                      global_num_tokens_gpu: torch.Tensor | None = None) -> None:
    current().set_dp_buffer_len(global_dp_buffer_len, local_dp_buffer_len, dp_max_padding,
                                global_num_tokens, global_num_tokens_gpu)


def set_local_dp_buffer_len(local_dp_buffer_len: int) -> None:
    current().set_local_dp_buffer_len(local_dp_buffer_len)


def get_dp_global_num_tokens_gpu() -> torch.Tensor | None:
    return current().get_dp_global_num_tokens_gpu()


def get_global_dp_buffer(group: Any = None) -> torch.Tensor:
    return current().get_global_dp_buffer(group)


def get_local_dp_buffer(group: Any = None) -> torch.Tensor:
    return current().get_local_dp_buffer(group)


def get_global_dp_buffer_len() -> int:
    return current().get_global_dp_buffer_len()


def get_local_dp_buffer_len() -> int:
    return current().get_local_dp_buffer_len()


def get_dp_global_num_tokens() -> list[int] | None:
    return current().get_dp_global_num_tokens()


def get_dp_hidden_size() -> int:
    return current().get_dp_hidden_size()


def get_dp_dtype() -> torch.dtype:
    return current().get_dp_dtype()


def get_dp_device() -> torch.device:
    return current().get_dp_device()


def is_dp_max_padding() -> bool:
    return current().is_dp_max_padding()


def is_allocation_symmetric() -> bool:
    return not is_dp_attention_enabled() or current().is_allocation_symmetric()


def set_is_extend_in_batch(is_extend_in_batch: bool) -> None:
    current().set_is_extend_in_batch(is_extend_in_batch)


def get_is_extend_in_batch() -> bool:
    return current().get_is_extend_in_batch()


def is_dp_gatherv_active() -> bool:
    return current().is_dp_gatherv_active()


def get_dp_local_info(forward_batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return current().get_dp_local_info(forward_batch)


def get_dp_local_slice_cpu(forward_batch: Any, can_run_graph: bool,
                           cuda_graph_batch: int | None) -> tuple[int, int]:
    return current().get_dp_local_slice_cpu(forward_batch, can_run_graph, cuda_graph_batch)


def dp_gather_partial(global_tokens: torch.Tensor, local_tokens: torch.Tensor,
                      forward_batch: Any, cp_shard_counts: Sequence[int] | None = None) -> None:
    current().dp_gather_partial(global_tokens, local_tokens, forward_batch, cp_shard_counts)


def dp_gather_replicate(global_tokens: torch.Tensor, local_tokens: torch.Tensor,
                        forward_batch: Any,
                        cp_shard_counts: Sequence[int] | None = None) -> None:
    current().dp_gather_replicate(global_tokens, local_tokens, forward_batch, cp_shard_counts)


def dp_scatter(local_tokens: torch.Tensor, global_tokens: torch.Tensor,
               forward_batch: Any, cp_shard_counts: Sequence[int] | None = None) -> None:
    current().dp_scatter(local_tokens, global_tokens, forward_batch, cp_shard_counts)


def dp_reduce_scatter_tensor(output: torch.Tensor, input: torch.Tensor) -> None:
    current().dp_reduce_scatter_tensor(output, input)


def dp_gather_partial_async(global_tokens: torch.Tensor, local_tokens: torch.Tensor,
                            forward_batch: Any, event_key: Any = ("gather", 0)
                            ) -> torch.cuda.Event | None:
    return current().dp_gather_partial_async(global_tokens, local_tokens, forward_batch,
                                             event_key)


def dp_reduce_scatterv_async(output_local: torch.Tensor, global_tokens: torch.Tensor,
                             sizes: Sequence[int], event_key: Any = ("combine", 0)
                             ) -> torch.cuda.Event | None:
    return current().dp_reduce_scatterv_async(output_local, global_tokens, sizes, event_key)


def get_tbo_persistent_buffer(key: Any, rows: int, hidden: int, dtype: torch.dtype,
                              device: Any) -> torch.Tensor:
    return current().get_tbo_persistent_buffer(key, rows, hidden, dtype, device)


def attn_tp_reduce_scatter_tensor(output: torch.Tensor, input: torch.Tensor) -> None:
    current().attn_tp_reduce_scatter_tensor(output, input)


def attn_cp_reduce_scatter_tensor(output: torch.Tensor, input: torch.Tensor) -> None:
    current().attn_cp_reduce_scatter_tensor(output, input)


def attn_tp_all_reduce(input: torch.Tensor) -> torch.Tensor:
    return current().attn_tp_all_reduce(input)


def attn_tp_all_gather_into_tensor(output: torch.Tensor, input: torch.Tensor) -> None:
    current().attn_tp_all_gather_into_tensor(output, input)


def attn_cp_all_gather_into_tensor(output: torch.Tensor, input: torch.Tensor) -> None:
    current().attn_cp_all_gather_into_tensor(output, input)
