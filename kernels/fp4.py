"""fp4 wire kernels (the nvfp4 and mxfp4 formats of :mod:`dpx.wire`): quantize rows while
taking them into a wire buffer, and dequantize wire rows.

A wire row is ``H / 2`` payload bytes (two e2m1 codes each, element ``2k`` in the low
nibble of byte ``k``) then one scale byte per block of ``GS`` elements (16: nvfp4, an e4m3
scale; 32: mxfp4, a UE8M0 exponent); the buffers are uint8 ``[rows, ROW_BYTES]``.

One program covers ``BLOCK_B`` consecutive blocks of the row-major ``[rows, H / GS]`` block
grid as a ``[BLOCK_B, GS]`` tile (contiguous elements: vector loads and stores); quantize
stores the codes as little-endian int32 words of eight when a wire row is a multiple of 4
bytes (else byte by byte), dequantize splits bytes into nibbles in registers.

Every rounding is written so that the compiled kernel, Triton's interpreter, the torch ops
and JAX's XLA path give the same bits:

- amax as the integer maximum of the magnitudes' bits (a NaN's bits exceed every number's,
  so the same maximum finds the NaN blocks);
- nvfp4: ``s`` and the quotients correctly rounded (``div_rn``; on a GPU (``COMPILED``) a
  product with the reciprocal and two fused corrections, Markstein's correctly rounded
  quotient for these operands), e4m3 by bits;
- mxfp4: ``x * 2**-E`` on the float pipe where every block of the tile has ``E`` in
  [-100, 126] (``2**-E`` is then normal, and a subnormal ``x`` or quotient lies far below
  the first threshold, so a flush to zero changes nothing); otherwise ``|x|``'s bits
  compared with the e2m1 thresholds times ``2**E``, exact integers;
- e2m1 of a quotient ``q <= 6`` (larger ones and NaN clamped to 6): the first code of
  ``q``'s range plus ``q`` times 2, 1 or 1/2 rounded to nearest even, as the low bits of a
  sum with ``2**23`` (one fused multiply-add);
- dequantize scales e2m1 magnitudes by adding to exponent bits (exact): mxfp4 by ``E`` (by
  bits with a shift where a tile holds a block whose values would be subnormal or
  infinite), nvfp4 from two correctly rounded quotients per block, ``s / g`` and ``3s / g``
  (``e2m1 * s / g`` is one of them times a power of two).

Like every dpx kernel they read ``start`` / ``count`` from device memory or plain ints and
mask every access; the shared blocks are :mod:`dpx.kernels.blocks`', the constants
:mod:`dpx.kernels.constants`' (from :mod:`dpx.wire`).

Grid of both: ``(cdiv(rows * H / GS, BLOCK_B),)``.
"""

import triton
import triton.language as tl

from dpx.kernels.blocks import (block_index, div_corrected, e2m1_code, e4m3_code, e4m3_value,
                                load_index)
from dpx.kernels.constants import (E2M1_MAX, E2M1_RECIP, FP8_MAX, MX_BLOCK, MX_NAN_SCALE,
                                   NAN_BF16, NAN_F16, NAN_F32, NV_BLOCK, NV_NAN_SCALE)

__all__ = ["dequantize_fp4_kernel", "fp4_value_bits", "quantize_fp4_kernel"]


