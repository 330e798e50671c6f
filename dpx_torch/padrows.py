"""Pad rows of a gathered buffer (rows that are not real token rows,
:func:`dpx.extents.real_ranges`): ``mask_pad_rows`` fills them in place in one kernel
launch, ``pad_row_mask`` returns the boolean mask.

Layer: call paths. Imports dpx, the shims, passes, transports and runner layers and the
modules before it in its own row (docs/semantics.md, "Where things live").

``counts`` (int32 ``[dp_size]`` on the buffer's device, or the ``[dp_size, cp_size]`` shard
table of a sharded plan; capacity plans only) makes the real rows device data: no host
sync, and a captured CUDA graph replays with new counts. Without it the plan's host counts
are used. The device copies of the host index tables come from ``tables`` (a
:class:`dpx_torch.DeviceTables`; ``DpComm.mask_pad_rows`` passes its own) or are made for
the call -- which a CUDA-graph capture cannot do: inside one, pass tables used once before
it, or call ``DpComm.mask_pad_rows`` (a dpx error says so). The mask is the
``dpx::mask_rows_`` custom op under torch.compile.
"""

from __future__ import annotations

import torch

from dpx import values as V
from dpx.errors import DpxTypeError, DpxValueError
from dpx.extents import fill_bits, real_ranges
from dpx.plan import DpPlan, check_plan
from dpx_torch.checks import check_device_counts
from dpx_torch.ops import OpPasses
from dpx_torch.passes import Passes, passes_for
from dpx_torch.program import DeviceTables, DeviceValues, FreshTables, tables_for_call

__all__ = ["mask_pad_rows", "pad_row_mask", "real_rows"]

#: The integer dtype a fill's bits are stored through, by element size.
_INTS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _check(plan: object, counts: torch.Tensor | None, device: torch.device) -> None:
    check_device_counts(check_plan(plan), counts, device)


def _tables_for(tables: DeviceTables | None, device: torch.device
                ) -> DeviceTables | FreshTables:
    if tables is None:
        if device.type == "cuda" and not torch.compiler.is_compiling() \
                and torch.cuda.is_current_stream_capturing():
            raise DpxValueError("mask_pad_rows / pad_row_mask inside a CUDA-graph capture "
                                "need device tables made before it: call "
                                "DpComm.mask_pad_rows (its tables), or pass tables= (a "
                                "dpx_torch.DeviceTables used once before the capture)")
        return FreshTables()
    return tables_for_call(tables)


def _tables(plan: DpPlan, counts: torch.Tensor | None, device: torch.device,
            tables: DeviceTables | FreshTables) -> tuple[torch.Tensor, torch.Tensor]:
    if counts is None:
        firsts, lens = real_ranges(plan, device_counts=False)
        return tables.get(firsts, device), tables.get(lens, device)
    ops = DeviceValues(counts.reshape(-1), tables, (None, 0))
    firsts, lens = real_ranges(plan, device_counts=True)
    return V.evaluate(firsts, ops, ops.memo), V.evaluate(lens, ops, ops.memo)


def mask_pad_rows(t: torch.Tensor, plan: DpPlan, *, counts: torch.Tensor | None = None,
                  fill: int | float = -1, tables: DeviceTables | None = None,
                  passes: Passes | None = None) -> torch.Tensor:
    """In place: every row of ``t [plan.global_rows, ...]`` that is not a real token row
    becomes ``fill`` (slot padding, alignment rows, idle replicas; every mode), a value of
    ``t``'s dtype stored as the element :func:`dpx.extents.fill_bits` gives. Returns
    ``t``. One kernel launch on CUDA for host counts and for MAX_LEN plans with device
    counts (other capacity plans first add the counts into offsets on the device); torch
    ops on CPU (``passes``: :mod:`dpx_torch.passes`, default the device's)."""
    _check(plan, None, torch.device("cpu"))
    if not isinstance(t, torch.Tensor):
        raise DpxTypeError(f"t must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() < 1 or t.shape[0] != plan.global_rows:
        raise DpxValueError(f"t must be a tensor of plan.global_rows={plan.global_rows} rows, "
                            f"got shape {tuple(getattr(t, 'shape', ()))}")
    if not t.is_contiguous():
        raise DpxValueError(f"t of shape {tuple(t.shape)} must be contiguous")
    bits, size = fill_bits(fill, str(t.dtype).removeprefix("torch."))
    check_device_counts(plan, counts, t.device)
    if t.numel() == 0:
        return t
    firsts, lens = _tables(plan, counts, t.device, _tables_for(tables, t.device))
    if torch.compiler.is_compiling():
        passes = OpPasses()
    # the fill's bits through the integer view: every device stores the same element
    (passes or passes_for(t.device)).mask(t.view(_INTS[size]), firsts, lens, bits)
    return t


def real_rows(plan: DpPlan, *, counts: torch.Tensor | None = None,
              device: torch.device | str | None = None,
              tables: DeviceTables | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(firsts, lens)``, int32 ``[dp]`` tensors: replica d's real rows are global rows
    ``[firsts[d], firsts[d] + lens[d])`` (:func:`dpx.extents.real_ranges` on ``counts``'
    device, else ``device``, default CPU)."""
    dev = counts.device if isinstance(counts, torch.Tensor) else torch.device(device or "cpu")
    _check(plan, counts, dev)
    return _tables(plan, counts, dev, _tables_for(tables, dev))


def pad_row_mask(plan: DpPlan, *, counts: torch.Tensor | None = None,
                 device: torch.device | str | None = None,
                 tables: DeviceTables | None = None) -> torch.Tensor:
    """Boolean ``[plan.global_rows]``: True at the rows :func:`mask_pad_rows` fills. On
    ``counts``' device (else ``device``, default CPU)."""
    firsts, lens = real_rows(plan, counts=counts, device=device, tables=tables)
    dev = firsts.device
    rows = torch.arange(plan.global_rows, device=dev, dtype=torch.int32)[:, None]
    real = ((rows >= firsts) & (rows < firsts + lens)).any(dim=1)
    return ~real
