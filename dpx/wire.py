"""The quantized wire formats of ``gather(..., wire=...)``: their constants, sizes and rules,
one definition for both frontends. docs/semantics.md ("Serving features": fp8, "fp4 wires")
states each format in full: the scales, the rounding, non-finite values, error bounds.

A row of ``H`` elements travels as ``wire_row_bytes(H, wire)`` bytes: the payload (``H``
e4m3 bytes for fp8; ``H / 2`` bytes of two e2m1 codes for nvfp4 and mxfp4), then one scale
per block of ``block(wire)`` elements (a float32 for fp8; a byte for nvfp4 and mxfp4).
Rows that are not real rows are zero bytes. A gather travels quantized in the copy modes
(MAX_LEN, GATHERV); a reduce_scatter (the combine) in every mode, its sum taken in float32
after the wire (docs/semantics.md, "The quantized combine").
"""

from __future__ import annotations

import math
import struct

from dpx.errors import DpxTypeError, DpxValueError, check_bool
from dpx.modes import Op, PaddingMode, Wire

__all__ = ["block", "CANONICAL_NAN", "check_wire", "check_wire_mode", "check_wire_scale",
           "dequantized", "E2M1_MAX", "E2M1_VALUES", "EPS", "FLOAT_DTYPES", "FP4_NAN_SCALE",
           "FP8_MAX", "GROUP", "in_place_schedule", "NAN_CODE", "nvfp4_scale",
           "payload_bytes", "SCALE_RANGE", "width_of", "wire_row_bytes"]

GROUP = 128
#: The largest finite e4m3fn magnitude: fp8's scale maps a group's amax to it, nvfp4's
#: block scale saturates at it.
FP8_MAX = 448.0
EPS = 1e-10
#: The e2m1 magnitudes by code (0..7), and the largest.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX = E2M1_VALUES[-1]
#: The canonical quiet NaN of each output dtype, as its bits: what a NaN arrives as.
CANONICAL_NAN = {"float32": 0x7FC00000, "bfloat16": 0x7FC0, "float16": 0x7E00}
#: The e4m3fn NaN code (exponent and mantissa all ones) of every non-finite element.
NAN_CODE = 0x7F
#: Input dtypes the quantized wires take (by name, as both frontends spell them).
FLOAT_DTYPES = ("float32", "bfloat16", "float16")
#: The scale byte of an fp4 block that holds a NaN (e4m3's NaN; E8M0's NaN).
FP4_NAN_SCALE = {Wire.NVFP4: 0x7F, Wire.MXFP4: 0xFF}
#: The nvfp4 global scale's range (both ends included): the dequantize's division by ``g``
#: then neither overflows nor underflows, so every implementation gives the same bits.
SCALE_RANGE = (2.0 ** -64, 2.0 ** 64)

#: Elements per scale, by wire.
_BLOCK = {Wire.FP8: GROUP, Wire.NVFP4: 16, Wire.MXFP4: 32}


def block(wire: Wire) -> int:
    """Elements per scale of a quantized ``wire``."""
    return _BLOCK[wire]


def dequantized(wire: Wire, dequantize: object) -> bool:
    """Whether a call's result is rows of its input's dtype: always on the native wire
    (nothing to dequantize), on a quantized one unless ``dequantize=False`` asks for the
    wire rows themselves (a :class:`DpxTypeError` unless ``dequantize`` is a bool)."""
    return check_bool("dequantize", dequantize) or wire is Wire.NATIVE


def in_place_schedule(wire: Wire, in_place: bool) -> bool:
    """Whether a gather whose input is its own slot of ``out`` (``in_place``) runs the
    in-place schedule, which moves no row locally: on the native wire only. A quantized
    wire's quantize pass reads the rows where they lie, before anything writes ``out``, so
    such a gather runs the separate-input schedule (the same result)."""
    return in_place and wire is Wire.NATIVE


def payload_bytes(width: int, wire: Wire = Wire.FP8) -> int:
    """Payload bytes of one row of ``width`` elements (the scales follow)."""
    return width if wire is Wire.FP8 else width // 2


