"""Row movement kernels shared by both frontends (outputs are the last pointer argument).

Every kernel views its buffers as ``[rows, WIDTH]`` row-major matrices (trailing dims
flattened into ``WIDTH``), writes every element of its output exactly once (one pass, no
fill-then-copy), reads its row offsets and counts each either from device memory
(``*_PTR``: int32 scalars, so a captured CUDA graph or a compiled JAX function sees new
values without a new launch) or from plain integer arguments, and masks every access
against the buffer bounds: a wrong count can never read or write out of bounds. Their
shared blocks are ``@triton.jit`` helpers (:mod:`dpx.kernels.blocks`). No integer
argument is specialised (Triton would otherwise fold a 1 into a constant and assume
divisibility by 16 of others, which jax-triton never does): a torch launch and a
jax-triton launch compile to the same PTX, except that jax-triton always folds an argument
equal to 1. Index math in :func:`move_rows_kernel` and :func:`zero_rows_kernel` runs in
int32 unless a buffer holds 2**31 elements or more (``WIDE``: int64), in the chunk-table
kernels always in int64; the launch shape and the store kind (``STREAM``) are
:func:`dpx.kernels.launch.tile_for`'s, a pure function of the buffers' rows, width and
element size that both frontends call.

``pack_rows`` / ``unpack_rows`` move the chunks of a chunk table (int32 ``firsts`` and
``lens`` in device memory) between their rows of a buffer and equal ``block``-row pieces.

Grid for all: ``(cdiv(out_rows, BLOCK_R), cdiv(WIDTH, BLOCK_C))``.
"""

import triton
import triton.language as tl

from dpx.kernels.blocks import block_index, load_index

__all__ = ["move_rows_kernel", "pack_rows_kernel", "unpack_rows_kernel", "zero_rows_kernel"]


@triton.jit(do_not_specialize=["src_start_val", "dst_start_val", "count_val", "src_rows",
                             "out_rows"])
def move_rows_kernel(src_ptr, src_start_ptr, dst_start_ptr, count_ptr, src_start_val,
                     dst_start_val, count_val, src_rows, out_rows, out_ptr,
                     WIDTH: tl.constexpr, SRC_START_PTR: tl.constexpr,
                     DST_START_PTR: tl.constexpr, COUNT_PTR: tl.constexpr,
                     BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, WIDE: tl.constexpr,
                     STREAM: tl.constexpr):
    """``out[dst_start + j] = src[src_start + j]`` for ``0 <= j < count``; every other row
    of ``out`` is 0 (a *place* when ``src_start`` is 0, a *take* when ``dst_start`` is 0).

    src ``[src_rows, WIDTH]`` -> out ``[out_rows, WIDTH]``. Rows of ``src`` outside
    ``[src_start, src_start + count)`` are never read. Each of ``src_start``,
    ``dst_start`` and ``count`` is read from device memory (``*_PTR``) or given as an int.
    ``WIDE``: index math in int64 (buffers of 2**31 elements or more), else int32.
    ``STREAM``: streaming (``.cs``) stores.
    """
    src_start = load_index(src_start_ptr, src_start_val, SRC_START_PTR, WIDE)
    dst_start = load_index(dst_start_ptr, dst_start_val, DST_START_PTR, WIDE)
    count = load_index(count_ptr, count_val, COUNT_PTR, WIDE)
    rows = block_index(0, BLOCK_R, WIDE)
    cols = block_index(1, BLOCK_C, WIDE)
    j = rows - dst_start
    s = src_start + j
    row_real = (j >= 0) & (j < count) & (s >= 0) & (s < src_rows) & (rows < out_rows)
    col_ok = cols < WIDTH
    vals = tl.load(src_ptr + s[:, None] * WIDTH + cols[None, :],
                   mask=row_real[:, None] & col_ok[None, :], other=0)
    ptrs = out_ptr + rows[:, None] * WIDTH + cols[None, :]
    keep = (rows < out_rows)[:, None] & col_ok[None, :]
    if STREAM:
        tl.store(ptrs, vals, mask=keep, cache_modifier=".cs")
    else:
        tl.store(ptrs, vals, mask=keep)


