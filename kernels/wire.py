"""fp8 wire kernels (the format of :mod:`dpx.wire`): quantize rows while taking them into a
wire buffer, and dequantize wire rows.

A wire row is ``H`` float8_e4m3fn payload bytes then ``H / 128`` float32 scales; the
buffers are uint8 ``[rows, ROW_BYTES]``. Divisions are IEEE-rounded and conversions round
to nearest even: written with ``div_rn`` and integer bit operations where the hardware
instruction is not there (Triton's interpreter truncates these conversions), with
quantize's ``COMPILED`` arithmetic on GPUs, so the compiled kernel and the interpreter give
the same bits, those of torch's division and ``.to(torch.float8_e4m3fn)``. Like every
dpx kernel they call no other ``@triton.jit`` function, read ``start`` / ``count`` from
device memory or plain ints, and mask every access.

Grids: quantize ``(cdiv(out_rows, BLOCK_R), cdiv(H // 128, BLOCK_G))``, one program per
block of rows and block of 128-element groups; dequantize ``(cdiv(rows, BLOCK_R), H //
128)``.
"""

import triton
import triton.language as tl

__all__ = ["dequantize_rows_kernel", "quantize_rows_kernel"]

@triton.jit(do_not_specialize=["start_val", "count_val", "src_rows", "out_rows"])
def quantize_rows_kernel(src_ptr, start_ptr, count_ptr, start_val, count_val, src_rows,
                         out_rows, out_ptr, H: tl.constexpr, ROW_BYTES: tl.constexpr,
                         START_PTR: tl.constexpr, COUNT_PTR: tl.constexpr,
                         BLOCK_R: tl.constexpr, BLOCK_G: tl.constexpr,
                         COMPILED: tl.constexpr, WIDE: tl.constexpr):
    """``out[j] = fp8_wire(src[start + j])`` for ``j < count``; rows ``count..out_rows`` of
    ``out`` are zero bytes. src ``[src_rows, H]`` (float32 / bfloat16 / float16) -> out
    uint8 ``[out_rows, ROW_BYTES]``. One program: ``BLOCK_R`` rows x ``BLOCK_G`` groups. A
    group's scale comes from its finite elements; a NaN or an infinity is stored as the NaN
    code ``0x7F``.

    ``COMPILED`` (a GPU build; Triton's interpreter has no exact fused multiply-add and
    truncates float8 conversions): ``x / scale`` as ``q = x * r`` with ``r = div_rn(1,
    scale)`` and two corrections ``q += fma(-q, scale, x) * r`` (fused); after the first,
    ``q`` is within one ulp, so the second gives the correctly rounded quotient
    (Markstein) when its residual is exact. It is unless it underflows, which takes a
    quotient far below ``2**-10`` (``scale >= 2**-43``), an e4m3fn zero either way. The
    corrections are written so that a zero keeps its sign (Triton negates as ``0 - x``,
    which turns -0.0 into +0.0: the residual is negated through ``-r``, never a zero).
    Then the hardware's round-to-nearest-even conversion. Otherwise ``div_rn`` and the
    conversion by bits. Both give the same bits. ``WIDE``: index math in int64 (buffers of
    2**31 elements or more), else int32."""
    if START_PTR:
        start = tl.load(start_ptr)
    else:
        start = start_val
    if COUNT_PTR:
        count = tl.load(count_ptr)
    else:
        count = count_val
    if WIDE:
        rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)
        start = start.to(tl.int64)
        count = count.to(tl.int64)
    else:
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        start = start.to(tl.int32)
        count = count.to(tl.int32)
    grps = tl.program_id(1) * BLOCK_G + tl.arange(0, BLOCK_G)
    g_ok = grps < H // 128
    cols = grps[:, None] * 128 + tl.arange(0, 128)[None, :]            # [G, 128]
    src_row = start + rows
    real = (rows < count) & (src_row < src_rows) & (src_row >= 0) & (rows < out_rows)
    load_ok = real[:, None, None] & g_ok[None, :, None]
    x = tl.load(src_ptr + src_row[:, None, None] * H + cols[None, :, :], mask=load_ok,
                other=0).to(tl.float32)                                 # [R, G, 128]
    # Non-finite elements take no part in the scale and travel as the NaN code 0x7F.
    ax = tl.abs(x)
    if COMPILED:
        # fma(|x|, 0, |x|) is |x| when finite and NaN otherwise, and the GPU's max ignores
        # NaN: the maximum over the finite elements (NaN when there is none, which the
        # clamp to 1e-10 below also ignores) at one instruction per element
        amax = tl.reduce(tl.fma(ax, 0.0, ax), 2, tl.standard._elementwise_max)
    else:
        amax = tl.reduce(tl.where(ax < float("inf"), ax, 0.0), 2,
                         tl.standard._elementwise_max)
    scale = tl.math.div_rn(tl.maximum(amax, 1e-10), 448.0)
    if COMPILED:
        s = scale[:, :, None]
        r = tl.math.div_rn(1.0, scale)[:, :, None]
        nr = -r  # nonzero: its negation is exact (a negated zero would lose its sign)
        q = x * r
        # q += (x - q*s) * r, written as fma(fma(q, s, -x), -r, q) so that a zero x gives
        # fma(+0, -r, q) = q, the zero with x's sign; a NaN or an infinity x gives NaN
        q = tl.fma(tl.fma(q, s, -x), nr, q)
        y = tl.fma(tl.fma(q, s, -x), nr, q)
        # |y| <= 448 (the scale is the finite amax / 448): the conversion needs no clamp,
        # and turns the NaN of a non-finite element into the NaN code 0x7F
        code = y.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    else:
        y = tl.math.div_rn(x, scale[:, :, None])
        y = tl.minimum(tl.maximum(y, -448.0), 448.0)
        # float32 -> e4m3fn, round to nearest even, by bits
        bits = y.to(tl.int32, bitcast=True)
        sign = (bits >> 31) & 1
        a = tl.abs(y)
        u = a.to(tl.int32, bitcast=True)
        normal = ((u + 0x7FFFF + ((u >> 20) & 1)) >> 20) - (120 << 3)
        sub = ((a * 512.0 + 8388608.0) - 8388608.0).to(tl.int32)  # exact: a * 512 < 8
        code = (tl.where(a < 0.015625, sub, normal) | (sign << 7)).to(tl.uint8)
        code = tl.where(ax < float("inf"), code, 0x7F)
    row_ok = rows < out_rows  # (rows past count loaded zeros: their codes are 0)
    row_base = out_ptr + rows * ROW_BYTES
    tl.store(row_base[:, None, None] + cols[None, :, :], code,
             mask=row_ok[:, None, None] & g_ok[None, :, None])
    scale_ptr = (row_base[:, None] + H + grps[None, :] * 4).to(tl.pointer_type(tl.float32))
    tl.store(scale_ptr, tl.where(real[:, None], scale, 0.0),
             mask=row_ok[:, None] & g_ok[None, :])