def wire_row_bytes(width: int, wire: Wire = Wire.FP8) -> int:
    """Bytes of one token row of ``width`` elements on ``wire``."""
    scale = 4 if wire is Wire.FP8 else 1
    return payload_bytes(width, wire) + scale * (width // _BLOCK[wire])


def width_of(row_bytes: int, wire: Wire = Wire.FP8) -> int:
    """The row width ``H`` whose wire rows are ``row_bytes`` bytes (the inverse of
    :func:`wire_row_bytes`)."""
    return row_bytes * _BLOCK[wire] // wire_row_bytes(_BLOCK[wire], wire)


def nvfp4_scale(amax: float) -> float:
    """nvfp4's global scale ``g`` for data whose largest magnitude is ``amax`` (a positive
    number -- a checkpoint's calibrated input amax, or ``x.abs().max()``, a one-element
    tensor read on the host): ``g = 448 * 6 /
    amax``, the convention NVIDIA's NVFP4 checkpoints store. A block's scale is ``e4m3(amax_b
    * g / 6)``, so the block holding ``amax`` gets the largest e4m3 scale (448) and no block
    saturates. With a larger ``g`` the blocks past ``6 * 448 / g`` saturate (their values
    arrive clipped to it); with a much smaller one (the reciprocal convention, ``amax /
    2688``, say) small blocks' scales round to 0 and their rows arrive as zeros."""
    try:   # a float, int, numpy scalar or one-element tensor
        a = float(amax) if not isinstance(amax, (bool, str, bytes)) else None
    except (TypeError, ValueError):
        a = None
    if a is None:
        raise DpxTypeError(f"nvfp4_scale(amax={amax!r}): amax must be a number, got "
                           f"{type(amax).__name__}")
    if not (a > 0 and math.isfinite(a)):
        raise DpxValueError(f"nvfp4_scale(amax={amax!r}): amax must be a positive finite "
                            f"float (the data's largest magnitude)")
    g = FP8_MAX * E2M1_MAX / a
    lo, hi = SCALE_RANGE
    if not lo <= g <= hi:
        raise DpxValueError(f"nvfp4_scale(amax={amax!r}) = {g!r} is outside nvfp4's global "
                            f"scale range [2**-64, 2**64]")
    return g


def check_wire_mode(mode: PaddingMode, wire: Wire = Wire.FP8, op: Op = Op.GATHER) -> None:
    """A quantized wire carries a gather in a copy mode (a sum cannot run on quantized
    rows, and sum_len's gather is an all-reduce), or a reduce_scatter in any mode (each
    rank's rows travel quantized and are summed in float32 after the wire)."""
    if op is not Op.GATHER and op is not Op.REDUCE_SCATTER:
        raise DpxValueError(f"wire='{wire.value}' applies to gather and reduce_scatter, not "
                            f"{op.value}")
    if op is Op.GATHER and mode is PaddingMode.SUM_LEN:
        raise DpxValueError(f"wire='{wire.value}' needs a copy mode (max_len or gatherv): "
                            f"sum_len adds the slots in an all-reduce, and a sum cannot run "
                            f"on {wire.value}")


def check_wire_scale(wire: Wire, scale: object) -> float | None:
    """The global scale of a ``wire`` gather, rounded to float32 (what every implementation
    multiplies and divides by): nvfp4 needs a positive float whose float32 lies in
    :data:`SCALE_RANGE`, the same on every rank; other wires take none (None)."""
    if wire is not Wire.NVFP4:
        if scale is not None:
            raise DpxValueError(f"wire_scale applies to wire='nvfp4', not wire='{wire.value}'")
        return None
    if scale is None:
        raise DpxValueError("wire='nvfp4' needs wire_scale=: the global scale g (the "
                            "checkpoint's input scale, a positive float, the same on every "
                            "rank)")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise DpxTypeError(f"wire_scale must be a Python float, got {type(scale).__name__}")
    lo, hi = SCALE_RANGE
    g = struct.unpack("f", struct.pack("f", scale))[0] if 0 < scale < 2 * hi else scale
    if not (math.isfinite(g) and lo <= g <= hi):
        raise DpxValueError(f"wire_scale={scale!r}: nvfp4's global scale must be a positive "
                            f"float in [2**-64, 2**64]")
    return g


def check_wire(wire: Wire, mode: PaddingMode, shape: tuple, dtype_name: str,
               name: str = "local", op: Op = Op.GATHER) -> None:
    """The rules of a quantized gather or reduce_scatter (``op``; raised before any
    collective, alike on every rank for the shared ``mode``): :func:`check_wire_mode`, a
    float input of shape ``[rows, H]``, ``H`` a positive multiple of the wire's block."""
    check_wire_mode(mode, wire, op)
    w = wire.value
    if dtype_name not in FLOAT_DTYPES:
        raise DpxTypeError(f"wire='{w}' quantizes {', '.join(FLOAT_DTYPES)}; {name} has "
                           f"dtype {dtype_name}")
    if len(shape) != 2:
        raise DpxValueError(f"wire='{w}' needs {name} of shape [rows, H]; got {tuple(shape)}")
    b = _BLOCK[wire]
    if shape[1] % b or shape[1] == 0:
        raise DpxValueError(f"wire='{w}' quantizes blocks of {b} elements: H="
                            f"{shape[1]} must be a positive multiple of {b}")
