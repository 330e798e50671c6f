"""The fp8 wire format of ``gather(..., wire="fp8")``: one definition for both frontends.

A token row of ``H`` elements (``H % GROUP == 0``) travels as ``wire_row_bytes(H) = H +
4 * H / GROUP`` bytes: ``H`` float8_e4m3fn payload bytes, then ``H / GROUP`` float32 scales
(little-endian), one per group of ``GROUP = 128`` consecutive elements. For a real row's
group ``x`` (computed in float32)::

    scale   = max(amax(|x_f|), EPS) / FP8_MAX        (IEEE division; EPS = 1e-10)
    payload = float8_e4m3fn(clamp(x / scale, -FP8_MAX, FP8_MAX))   (round to nearest even)
    x'      = float32(payload) * scale, rounded to the output dtype (nearest even)

where ``x_f`` are the group's **finite** elements (the amax of a group without any is 0),
so an all-zero group of a real row has ``scale = EPS / FP8_MAX`` and a zero payload. Rows
that are not real rows (slot padding, alignment rows, idle replicas, rows outside every
chunk) are all-zero bytes: payload 0 and scale 0, which dequantize to exact zeros. For
finite inputs, ``|x' - x| <= 2**-4 * |x| + 2**-10 * scale`` per element before the final
rounding to the output dtype (e4m3 keeps 3 mantissa bits: half a unit in the last place is
at most ``2**-4`` of a normal value, and ``2**-10`` (times the scale) for a subnormal one).

Non-finite elements: a NaN or an infinity, of either sign, travels as e4m3fn's NaN code
``NAN_CODE = 0x7F`` (e4m3fn has no infinity; the sign of a NaN is not kept, as a GPU's
float16-to-float32 conversion does not keep it either) and dequantizes to the output
dtype's canonical quiet NaN (float32 ``0x7FC00000``, bfloat16 ``0x7FC0``, float16
``0x7E00``): **NaN stays NaN and +-inf arrives as NaN**. They take no part in their
group's scale, so no finite element -- of their group, their row or any other row --
changes because of them.

A sum cannot run on fp8, so only the copy modes carry it: ``MAX_LEN`` and ``GATHERV``.
The attn-tp sum of a partial input runs in the input's dtype first; only the world
collective moves fp8. ``reduce_scatter`` always runs in the input's dtype.
"""

from __future__ import annotations

from dpx.errors import DpxTypeError, DpxValueError
from dpx.modes import PaddingMode

__all__ = ["check_fp8", "check_fp8_mode", "EPS", "FLOAT_DTYPES", "FP8_MAX", "GROUP", "NAN_CODE", "wire_row_bytes"]

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
