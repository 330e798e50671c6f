"""fp4 wire kernels (the nvfp4 and mxfp4 formats of :mod:`dpx.wire`): quantize rows while
taking them into a wire buffer, and dequantize wire rows.

A wire row is ``H / 2`` payload bytes (two e2m1 codes each, element ``2k`` in the low
nibble of byte ``k``) then one scale byte per block of ``GS`` elements (16: nvfp4, an e4m3
scale; 32: mxfp4, a UE8M0 exponent); the buffers are uint8 ``[rows, ROW_BYTES]``.

One program covers ``BLOCK_B`` consecutive blocks of the row-major ``[rows, H / GS]`` block
grid (quantize holds each block whole in one thread: :func:`load_bits8`); the payload
moves as little-endian int32 words of eight codes when a wire row is a multiple of 4 bytes
(else byte by byte).

Every rounding is written so that the compiled kernel, Triton's interpreter, the torch ops
and JAX's XLA path give the same bits:

- amax as the integer maximum of the magnitudes' bits (a NaN's bits exceed every number's,
  so the same maximum finds the NaN blocks);
- nvfp4: ``s`` and the quotients correctly rounded (``div_rn``; on a GPU (``COMPILED``) a
  product with the reciprocal and one fused correction, Markstein's correctly rounded
  quotient where the divisor is 6 or an e4m3 scale, whose significands have four bits at
  most (:func:`~dpx.kernels.blocks.div_by_short`)), e4m3 by bits;
- mxfp4: ``x * 2**-E`` on the float pipe, one multiplication (PTX ``mul.f32`` keeps
  subnormal operands and results: ``2**-127``, the scale of a block holding an infinity,
  is one), exact wherever the e2m1 code depends on it;
- e2m1 of a quotient ``q >= 0``: the minimum of the codes ``q`` would have in each range of
  e2m1's step (:func:`~dpx.kernels.blocks.e2m1_code`), at most 7 (NaN saturates);
- dequantize: each code's bits placed in a float16 (:func:`e2m1_halves`), then mxfp4 two
  exact multiplications by factors making ``2**(E + 14)`` (on a GPU the float16 pair times
  ``2**14`` in one packed multiplication, then one by ``2**E``), nvfp4 the element's power of two
  times one of two correctly rounded quotients per block, ``s / g`` and ``1.5 s / g``
  (:func:`fp4_values`; on a GPU float64 products with ``1 / g``, :func:`nv_factor`); then
  the rounding to the output dtype of :func:`~dpx.kernels.blocks.store_rounded`.

Like every dpx kernel they read ``start`` / ``count`` from device memory or plain ints and
mask every access; the shared blocks are :mod:`dpx.kernels.blocks`', the constants
:mod:`dpx.kernels.constants`' (from :mod:`dpx.wire`).

Grid of both: ``(cdiv(rows * H / GS, BLOCK_B),)``.
"""

import triton
import triton.language as tl

from dpx.kernels.blocks import (add_rn, block_index, div_by_short, e2m1_code, e4m3_code,
                                e4m3_value, load_index, store_rounded)
from dpx.kernels.constants import (E2M1_MAX, E2M1_RECIP, FP8_MAX, MX_BLOCK, MX_NAN_SCALE,
                                   NV_BLOCK, NV_NAN_SCALE)

__all__ = ["dequantize_fp4_kernel", "fp4_values", "quantize_fp4_kernel"]


