"""fp8 wire kernels (the format of :mod:`dpx.wire`): quantize rows while taking them into a
wire buffer, and dequantize wire rows.

A wire row is ``H`` float8_e4m3fn payload bytes then ``H / 128`` float32 scales; the
buffers are uint8 ``[rows, ROW_BYTES]``. Divisions are IEEE-rounded and conversions round
to nearest even: written with ``div_rn`` and integer bit operations where the hardware
instruction is not there (Triton's interpreter truncates these conversions), with
``COMPILED`` arithmetic and conversions on GPUs, so the compiled kernel and the interpreter give
the same bits, those of torch's division and ``.to(torch.float8_e4m3fn)``. Like every
dpx kernel they read ``start`` / ``count`` from device memory or plain ints and mask every
access; the shared blocks are :mod:`dpx.kernels.blocks`', the constants
:mod:`dpx.kernels.constants`' (from :mod:`dpx.wire`).

Grids: quantize ``(cdiv(out_rows, BLOCK_R), cdiv(H // 128, BLOCK_G))``, one program per
block of rows and block of 128-element groups; dequantize ``(cdiv(rows * H / 128,
BLOCK_B),)``, one program per ``BLOCK_B`` consecutive groups.
"""

import triton
import triton.language as tl

from dpx.kernels.blocks import (block_index, e4m3_code, fp8_block_values, load_index,
                                store_rounded)
from dpx.kernels.constants import FP8_EPS, FP8_MAX, GROUP, NAN_CODE

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
    start = load_index(start_ptr, start_val, START_PTR, WIDE)
    count = load_index(count_ptr, count_val, COUNT_PTR, WIDE)
    rows = block_index(0, BLOCK_R, WIDE)
    grps = tl.program_id(1) * BLOCK_G + tl.arange(0, BLOCK_G)
    g_ok = grps < H // GROUP
    cols = grps[:, None] * GROUP + tl.arange(0, GROUP)[None, :]        # [G, GROUP]
    src_row = start + rows
    real = (rows < count) & (src_row < src_rows) & (src_row >= 0) & (rows < out_rows)
    load_ok = real[:, None, None] & g_ok[None, :, None]
    x = tl.load(src_ptr + src_row[:, None, None] * H + cols[None, :, :], mask=load_ok,
                other=0).to(tl.float32)                                 # [R, G, 128]
    # Non-finite elements take no part in the scale and travel as the NaN code.
    ax = tl.abs(x)
    if COMPILED:
        # fma(|x|, 0, |x|) is |x| when finite and NaN otherwise, and the GPU's max ignores
        # NaN: the maximum over the finite elements (NaN when there is none, which the
        # clamp to the amax floor below also ignores) at one instruction per element
        amax = tl.max(tl.fma(ax, 0.0, ax), 2)
    else:
        amax = tl.max(tl.where(ax < float("inf"), ax, 0.0), 2)
    scale = tl.math.div_rn(tl.maximum(amax, FP8_EPS), FP8_MAX)
    if COMPILED:
        s = scale[:, :, None]
        r = tl.math.div_rn(1.0, scale)[:, :, None]
        nr = -r  # nonzero: its negation is exact (a negated zero would lose its sign)
        q = x * r
        # q += (x - q*s) * r, written as fma(fma(q, s, -x), -r, q) so that a zero x gives
        # fma(+0, -r, q) = q, the zero with x's sign; a NaN or an infinity x gives NaN
        q = tl.fma(tl.fma(q, s, -x), nr, q)
        y = tl.fma(tl.fma(q, s, -x), nr, q)
        # |y| <= FP8_MAX (the scale is the finite amax / FP8_MAX): the conversion needs
        # no clamp, and turns the NaN of a non-finite element into the NaN code
        code = y.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    else:
        y = tl.math.div_rn(x, scale[:, :, None])
        y = tl.minimum(tl.maximum(y, -FP8_MAX), FP8_MAX)
        sign = (y.to(tl.int32, bitcast=True) >> 31) & 1
        code = (e4m3_code(tl.abs(y)) | (sign << 7)).to(tl.uint8)
        code = tl.where(ax < float("inf"), code, NAN_CODE)
    row_ok = rows < out_rows  # (rows past count loaded zeros: their codes are 0)
    row_base = out_ptr + rows * ROW_BYTES
    tl.store(row_base[:, None, None] + cols[None, :, :], code,
             mask=row_ok[:, None, None] & g_ok[None, :, None])
    scale_ptr = (row_base[:, None] + H + grps[None, :] * 4).to(tl.pointer_type(tl.float32))
    tl.store(scale_ptr, tl.where(real[:, None], scale, 0.0),
             mask=row_ok[:, None] & g_ok[None, :])


@triton.jit(do_not_specialize=["rows_n"])
def dequantize_rows_kernel(src_ptr, rows_n, out_ptr, H: tl.constexpr, ROW_BYTES: tl.constexpr,
                           OUT_KIND: tl.constexpr, BLOCK_B: tl.constexpr,
                           COMPILED: tl.constexpr, WIDE: tl.constexpr):
    """``out[:rows_n] = dequantize(src[:rows_n])``: uint8 ``[rows_n, ROW_BYTES]`` wire rows ->
    ``[rows_n, H]`` of ``OUT_KIND`` (0: float32, 1: bfloat16, 2: float16); a NaN code gives
    the output's canonical quiet NaN. One program: ``BLOCK_B`` consecutive 128-element
    groups of the row-major ``[rows_n, H / 128]`` group grid, a ``[BLOCK_B, 128]`` tile.
    ``COMPILED``: the GPU's exact e4m3 and rounding conversions (:func:`~dpx.kernels.blocks.
    fp8_block_values`, :func:`~dpx.kernels.blocks.store_rounded`), else the same by bits.
    ``WIDE``: index math in int64, else int32."""
    NB: tl.constexpr = H // GROUP
    f = block_index(0, BLOCK_B, WIDE)
    row = f // NB
    grp = f % NB
    ok = row < rows_n
    v = fp8_block_values(src_ptr + row * ROW_BYTES, grp, ok, H, COMPILED)
    store_rounded(v, out_ptr, (f * GROUP)[:, None] + tl.arange(0, GROUP)[None, :],
                  ok[:, None], OUT_KIND, COMPILED)
