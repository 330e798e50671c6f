"""The blocks several kernels share, as ``@triton.jit`` helpers (inlined where they are
called: the compiled code is the one the kernel would have with the block written out;
``tests/kernel_digest.py`` compares). Triton's interpreter runs them through
:mod:`dpx_torch.shims.interpreter`.

- :func:`load_index` / :func:`block_index`: a kernel's index prologue (a start or count
  from device memory or an int; a program's row or column indices), in int32, or int64
  for buffers of 2**31 elements or more (``WIDE``);
- :func:`e4m3_code` / :func:`e4m3_value` / :func:`e4m3_signed_value`: e4m3 by bits (round
  to nearest even) and back;
- :func:`div_by_short`: a correctly rounded quotient of non-negative operands from a
  product with the reciprocal and one fused correction, where the divisor's significand
  has at most four bits (6, or an e4m3 value);
- :func:`e2m1_code`: e2m1 rounding of a non-negative quotient on the float pipe;
- :func:`add_rn`: a float32 addition rounded to nearest even, never fused;
- :func:`fp8_values` / :func:`fp8_block_values` / :func:`store_rounded`: the fp8 wire's
  float32 values of codes and scales (of one group of wire rows), and float32 values stored
  rounded to an output dtype with the canonical NaN.
"""

import triton
import triton.language as tl

from dpx.kernels.constants import GROUP, NAN_BF16, NAN_CODE, NAN_F16, NAN_F32

__all__ = ["add_rn", "block_index", "div_by_short", "e2m1_code", "e4m3_code",
           "e4m3_signed_value", "e4m3_value", "fp8_block_values", "fp8_values", "load_index",
           "store_rounded"]


@triton.jit
def load_index(ptr, value, FROM_PTR: tl.constexpr, WIDE: tl.constexpr):
    """A start or count: ``ptr``'s int32 in device memory when ``FROM_PTR`` (a captured
    CUDA graph or a compiled JAX function reads new values without a new launch), else the
    int ``value``; as int64 when ``WIDE``, else int32."""
    if FROM_PTR:
        v = tl.load(ptr)
    else:
        v = value
    if WIDE:
        return v.to(tl.int64)
    else:
        return v.to(tl.int32)


@triton.jit
def block_index(axis: tl.constexpr, BLOCK: tl.constexpr, WIDE: tl.constexpr):
    """This program's ``BLOCK`` consecutive indices along grid axis ``axis`` (int64 when
    ``WIDE``)."""
    if WIDE:
        return tl.program_id(axis).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    else:
        return tl.program_id(axis) * BLOCK + tl.arange(0, BLOCK)


@triton.jit
def e4m3_code(a):
    """The e4m3 code (int32, 0..126) of float32 ``a`` in [0, FP8_MAX], rounded to nearest
    even, by bits (Triton's interpreter truncates the conversion)."""
    u = a.to(tl.int32, bitcast=True)
    normal = ((u + 0x7FFFF + ((u >> 20) & 1)) >> 20) - (120 << 3)
    sub = ((a * 512.0 + 8388608.0) - 8388608.0).to(tl.int32)  # exact: a * 512 < 8
    return tl.where(a < 0.015625, sub, normal)


@triton.jit
def e4m3_value(code):
    """The float32 value of an e4m3 magnitude code (int32, 0..127: the sign bit clear;
    exact, by bits)."""
    e = code >> 3
    m = code & 7
    return tl.where(e == 0, m.to(tl.float32) * 0.001953125,
                    ((e + 120) << 23 | (m << 20)).to(tl.float32, bitcast=True))


