"""The row passes as checked, differentiable functions.

Layer: passes. Imports dpx, the shims layer and the modules before it in its own row
(docs/semantics.md, "Where things live").

``place_rows(src [m, *rest], start, count, rows) -> out [rows, *rest]``:
    ``out[start + j] = src[j]`` for ``j < count``; every other row is 0.
``take_rows(src [m, *rest], start, count, rows) -> out [rows, *rest]``:
    ``out[j] = src[start + j]`` for ``j < count``; rows ``count..`` are 0.
``zero_rows_(out [rows, *rest], keep_start, keep_count)``: in place, every row outside
    ``[keep_start, keep_start + keep_count)`` becomes 0.
``unpack_rows`` / ``pack_rows``: the chunks of a chunk table between their rows and equal
    ``block``-row pieces (see below).

``start`` and ``count`` are each a Python int (checked against the shapes here) or a
one-element int32 tensor on ``src``'s device (read on the device: no host sync, CUDA-graph
replayable; a wrong value there is clipped to the buffers, never out of bounds). ``passes``
picks the implementation (:mod:`dpx_torch.passes`): by default the device's (the Triton
kernels on CUDA, torch ops on CPU); ``TritonPasses()`` runs the Triton kernels on CPU
tensors too, through Triton's interpreter (what the kernel tests check). ``tile`` (a
:class:`dpx.kernels.Tile`) sets a kernel launch's shape. Place and take are adjoint
(``<place(x), y> == <x, take(y)>`` for equal ``start``/``count``), which is how their
gradients are defined: a call that records autograd, or one traced by ``torch.compile``,
runs the ``dpx::*`` custom ops (:mod:`dpx_torch.ops`).
"""

from __future__ import annotations

import torch

from dpx.errors import DpxTypeError, DpxValueError
from dpx.kernels.launch import Tile
from dpx_torch import ops
from dpx_torch.passes import Index, Passes, passes_for
from dpx_torch.tensors import check_out, overlaps

__all__ = ["Index", "pack_rows", "place_rows", "take_rows", "unpack_rows", "zero_rows_"]


def _split_index(name: str, value: Index, device: torch.device) -> tuple[torch.Tensor | None, int]:
    if isinstance(value, torch.Tensor):
        if value.dtype != torch.int32 or value.numel() != 1:
            raise DpxTypeError(f"{name} must be a one-element int32 tensor, got "
                               f"dtype={value.dtype} shape={tuple(value.shape)}")
        if value.device != device:
            raise DpxValueError(f"{name} is on {value.device}, the data on {device}")
        return value, 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise DpxTypeError(f"{name}={value!r} must be an int or an int32 tensor")
    if value < 0 or value >= 2**31:
        raise DpxValueError(f"{name}={value} must be in [0, 2**31)")
    return None, value


def _check_src_out(name: str, src: torch.Tensor, rows: int, out: torch.Tensor | None) -> None:
    if not isinstance(src, torch.Tensor):
        raise DpxTypeError(f"{name}: src must be a torch.Tensor, got {type(src).__name__}")
    if src.dim() < 1:
        raise DpxValueError(f"{name}: src must have at least one dim (rows), got a scalar")
    if not src.is_contiguous():
        raise DpxValueError(f"{name}: src of shape {tuple(src.shape)} must be contiguous")
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        raise DpxValueError(f"{name}: rows={rows!r} must be an int >= 0")
    if out is None:
        return
    check_out(out, (rows, *src.shape[1:]), src.dtype, src.device, name=f"{name}: ")
    if not out.is_contiguous():
        raise DpxValueError(f"{name}: out must be contiguous")
    if not torch.compiler.is_compiling() and overlaps(src, out):
        raise DpxValueError(f"{name}: out and src share memory; they must not alias")


def _traced(src: torch.Tensor) -> bool:
    return torch.compiler.is_compiling() or (src.requires_grad and torch.is_grad_enabled())


def _move(src: torch.Tensor, ss: Index, ds: Index, count: Index, rows: int,
          out: torch.Tensor | None, tile: Tile | None, passes: Passes | None) -> torch.Tensor:
    ss_t, ss_v = _split_index("start", ss, src.device)
    ds_t, ds_v = _split_index("start", ds, src.device)
    c_t, c_v = _split_index("count", count, src.device)
    if passes is None and _traced(src):
        if out is None:
            return ops.move_rows(src, ss_t, ds_t, c_t, ss_v, ds_v, c_v, rows,
                                 ops.tile_list(tile))
        ops.move_rows_out(src, ss_t, ds_t, c_t, ss_v, ds_v, c_v, out, ops.tile_list(tile))
        return out
    if out is None:
        out = src.new_empty((rows, *src.shape[1:]))
    p = passes or passes_for(src.device)
    p.move(src, ss if ss_t is None else ss_t, ds if ds_t is None else ds_t,
           count if c_t is None else c_t, out, tile=tile)
    return out


def place_rows(src: torch.Tensor, start: Index, count: Index, rows: int, *,
               out: torch.Tensor | None = None, tile: Tile | None = None,
               passes: Passes | None = None) -> torch.Tensor:
    """``src [m, *rest] -> out [rows, *rest]`` with ``out[start:start+count] = src[:count]``,
    zeros elsewhere. Python-int ``start``/``count`` must satisfy ``count <= m`` and
    ``start + count <= rows``. Differentiable (adjoint: :func:`take_rows`)."""
    _check_src_out("place_rows", src, rows, out)
    if isinstance(start, int) and isinstance(count, int):
        if count > src.shape[0] or start + count > rows:
            raise DpxValueError(
                f"place_rows: start={start}, count={count} must satisfy count <= src rows "
                f"({src.shape[0]}) and start + count <= rows ({rows})")
    return _move(src, 0, start, count, rows, out, tile, passes)


