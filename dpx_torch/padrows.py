"""Pad rows of a gathered buffer (rows that are not real token rows, :mod:`dpx.padrows`):
``mask_pad_rows`` fills them in place in one kernel launch, ``pad_row_mask`` returns the
boolean mask.

``counts`` (int32 ``[dp_size]`` on the buffer's device, or the ``[dp_size, cp_size]`` shard
table of a sharded plan; capacity plans only) makes the real rows device data: no host
sync, and a captured CUDA graph replays with new counts. Without it the plan's host counts
are used (their tables are made once per device and kept).
"""

from __future__ import annotations

import functools

import torch

from dpx import expr as X
from dpx.errors import DpxTypeError, DpxValueError
from dpx.kernels import launch as _launch
from dpx.kernels import mask as _mask
from dpx.padrows import real_ranges
from dpx.plan import DpPlan
from dpx_torch.checks import check_counts
from dpx_torch.interpreter import DeviceValues
from dpx_torch.rows import _kernel_of, _width

_CONSTS: dict = {}


@functools.lru_cache(maxsize=1024)
def _host_tables(plan: DpPlan) -> tuple[tuple, tuple]:
    return real_ranges(plan, device_counts=False)


def _check(plan: object, counts: torch.Tensor | None, device: torch.device) -> None:
    if not isinstance(plan, DpPlan):
        raise DpxTypeError(f"plan must be a dpx.DpPlan, got {type(plan).__name__}")
    check_counts(plan, counts, device)


def _tables(plan: DpPlan, counts: torch.Tensor | None,
            device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    if counts is None:
        out = []
        for v in _host_tables(plan):
            t = _CONSTS.get((v, device))
            if t is None:
                t = _CONSTS[(v, device)] = torch.tensor(v, dtype=torch.int32, device=device)
            out.append(t)
        return out[0], out[1]
    ops = DeviceValues(counts.reshape(-1), _CONSTS)
    memo: dict = {}
    firsts, lens = real_ranges(plan, device_counts=True)
    return X.evaluate(firsts, ops, memo), X.evaluate(lens, ops, memo)


def mask_pad_rows(t: torch.Tensor, plan: DpPlan, *, counts: torch.Tensor | None = None,
                  fill: int | float = -1) -> torch.Tensor:
    """In place: every row of ``t [plan.global_rows, ...]`` that is not a real token row
    becomes ``fill`` (slot padding, alignment rows, idle replicas; every mode). Returns
    ``t``. One kernel launch for host counts and for MAX_LEN plans with device counts
    (other capacity plans first add the counts into offsets on the device)."""
    _check(plan, None, torch.device("cpu"))
    if not isinstance(t, torch.Tensor) or t.dim() < 1 or t.shape[0] != plan.global_rows:
        raise DpxValueError(f"t must be a tensor of plan.global_rows={plan.global_rows} rows, "
                            f"got shape {tuple(getattr(t, 'shape', ()))}")
    if not t.is_contiguous():
        raise DpxValueError(f"t of shape {tuple(t.shape)} must be contiguous")
    check_counts(plan, counts, t.device)
    if t.numel() == 0:
        return t
    firsts, lens = _tables(plan, counts, t.device)
    width = _width(t)
    block_r, block_c, warps = _launch.row_blocks(width)
    grid = (-(-t.shape[0] // block_r), -(-width // block_c))
    _kernel_of(_mask, "mask_rows_kernel", t.device)[grid](
        firsts, lens, firsts.shape[0], fill, t.shape[0], t, WIDTH=width, BLOCK_R=block_r,
        BLOCK_C=block_c, num_warps=warps)
    return t


def pad_row_mask(plan: DpPlan, *, counts: torch.Tensor | None = None,
                 device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean ``[plan.global_rows]``: True at the rows :func:`mask_pad_rows` fills. On
    ``counts``' device (else ``device``, default CPU)."""
    dev = counts.device if isinstance(counts, torch.Tensor) else torch.device(device or "cpu")
    _check(plan, counts, dev)
    firsts, lens = _tables(plan, counts, dev)
    rows = torch.arange(plan.global_rows, device=dev, dtype=torch.int32)[:, None]
    real = ((rows >= firsts) & (rows < firsts + lens)).any(dim=1)
    return ~real
