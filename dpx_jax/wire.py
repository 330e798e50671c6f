"""The fp8 wire format (:mod:`dpx.wire`) for JAX: quantize rows while taking them into wire
rows, and dequantize wire rows. On GPU with jax-triton: the ``dpx.kernels.wire`` Triton
kernels (the ones ``dpx_torch`` runs); elsewhere an XLA implementation of the same
definition (IEEE-rounded divisions and round-to-nearest-even conversions, written with
integer operations so that every XLA backend gives the kernels' bits).

``quantize_take(src [m, H], start, count, rows) -> uint8 [rows, wire_row_bytes(H)]``
``dequantize(src uint8 [rows, wire_row_bytes(H)], dtype) -> [rows, H] dtype``
``split_wire(buf) -> (payload float8_e4m3fn [rows, H], scales float32 [rows, H/128])``
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from dpx import wire as W
from dpx_jax.rows import Impl, _index, _take_xla, vary_like

__all__ = ["dequantize", "quantize_take", "split_wire"]

_BLOCK_R = 16
_OUT_KIND = {jnp.dtype(jnp.float32): 0, jnp.dtype(jnp.bfloat16): 1, jnp.dtype(jnp.float16): 2}


def _width_of(row_bytes: int) -> int:
    return row_bytes * W.GROUP // (W.GROUP + 4)


def _div_rn(a, b):
    """``a / b`` rounded to nearest even, by integer operations (float32 ``a`` finite,
    ``b`` positive and normal, broadcast against ``a``): XLA divides float32 approximately
    on GPUs (up to 2 ulp) and rewrites divisions by a broadcast into products with its
    reciprocal; these quotients must be the kernels' (correctly rounded). A quotient below
    float32's normal range comes out as a zero of ``a``'s sign (such a quotient is an
    e4m3fn zero either way)."""
    ua = lax.bitcast_convert_type(a, jnp.uint32)
    ub = lax.bitcast_convert_type(jnp.broadcast_to(b, a.shape), jnp.uint32)
    sign = ua & jnp.uint32(0x80000000)
    ua = ua & jnp.uint32(0x7FFFFFFF)
    ea, eb = (ua >> 23).astype(jnp.int32), (ub >> 23).astype(jnp.int32)
    ma = (ua & jnp.uint32(0x7FFFFF)) | jnp.uint32(0x800000)
    mb = (ub & jnp.uint32(0x7FFFFF)) | jnp.uint32(0x800000)
    low = ma < mb                      # quotient of the mantissas in [1/2, 1): one more bit
    r = jnp.where(low, ma << 1, ma)
    e = ea - eb + 127 - low.astype(jnp.int32)
    q = jnp.zeros_like(r)
    for _ in range(24):                # restoring division: 24 quotient bits
        take = r >= mb
        q = (q << 1) | take.astype(jnp.uint32)
        r = jnp.where(take, r - mb, r) << 1
    half = r >= mb                     # the next bit, and whether anything follows it
    rest = jnp.where(half, r - mb, r) != 0
    q = q + (half & (rest | ((q & 1) == 1))).astype(jnp.uint32)
    carry = q >> 24                    # rounded up to 2.0: mantissa 1.0, exponent + 1
    q, e = q >> carry, e + carry.astype(jnp.int32)
    bits = sign | (jnp.clip(e, 0, 255).astype(jnp.uint32) << 23) | (q & jnp.uint32(0x7FFFFF))
    bits = jnp.where(e >= 255, sign | jnp.uint32(0x7F800000), bits)
    bits = jnp.where((ea == 0) | (e <= 0), sign, bits)
    return lax.bitcast_convert_type(bits, jnp.float32)


def _e4m3_bits(y):
    """float32 ``y`` (|y| <= 448) -> its float8_e4m3fn bits (uint8), round to nearest even,
    by integer operations: XLA's own conversion is not round-to-nearest-even on every
    backend (on GPUs it can round twice), and these bits must be the kernels'."""
    u = lax.bitcast_convert_type(y, jnp.int32)
    sign = (u >> 31) & 1
    a = jnp.abs(y)
    ua = lax.bitcast_convert_type(a, jnp.int32)
    normal = ((ua + 0x7FFFF + ((ua >> 20) & 1)) >> 20) - (120 << 3)
    sub = lax.round(a * 512.0, lax.RoundingMethod.TO_NEAREST_EVEN).astype(jnp.int32)
    code = jnp.where(a < 0.015625, sub, normal) | (sign << 7)
    return code.astype(jnp.uint8)