def take_rows(src: torch.Tensor, start: Index, count: Index, rows: int, *,
              out: torch.Tensor | None = None, tile: Tile | None = None,
              passes: Passes | None = None) -> torch.Tensor:
    """``src [m, *rest] -> out [rows, *rest]`` with ``out[:count] = src[start:start+count]``,
    zeros elsewhere. Python-int ``start``/``count`` must satisfy ``start + count <= m`` and
    ``count <= rows``. Differentiable (adjoint: :func:`place_rows`)."""
    _check_src_out("take_rows", src, rows, out)
    if isinstance(start, int) and isinstance(count, int):
        if start + count > src.shape[0] or count > rows:
            raise DpxValueError(
                f"take_rows: start={start}, count={count} must satisfy start + count <= src "
                f"rows ({src.shape[0]}) and count <= rows ({rows})")
    return _move(src, start, 0, count, rows, out, tile, passes)


def zero_rows_(out: torch.Tensor, keep_start: Index, keep_count: Index, *,
               tile: Tile | None = None, passes: Passes | None = None) -> torch.Tensor:
    """In place: every row of ``out`` outside ``[keep_start, keep_start + keep_count)``
    becomes 0 (the kept rows are neither read nor written)."""
    if not isinstance(out, torch.Tensor) or out.dim() < 1 or not out.is_contiguous():
        raise DpxValueError(f"zero_rows_: out of shape {tuple(getattr(out, 'shape', ()))} "
                            f"must be a contiguous tensor with a rows dim")
    s_t, s_v = _split_index("keep_start", keep_start, out.device)
    c_t, c_v = _split_index("keep_count", keep_count, out.device)
    if passes is None and torch.compiler.is_compiling():
        ops.zero_rows_out(out, s_t, c_t, s_v, c_v)
        return out
    (passes or passes_for(out.device)).zero(out, keep_start, keep_count, tile=tile)
    return out


# ---------------------------------------------------------------- chunk tables
# ``unpack_rows(src [n*block, *rest], firsts, lens, rows) -> [rows, *rest]``:
#     ``out[firsts[r] + j] = src[r*block + j]`` for ``j < lens[r]``; other rows 0.
# ``pack_rows(src [m, *rest], firsts, lens, block) -> [n*block, *rest]``:
#     ``out[r*block + j] = src[firsts[r] + j]`` for ``j < lens[r]``; other rows 0.
# ``firsts`` / ``lens``: int32 ``[n]`` tensors on the data's device. The two are adjoint.

def _check_table(name: str, src: torch.Tensor, firsts: torch.Tensor, lens: torch.Tensor,
                 block: int) -> None:
    _check_src_out(name, src, 0, None)
    for what, t in (("firsts", firsts), ("lens", lens)):
        if (not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1
                or t.device != src.device):
            raise DpxTypeError(f"{name}: {what} must be a 1-d int32 tensor on {src.device}")
    if firsts.shape != lens.shape:
        raise DpxValueError(f"{name}: firsts has {firsts.shape[0]} entries, lens "
                            f"{lens.shape[0]}; they must match")
    if isinstance(block, bool) or not isinstance(block, int) or block < 0:
        raise DpxValueError(f"{name}: block={block!r} must be an int >= 0")


def unpack_rows(src: torch.Tensor, firsts: torch.Tensor, lens: torch.Tensor,
                rows: int, *, passes: Passes | None = None) -> torch.Tensor:
    """``src [n*block, *rest] -> [rows, *rest]``: chunk ``r`` (``src[r*block :
    r*block + lens[r]]``, ``block = src rows // n``) moved to rows ``firsts[r]...``;
    every other row is 0. Chunks must not overlap; every access is clipped to the buffers,
    so a wrong table can never read or write out of bounds. Differentiable (adjoint:
    :func:`pack_rows`)."""
    _check_table("unpack_rows", src, firsts, lens, 0)
    n = firsts.shape[0]
    if n == 0 or src.shape[0] % n:
        raise DpxValueError(f"unpack_rows: src has {src.shape[0]} rows; it must be "
                            f"{n} chunks of equal size")
    _check_src_out("unpack_rows", src, rows, None)
    block = src.shape[0] // n
    if passes is None and _traced(src):
        return ops.unpack_rows(src, firsts, lens, block, rows)
    out = src.new_empty((rows, *src.shape[1:]))
    (passes or passes_for(src.device)).unpack(src, firsts, lens, block, out)
    return out


def pack_rows(src: torch.Tensor, firsts: torch.Tensor, lens: torch.Tensor,
              block: int, *, passes: Passes | None = None) -> torch.Tensor:
    """``src [m, *rest] -> [n*block, *rest]``: ``src[firsts[r] : firsts[r] + lens[r]]``
    moved to rows ``r*block...``, zeros after each chunk. Differentiable (adjoint:
    :func:`unpack_rows`)."""
    _check_table("pack_rows", src, firsts, lens, block)
    if passes is None and _traced(src):
        return ops.pack_rows(src, firsts, lens, block)
    out = src.new_empty((firsts.shape[0] * block, *src.shape[1:]))
    (passes or passes_for(src.device)).pack(src, firsts, lens, block, out)
    return out
