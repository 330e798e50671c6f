"""Pad-row masking: every row of a gathered buffer outside the real-row ranges gets a fill
value, in place, in one launch (ranges as int32 tables in device memory: a captured CUDA
graph replays with new counts). Like every dpx kernel it masks every access; index math
in int64.

Grid: ``(cdiv(rows, BLOCK_R), cdiv(WIDTH, BLOCK_C))``.
"""

import triton
import triton.language as tl

from dpx.kernels.blocks import block_index

__all__ = ["mask_rows_kernel"]


@triton.jit(do_not_specialize=["n_ranges", "fill", "rows_n"])
def mask_rows_kernel(firsts_ptr, lens_ptr, n_ranges, fill, rows_n, buf_ptr,
                     WIDTH: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """``buf[i] = fill`` for every row ``i < rows_n`` outside all ranges ``[firsts[k],
    firsts[k] + lens[k])``, ``k < n_ranges``; real rows are not touched."""
    rows = block_index(0, BLOCK_R, True)
    cols = block_index(1, BLOCK_C, True)
    real = rows < 0
    for k in range(n_ranges):
        f = tl.load(firsts_ptr + k).to(tl.int64)
        n = tl.load(lens_ptr + k).to(tl.int64)
        real = real | ((rows >= f) & (rows < f + n))
    pad = (~real) & (rows < rows_n)
    vals = tl.full([BLOCK_R, BLOCK_C], 0, buf_ptr.dtype.element_ty) + fill
    tl.store(buf_ptr + rows[:, None] * WIDTH + cols[None, :], vals.to(buf_ptr.dtype.element_ty),
             mask=pad[:, None] & (cols < WIDTH)[None, :])
