"""The quantized wire formats (:mod:`dpx.wire`) for JAX: quantize rows while taking them into
wire rows, and dequantize wire rows. On GPU with jax-triton: the ``dpx.kernels.wire`` and
``dpx.kernels.fp4`` Triton kernels (the ones ``dpx_torch`` runs); elsewhere an XLA
implementation of the same definition (IEEE-rounded divisions and round-to-nearest-even
conversions, written with integer operations so that every XLA backend gives the kernels'
bits).

``quantize_take(src [m, H], start, count, rows, impl, wire, g) -> uint8 [rows,
wire_row_bytes(H, wire)]``
``dequantize(src uint8 [rows, wire_row_bytes(H, wire)], dtype, impl, wire, g) -> [rows, H]``
``dequantize_sum(src uint8 [parts * rows, wire_row_bytes(H, wire)], parts, dtype, impl, wire,
g) -> [rows, H]``: the combine's sum (docs/semantics.md, "The quantized combine"): row ``j``
is the float32 sum from +0.0, over ``p`` in order, of the dequantized ``src[p * rows + j]``,
rounded to ``dtype``. XLA's additions are written with integer operations
(:func:`add_f32_bits`): XLA on CPU flushes subnormal sums to zero and may fuse a product
into an addition on GPUs; the definition does neither.
``split_wire(buf, wire)``: fp8 ``(payload float8_e4m3fn [rows, H], scales float32 [rows,
H/128])``; fp4 ``(payload uint8 [rows, H/2], scales uint8 [rows, H/16 or H/32])``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from dpx import wire as W
from dpx.modes import Wire
from dpx_jax.rows import Impl, _index, _take_xla, vary_like

__all__ = ["add_f32_bits", "dequantize", "dequantize_sum", "quantize_take", "split_wire"]

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
    """float32 ``y`` (|y| <= the largest e4m3 magnitude) -> its float8_e4m3fn bits (uint8),
    round to nearest even, by integer operations: XLA's own conversion is not
    round-to-nearest-even on every backend (on GPUs it can round twice), and these bits
    must be the kernels'."""
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
    scale_bytes = lax.bitcast_convert_type(scale, jnp.uint8).reshape(rows, h // W.GROUP * 4)
    return jnp.concatenate([payload, scale_bytes], axis=1)


def _dequantize_xla(src, dtype):
    rows, h = src.shape[0], W.width_of(src.shape[1])
    payload = lax.bitcast_convert_type(src[:, :h], jnp.float8_e4m3fn).astype(jnp.float32)
    scale = lax.bitcast_convert_type(src[:, h:].reshape(rows, h // W.GROUP, 4), jnp.float32)
    v = (payload.reshape(rows, h // W.GROUP, W.GROUP) * scale[..., None]).reshape(rows, h)
    return _round_to(v, dtype)


def quantize_take(src, start, count, rows: int, impl: Impl, wire: Wire = Wire.FP8,
                  g: float | None = None):
    start, count = _index("start", start), _index("count", count)
    if wire is not Wire.FP8:
        return _quantize_fp4(src, start, count, rows, impl, wire, g)
    h = src.shape[1]
    rb = W.wire_row_bytes(h)
    if impl is not Impl.TRITON or rows == 0:
        return _quantize_xla(src, start, count, rows) if rows else jnp.zeros((0, rb), jnp.uint8)
    from dpx.kernels import launch

    return _triton(launch.quantize_launch(wire, src.shape[0], rows, h,
                                          jnp.dtype(src.dtype).itemsize, start_ptr=True,
                                          count_ptr=True, compiled=True),
                   (rows, rb), jnp.uint8, src, start.reshape(1), count.reshape(1), 0, 0,
                   src.shape[0], rows)


def dequantize(src, dtype, impl: Impl, wire: Wire = Wire.FP8, g: float | None = None):
    if wire is not Wire.FP8:
        return _dequantize_fp4(src, dtype, impl, wire, g)
    rows, h = src.shape[0], W.width_of(src.shape[1])
    if impl is not Impl.TRITON or rows == 0:
        return _dequantize_xla(src, dtype)
    from dpx.kernels import launch

    return _triton(launch.dequantize_launch(wire, rows, h, jnp.dtype(dtype).name,
                                            compiled=True), (rows, h), dtype, src, rows)


def add_f32_bits(a, b):
    """The bits (int32) of the float32 sum ``a + b`` of float32 bits ``a``, ``b`` (int32),
    rounded to nearest even with subnormals kept, by integer operations; a zero sum is +0.0
    and a non-finite one comes from XLA's own addition (which a flush cannot change)."""
    big = (b & 0x7FFFFFFF) > (a & 0x7FFFFFFF)
    x, y = jnp.where(big, b, a), jnp.where(big, a, b)        # |x| >= |y|
    ex, ey = (x >> 23) & 0xFF, (y >> 23) & 0xFF
    mx = ((x & 0x7FFFFF) | jnp.where(ex > 0, 0x800000, 0)) << 3   # 3 guard bits
    my = ((y & 0x7FFFFF) | jnp.where(ey > 0, 0x800000, 0)) << 3
    ex, ey = jnp.maximum(ex, 1), jnp.maximum(ey, 1)
    d = jnp.minimum(ex - ey, 27)
    my = (my >> d) | ((my & ((1 << d) - 1)) != 0).astype(jnp.int32)   # sticky bit
    m = jnp.where((x ^ y) >= 0, mx + my, mx - my)
    carry = m >= (1 << 27)
    m = jnp.where(carry, (m >> 1) | (m & 1), m)
    e = ex + carry.astype(jnp.int32)
    sh = jnp.clip(jnp.minimum(lax.clz(m) - 5, e - 1), 0, 31)   # normalise, not below e = 1
    m, e = m << sh, e - sh
    low, m = m & 7, m >> 3
    m = m + ((low > 4) | ((low == 4) & ((m & 1) == 1))).astype(jnp.int32)
    over = m >= (1 << 24)
    m, e = jnp.where(over, m >> 1, m), e + over.astype(jnp.int32)
    bits = jnp.where(m >= (1 << 23), e << 23, 0) | (m & 0x7FFFFF)
    bits = jnp.where(e >= 255, 0x7F800000, bits) | (x & jnp.int32(-2**31))
    bits = jnp.where(m == 0, 0, bits)
    finite = ((a & 0x7F800000) != 0x7F800000) & ((b & 0x7F800000) != 0x7F800000)
    return jnp.where(finite, bits, _u32(_f32(a) + _f32(b)))


def _round_to(v, dtype):
    """float32 ``v`` rounded to ``dtype`` (nearest even; bfloat16 by bits), a NaN as the
    dtype's canonical quiet NaN."""
    dt = jnp.dtype(dtype)
    nan = jnp.isnan(v)
    if dt == jnp.float32:
        return _f32(jnp.where(nan, W.CANONICAL_NAN["float32"], _u32(v)))
    if dt == jnp.bfloat16:
        u = lax.bitcast_convert_type(v, jnp.uint32)
        r = (u + jnp.uint32(0x7FFF) + ((u >> 16) & jnp.uint32(1))) >> 16
        r = jnp.where(nan, jnp.uint32(W.CANONICAL_NAN["bfloat16"]), r).astype(jnp.uint16)
        return lax.bitcast_convert_type(r, jnp.bfloat16)
    h16 = lax.bitcast_convert_type(jnp.where(nan, 0.0, v).astype(jnp.float16), jnp.uint16)
    return lax.bitcast_convert_type(jnp.where(nan, jnp.uint16(W.CANONICAL_NAN["float16"]),
                                              h16), jnp.float16)


def dequantize_sum(src, parts: int, dtype, impl: Impl, wire: Wire = Wire.FP8,
                   g: float | None = None):
    rows = src.shape[0] // parts
    h = W.width_of(src.shape[1], wire)
    if impl is Impl.TRITON and rows:
        from dpx.kernels import launch

        return _triton(launch.dequantize_sum_launch(wire, rows, parts, h,
                                                    jnp.dtype(dtype).name, compiled=True),
                       (rows, h), dtype, src, rows, np.float32(launch.fp4_scale(g)))
    acc = jnp.zeros((rows, h), jnp.int32)
    for p in range(parts):
        v = dequantize(src[p * rows:(p + 1) * rows], jnp.float32, Impl.XLA, wire, g)
        acc = add_f32_bits(acc, _u32(v))
    return _round_to(_f32(acc), dtype)


def split_wire(buf, wire: Wire = Wire.FP8):
    """``(payload, scales)`` of wire rows (see the module docstring)."""
    if wire is not Wire.FP8:
        p = W.payload_bytes(W.width_of(buf.shape[1], wire), wire)
        return buf[:, :p], buf[:, p:]
    rows, h = buf.shape[0], W.width_of(buf.shape[1])
    payload = lax.bitcast_convert_type(buf[:, :h], jnp.float8_e4m3fn)
    scales = lax.bitcast_convert_type(buf[:, h:].reshape(rows, h // W.GROUP, 4), jnp.float32)
    return payload, scales


# ---------------------------------------------------------------- fp4 (nvfp4, mxfp4)
def _u32(x):
    return lax.bitcast_convert_type(x, jnp.int32)


def _f32(bits):
    return lax.bitcast_convert_type(bits, jnp.float32)


def _scaled_bits(mant: int, e):
    """float32 bits of ``(1 + mant / 2**23) * 2**e`` (int32 ``e``; ``mant`` with its low 21
    bits zero): exact, subnormal by a shift, infinity past the range."""
    b = e + 127
    sub = jnp.right_shift(jnp.int32(0x800000 | mant), jnp.clip(1 - b, 0, 31))
    return jnp.where(b >= 255, 0x7F800000, jnp.where(b >= 1, (b << 23) | mant, sub))


def _e2m1_of_bits(qb):
    """e2m1 magnitude codes of float32 magnitude bits ``qb`` (NaN counts as infinity)."""
    qb = jnp.minimum(qb & 0x7FFFFFFF, 0x7F800000)
    q = _f32(qb)
    big = jnp.minimum(((qb + 0x1FFFFF + ((qb >> 22) & 1)) >> 22) - 252, 7)
    small = (q > 0.25).astype(jnp.int32) + (q >= 0.75).astype(jnp.int32)
    return jnp.where(qb < 0x3F800000, small, big)


def _e4m3_scale(sv):
    """e4m3 code (int32) and value of ``sv >= 0``: nearest even, saturating at the largest
    e4m3 magnitude."""
    a = jnp.minimum(sv, jnp.float32(W.FP8_MAX))
    u = _u32(a)
    normal = ((u + 0x7FFFF + ((u >> 20) & 1)) >> 20) - (120 << 3)
    sub = lax.round(a * 512.0, lax.RoundingMethod.TO_NEAREST_EVEN).astype(jnp.int32)
    code = jnp.where(a < 0.015625, sub, normal)
    return code, _e4m3_value(code)


def _e4m3_value(code):
    e, m = (code >> 3) & 15, code & 7
    return jnp.where(e == 0, m.astype(jnp.float32) * jnp.float32(0.001953125),
                     _f32(((e + 120) << 23) | (m << 20)))


def _quantize_fp4_xla(src, start, count, rows: int, wire: Wire, g):
    h = src.shape[1]
    gs = W.block(wire)
    x = _take_xla(src, start, count, rows).astype(jnp.float32).reshape(rows, h // gs, gs)
    real = jnp.arange(rows, dtype=jnp.int32) < count
    ux = _u32(x)
    sign = (ux >> 31) & 1
    ab = ux & 0x7FFFFFFF
    isnan = ab > 0x7F800000
    nan_blk = jnp.any(isnan, axis=-1)
    amax_b = jnp.max(jnp.where(isnan, 0, ab), axis=-1)
    if wire is Wire.NVFP4:
        g32 = jnp.float32(g)
        prod = _f32(amax_b) * g32
        finite = prod < jnp.inf
        sv = jnp.where(finite, _div_rn(jnp.where(finite, prod, 0), jnp.float32(6)), prod)
        s_code, s = _e4m3_scale(sv)
        s_safe = jnp.where(s_code == 0, jnp.float32(1), s)[..., None]
        p = _f32(ab) * g32
        pf = p < jnp.inf
        q = jnp.where(pf, _div_rn(jnp.where(pf, p, 0), s_safe), jnp.inf)
        mag = _e2m1_of_bits(_u32(q))
        zero = (s_code == 0) | nan_blk
        scale = jnp.where(nan_blk, W.FP4_NAN_SCALE[wire], s_code)
    else:
        ea = amax_b >> 23
        e = jnp.where(ea == 255, 127, jnp.maximum(ea - 129, -127))[..., None]
        mag = jnp.zeros(ab.shape, jnp.int32)
        # (mantissa, exponent of t, at-or-above) of each threshold t: 0.25, 0.75, 1.25,
        # 1.75, 2.5, 3.5, 5 (ties to the even code)
        for mant, k, at in ((0, -2, False), (0x400000, -1, True), (0x200000, 0, False),
                            (0x600000, 0, True), (0x200000, 1, False), (0x600000, 1, True),
                            (0x200000, 2, False)):
            t = _scaled_bits(mant, e + k)
            mag += (ab >= t if at else ab > jnp.minimum(t, 0x7F7FFFFF)).astype(jnp.int32)
        zero = nan_blk
        scale = jnp.where(nan_blk, W.FP4_NAN_SCALE[wire], e[..., 0] + 127)
    code = jnp.where(zero[..., None], 0, mag | (sign << 3)).reshape(rows, h // 2, 2)
    payload = (code[..., 0] | (code[..., 1] << 4)).astype(jnp.uint8)
    scale = jnp.where(real[:, None], scale, 0).astype(jnp.uint8)
    return jnp.concatenate([payload, scale], axis=1)


def _dequantize_fp4_xla(src, dtype, wire: Wire, g):
    rows = src.shape[0]
    h = W.width_of(src.shape[1], wire)
    gs = W.block(wire)
    byte = src[:, :h // 2].astype(jnp.int32)
    c = jnp.stack([byte & 15, byte >> 4], axis=-1).reshape(rows, h // gs, gs)
    sb = src[:, h // 2:].astype(jnp.int32)[..., None]
    m, sign = c & 7, c >> 3
    if wire is Wire.NVFP4:
        nan = (sb & 0x7F) == W.FP4_NAN_SCALE[Wire.NVFP4]   # e4m3's NaN, either sign
        em = jnp.where(m < 2, m.astype(jnp.float32) * 0.5,
                       _f32((((m >> 1) + 126) << 23) | ((m & 1) << 22)))
        yb = _u32(_div_rn(em * _e4m3_value(sb), jnp.float32(g)))
    else:
        nan = sb == W.FP4_NAN_SCALE[Wire.MXFP4]
        mant = jnp.where(m >= 2, (m & 1) << 22, 0)
        b = sb - 127 + (m >> 1) + 126
        sub = jnp.right_shift(0x800000 | mant, jnp.clip(1 - b, 0, 31))
        yb = jnp.where(b >= 255, 0x7F800000, jnp.where(b >= 1, (b << 23) | mant, sub))
        yb = jnp.where(m == 0, 0, yb)
    yb = (yb | (sign << 31)).reshape(rows, h)
    nan = jnp.broadcast_to(nan, c.shape).reshape(rows, h)
    dt = jnp.dtype(dtype)
    if dt == jnp.float32:
        return _f32(jnp.where(nan, W.CANONICAL_NAN["float32"], yb))
    if dt == jnp.bfloat16:   # round to nearest even, by bits
        u = yb & 0x7FFFFFFF
        r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) | ((yb >> 31 & 1) << 15)
        r = jnp.where(nan, W.CANONICAL_NAN["bfloat16"], r).astype(jnp.uint16)
        return lax.bitcast_convert_type(r, jnp.bfloat16)
    h16 = lax.bitcast_convert_type(_f32(yb).astype(jnp.float16), jnp.uint16)
    return lax.bitcast_convert_type(jnp.where(nan, jnp.uint16(W.CANONICAL_NAN["float16"]),
                                              h16), jnp.float16)


def _quantize_fp4(src, start, count, rows: int, impl: Impl, wire: Wire, g):
    h = src.shape[1]
    rb = W.wire_row_bytes(h, wire)
    if impl is not Impl.TRITON or rows == 0:
        if rows == 0:
            return jnp.zeros((0, rb), jnp.uint8)
        return _quantize_fp4_xla(src, start, count, rows, wire, g)
    from dpx.kernels import launch

    return _triton(launch.quantize_launch(wire, src.shape[0], rows, h,
                                          jnp.dtype(src.dtype).itemsize, start_ptr=True,
                                          count_ptr=True, compiled=True),
                   (rows, rb), jnp.uint8, src, start.reshape(1), count.reshape(1), 0, 0,
                   src.shape[0], rows, np.float32(launch.fp4_scale(g)))


def _dequantize_fp4(src, dtype, impl: Impl, wire: Wire, g):
    rows = src.shape[0]
    h = W.width_of(src.shape[1], wire)
    if impl is not Impl.TRITON or rows == 0:
        return _dequantize_fp4_xla(src, dtype, wire, g)
    from dpx.kernels import launch

    return _triton(launch.dequantize_launch(wire, rows, h, jnp.dtype(dtype).name,
                                            compiled=True), (rows, h), dtype, src, rows,
                   np.float32(launch.fp4_scale(g)))


def _triton(lt, shape: tuple, dtype, *args):
    """``lt`` (a :class:`dpx.kernels.launch.Launch`) through jax-triton: ``args`` the
    runtime arguments before the output, which is ``shape`` of ``dtype``; varying like
    its array arguments."""
    from dpx_jax.triton_shim import triton_call

    out = triton_call(*args, kernel=lt.kernel, out=jax.ShapeDtypeStruct(shape, dtype),
                      grid=lt.grid, num_warps=lt.warps, **lt.consts)
    return vary_like(out, *(a for a in args if hasattr(a, "shape") and a.ndim))