@triton.jit(do_not_specialize=["rows_n"])
def dequantize_rows_kernel(src_ptr, rows_n, out_ptr, H: tl.constexpr, ROW_BYTES: tl.constexpr,
                           OUT_KIND: tl.constexpr, BLOCK_R: tl.constexpr, WIDE: tl.constexpr):
    """``out[:rows_n] = dequantize(src[:rows_n])``: uint8 ``[rows_n, ROW_BYTES]`` wire rows ->
    ``[rows_n, H]`` of ``OUT_KIND`` (0: float32, 1: bfloat16, 2: float16); a NaN code gives
    the output's canonical quiet NaN. ``WIDE``: index math in int64, else int32."""
    if WIDE:
        rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)
        grp = tl.program_id(1).to(tl.int64)
        cols = grp * 128 + tl.arange(0, 128).to(tl.int64)
    else:
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        grp = tl.program_id(1)
        cols = grp * 128 + tl.arange(0, 128)
    ok = rows < rows_n
    c = tl.load(src_ptr + rows[:, None] * ROW_BYTES + cols[None, :], mask=ok[:, None],
                other=0).to(tl.int32)
    scale_ptr = (src_ptr + rows * ROW_BYTES + H + grp * 4).to(tl.pointer_type(tl.float32))
    scale = tl.load(scale_ptr, mask=ok, other=0.0)
    # e4m3fn -> float32, by bits (exact)
    sign = (c >> 7) & 1
    e = (c >> 3) & 15
    m = c & 7
    normal = ((sign << 31) | ((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    sub = m.to(tl.float32) * 0.001953125
    # the sign by its bit: a compiled negation of +0.0 can give +0.0
    sub = (sub.to(tl.int32, bitcast=True) | (sign << 31)).to(tl.float32, bitcast=True)
    v = tl.where(e == 0, sub, normal) * scale[:, None]
    # the NaN code (exponent and mantissa all ones) -> the output's canonical quiet NaN,
    # written by bits (a NaN's bits after arithmetic differ between devices); only a block
    # holding one (rare) pays for the selects
    low7 = c & 0x7F
    nan_block = tl.reduce(tl.reduce(low7, 1, tl.standard._elementwise_max), 0,
                          tl.standard._elementwise_max) == 0x7F
    offs = rows[:, None] * H + cols[None, :]
    if OUT_KIND == 0:
        u32 = v.to(tl.uint32, bitcast=True)
        if nan_block:
            u32 = tl.where(low7 == 0x7F, 0x7FC00000, u32).to(tl.uint32)
        out32 = out_ptr.to(tl.pointer_type(tl.uint32))
        tl.store(out32 + offs, u32, mask=ok[:, None])
    elif OUT_KIND == 1:
        # float32 -> bfloat16, round to nearest even, by bits
        u = v.to(tl.uint32, bitcast=True)
        r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        if nan_block:
            r = tl.where(low7 == 0x7F, 0x7FC0, r).to(tl.uint32)
        out16 = out_ptr.to(tl.pointer_type(tl.uint16))
        tl.store(out16 + offs, r.to(tl.uint16), mask=ok[:, None])
    else:
        h16 = v.to(tl.float16).to(tl.uint16, bitcast=True)
        if nan_block:
            h16 = tl.where(low7 == 0x7F, 0x7E00, h16.to(tl.int32)).to(tl.uint16)
        out16 = out_ptr.to(tl.pointer_type(tl.uint16))
        tl.store(out16 + offs, h16, mask=ok[:, None])