@triton.jit(do_not_specialize=["start_val", "count_val", "out_rows"])
def zero_rows_kernel(start_ptr, count_ptr, start_val, count_val, out_rows,
                     out_ptr, WIDTH: tl.constexpr, START_PTR: tl.constexpr, COUNT_PTR: tl.constexpr,
                     BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, WIDE: tl.constexpr,
                     STREAM: tl.constexpr):
    """In place: zero every row ``j < out_rows`` of ``out`` outside ``[start, start +
    count)`` (writes those rows only; the kept rows are neither read nor written).

    Used after a collective has written a slot whose tail past the real count must be 0,
    and around a caller's own rows before an in-place collective.
    """
    start = load_index(start_ptr, start_val, START_PTR, WIDE)
    count = load_index(count_ptr, count_val, COUNT_PTR, WIDE)
    rows = block_index(0, BLOCK_R, WIDE)
    cols = block_index(1, BLOCK_C, WIDE)
    pad = ((rows < start) | (rows >= start + count)) & (rows < out_rows)
    zeros = tl.full((BLOCK_R, BLOCK_C), 0, dtype=out_ptr.dtype.element_ty)
    ptrs = out_ptr + rows[:, None] * WIDTH + cols[None, :]
    keep = pad[:, None] & (cols < WIDTH)[None, :]
    if STREAM:
        tl.store(ptrs, zeros, mask=keep, cache_modifier=".cs")
    else:
        tl.store(ptrs, zeros, mask=keep)


@triton.jit(do_not_specialize=["src_rows", "out_rows", "n_chunks", "block"])
def unpack_rows_kernel(src_ptr, firsts_ptr, lens_ptr, src_rows, out_rows, n_chunks, block,
                       out_ptr, WIDTH: tl.constexpr, BLOCK_R: tl.constexpr,
                       BLOCK_C: tl.constexpr):
    """``out[firsts[r] + j] = src[r*block + j]`` for ``j < lens[r]``, ``r < n_chunks``;
    every other row of ``out`` is 0 (chunks must not overlap).

    src ``[src_rows, WIDTH]`` (``n_chunks`` pieces of ``block`` rows: an equal all-gather's
    output) -> out ``[out_rows, WIDTH]``. ``firsts`` / ``lens``: int32 ``[n_chunks]`` in
    device memory. Each program scans the chunk table once for its rows.
    """
    rows = block_index(0, BLOCK_R, True)
    cols = block_index(1, BLOCK_C, True)
    src_row = tl.full((BLOCK_R,), -1, tl.int64)
    for r in range(0, n_chunks):
        first = tl.load(firsts_ptr + r).to(tl.int64)
        length = tl.minimum(tl.load(lens_ptr + r).to(tl.int64), block)
        hit = (rows >= first) & (rows < first + length)
        src_row = tl.where(hit, r * block + rows - first, src_row)
    row_real = (src_row >= 0) & (src_row < src_rows) & (rows < out_rows)
    col_ok = cols < WIDTH
    vals = tl.load(src_ptr + src_row[:, None] * WIDTH + cols[None, :],
                   mask=row_real[:, None] & col_ok[None, :], other=0)
    tl.store(out_ptr + rows[:, None] * WIDTH + cols[None, :], vals,
             mask=(rows < out_rows)[:, None] & col_ok[None, :])


@triton.jit(do_not_specialize=["src_rows", "out_rows", "n_chunks", "block"])
def pack_rows_kernel(src_ptr, firsts_ptr, lens_ptr, src_rows, out_rows, n_chunks, block,
                     out_ptr, WIDTH: tl.constexpr, BLOCK_R: tl.constexpr,
                     BLOCK_C: tl.constexpr):
    """``out[r*block + j] = src[firsts[r] + j]`` for ``j < lens[r]``; every other row of
    ``out`` is 0. The adjoint of :func:`unpack_rows_kernel`.

    src ``[src_rows, WIDTH]`` -> out ``[out_rows, WIDTH]`` (``out_rows = n_chunks * block``:
    an equal reduce-scatter's input).
    """
    rows = block_index(0, BLOCK_R, True)
    cols = block_index(1, BLOCK_C, True)
    in_out = rows < out_rows
    safe_block = tl.maximum(block, 1)
    r = rows // safe_block
    j = rows - r * safe_block
    chunk_ok = in_out & (r < n_chunks)
    first = tl.load(firsts_ptr + r, mask=chunk_ok, other=0).to(tl.int64)
    length = tl.load(lens_ptr + r, mask=chunk_ok, other=0).to(tl.int64)
    s = first + j
    row_real = chunk_ok & (j < length) & (s >= 0) & (s < src_rows)
    col_ok = cols < WIDTH
    vals = tl.load(src_ptr + s[:, None] * WIDTH + cols[None, :],
                   mask=row_real[:, None] & col_ok[None, :], other=0)
    tl.store(out_ptr + rows[:, None] * WIDTH + cols[None, :], vals,
             mask=in_out[:, None] & col_ok[None, :])