@triton.jit(do_not_specialize=["start_val", "count_val", "src_rows", "out_rows", "g"])
def quantize_fp4_kernel(src_ptr, start_ptr, count_ptr, start_val, count_val, src_rows,
                        out_rows, g, out_ptr, H: tl.constexpr, ROW_BYTES: tl.constexpr,
                        NV: tl.constexpr, START_PTR: tl.constexpr, COUNT_PTR: tl.constexpr,
                        BLOCK_B: tl.constexpr, COMPILED: tl.constexpr, WIDE: tl.constexpr):
    """``out[j] = fp4_wire(src[start + j])`` for ``j < count``; rows ``count..out_rows`` of
    ``out`` are zero bytes. src ``[src_rows, H]`` (float32 / bfloat16 / float16) -> out
    uint8 ``[out_rows, ROW_BYTES]``. ``NV``: nvfp4 with global scale ``g`` (float32), else
    mxfp4. ``WIDE``: index math in int64."""
    GS: tl.constexpr = NV_BLOCK if NV else MX_BLOCK
    HALF: tl.constexpr = GS // 2
    NB: tl.constexpr = H // GS
    start = load_index(start_ptr, start_val, START_PTR, WIDE)
    count = load_index(count_ptr, count_val, COUNT_PTR, WIDE)
    f = block_index(0, BLOCK_B, WIDE)
    row = f // NB
    grp = f % NB
    src_row = start + row
    real = (row < count) & (src_row < src_rows) & (src_row >= 0) & (row < out_rows)
    offs = (src_row * H + grp * GS)[:, None] + tl.arange(0, GS)[None, :]   # [B, GS]
    if src_ptr.dtype.element_ty == tl.bfloat16 and not COMPILED:
        # bfloat16 -> float32 by bits (Triton's interpreter mishandles subnormals)
        hb = tl.load(src_ptr.to(tl.pointer_type(tl.int16)) + offs, mask=real[:, None],
                     other=0)
        ux = (hb.to(tl.int32) & 0xFFFF) << 16
    else:
        x = tl.load(src_ptr + offs, mask=real[:, None], other=0)
        ux = x.to(tl.float32).to(tl.int32, bitcast=True)
    sign = (ux >> 28) & 8                                  # the sign bit as code bit 3
    ab = ux & 0x7FFFFFFF                                   # |x| as bits
    amax_b = tl.max(ab, 1)                                 # [B]
    nan_blk = amax_b > 0x7F800000                          # the block holds a NaN
    if NV:
        sp = amax_b.to(tl.float32, bitcast=True) * g
        if COMPILED:  # sp / 6 correctly rounded (a NaN from an infinite sp saturates below)
            sv = div_corrected(sp, E2M1_MAX, E2M1_RECIP)
        else:
            sv = tl.math.div_rn(sp, E2M1_MAX)
        # e4m3, round to nearest even, saturating at its largest magnitude
        s_code = e4m3_code(tl.where(sv < FP8_MAX, sv, FP8_MAX))
        s = e4m3_value(s_code)
        s_safe = tl.where(s_code == 0, 1.0, s)[:, None]
        ap = ab.to(tl.float32, bitcast=True) * g                        # |x| * g
        if COMPILED:
            q = div_corrected(ap, s_safe, tl.math.div_rn(1.0, s_safe))
        else:
            q = tl.math.div_rn(ap, s_safe)
        # e2m1 of q >= 0 (a NaN quotient, from an infinite |x| * g, saturates like infinity)
        mag = e2m1_code(q)
        zero_blk = (s_code == 0) | nan_blk
        scale_byte = tl.where(nan_blk, NV_NAN_SCALE, s_code)
    else:
        ea = amax_b >> 23
        E = tl.where(ea >= 255, 127, tl.maximum(ea - 129, -127))        # [B]
        zero_blk = nan_blk
        scale_byte = tl.where(nan_blk, MX_NAN_SCALE, E + 127)
        # blocks of numbers (no NaN, not all zero): where every E lies in [-100, 126],
        # x * 2**-E on the float pipe is exact where it matters (2**-E is normal; a
        # subnormal x or quotient is far below the first threshold, so flushing it
        # changes nothing); else the thresholds by bits
        live = real & (amax_b > 0) & ~nan_blk
        lo_e = tl.min(tl.where(live, E, 0), 0)
        hi_e = tl.max(tl.where(live, E, 0), 0)
        if (lo_e >= -100) & (hi_e <= 126):
            p2 = ((127 - E) << 23).to(tl.float32, bitcast=True)            # 2**-E
            mag = e2m1_code(ab.to(tl.float32, bitcast=True) * p2[:, None])
        else:
            # the thresholds t * 2**E as float32 bits, t = (1 + M / 2**23) * 2**k; those
            # compared with > past float32's range become its largest finite value
            # (E <= 127: t0..t3 never are); a subnormal threshold by a shift (exact: its
            # low bits are zero)
            b = E + 125                     # 0.25 (>)
            sh = tl.maximum(1 - b, 0)
            t0 = tl.where(b >= 1, b << 23, 0x800000 >> sh)
            b = E + 126                     # 0.75 (>=)
            sh = tl.maximum(1 - b, 0)
            t1 = tl.where(b >= 1, (b << 23) | 0x400000, 0xC00000 >> sh)
            b = E + 127                     # 1.25 (>), 1.75 (>=)
            sh = tl.maximum(1 - b, 0)
            t2 = tl.where(b >= 1, (b << 23) | 0x200000, 0xA00000 >> sh)
            t3 = tl.where(b >= 1, (b << 23) | 0x600000, 0xE00000 >> sh)
            b = E + 128                     # 2.5 (>), 3.5 (>=)
            sh = tl.maximum(1 - b, 0)
            t4 = tl.where(b >= 255, 0x7F7FFFFF, tl.where(b >= 1, (b << 23) | 0x200000,
                                                         0xA00000 >> sh))
            t5 = tl.where(b >= 255, 0x7F800000, tl.where(b >= 1, (b << 23) | 0x600000,
                                                         0xE00000 >> sh))
            b = E + 129                     # 5 (>)
            sh = tl.maximum(1 - b, 0)
            t6 = tl.where(b >= 255, 0x7F7FFFFF, tl.where(b >= 1, (b << 23) | 0x200000,
                                                         0xA00000 >> sh))
            mag = ((ab > t0[:, None]).to(tl.int32) + (ab >= t1[:, None]).to(tl.int32)
                   + (ab > t2[:, None]).to(tl.int32) + (ab >= t3[:, None]).to(tl.int32)
                   + (ab > t4[:, None]).to(tl.int32) + (ab >= t5[:, None]).to(tl.int32)
                   + (ab > t6[:, None]).to(tl.int32))
    code = tl.where(zero_blk[:, None], 0, mag | sign)
    row_ok = row < out_rows
    base = out_ptr + row * ROW_BYTES
    if ROW_BYTES % 4 == 0:
        # eight codes a little-endian int32 word (element 8w + k at bits 4k): the words
        # of a thread's eight loaded elements are formed in its registers
        w8 = tl.sum(tl.reshape(code, [BLOCK_B, GS // 8, 8])
                    << (tl.arange(0, 8) * 4)[None, None, :], 2)
        words = (base + grp * HALF).to(tl.pointer_type(tl.int32), bitcast=True)
        tl.store(words[:, None] + tl.arange(0, GS // 8)[None, :], w8, mask=row_ok[:, None])
    else:
        lo, hi = tl.split(tl.reshape(code, [BLOCK_B, HALF, 2]))
        tl.store((base + grp * HALF)[:, None] + tl.arange(0, HALF)[None, :],
                 (lo | (hi << 4)).to(tl.uint8), mask=row_ok[:, None])
    tl.store(base + H // 2 + grp, tl.where(real, scale_byte, 0).to(tl.uint8), mask=row_ok)


@triton.jit
def fp4_value_bits(byte, sb, g, BLOCK_B: tl.constexpr, NV: tl.constexpr,
                   COMPILED: tl.constexpr):
    """``(bits, sign, nan_blk)`` of ``BLOCK_B`` fp4 blocks: the float32 bits (int32 ``[BLOCK_B,
    GS]``, sign included) of the elements of payload bytes ``byte`` (int32 ``[BLOCK_B,
    GS / 2]``) with scale bytes ``sb`` (int32 ``[BLOCK_B]``; nvfp4's global scale ``g``),
    their sign bits, and which blocks are NaN blocks (their bits are left as computed):
    the dequantized values before the rounding to an output dtype."""
    GS: tl.constexpr = NV_BLOCK if NV else MX_BLOCK
    c = tl.reshape(tl.join(byte & 15, byte >> 4), [BLOCK_B, GS])         # element 2k: low
    m = c & 7
    sign = (c & 8) << 28
    # e2m1 magnitude bits: 0.5 (m = 1), (1 + (m & 1) / 2) * 2**((m >> 1) - 1) (m >= 2)
    em = tl.where(m < 2, 126 << 23, (((m >> 1) + 126) << 23) | ((m & 1) << 22))
    if NV:
        nan_blk = (sb & NV_NAN_SCALE) == NV_NAN_SCALE
        s = e4m3_value(sb & 0x7F)
        # e2m1 * s / g = 2**j * (s / g) or 2**j * (3s / g), both quotients correctly
        # rounded (3s is exact: s has 4 significant bits)
        s3 = s * 3.0
        if COMPILED:
            r = tl.math.div_rn(1.0, g)
            q1 = div_corrected(s, g, r)
            q3 = div_corrected(s3, g, r)
        else:
            q1 = tl.math.div_rn(s, g)
            q3 = tl.math.div_rn(s3, g)
        odd = ((m & 1) == 1) & (m > 1)
        j = (m >> 1) - 1 - odd.to(tl.int32)
        yb = tl.where(odd, q3.to(tl.int32, bitcast=True)[:, None],
                      q1.to(tl.int32, bitcast=True)[:, None]) + (j << 23)
        yb = tl.where((m == 0) | (s == 0.0)[:, None], 0, yb)
    else:
        nan_blk = sb == MX_NAN_SCALE
        E = sb - 127
        # the exponents of the blocks with a nonzero magnitude (not pad rows, NaN blocks)
        live = (tl.max(byte & 0x77, 1) > 0) & ~nan_blk
        lo_e = tl.min(tl.where(live, E, 0), 0)
        hi_e = tl.max(tl.where(live, E, 0), 0)
        if (lo_e >= -125) & (hi_e <= 125):
            # every value normal: the magnitude's exponent plus E
            yb = tl.where(m == 0, 0, em + (E << 23)[:, None])
        else:
            b = E[:, None] + (m >> 1) + 126
            mant = tl.where(m >= 2, (m & 1) << 22, 0)
            yb = tl.where(b >= 255, 0x7F800000,
                          tl.where(b >= 1, (b << 23) | mant,
                                   (0x800000 | mant) >> tl.maximum(1 - b, 0)))
            yb = tl.where(m == 0, 0, yb)
    yb = yb | sign
    return yb, sign, nan_blk


@triton.jit(do_not_specialize=["rows_n", "g"])
def dequantize_fp4_kernel(src_ptr, rows_n, g, out_ptr, H: tl.constexpr,
                          ROW_BYTES: tl.constexpr, NV: tl.constexpr, OUT_KIND: tl.constexpr,
                          BLOCK_B: tl.constexpr, COMPILED: tl.constexpr, WIDE: tl.constexpr):
    """``out[:rows_n] = dequantize(src[:rows_n])``: uint8 ``[rows_n, ROW_BYTES]`` wire rows ->
    ``[rows_n, H]`` of ``OUT_KIND`` (0: float32, 1: bfloat16, 2: float16); a block whose
    scale byte is the NaN code gives the output's canonical quiet NaN."""
    GS: tl.constexpr = NV_BLOCK if NV else MX_BLOCK
    HALF: tl.constexpr = GS // 2
    NB: tl.constexpr = H // GS
    f = block_index(0, BLOCK_B, WIDE)
    row = f // NB
    grp = f % NB
    ok = row < rows_n
    base = src_ptr + row * ROW_BYTES
    byte = tl.load((base + grp * HALF)[:, None] + tl.arange(0, HALF)[None, :],
                   mask=ok[:, None], other=0).to(tl.int32)              # [B, HALF]
    sb = tl.load(base + H // 2 + grp, mask=ok, other=0).to(tl.int32)     # [B]
    yb, sign, nan_blk = fp4_value_bits(byte, sb, g, BLOCK_B, NV, COMPILED)
    nan = nan_blk[:, None]
    offs = (f * GS)[:, None] + tl.arange(0, GS)[None, :]
    okk = ok[:, None]
    if OUT_KIND == 0:
        out32 = out_ptr.to(tl.pointer_type(tl.int32))
        tl.store(out32 + offs, tl.where(nan, NAN_F32, yb), mask=okk)
    elif OUT_KIND == 1:
        out16 = out_ptr.to(tl.pointer_type(tl.int16))
        if not NV:     # two significant bits: bfloat16 holds the value exactly
            r16 = yb >> 16
        elif COMPILED:   # the hardware's round-to-nearest-even conversion
            r16 = yb.to(tl.float32, bitcast=True).to(tl.bfloat16).to(tl.int16, bitcast=True)
        else:          # float32 -> bfloat16, round to nearest even, by bits
            u = yb & 0x7FFFFFFF
            r16 = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) | (sign >> 16)).to(tl.int16)
        tl.store(out16 + offs, tl.where(nan, NAN_BF16, r16.to(tl.int32)).to(tl.int16),
                 mask=okk)
    else:
        h16 = yb.to(tl.float32, bitcast=True).to(tl.float16).to(tl.int16, bitcast=True)
        out16 = out_ptr.to(tl.pointer_type(tl.int16))
        tl.store(out16 + offs, tl.where(nan, NAN_F16, h16.to(tl.int32)).to(tl.int16),
                 mask=okk)