@triton.jit
def e4m3_signed_value(c):
    """The float32 value of an e4m3fn code with its sign (int32, 0..255; the NaN code's
    value is NaN-like garbage the caller replaces): exact, by bits, the sign set by its
    bit in both branches (a compiled negation of +0.0 can give +0.0)."""
    sign = (c >> 7) & 1
    e = (c >> 3) & 15
    m = c & 7
    normal = ((sign << 31) | ((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    sub = m.to(tl.float32) * 0.001953125
    sub = (sub.to(tl.int32, bitcast=True) | (sign << 31)).to(tl.float32, bitcast=True)
    return tl.where(e == 0, sub, normal)


@triton.jit
def div_by_short(a, b, r):
    """``a / b`` correctly rounded, for ``a >= 0``, ``b > 0`` whose significand has at most
    four bits (6, or an e4m3 value) and ``r = RN(1/b)``: ``q = a * r`` and one fused
    correction ``q += fma(-q, b, a) * r``. Where the remainder ``a - q * b`` does not
    underflow (``a`` above about ``2**-100`` for the e4m3 divisors), the corrected
    quotient is off by far less than how close ``a / b`` can come to a rounding boundary
    when ``b`` is this short (a midpoint times ``b`` has at most 29 significant bits), so
    it rounds correctly; a GPU test checks every float32 significand against each of the
    eight divisors' (tests/test_fp4_wire.py). Smaller ``a`` give quotients far below
    e2m1's smallest step (code 0 however they round)."""
    q = a * r
    return tl.fma(tl.fma(-q, b, a), r, q)


@triton.jit
def e2m1_code(q):
    """The e2m1 magnitude code (0..7) of ``q >= 0``, nearest even, on the float pipe: the
    codes ``q`` would have in each range of e2m1's step (the first code of the range, 0, 2
    or 4, plus ``q`` times 2, 1 or 1/2 rounded to nearest even, as the low bits of a sum with
    ``2**23``: one rounding each) are each at least the right one, which is their minimum;
    7 at most (a NaN saturates like infinity: the minimum ignores it)."""
    r2 = q * 2.0 + 8388608.0
    r1 = q + 8388610.0
    r05 = q * 0.5 + 8388612.0
    nan_off: tl.constexpr = tl.PropagateNan.NONE      # the minimum of a number and a NaN
    r = tl.minimum(tl.minimum(r2, r1, propagate_nan=nan_off),
                   tl.minimum(r05, 8388615.0, propagate_nan=nan_off), propagate_nan=nan_off)
    return r.to(tl.int32, bitcast=True) & 7


@triton.jit
def add_rn(acc, v, COMPILED: tl.constexpr):
    """``acc + v`` in float32, rounded to nearest even with subnormals: a PTX ``add.rn.f32``
    on a GPU (never fused into a multiply-add), NumPy's addition in the interpreter."""
    if COMPILED:
        return tl.inline_asm_elementwise("add.rn.f32 $0, $1, $2;", "=f,f,f", [acc, v],
                                         dtype=tl.float32, is_pure=True, pack=1)
    else:
        return acc + v


@triton.jit
def fp8_values(c, scale, COMPILED: tl.constexpr):
    """``e4m3fn(c) * scale`` in float32 (one rounding: the e4m3 value is exact) for uint8
    codes ``c``, NaN (bits unspecified) for the NaN codes. ``COMPILED``: the GPU's e4m3 ->
    float conversion (exact, subnormals and signed zeros included); else by bits."""
    if COMPILED:
        return c.to(tl.float8e4nv, bitcast=True).to(tl.float32) * scale
    else:
        ci = c.to(tl.int32)
        return tl.where((ci & 0x7F) == NAN_CODE, float("nan"),
                        e4m3_signed_value(ci) * scale)


@triton.jit
def fp8_block_values(base, grp, ok, H: tl.constexpr, COMPILED: tl.constexpr):
    """The float32 values ``[B, GROUP]`` (:func:`fp8_values`) of group ``grp`` of the fp8 wire
    rows at ``base`` (uint8 pointers ``[B]``, one per row; ``ok``: rows to read)."""
    c = tl.load((base + grp * GROUP)[:, None] + tl.arange(0, GROUP)[None, :],
                mask=ok[:, None], other=0)
    scale = tl.load((base + H + grp * 4).to(tl.pointer_type(tl.float32)), mask=ok, other=0.0)
    return fp8_values(c, scale[:, None], COMPILED)


@triton.jit
def store_rounded(v, out_ptr, offs, mask, OUT_KIND: tl.constexpr, COMPILED: tl.constexpr):
    """float32 ``v`` stored at ``out_ptr + offs`` as ``OUT_KIND`` (0: float32, 1: bfloat16,
    2: float16), rounded to nearest even, a NaN as the output's canonical quiet NaN (by
    bits: a NaN's bits after arithmetic differ between devices). ``COMPILED``: the GPU's
    bfloat16 conversion, else by bits (Triton's interpreter truncates it); float16 by the
    conversion in both."""
    nan = v != v
    if OUT_KIND == 0:
        out32 = out_ptr.to(tl.pointer_type(tl.uint32))
        tl.store(out32 + offs, tl.where(nan, NAN_F32, v.to(tl.uint32, bitcast=True)),
                 mask=mask)
    elif OUT_KIND == 1:
        if COMPILED:
            r = v.to(tl.bfloat16).to(tl.uint16, bitcast=True)
        else:
            u = v.to(tl.uint32, bitcast=True)
            r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).to(tl.uint16)
        out16 = out_ptr.to(tl.pointer_type(tl.uint16))
        tl.store(out16 + offs, tl.where(nan, NAN_BF16, r).to(tl.uint16), mask=mask)
    else:
        h16 = v.to(tl.float16).to(tl.uint16, bitcast=True)
        out16 = out_ptr.to(tl.pointer_type(tl.uint16))
        tl.store(out16 + offs, tl.where(nan, NAN_F16, h16).to(tl.uint16), mask=mask)