def _quantize_xla(src, start, count, rows: int):
    h = src.shape[1]
    x = _take_xla(src, start, count, rows).astype(jnp.float32)
    real = jnp.arange(rows, dtype=jnp.int32) < count
    g_in = x.reshape(rows, h // W.GROUP, W.GROUP)
    finite = jnp.isfinite(g_in)   # non-finite elements: no part in the scale, the NaN code
    g = jnp.where(finite, g_in, jnp.float32(0))
    amax = jnp.maximum(jnp.max(jnp.abs(g), axis=-1), jnp.float32(W.EPS))
    scale = _div_rn(amax, jnp.float32(W.FP8_MAX))
    y = _div_rn(g, scale[..., None])
    code = _e4m3_bits(jnp.clip(y, -W.FP8_MAX, W.FP8_MAX))
    payload = jnp.where(finite, code, jnp.uint8(W.NAN_CODE)).reshape(rows, h)
    payload = jnp.where(real[:, None], payload, jnp.uint8(0))
    scale = jnp.where(real[:, None], scale, jnp.float32(0))
    scale_bytes = lax.bitcast_convert_type(scale, jnp.uint8).reshape(rows, -1)
    return jnp.concatenate([payload, scale_bytes], axis=1)


def _dequantize_xla(src, dtype):
    rows, h = src.shape[0], _width_of(src.shape[1])
    payload = lax.bitcast_convert_type(src[:, :h], jnp.float8_e4m3fn).astype(jnp.float32)
    scale = lax.bitcast_convert_type(src[:, h:].reshape(rows, -1, 4), jnp.float32)
    v = (payload.reshape(rows, h // W.GROUP, W.GROUP) * scale[..., None]).reshape(rows, h)
    nan = jnp.isnan(v)   # the output's canonical quiet NaN, by bits
    out = jnp.where(nan, jnp.float32(0), v).astype(dtype)
    bits = jnp.dtype(dtype).itemsize * 8
    ut = jnp.uint32 if bits == 32 else jnp.uint16
    canon = {jnp.dtype(jnp.float32): 0x7FC00000, jnp.dtype(jnp.bfloat16): 0x7FC0,
             jnp.dtype(jnp.float16): 0x7E00}[jnp.dtype(dtype)]
    u = jnp.where(nan, ut(canon), lax.bitcast_convert_type(out, ut))
    return lax.bitcast_convert_type(u, dtype)


def quantize_take(src, start, count, rows: int, impl: Impl):
    start, count = _index("start", start), _index("count", count)
    h = src.shape[1]
    rb = W.wire_row_bytes(h)
    if impl is not Impl.TRITON or rows == 0:
        return _quantize_xla(src, start, count, rows) if rows else jnp.zeros((0, rb), jnp.uint8)
    from dpx.kernels import launch, wire as kernels
    from dpx_jax.triton_shim import triton_call

    q = launch.quantize_shape(rows, h, jnp.dtype(src.dtype).itemsize)
    out = triton_call(
        src, start.reshape(1), count.reshape(1), 0, 0, src.shape[0], rows,
        kernel=kernels.quantize_rows_kernel, out=jax.ShapeDtypeStruct((rows, rb), jnp.uint8),
        grid=launch.quantize_grid(rows, h, q), num_warps=q.warps, H=h, ROW_BYTES=rb,
        START_PTR=True, COUNT_PTR=True, BLOCK_R=q.block_r, BLOCK_G=q.block_g, COMPILED=True,
        WIDE=launch.wide(src.size, rows * rb))
    return vary_like(out, src, start, count)


def dequantize(src, dtype, impl: Impl):
    rows, h = src.shape[0], _width_of(src.shape[1])
    if impl is not Impl.TRITON or rows == 0:
        return _dequantize_xla(src, dtype)
    from dpx.kernels import launch, wire as kernels
    from dpx_jax.triton_shim import triton_call

    out = triton_call(
        src, rows, kernel=kernels.dequantize_rows_kernel,
        out=jax.ShapeDtypeStruct((rows, h), dtype), grid=(-(-rows // _BLOCK_R), h // W.GROUP),
        num_warps=4, H=h, ROW_BYTES=src.shape[1], OUT_KIND=_OUT_KIND[jnp.dtype(dtype)],
        BLOCK_R=_BLOCK_R, WIDE=launch.wide(src.size, rows * h))
    return vary_like(out, src)


def split_wire(buf):
    """``(payload float8_e4m3fn [rows, H], scales float32 [rows, H/128])`` of wire rows."""
    rows, h = buf.shape[0], _width_of(buf.shape[1])
    payload = lax.bitcast_convert_type(buf[:, :h], jnp.float8_e4m3fn)
    scales = lax.bitcast_convert_type(buf[:, h:].reshape(rows, -1, 4), jnp.float32)
    return payload, scales
