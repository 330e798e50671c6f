"""The fp8 wire format (:mod:`dpx.wire`) in stock torch ops -- what CPU tensors run (CUDA
runs the ``dpx.kernels.wire`` kernels; :mod:`dpx_torch.passes` picks) -- and the views of a
wire buffer.

``quantize_rows(src [k, H] float, out uint8 [k, wire_row_bytes(H)])``: every row of ``src``
as a wire row.
``dequantize_rows(src uint8 [k, wire_row_bytes(H)], out [k, H])``.
``split_wire(buf)``: ``(payload float8_e4m3fn [rows, H], scales float32 [rows, H/128])``
views of a wire buffer (strided views of its bytes, no copy).

Divisions are IEEE (torch's CPU division of float32 tensors is correctly rounded; the
divisors are tensors, never Python scalars, which some builds turn into a product with the
reciprocal) and ``.to(torch.float8_e4m3fn)`` rounds to nearest even, so the bits are those
of the kernels and of JAX's XLA path.
"""

from __future__ import annotations

import torch

from dpx import wire as W

__all__ = ["dequantize_rows", "quantize_rows", "split_wire"]

#: The canonical quiet NaN a dequantized NaN code becomes, by output dtype (bits).
_NAN_BITS = {torch.float32: (0x7FC00000, torch.int32), torch.bfloat16: (0x7FC0, torch.int16),
             torch.float16: (0x7E00, torch.int16)}


def quantize_rows(src: torch.Tensor, out: torch.Tensor) -> None:
    k, h = src.shape
    g = h // W.GROUP
    x = src.float().view(k, g, W.GROUP)
    finite = torch.isfinite(x)
    xf = torch.where(finite, x, torch.zeros((), dtype=torch.float32))
    amax = xf.abs().amax(-1)
    scale = amax.clamp_min(W.EPS) / torch.full((1,), W.FP8_MAX)
    q = (xf / scale[..., None]).clamp_(-W.FP8_MAX, W.FP8_MAX)
    code = q.to(torch.float8_e4m3fn).view(torch.uint8)
    if not bool(finite.all()):
        code = torch.where(finite, code, torch.full((), W.NAN_CODE, dtype=torch.uint8))
    out[:, :h].copy_(code.view(k, h))
    out[:, h:].copy_(scale.view(torch.uint8).view(k, 4 * g))


def dequantize_rows(src: torch.Tensor, out: torch.Tensor) -> None:
    k, h = out.shape
    payload, scales = split_wire(src)
    v = (payload.float().view(k, h // W.GROUP, W.GROUP) * scales[..., None]).view(k, h)
    res = v.to(out.dtype)
    nan = torch.isnan(v)
    if bool(nan.any()):
        bits, idt = _NAN_BITS[out.dtype]
        res = torch.where(nan, torch.tensor(bits, dtype=idt).view(out.dtype), res)
    out.copy_(res)


def split_wire(buf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(payload [rows, H] float8_e4m3fn, scales [rows, H/128] float32)``: views of the
    uint8 wire rows ``buf [rows, wire_row_bytes(H)]`` (strided: row stride
    ``wire_row_bytes(H)`` bytes; ``.contiguous()`` copies them out)."""
    width = buf.shape[1] * W.GROUP // (W.GROUP + 4)
    payload = buf[:, :width].view(torch.float8_e4m3fn)
    scales = buf[:, width:].view(torch.float32)
    return payload, scales
