"""Torch launchers of the fp8 wire kernels (:mod:`dpx.kernels.wire`, format :mod:`dpx.wire`).

``quantize_into(src [m, H], start, count, out uint8 [rows, wire_row_bytes(H)])``: ``out[j]``
is the wire row of ``src[start + j]`` for ``j < count``, zero bytes after.
``dequantize_into(src uint8 [rows, wire_row_bytes(H)], out [rows, H])``.
``split_wire(buf)``: the ``(payload float8_e4m3fn [rows, H], scales float32 [rows, H/128])``
views of a wire buffer (strided views of its bytes, no copy).

``start`` / ``count`` are Python ints or one-element int32 device tensors (no host sync).
CUDA runs the compiled kernels, CPU the same kernels in Triton's interpreter. Registered as
``torch.library`` ops so torch.compile traces them.
"""

from __future__ import annotations

import torch

from dpx import wire as W
from dpx.kernels import launch as _launch
from dpx.kernels import wire as _wire
from dpx_torch.rows import Index, kernel_for

__all__ = ["dequantize_into", "quantize_into", "split_wire"]

_OUT_KIND = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_BLOCK_R = 16


def _quantize(src, start, count, start_val, count_val, out) -> None:
    rows, H = out.shape[0], src.shape[1]
    if rows == 0:
        return
    anchor = src
    kern = kernel_for(_wire.quantize_rows_kernel, out.device)
    q = _launch.quantize_shape(rows, H, src.element_size())
    kern[_launch.quantize_grid(rows, H, q)](
        src, anchor if start is None else start, anchor if count is None else count,
        start_val, count_val, src.shape[0], rows, out, H=H, ROW_BYTES=out.shape[1],
        START_PTR=start is not None, COUNT_PTR=count is not None, BLOCK_R=q.block_r,
        BLOCK_G=q.block_g, COMPILED=out.device.type == "cuda",
        WIDE=_launch.wide(src.numel(), out.numel()), num_warps=q.warps)


def _dequantize(src, out) -> None:
    rows, H = out.shape[0], out.shape[1]
    if rows == 0:
        return
    kern = kernel_for(_wire.dequantize_rows_kernel, out.device)
    kern[(-(-rows // _BLOCK_R), H // W.GROUP)](src, rows, out, H=H, ROW_BYTES=src.shape[1],
                                               OUT_KIND=_OUT_KIND[out.dtype],
                                               BLOCK_R=_BLOCK_R,
                                               WIDE=_launch.wide(src.numel(), out.numel()),
                                               num_warps=4)


@torch.library.custom_op("dpx::quantize_rows_out", mutates_args=("out",))
def _quantize_out(src: torch.Tensor, start: torch.Tensor | None, count: torch.Tensor | None,
                  start_val: int, count_val: int, out: torch.Tensor) -> None:
    _quantize(src, start, count, start_val, count_val, out)


@torch.library.custom_op("dpx::dequantize_rows_out", mutates_args=("out",))
def _dequantize_out(src: torch.Tensor, out: torch.Tensor) -> None:
    _dequantize(src, out)


@_quantize_out.register_fake
def _(src, start, count, start_val, count_val, out) -> None:
    return None


@_dequantize_out.register_fake
def _(src, out) -> None:
    return None


def quantize_into(src: torch.Tensor, start: Index, count: Index,
                  out: torch.Tensor) -> torch.Tensor:
    """Unchecked (the interpreter's; see the module docstring)."""
    s_t, s_v = (start, 0) if isinstance(start, torch.Tensor) else (None, start)
    c_t, c_v = (count, 0) if isinstance(count, torch.Tensor) else (None, count)
    if torch.compiler.is_compiling():
        _quantize_out(src, s_t, c_t, s_v, c_v, out)
    else:
        _quantize(src, s_t, c_t, s_v, c_v, out)
    return out


def dequantize_into(src: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Unchecked (the interpreter's; see the module docstring)."""
    if torch.compiler.is_compiling():
        _dequantize_out(src, out)
    else:
        _dequantize(src, out)
    return out


def split_wire(buf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(payload [rows, H] float8_e4m3fn, scales [rows, H/128] float32)``: views of the
    uint8 wire rows ``buf [rows, wire_row_bytes(H)]`` (strided: row stride
    ``wire_row_bytes(H)`` bytes; ``.contiguous()`` copies them out)."""
    width = buf.shape[1] * W.GROUP // (W.GROUP + 4)
    payload = buf[:, :width].view(torch.float8_e4m3fn)
    scales = buf[:, width:].view(torch.float32)
    return payload, scales