@triton.jit
def load_bits8(src_ptr, first, real, k: tl.constexpr, COMPILED: tl.constexpr):
    """The float32 bits (int32 ``[B, 8]``) of elements ``first + 8k .. first + 8k + 7`` of
    ``src_ptr`` (``first``: ``[B]``; rows not ``real`` read as zeros): an eight-element
    chunk of a block (for 16-bit inputs Triton gives each thread one row of an 8-wide tile:
    a block's chunks are one thread's)."""
    offs = (first + 8 * k)[:, None] + tl.arange(0, 8)[None, :]
    if src_ptr.dtype.element_ty == tl.bfloat16 and not COMPILED:
        # bfloat16 -> float32 by bits (Triton's interpreter mishandles subnormals)
        hb = tl.load(src_ptr.to(tl.pointer_type(tl.int16)) + offs, mask=real[:, None],
                     other=0)
        return (hb.to(tl.int32) & 0xFFFF) << 16
    else:
        x = tl.load(src_ptr + offs, mask=real[:, None], other=0)
        return x.to(tl.float32).to(tl.int32, bitcast=True)


@triton.jit
def fp4_word(ux, g, d, r, zero_blk, NV: tl.constexpr, COMPILED: tl.constexpr):
    """The eight e2m1 codes of a chunk (float32 bits ``ux [B, 8]``) as one int32 word
    (element ``k`` at bits ``4k``), from its block's factor ``d``: nvfp4 the quotient
    ``RN(|x| * g) / d`` correctly rounded (``r = RN(1 / d)`` on a GPU), mxfp4 the product
    ``|x| * d`` (``d = 2**-E``)."""
    sign = (ux >> 28) & 8                                  # the sign bit as code bit 3
    a = (ux & 0x7FFFFFFF).to(tl.float32, bitcast=True)
    if NV:
        if COMPILED:
            q = div_by_short(a * g, d, r)
        else:
            q = tl.math.div_rn(a * g, d)
    else:
        q = a * d
    # (a NaN quotient, from an infinite |x| * g, saturates like infinity)
    code = tl.where(zero_blk, 0, e2m1_code(q) | sign)
    return tl.sum(code << (tl.arange(0, 8) * 4)[None, :], 1)


