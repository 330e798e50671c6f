"""The fp8 wire format (:mod:`dpx.wire`) for JAX: quantize rows while taking them into wire
rows, and dequantize wire rows. On GPU with jax-triton: the ``dpx.kernels.wire`` Triton
kernels (the ones ``dpx_torch`` runs); elsewhere an XLA implementation of the same
definition (IEEE division, round-to-nearest-even conversions).

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

_BLOCK_R = 16
_OUT_KIND = {jnp.dtype(jnp.float32): 0, jnp.dtype(jnp.bfloat16): 1, jnp.dtype(jnp.float16): 2}


def _width_of(row_bytes: int) -> int:
    return row_bytes * W.GROUP // (W.GROUP + 4)


def _opaque(divisor):
    """A divisor XLA cannot see through: it rewrites ``a / broadcast(b)`` into ``a *
    broadcast(1 / b)``, which is not IEEE division (bits would differ from the kernels')."""
    return lax.optimization_barrier(divisor)


def _quantize_xla(src, start, count, rows: int):
    h = src.shape[1]
    x = _take_xla(src, start, count, rows).astype(jnp.float32)
    real = jnp.arange(rows, dtype=jnp.int32) < count
    g = x.reshape(rows, h // W.GROUP, W.GROUP)
    amax = jnp.maximum(jnp.max(jnp.abs(g), axis=-1), jnp.float32(W.EPS))
    scale = amax / _opaque(jnp.full(amax.shape, W.FP8_MAX, jnp.float32))
    y = g / _opaque(jnp.broadcast_to(scale[..., None], g.shape))
    q = jnp.clip(y, -W.FP8_MAX, W.FP8_MAX).astype(jnp.float8_e4m3fn)
    payload = lax.bitcast_convert_type(q, jnp.uint8).reshape(rows, h)
    payload = jnp.where(real[:, None], payload, jnp.uint8(0))
    scale = jnp.where(real[:, None], scale, jnp.float32(0))
    scale_bytes = lax.bitcast_convert_type(scale, jnp.uint8).reshape(rows, -1)
    return jnp.concatenate([payload, scale_bytes], axis=1)


def _dequantize_xla(src, dtype):
    rows, h = src.shape[0], _width_of(src.shape[1])
    payload = lax.bitcast_convert_type(src[:, :h], jnp.float8_e4m3fn).astype(jnp.float32)
    scale = lax.bitcast_convert_type(src[:, h:].reshape(rows, -1, 4), jnp.float32)
    v = payload.reshape(rows, h // W.GROUP, W.GROUP) * scale[..., None]
    return v.reshape(rows, h).astype(dtype)


def quantize_take(src, start, count, rows: int, impl: Impl):
    start, count = _index("start", start), _index("count", count)
    h = src.shape[1]
    rb = W.wire_row_bytes(h)
    if impl is not Impl.TRITON or rows == 0:
        return _quantize_xla(src, start, count, rows) if rows else jnp.zeros((0, rb), jnp.uint8)
    from dpx.kernels import wire as kernels
    from dpx_jax.triton_shim import triton_call

    out = triton_call(
        src, start.reshape(1), count.reshape(1), 0, 0, src.shape[0], rows,
        kernel=kernels.quantize_rows_kernel, out=jax.ShapeDtypeStruct((rows, rb), jnp.uint8),
        grid=(-(-rows // _BLOCK_R), h // W.GROUP), num_warps=4, H=h, ROW_BYTES=rb,
        START_PTR=True, COUNT_PTR=True, BLOCK_R=_BLOCK_R)
    return vary_like(out, src, start, count)


def dequantize(src, dtype, impl: Impl):
    rows, h = src.shape[0], _width_of(src.shape[1])
    if impl is not Impl.TRITON or rows == 0:
        return _dequantize_xla(src, dtype)
    from dpx.kernels import wire as kernels
    from dpx_jax.triton_shim import triton_call

    out = triton_call(
        src, rows, kernel=kernels.dequantize_rows_kernel,
        out=jax.ShapeDtypeStruct((rows, h), dtype), grid=(-(-rows // _BLOCK_R), h // W.GROUP),
        num_warps=4, H=h, ROW_BYTES=src.shape[1], OUT_KIND=_OUT_KIND[jnp.dtype(dtype)],
        BLOCK_R=_BLOCK_R)
    return vary_like(out, src)


def split_wire(buf):
    """``(payload float8_e4m3fn [rows, H], scales float32 [rows, H/128])`` of wire rows."""
    rows, h = buf.shape[0], _width_of(buf.shape[1])
    payload = lax.bitcast_convert_type(buf[:, :h], jnp.float8_e4m3fn)
    scales = lax.bitcast_convert_type(buf[:, h:].reshape(rows, -1, 4), jnp.float32)
    return payload, scales
