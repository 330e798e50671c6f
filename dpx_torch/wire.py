"""The quantized wire formats (:mod:`dpx.wire`) in stock torch ops -- what CPU tensors run
(CUDA runs the ``dpx.kernels.wire`` and ``dpx.kernels.fp4`` kernels; :mod:`dpx_torch.passes`
picks) -- and the views of a wire buffer.

Layer: passes. Imports dpx, the shims layer and the modules before it in its own row
(docs/semantics.md, "Where things live").

``quantize_rows(src [k, H] float, out uint8 [k, wire_row_bytes(H, wire)], wire, g)``: every
row of ``src`` as a wire row (``g``: nvfp4's global scale).
``dequantize_rows(src uint8 [k, wire_row_bytes(H, wire)], out [k, H], wire, g)``.
``dequantize_sum_rows(src uint8 [parts * k, wire_row_bytes(H, wire)], out [k, H], parts,
wire, g)``: the combine's sum (docs/semantics.md, "The quantized combine"): ``out[j]`` is
the float32 sum from +0.0, over ``p`` in order, of ``dequantize(src[p*k + j])`` in float32,
rounded to ``out``'s dtype (a NaN: the canonical one). CPU float32 additions are IEEE with
subnormals: torch leaves the flush-to-zero mode off (``torch.set_flush_denormal(True)``
would flush mxfp4's subnormal sums, and the bits would no longer be the definition's).
``write_rounded(v float32, out)``: ``v`` rounded once to ``out``'s dtype, a NaN as the
dtype's canonical quiet NaN (torch's own CPU conversion writes bfloat16 NaNs as 0xFFFF).
``split_wire(buf, wire)``: fp8 ``(payload float8_e4m3fn [rows, H], scales float32 [rows,
H/128])``; fp4 ``(payload uint8 [rows, H/2], scales uint8 [rows, H/16 or H/32])``: views of
a wire buffer (strided views of its bytes, no copy).

Divisions are IEEE (torch's CPU division of float32 tensors is correctly rounded; the
divisors are tensors, never Python scalars, which some builds turn into a product with the
reciprocal), conversions round to nearest even, and mxfp4's powers of two are applied in
float64 (exact, no float32 subnormal arithmetic), so the bits are those of the kernels and
of JAX's XLA path.
"""

from __future__ import annotations

import torch

from dpx import wire as W
from dpx.modes import Wire

__all__ = ["dequantize_rows", "dequantize_sum_rows", "quantize_rows", "split_wire",
           "write_rounded"]

#: The canonical quiet NaN a dequantized NaN code becomes, by output dtype: its bits
#: (:data:`dpx.wire.CANONICAL_NAN`) and the int dtype they are written in.
_NAN_BITS = {dt: (W.CANONICAL_NAN[str(dt).replace("torch.", "")], it)
             for dt, it in ((torch.float32, torch.int32), (torch.bfloat16, torch.int16),
                            (torch.float16, torch.int16))}


def quantize_rows(src: torch.Tensor, out: torch.Tensor, wire: Wire = Wire.FP8,
                  g: float | None = None) -> None:
    if wire is not Wire.FP8:
        _quantize_fp4(src, out, wire, g)
        return
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