@triton.jit(do_not_specialize=["start_val", "count_val", "src_rows", "out_rows", "g"])
def quantize_fp4_kernel(src_ptr, start_ptr, count_ptr, start_val, count_val, src_rows,
                        out_rows, g, out_ptr, H: tl.constexpr, ROW_BYTES: tl.constexpr,
                        NV: tl.constexpr, START_PTR: tl.constexpr, COUNT_PTR: tl.constexpr,
                        BLOCK_B: tl.constexpr, COMPILED: tl.constexpr, WIDE: tl.constexpr):
    """``out[j] = fp4_wire(src[start + j])`` for ``j < count``; rows ``count..out_rows`` of
    ``out`` are zero bytes. src ``[src_rows, H]`` (float32 / bfloat16 / float16) -> out
    uint8 ``[out_rows, ROW_BYTES]``. ``NV``: nvfp4 with global scale ``g`` (float32), else
    mxfp4. ``WIDE``: index math in int64. Each thread holds whole blocks, as chunks of
    eight elements (:func:`load_bits8`): a block's amax and scale are its own work."""
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
    first = src_row * H + grp * GS
    u0 = load_bits8(src_ptr, first, real, 0, COMPILED)
    u1 = load_bits8(src_ptr, first, real, 1, COMPILED)
    # amax as the integer maximum of the magnitudes' bits
    amax_b = tl.maximum(tl.max(u0 & 0x7FFFFFFF, 1), tl.max(u1 & 0x7FFFFFFF, 1))       # [B]
    if not NV:
        u2 = load_bits8(src_ptr, first, real, 2, COMPILED)
        u3 = load_bits8(src_ptr, first, real, 3, COMPILED)
        amax_b = tl.maximum(amax_b, tl.maximum(tl.max(u2 & 0x7FFFFFFF, 1),
                                               tl.max(u3 & 0x7FFFFFFF, 1)))
    nan_blk = amax_b > 0x7F800000                          # the block holds a NaN
    if NV:
        sp = amax_b.to(tl.float32, bitcast=True) * g
        if COMPILED:  # sp / 6 correctly rounded (a NaN from an infinite sp saturates below)
            sv = div_by_short(sp, E2M1_MAX, E2M1_RECIP)
        else:
            sv = tl.math.div_rn(sp, E2M1_MAX)
        # e4m3, round to nearest even, saturating at its largest magnitude
        s_code = e4m3_code(tl.where(sv < FP8_MAX, sv, FP8_MAX))
        s = e4m3_value(s_code)
        d = tl.where(s_code == 0, 1.0, s)
        r = tl.math.div_rn(1.0, d) if COMPILED else d
        d, r = d[:, None], r[:, None]
        zero_blk = (s_code == 0) | nan_blk
        scale_byte = tl.where(nan_blk, NV_NAN_SCALE, s_code)
    else:
        ea = amax_b >> 23
        E = tl.where(ea >= 255, 127, tl.maximum(ea - 129, -127))        # [B]
        zero_blk = nan_blk
        scale_byte = tl.where(nan_blk, MX_NAN_SCALE, E + 127)
        # |x| * 2**-E on the float pipe, exact wherever it matters: 2**-E is a normal
        # float for E <= 126 and 2**-127 (a block holding an infinity) a subnormal one,
        # and the multiplication keeps subnormal operands and results (no flush to zero);
        # a product is exact unless it falls below 2**-126, far below the first threshold
        d = tl.where(E < 127, (127 - E) << 23, 0x400000).to(tl.float32, bitcast=True)
        d = d[:, None]
        r = d
    zb = zero_blk[:, None]
    w0 = fp4_word(u0, g, d, r, zb, NV, COMPILED)
    w1 = fp4_word(u1, g, d, r, zb, NV, COMPILED)
    row_ok = row < out_rows
    base = out_ptr + row * ROW_BYTES
    if NV:
        words = tl.join(w0, w1)                                            # [B, 2]
    else:
        w2 = fp4_word(u2, g, d, r, zb, NV, COMPILED)
        w3 = fp4_word(u3, g, d, r, zb, NV, COMPILED)
        words = tl.reshape(tl.join(tl.join(w0, w2), tl.join(w1, w3)), [BLOCK_B, 4])
    WB: tl.constexpr = GS // 8
    if ROW_BYTES % 4 == 0:
        wp = (base + grp * HALF).to(tl.pointer_type(tl.int32), bitcast=True)
        tl.store(wp[:, None] + tl.arange(0, WB)[None, :], words, mask=row_ok[:, None])
    else:
        byte = (words[:, :, None] >> (tl.arange(0, 4) * 8)[None, None, :]) & 0xFF
        tl.store((base + grp * HALF)[:, None] + tl.arange(0, HALF)[None, :],
                 tl.reshape(byte, [BLOCK_B, HALF]).to(tl.uint8), mask=row_ok[:, None])
    tl.store(base + H // 2 + grp, tl.where(real, scale_byte, 0).to(tl.uint8), mask=row_ok)


@triton.jit
def e2m1_halves(words, i: tl.constexpr, WHOLE: tl.constexpr, COMPILED: tl.constexpr):
    """Elements ``8w + i`` and ``8w + i + 4`` of int32 payload words ``words`` (element ``8w +
    k`` in bits ``4k .. 4k + 3``) as float32 ``e2m1 * 2**-14``, exact: each code's sign,
    exponent and mantissa bits moved to a float16's (bits 15, 10-11 and 9: a float16 with
    those bits is 2**-14 times the e2m1 value, its subnormal 0.5 included), the two codes
    16 bits apart moving together into one word's two float16, then converted. ``WHOLE``
    (a GPU): ``e2m1`` itself, the word's two float16 first multiplied by ``2**14`` in one
    packed ``mul.rn.f16x2`` (exact: a power of two, the results in float16's normal
    range)."""
    if i < 3:
        mag = words << (9 - 4 * i)
    else:
        mag = words >> 3
    h2 = (mag & 0x0E000E00) | ((words << (12 - 4 * i)) & -0x7FFF8000)    # 0x80008000
    if WHOLE:
        h2 = tl.inline_asm_elementwise("mul.rn.f16x2 $0, $1, $2;", "=r,r,r",
                                       [h2, tl.full(h2.shape, 0x74007400, tl.int32)],
                                       dtype=tl.int32, is_pure=True, pack=1)
    if COMPILED:
        # the two float16 converted where they lie (LLVM, left to itself, may regroup the
        # halves of several words first: one byte permute an element more)
        lo, hi = tl.inline_asm_elementwise(
            "{ .reg .b16 l, h; mov.b32 {l, h}, $2; cvt.f32.f16 $0, l; cvt.f32.f16 $1, h; }",
            "=f,=f,r", [h2], dtype=(tl.float32, tl.float32), is_pure=True, pack=1)
    else:
        lo = h2.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        hi = (h2 >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def fp4_terms(f, c1, c2, NV: tl.constexpr, WHOLE: tl.constexpr):
    """A dequantized value as the product of two terms ``(a, b)``, from ``f = e2m1 *
    2**-14`` (:func:`e2m1_halves`; ``e2m1`` itself when ``WHOLE``) and its block's factors
    (:func:`fp4_values`): mxfp4 ``(f * c1, c2)`` (``(f, c1)`` when ``WHOLE``); nvfp4 the
    power of two of ``f`` (its sign and exponent bits) and ``c2`` where ``e2m1`` is 1.5
    times a power of two, else ``c1``: an exact product wherever ``c1``, ``c2`` are numbers
    (a power of two times a normal float32, in range: :func:`fp4_values`)."""
    if NV:
        fb = f.to(tl.int32, bitcast=True)
        pw = (fb & -0x800000).to(tl.float32, bitcast=True)          # sign and exponent
        return pw, tl.where((fb & 0x7FFFFF) != 0, c2, c1)
    elif WHOLE:
        return f, c1
    else:
        return f * c1, c2


@triton.jit
def tile8(x0, x1, x2, x3, x4, x5, x6, x7, BLOCK_B: tl.constexpr, GS: tl.constexpr):
    """Eight ``[BLOCK_B, GS / 8]`` pieces (``xi``: elements ``8w + i`` of a block) as the
    ``[BLOCK_B, GS]`` tile of the block's elements in order (element ``8w + 4h + 2j + k`` at
    ``[.., w, h, j, k]`` of the joins)."""
    v = tl.join(tl.join(tl.join(x0, x4), tl.join(x2, x6)),
                tl.join(tl.join(x1, x5), tl.join(x3, x7)))
    return tl.reshape(v, [BLOCK_B, GS])


@triton.jit
def recip64(g):
    """``1 / g`` in float64 for a float32 ``g`` in the global scale's range, within about
    ``2**-52`` (relative): the GPU's reciprocal approximation (PTX ``rcp.approx.ftz.f64``,
    about 20 correct bits; 14 would do) and two Newton steps, each doubling the correct
    bits, in fused float64 arithmetic (:func:`nv_factor`'s ``r``)."""
    gd = g.to(tl.float64)
    r = tl.inline_asm_elementwise("rcp.approx.ftz.f64 $0, $1;", "=d,d", [gd],
                                  dtype=tl.float64, is_pure=True, pack=1)
    r = tl.fma(r, tl.fma(-gd, r, 1.0), r)
    return tl.fma(r, tl.fma(-gd, r, 1.0), r)


@triton.jit
def nv_factor(s, k: tl.constexpr, r):
    """``RN(k * s / g)`` in float32 for an e4m3 value ``s`` times a power of two (float32;
    NaN gives NaN) and ``k`` a power of two or 1.5 times one, from ``r`` :func:`recip64` of
    ``g``: ``s * (k * r)`` in float64, rounded to float32 once. Exact, wherever the quotient
    is a normal float32: ``k s`` has at most six significant bits and ``g`` 24, so ``k s /
    g`` lies at least ``2**-49`` (relative) from every float32 rounding boundary (a
    boundary ``m`` has a 25-bit odd significand: ``k s = g m`` cannot hold, and ``k s - g
    m`` is a multiple of the lesser of their last bits' weights), while the float64
    product is within about ``2**-51`` of it (``r``'s error, then one rounding each for ``k
    * r`` and the product). In the global scale's range every quotient
    :func:`fp4_values` forms is a normal float32. A GPU test checks every scale byte at
    many global scales, the hardest among them (tests/test_fp4_wire.py)."""
    return (s.to(tl.float64) * (r * k)).to(tl.float32)


@triton.jit
def fp4_values(base, grp, ok, g, H: tl.constexpr, ROW_BYTES: tl.constexpr, NV: tl.constexpr,
               BLOCK_B: tl.constexpr, COMPILED: tl.constexpr, acc, SUM: tl.constexpr):
    """The float32 values ``[BLOCK_B, GS]`` of block ``grp`` of the fp4 wire rows at ``base``
    (uint8 pointers ``[BLOCK_B]``, one per row; ``ok``: rows to read; nvfp4 with global
    scale ``g`` when ``NV``, else mxfp4), NaN (bits unspecified) in a block whose scale byte
    is the NaN code: the dequantized values before the rounding to an output dtype; ``SUM``:
    ``acc`` plus them (float32 ``[BLOCK_B, GS]``, :func:`~dpx.kernels.blocks.add_rn` of each
    value rounded; on a GPU nvfp4's as one ``fma.rn.f32`` of its exact product: the same
    bits, one instruction less).

    Each element is ``f = e2m1 * 2**-14`` (:func:`e2m1_halves`) times per-block factors
    (:func:`fp4_terms`; a NaN block's are NaN), exact where the definition is:

    - mxfp4: ``2**(E + 14)`` as two powers of two in float32's normal range (on a GPU
      ``e2m1`` itself, :func:`e2m1_halves`' ``WHOLE``, times ``2**E``, a subnormal float32
      for ``E = -127``); the products have two significant bits and are exact from
      ``2**-128`` up, rounding to infinity past the largest float as the definition does;
    - nvfp4: ``e2m1 * s / g`` correctly rounded is ``2**j * RN(s / g)`` or ``2**j *
      RN(1.5 s / g)`` (``e2m1 = 2**j`` or ``1.5 * 2**j``; 1.5s is exact, and in the global
      scale's range every such value is a normal float, so scaling by ``2**j`` is exact):
      the two quotients times ``2**14`` per block, ``f``'s power of two per element;
      the product is exact (:func:`nv_factor`: the quotients lie in ``[2**-73, 2**74]``,
      so their ``2**14`` multiples times ``2**-15 .. 2**-12`` are normal floats), so
      ``fma(a, b, acc)`` rounds once what ``acc + RN(a * b)`` rounds once.
    """
    GS: tl.constexpr = NV_BLOCK if NV else MX_BLOCK
    HALF: tl.constexpr = GS // 2
    WB: tl.constexpr = GS // 8
    okk = ok[:, None]
    sb = tl.load(base + H // 2 + grp, mask=ok, other=0).to(tl.int32)
    if ROW_BYTES % 4 == 0:
        wp = (base + grp * HALF).to(tl.pointer_type(tl.int32), bitcast=True)
        words = tl.load(wp[:, None] + tl.arange(0, WB)[None, :], mask=okk, other=0)
    else:
        byte = tl.load((base + grp * HALF)[:, None] + tl.arange(0, HALF)[None, :],
                       mask=okk, other=0).to(tl.int32)
        words = tl.sum(tl.reshape(byte, [BLOCK_B, WB, 4])
                       << (tl.arange(0, 4) * 8)[None, None, :], 2)
    if NV:
        nan = (sb & NV_NAN_SCALE) == NV_NAN_SCALE
        if COMPILED:
            # s * 2**-8 exactly: the e4m3 code's bits as a float16's exponent and leading
            # mantissa bits (e4m3's subnormals are float16's); a NaN block's is NaN, and so
            # are its factors. Then 2**14 s / g and 2**14 * 1.5 s / g correctly rounded
            # (:func:`nv_factor`, the 2**8 in its k)
            h = ((sb & 0x7F) << 7).to(tl.int16).to(tl.float16, bitcast=True)
            s8 = tl.where(nan, float("nan"), h.to(tl.float32))
            r = recip64(g)
            c1 = nv_factor(s8, 4194304.0, r)[:, None]
            c2 = nv_factor(s8, 6291456.0, r)[:, None]
        else:
            s = e4m3_value(sb & 0x7F)
            c1 = tl.where(nan, float("nan"), tl.math.div_rn(s, g) * 16384.0)[:, None]
            c2 = tl.where(nan, float("nan"), tl.math.div_rn(s * 1.5, g) * 16384.0)[:, None]
    elif COMPILED:
        # 2**E: E + 127 as float32's exponent bits, 2**-127 (byte 0) a subnormal; the
        # products with e2m1 (WHOLE) are exact from 2**-128 up and round to infinity past
        # the largest float, as the definition does
        c1 = tl.where(sb == 0, 0x400000, sb << 23).to(tl.float32, bitcast=True)
        c1 = tl.where(sb == MX_NAN_SCALE, float("nan"), c1)[:, None]
        c2 = c1
    else:
        E = sb - 127
        # 2**(E + 14) = c1 * c2, both powers of two in float32's normal range
        c1 = tl.where(E <= 113, (E + 141) << 23, 254 << 23).to(tl.float32, bitcast=True)
        c1 = tl.where(sb == MX_NAN_SCALE, float("nan"), c1)[:, None]
        c2 = tl.where(E <= 113, 127 << 23, (E + 14) << 23).to(tl.float32, bitcast=True)
        c2 = c2[:, None]
    WH: tl.constexpr = COMPILED and not NV
    f0, f4 = e2m1_halves(words, 0, WH, COMPILED)
    f1, f5 = e2m1_halves(words, 1, WH, COMPILED)
    f2, f6 = e2m1_halves(words, 2, WH, COMPILED)
    f3, f7 = e2m1_halves(words, 3, WH, COMPILED)
    a, b = fp4_terms(tile8(f0, f1, f2, f3, f4, f5, f6, f7, BLOCK_B, GS), c1, c2, NV, WH)
    if SUM:
        if NV and COMPILED:
            return tl.fma(a, b, acc)
        else:
            return add_rn(acc, a * b, COMPILED)
    else:
        return a * b


@triton.jit(do_not_specialize=["rows_n", "g"])
def dequantize_fp4_kernel(src_ptr, rows_n, g, out_ptr, H: tl.constexpr,
                          ROW_BYTES: tl.constexpr, NV: tl.constexpr, OUT_KIND: tl.constexpr,
                          BLOCK_B: tl.constexpr, COMPILED: tl.constexpr, WIDE: tl.constexpr):
    """``out[:rows_n] = dequantize(src[:rows_n])``: uint8 ``[rows_n, ROW_BYTES]`` wire rows ->
    ``[rows_n, H]`` of ``OUT_KIND`` (0: float32, 1: bfloat16, 2: float16); a block whose
    scale byte is the NaN code gives the output's canonical quiet NaN."""
    GS: tl.constexpr = NV_BLOCK if NV else MX_BLOCK
    NB: tl.constexpr = H // GS
    f = block_index(0, BLOCK_B, WIDE)
    row = f // NB
    grp = f % NB
    ok = row < rows_n
    v = fp4_values(src_ptr + row * ROW_BYTES, grp, ok, g, H, ROW_BYTES, NV, BLOCK_B, COMPILED,
                   0.0, False)
    store_rounded(v, out_ptr, (f * GS)[:, None] + tl.arange(0, GS)[None, :], ok[:, None],
                  OUT_KIND, COMPILED)
