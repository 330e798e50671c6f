"""A small DeepSeek-style layer written the way sglang model code is: only against the
names of ``dpx_torch.sglang`` (no dpx call), plus the engine's own tensor-parallel
all-reduce. Attention is attn-TP (column-split QKV stand-in, row-split output projection:
partial sums over the attn-tp group); the MLP is tensor-parallel over every rank and runs
on the gathered buffer. Shared by the gloo jobs and the GPU test."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from dpx_torch.sglang import (DpPaddingMode, attn_tp_all_gather_into_tensor,
                              attn_tp_reduce_scatter_tensor, dp_gather_partial,
                              dp_gather_replicate, dp_reduce_scatter_tensor, dp_scatter,
                              get_attention_dp_rank, get_attention_dp_size,
                              get_attention_tp_rank, get_attention_tp_size,
                              get_global_dp_buffer, get_local_dp_buffer_len, is_dp_max_padding,
                              set_dp_buffer_len)

H, F = 32, 64  # hidden size and MLP width


def weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"wq": torch.randn(H, H, generator=g) / H ** 0.5,
            "wo": torch.randn(H, H, generator=g) / H ** 0.5,
            "w1": torch.randn(H, F, generator=g) / H ** 0.5,
            "w2": torch.randn(F, H, generator=g) / F ** 0.5}


def dense(x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    """The reference: the layer on one process."""
    a = torch.tanh(x @ w["wq"]) @ w["wo"]
    return torch.relu(a @ w["w1"]) @ w["w2"]


@dataclass
class ForwardBatch:
    """The fields of sglang's ForwardBatch the DP-attention functions read and write."""

    global_num_tokens_cpu: list[int] | None
    global_num_tokens_gpu: torch.Tensor
    dp_padding_mode: DpPaddingMode
    dp_local_start_pos: torch.Tensor | None = None
    dp_local_num_tokens: torch.Tensor | None = None


def prepare(num_tokens: list[int], is_extend: bool, device) -> tuple[ForwardBatch, int]:
    """sglang's per-forward sync: counts aligned to attn_tp, the padding mode, MAX_LEN
    counts raised to the max, the buffer lengths recorded. Returns the batch and this
    replica's padded row count."""
    tp, dp = get_attention_tp_size(), get_attention_dp_size()
    aligned = [-(-n // tp) * tp for n in num_tokens]
    mode = DpPaddingMode.get_dp_padding_mode(is_extend, aligned)
    if mode.is_max_len():
        aligned = [max(aligned)] * dp
        buffer_len = aligned[0] * dp
    else:
        buffer_len = sum(aligned)
    local = aligned[get_attention_dp_rank()]
    set_dp_buffer_len(buffer_len, local, mode.is_max_len(), aligned)
    return ForwardBatch(aligned, torch.tensor(aligned, dtype=torch.int32, device=device),
                        mode), local


def graph_batch(bucket: int, counts: torch.Tensor) -> ForwardBatch:
    """A CUDA-graph step: MAX_LEN buckets of ``bucket`` rows, the real counts as device
    data only."""
    dp = get_attention_dp_size()
    set_dp_buffer_len(bucket * dp, bucket, True, [bucket] * dp)
    return ForwardBatch(None, counts, DpPaddingMode.get_default_mode_in_cuda_graph())


def layer(x: torch.Tensor, w: dict[str, torch.Tensor], fb: ForwardBatch, *,
          replicate: bool = False) -> torch.Tensor:
    """``x [local rows, H]`` (this replica's tokens, padded) -> ``[local rows, H]``.

    ``replicate``: the attention output is first made whole on every attn-tp rank
    (reduce-scatter over attn-tp, then all-gather, as sglang's communicator does around
    the residual) and gathered with ``dp_gather_replicate``; otherwise its partial sums
    go to ``dp_gather_partial``."""
    tp, t = get_attention_tp_size(), get_attention_tp_rank()
    cols = slice(t * H // tp, (t + 1) * H // tp)
    partial = torch.tanh(x @ w["wq"][:, cols]) @ w["wo"][cols]      # summed over attn-tp
    g = get_global_dp_buffer()
    if replicate:
        part = torch.empty(partial.shape[0] // tp, H, dtype=x.dtype, device=x.device)
        attn_tp_reduce_scatter_tensor(part, partial.contiguous())
        whole = torch.empty_like(partial)
        attn_tp_all_gather_into_tensor(whole, part)
        dp_gather_replicate(g, whole, fb)
    else:
        dp_gather_partial(g, partial.contiguous(), fb)
    world, r = dist.get_world_size(), dist.get_rank()
    fcols = slice(r * F // world, (r + 1) * F // world)
    mlp = torch.relu(g @ w["w1"][:, fcols]) @ w["w2"][fcols]        # summed over the world
    out = torch.empty(get_local_dp_buffer_len(), H, dtype=x.dtype, device=x.device)
    if is_dp_max_padding():
        dp_reduce_scatter_tensor(out, mlp)
    else:
        dist.all_reduce(mlp)
        dp_scatter(out, mlp, fb)
    return out