def dequantize_rows(src: torch.Tensor, out: torch.Tensor, wire: Wire = Wire.FP8,
                    g: float | None = None) -> None:
    if wire is not Wire.FP8:
        _dequantize_fp4(src, out, wire, g)
        return
    k, h = out.shape
    payload, scales = split_wire(src)
    write_rounded((payload.float().view(k, h // W.GROUP, W.GROUP)
                   * scales[..., None]).view(k, h), out)


def dequantize_sum_rows(src: torch.Tensor, out: torch.Tensor, parts: int,
                        wire: Wire = Wire.FP8, g: float | None = None) -> None:
    k, h = out.shape
    acc = torch.zeros((k, h), dtype=torch.float32, device=out.device)
    v = torch.empty((k, h), dtype=torch.float32, device=out.device)
    for p in range(parts):
        dequantize_rows(src[p * k:(p + 1) * k], v, wire, g)
        acc += v
    write_rounded(acc, out)


def write_rounded(v: torch.Tensor, out: torch.Tensor) -> None:
    """``out = v`` rounded to ``out``'s dtype (nearest even), a NaN as the canonical one."""
    res = v.to(out.dtype)
    nan = torch.isnan(v)
    if bool(nan.any()):
        bits, idt = _NAN_BITS[out.dtype]
        res = torch.where(nan, torch.tensor(bits, dtype=idt).view(out.dtype), res)
    out.copy_(res)


def split_wire(buf: torch.Tensor, wire: Wire = Wire.FP8) -> tuple[torch.Tensor, torch.Tensor]:
    """``(payload, scales)``: views of the uint8 wire rows ``buf [rows, wire_row_bytes(H,
    wire)]`` (strided: row stride ``wire_row_bytes(H, wire)`` bytes; ``.contiguous()``
    copies them out). fp8: ``float8_e4m3fn [rows, H]`` and ``float32 [rows, H/128]``; fp4:
    uint8 ``[rows, H/2]`` (two codes a byte) and uint8 ``[rows, H/16 or H/32]``."""
    p = W.payload_bytes(W.width_of(buf.shape[1], wire), wire)
    if wire is not Wire.FP8:
        return buf[:, :p], buf[:, p:]
    return buf[:, :p].view(torch.float8_e4m3fn), buf[:, p:].view(torch.float32)


#: The e2m1 rounding thresholds between the magnitudes of :data:`dpx.wire.E2M1_VALUES`: a
#: magnitude above ``t`` (at or above, for the ``>=`` ones: ties go to the even code).
_ABOVE = (0.25, 1.25, 2.5, 5.0)
_AT_OR_ABOVE = (0.75, 1.75, 3.5)


def _e2m1_magnitude(q: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (0..7) of magnitudes ``q >= 0``: nearest, ties to even, saturating."""
    mag = torch.zeros(q.shape, dtype=torch.int32)
    for t in _ABOVE:
        mag += (q > t).int()
    for t in _AT_OR_ABOVE:
        mag += (q >= t).int()
    return mag


def _quantize_fp4(src: torch.Tensor, out: torch.Tensor, wire: Wire, g: float | None) -> None:
    k, h = src.shape
    gs = W.block(wire)
    x = src.float().reshape(k, h // gs, gs)
    ux = x.view(torch.int32)
    sign = (ux >> 31) & 1
    ab = ux & 0x7FFFFFFF
    isnan = ab > 0x7F800000
    nan_blk = isnan.any(-1)
    amax = torch.where(isnan, 0, ab).amax(-1).view(torch.float32)
    mag_f = ab.view(torch.float32)
    if wire is Wire.NVFP4:
        sv = (amax * g) / torch.full((1,), W.E2M1_MAX)
        s = sv.clamp(max=W.FP8_MAX).to(torch.float8_e4m3fn)
        s_byte, s = s.view(torch.uint8).int(), s.float()
        q = (mag_f * g) / torch.where(s > 0, s, 1.0)[..., None]
        zero = (s == 0) | nan_blk
        scale = torch.where(nan_blk, W.FP4_NAN_SCALE[wire], s_byte)
    else:
        ea = amax.view(torch.int32) >> 23
        e = torch.where(ea == 255, 127, (ea - 129).clamp(min=-127))
        q = mag_f.double() * torch.pow(2.0, -e.double())[..., None]
        zero = nan_blk
        scale = torch.where(nan_blk, W.FP4_NAN_SCALE[wire], e + 127)
    code = torch.where(zero[..., None], 0, _e2m1_magnitude(q) | (sign << 3))
    pairs = code.reshape(k, h // 2, 2)
    out[:, :h // 2].copy_((pairs[..., 0] | (pairs[..., 1] << 4)).to(torch.uint8))
    out[:, h // 2:].copy_(scale.to(torch.uint8))


def _dequantize_fp4(src: torch.Tensor, out: torch.Tensor, wire: Wire, g: float | None) -> None:
    k, h = out.shape
    gs = W.block(wire)
    payload, scales = split_wire(src, wire)
    b = payload.int()
    c = torch.stack((b & 15, b >> 4), -1).reshape(k, h // gs, gs)
    em = torch.tensor(W.E2M1_VALUES, dtype=torch.float64)[(c & 7).long()]
    sb = scales.int()
    if wire is Wire.NVFP4:
        s = (sb & 0x7F).to(torch.uint8).view(torch.float8_e4m3fn).float()   # magnitude bits
        v = ((em.float() * s[..., None]) / torch.full((1,), g)).double()
    else:
        v = em * torch.pow(2.0, (sb - 127).double())[..., None]
    y = v.float()
    y = torch.where((c >> 3) == 1, -y, y).reshape(k, h)
    nan_byte = W.FP4_NAN_SCALE[wire]
    nan = (sb & nan_byte == nan_byte) if wire is Wire.NVFP4 else (sb == nan_byte)
    res = y.to(out.dtype)
    if bool(nan.any()):
        bits, idt = _NAN_BITS[out.dtype]
        mask = nan[..., None].expand(k, h // gs, gs).reshape(k, h)
        res = torch.where(mask, torch.tensor(bits, dtype=idt).view(out.dtype), res)
    out.copy_(res)
