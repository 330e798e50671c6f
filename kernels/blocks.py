"""The blocks several kernels share, as ``@triton.jit`` helpers (inlined where they are
called: the compiled code is the one the kernel would have with the block written out;
``tests/kernel_digest.py`` compares). Triton's interpreter runs them through
:mod:`dpx_torch.shims.interpreter`.

- :func:`load_index` / :func:`block_index`: a kernel's index prologue (a start or count
  from device memory or an int; a program's row or column indices), in int32, or int64
  for buffers of 2**31 elements or more (``WIDE``);
- :func:`e4m3_code` / :func:`e4m3_value` / :func:`e4m3_signed_value`: e4m3 by bits (round
  to nearest even) and back;
- :func:`div_corrected`: a correctly rounded quotient of non-negative operands from a
  product with the reciprocal and two fused corrections;
- :func:`e2m1_code`: e2m1 rounding of a non-negative quotient on the float pipe.
"""

import triton
import triton.language as tl

from dpx.kernels.constants import E2M1_MAX

__all__ = ["block_index", "div_corrected", "e2m1_code", "e4m3_code", "e4m3_signed_value",
           "e4m3_value", "load_index"]


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
def div_corrected(a, b, r):
    """``a / b`` correctly rounded, for ``a >= 0``, ``b > 0`` and ``r = RN(1/b)``: ``q = a
    * r`` and two corrections ``q += fma(-q, b, a) * r`` (fused; Markstein's correctly
    rounded quotient for these operands)."""
    q = a * r
    q = tl.fma(tl.fma(-q, b, a), r, q)
    return tl.fma(tl.fma(-q, b, a), r, q)


@triton.jit
def e2m1_code(q):
    """The e2m1 magnitude code (0..7) of ``q >= 0``, nearest even, on the float pipe: at
    most 6 (a NaN saturates like infinity); then the first code of ``q``'s range (0, 2, 4
    below 2, 4, 6) plus ``q`` times 2, 1 or 1/2 to nearest even, as the low bits of the sum
    with 2**23 + that first code (one fused multiply-add)."""
    q = tl.where(q < E2M1_MAX, q, E2M1_MAX)
    lo2 = q < 2.0
    lo4 = q < 4.0
    return (q * tl.where(lo2, 2.0, tl.where(lo4, 1.0, 0.5))
            + tl.where(lo2, 8388608.0, tl.where(lo4, 8388610.0, 8388612.0))
            ).to(tl.int32, bitcast=True) & 7
