"""The fp8 wire format of ``gather(..., wire="fp8")``: one definition for both frontends
(docs/semantics.md, "fp8 wire", says it in full).

A row of ``H`` elements (``H % GROUP == 0``) travels as ``wire_row_bytes(H)`` bytes: ``H``
float8_e4m3fn payload bytes, then one little-endian float32 scale per group of ``GROUP``::

    scale   = max(amax(|finite x|), EPS) / FP8_MAX        (IEEE division)
    payload = float8_e4m3fn(clamp(x / scale, -FP8_MAX, FP8_MAX))   (nearest even)
    x'      = float32(payload) * scale, rounded to the output dtype

A non-finite element travels as ``NAN_CODE`` and arrives as the dtype's quiet NaN; rows
that are not real rows are zero bytes (exact zeros). Copy modes only (MAX_LEN, GATHERV).
"""

from __future__ import annotations

from dpx.errors import DpxTypeError, DpxValueError
from dpx.modes import PaddingMode

__all__ = ["check_fp8", "check_fp8_mode", "EPS", "FLOAT_DTYPES", "FP8_MAX", "GROUP", "NAN_CODE",
           "wire_row_bytes"]

GROUP = 128
FP8_MAX = 448.0
EPS = 1e-10
#: The e4m3fn NaN code (exponent and mantissa all ones) of every non-finite element.
NAN_CODE = 0x7F
#: Input dtypes the fp8 wire quantizes (by name, as both frontends spell them).
FLOAT_DTYPES = ("float32", "bfloat16", "float16")


def wire_row_bytes(width: int) -> int:
    """Bytes of one token row of ``width`` elements on the fp8 wire."""
    return width + 4 * (width // GROUP)


def check_fp8_mode(mode: PaddingMode) -> None:
    """An fp8 gather needs a copy mode: a sum cannot run on fp8."""
    if mode is PaddingMode.SUM_LEN:
        raise DpxValueError("wire='fp8' needs a copy mode (max_len or gatherv): sum_len "
                            "adds the slots in an all-reduce, and a sum cannot run on fp8")


def check_fp8(mode: PaddingMode, shape: tuple, dtype_name: str, name: str = "local") -> None:
    """The rules of an fp8 gather (raised before any collective, alike on every rank for
    the shared ``mode``): a copy mode, a float input of shape ``[rows, H]``, ``H % 128 ==
    0``."""
    check_fp8_mode(mode)
    if dtype_name not in FLOAT_DTYPES:
        raise DpxTypeError(f"wire='fp8' quantizes {', '.join(FLOAT_DTYPES)}; {name} has "
                           f"dtype {dtype_name}")
    if len(shape) != 2:
        raise DpxValueError(f"wire='fp8' needs {name} of shape [rows, H]; got "
                            f"{tuple(shape)}")
    if shape[1] % GROUP or shape[1] == 0:
        raise DpxValueError(f"wire='fp8' quantizes groups of {GROUP} elements: H="
                            f"{shape[1]} must be a positive multiple of {GROUP}")
