"""Torch launchers of the ``dpx.kernels`` row kernels, registered as ``torch.library`` ops.

``place_rows(src [m, *rest], start, count, rows) -> out [rows, *rest]``:
    ``out[start + j] = src[j]`` for ``j < count``; every other row is 0.
``take_rows(src [m, *rest], start, count, rows) -> out [rows, *rest]``:
    ``out[j] = src[start + j]`` for ``j < count``; rows ``count..`` are 0.
``zero_rows_(out [rows, *rest], keep_start, keep_count)``: in place, every row outside
    ``[keep_start, keep_start + keep_count)`` becomes 0.
``unpack_rows`` / ``pack_rows``: the chunks of a chunk table between their rows and equal
    ``block``-row pieces (see below).

Both of place and take are the one ``move_rows_kernel`` (``out[dst_start + j] =
src[src_start + j]``); the schedules' :class:`dpx.steps.Move` runs it through
:func:`move_into`. ``start`` and ``count`` are each a Python int (checked against the
shapes here) or a one-element int32 tensor on ``src``'s device (read by the kernel: no host
sync, CUDA-graph replayable; a wrong value there is clipped to the buffers by the kernel's
masks, never out of bounds). On CUDA the compiled Triton kernels run; on CPU the same
kernels run in Triton's interpreter. ``tile`` (a :class:`dpx.kernels.Tile`) sets the
launch shape. Place and take are adjoint (``<place(x), y> == <x, take(y)>`` for equal
``start``/``count``), which is how their gradients are defined.

Launch paths: eager calls launch the kernel directly; calls traced by ``torch.compile`` go
through the ``torch.library`` custom ops (``dpx::*``), which have fake implementations and
autograd rules. Both run the same launcher. The eager path skips the custom op's
dispatcher because it costs host time a serving step pays on every call (see
benchmarks/README.md, "Host overhead of a gather").
"""

from __future__ import annotations

from typing import Callable, Union

import torch

from dpx.errors import DpxTypeError, DpxValueError
from dpx.kernels import launch as _launch
from dpx.kernels import rows as _rows
from dpx.kernels.launch import Tile

Index = Union[int, torch.Tensor]

__all__ = ["Index", "move_into", "pack_into", "pack_rows", "place_rows", "take_rows",
           "unpack_into", "unpack_rows", "zero_into", "zero_rows_"]


class _Interpreted:
    """Triton-interpreter wrappers of the ``dpx.kernels`` (CPU tensors), made on first use
    and kept: one per kernel, a fixed set."""

    def __init__(self) -> None:
        self._fns: dict[object, Callable] = {}

    def __call__(self, kernel) -> Callable:
        fn = self._fns.get(kernel)
        if fn is None:
            from triton.runtime.interpreter import InterpretedFunction

            fn = self._fns[kernel] = InterpretedFunction(kernel.fn)
        return fn


#: The interpreter wrappers of this process (bounded by the number of kernels).
INTERPRETED = _Interpreted()


def kernel_for(kernel, device: torch.device):
    """``kernel`` (a ``dpx.kernels`` JIT function) for ``device``: compiled on CUDA,
    interpreted on CPU."""
    if device.type == "cuda":
        return kernel
    if device.type == "cpu":
        return INTERPRETED(kernel)
    raise DpxValueError(f"device {device} is not supported: dpx kernels run on cuda or cpu")


def width_of(t: torch.Tensor) -> int:
    w = 1
    for s in t.shape[1:]:
        w *= s
    return w


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


def _parts(v: Index) -> tuple[torch.Tensor | None, int]:
    return (v, 0) if isinstance(v, torch.Tensor) else (None, v)


def _launch_move(src: torch.Tensor, ss: torch.Tensor | None, ds: torch.Tensor | None,
                 c: torch.Tensor | None, ss_v: int, ds_v: int, c_v: int, out: torch.Tensor,
                 tile: Tile | None = None) -> None:
    rows, width = out.shape[0], width_of(out)
    if out.numel() == 0:
        return
    if tile is None:
        tile = _launch.tile_for(rows, width, out.element_size(), src_rows=src.shape[0])
    block_r, block_c, warps = _launch.row_blocks(width, tile)
    grid = (-(-rows // block_r), -(-width // block_c))
    kernel_for(_rows.move_rows_kernel, out.device)[grid](
        src, src if ss is None else ss, src if ds is None else ds, src if c is None else c,
        ss_v, ds_v, c_v, src.shape[0], rows, out, WIDTH=width, SRC_START_PTR=ss is not None,
        DST_START_PTR=ds is not None, COUNT_PTR=c is not None, BLOCK_R=block_r,
        BLOCK_C=block_c, WIDE=_launch.wide(src.numel(), out.numel()), STREAM=tile.stream,
        num_warps=warps)


def _launch_zero(out: torch.Tensor, s: torch.Tensor | None, c: torch.Tensor | None, s_v: int,
                 c_v: int, tile: Tile | None = None) -> None:
    rows, width = out.shape[0], width_of(out)
    if out.numel() == 0:
        return
    if tile is None:
        tile = _launch.tile_for(rows, width, out.element_size(), src_rows=0)
    block_r, block_c, warps = _launch.row_blocks(width, tile)
    grid = (-(-rows // block_r), -(-width // block_c))
    anchor = out if s is None else s
    kernel_for(_rows.zero_rows_kernel, out.device)[grid](
        anchor, anchor if c is None else c, s_v, c_v, rows, out, WIDTH=width,
        START_PTR=s is not None, COUNT_PTR=c is not None, BLOCK_R=block_r, BLOCK_C=block_c,
        WIDE=_launch.wide(out.numel()), STREAM=tile.stream, num_warps=warps)


# ---------------------------------------------------------------- torch.library ops
# Out-variants mutate ``out``; functional variants allocate and are differentiable.
# ``tile`` travels as ``[elems, warps, max_block_c, stream]`` (a custom op takes no
# dataclass).

def _tile(t: list[int]) -> Tile | None:
    return Tile(t[0], t[1], t[2], bool(t[3])) if t else None


def _tile_list(t: Tile | None) -> list[int]:
    """A tile as a custom op takes it (``[]``: chosen by size, :func:`tile_for`)."""
    return [] if t is None else [t.elems, t.warps, t.max_block_c, int(t.stream)]


@torch.library.custom_op("dpx::move_rows_out", mutates_args=("out",))
def _move_rows_out(src: torch.Tensor, src_start: torch.Tensor | None,
                   dst_start: torch.Tensor | None, count: torch.Tensor | None,
                   src_start_val: int, dst_start_val: int, count_val: int,
                   out: torch.Tensor, tile: list[int]) -> None:
    _launch_move(src, src_start, dst_start, count, src_start_val, dst_start_val, count_val,
                 out, _tile(tile))


@_move_rows_out.register_fake
def _(src, src_start, dst_start, count, src_start_val, dst_start_val, count_val, out,
      tile) -> None:
    return None


@torch.library.custom_op("dpx::zero_rows_", mutates_args=("out",))
def _zero_rows_(out: torch.Tensor, start: torch.Tensor | None, count: torch.Tensor | None,
                start_val: int, count_val: int, tile: list[int]) -> None:
    _launch_zero(out, start, count, start_val, count_val, _tile(tile))


@_zero_rows_.register_fake
def _(out, start, count, start_val, count_val, tile) -> None:
    return None


@torch.library.custom_op("dpx::move_rows", mutates_args=())
def _move_rows(src: torch.Tensor, src_start: torch.Tensor | None,
               dst_start: torch.Tensor | None, count: torch.Tensor | None, src_start_val: int,
               dst_start_val: int, count_val: int, rows: int,
               tile: list[int]) -> torch.Tensor:
    out = src.new_empty((rows, *src.shape[1:]))
    _launch_move(src, src_start, dst_start, count, src_start_val, dst_start_val, count_val,
                 out, _tile(tile))
    return out


@_move_rows.register_fake
def _(src, src_start, dst_start, count, src_start_val, dst_start_val, count_val, rows, tile):
    return src.new_empty((rows, *src.shape[1:]))


def _move_ctx(ctx, inputs, output) -> None:
    src, ss, ds, c, ss_v, ds_v, c_v, rows, tile = inputs
    ctx.src_rows = src.shape[0]
    ctx.index = (ss, ds, c, ss_v, ds_v, c_v)
    ctx.tile = tile


def _move_backward(ctx, grad):
    ss, ds, c, ss_v, ds_v, c_v = ctx.index  # the adjoint moves the rows back
    g = _move_rows(grad.contiguous(), ds, ss, c, ds_v, ss_v, c_v, ctx.src_rows, ctx.tile)
    return g, None, None, None, None, None, None, None, None


torch.library.register_autograd("dpx::move_rows", _move_backward, setup_context=_move_ctx)


# ---------------------------------------------------------------- public launchers
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
    want = (rows, *src.shape[1:])
    if tuple(out.shape) != want or out.dtype != src.dtype or out.device != src.device:
        raise DpxValueError(
            f"{name}: out has shape {tuple(out.shape)} {out.dtype} on {out.device}; it must "
            f"be {want} {src.dtype} on {src.device}")
    if not out.is_contiguous():
        raise DpxValueError(f"{name}: out must be contiguous")
    if not torch.compiler.is_compiling() and overlaps(src, out):
        raise DpxValueError(f"{name}: out and src share memory; they must not alias")


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors' memory ranges overlap (two live allocations never share an
    address, so comparing the byte ranges is enough). Call it outside torch.compile
    tracing only: data pointers do not exist there."""
    a0, b0, na, nb = a.data_ptr(), b.data_ptr(), a.nbytes, b.nbytes
    return bool(na and nb) and a0 < b0 + nb and b0 < a0 + na


def _both_ints(start: Index, count: Index) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) for v in (start, count))


def _move(src: torch.Tensor, ss: Index, ds: Index, count: Index, rows: int,
          out: torch.Tensor | None, tile: Tile | None) -> torch.Tensor:
    ss_t, ss_v = _split_index("start", ss, src.device)
    ds_t, ds_v = _split_index("start", ds, src.device)
    c_t, c_v = _split_index("count", count, src.device)
    if not torch.compiler.is_compiling() and not (src.requires_grad and torch.is_grad_enabled()):
        if out is None:
            out = src.new_empty((rows, *src.shape[1:]))
        _launch_move(src, ss_t, ds_t, c_t, ss_v, ds_v, c_v, out, tile)
        return out
    if out is None:
        return _move_rows(src, ss_t, ds_t, c_t, ss_v, ds_v, c_v, rows, _tile_list(tile))
    _move_rows_out(src, ss_t, ds_t, c_t, ss_v, ds_v, c_v, out, _tile_list(tile))
    return out


def place_rows(src: torch.Tensor, start: Index, count: Index, rows: int, *,
               out: torch.Tensor | None = None, tile: Tile | None = None) -> torch.Tensor:
    """``src [m, *rest] -> out [rows, *rest]`` with ``out[start:start+count] = src[:count]``,
    zeros elsewhere. Python-int ``start``/``count`` must satisfy ``count <= m`` and
    ``start + count <= rows``. Differentiable (adjoint: :func:`take_rows`)."""
    _check_src_out("place_rows", src, rows, out)
    if _both_ints(start, count):
        if count > src.shape[0] or start + count > rows:
            raise DpxValueError(
                f"place_rows: start={start}, count={count} must satisfy count <= src rows "
                f"({src.shape[0]}) and start + count <= rows ({rows})")
    return _move(src, 0, start, count, rows, out, tile)


def take_rows(src: torch.Tensor, start: Index, count: Index, rows: int, *,
              out: torch.Tensor | None = None, tile: Tile | None = None) -> torch.Tensor:
    """``src [m, *rest] -> out [rows, *rest]`` with ``out[:count] = src[start:start+count]``,
    zeros elsewhere. Python-int ``start``/``count`` must satisfy ``start + count <= m`` and
    ``count <= rows``. Differentiable (adjoint: :func:`place_rows`)."""
    _check_src_out("take_rows", src, rows, out)
    if _both_ints(start, count):
        if start + count > src.shape[0] or count > rows:
            raise DpxValueError(
                f"take_rows: start={start}, count={count} must satisfy start + count <= src "
                f"rows ({src.shape[0]}) and count <= rows ({rows})")
    return _move(src, start, 0, count, rows, out, tile)


def move_into(src: torch.Tensor, src_start: Index, dst_start: Index, count: Index,
              out: torch.Tensor) -> torch.Tensor:
    """``out[dst_start + j] = src[src_start + j]`` for ``j < count``, zeros elsewhere,
    without argument checks (the interpreter's: its schedules are checked by the planner);
    not differentiable."""
    ss_t, ss_v = _parts(src_start)
    ds_t, ds_v = _parts(dst_start)
    c_t, c_v = _parts(count)
    if torch.compiler.is_compiling():
        _move_rows_out(src, ss_t, ds_t, c_t, ss_v, ds_v, c_v, out, [])
    else:
        _launch_move(src, ss_t, ds_t, c_t, ss_v, ds_v, c_v, out)
    return out


def zero_into(out: torch.Tensor, keep_start: Index, keep_count: Index) -> torch.Tensor:
    """In place, unchecked: zero the rows of ``out`` outside ``[keep_start, keep_start +
    keep_count)``."""
    s_t, s_v = _parts(keep_start)
    c_t, c_v = _parts(keep_count)
    if torch.compiler.is_compiling():
        _zero_rows_(out, s_t, c_t, s_v, c_v, [])
    else:
        _launch_zero(out, s_t, c_t, s_v, c_v)
    return out


def zero_rows_(out: torch.Tensor, keep_start: Index, keep_count: Index, *,
               tile: Tile | None = None) -> torch.Tensor:
    """In place: every row of ``out`` outside ``[keep_start, keep_start + keep_count)``
    becomes 0 (the kept rows are neither read nor written)."""
    s_t, s_v = _split_index("keep_start", keep_start, out.device)
    c_t, c_v = _split_index("keep_count", keep_count, out.device)
    if torch.compiler.is_compiling():
        _zero_rows_(out, s_t, c_t, s_v, c_v, _tile_list(tile))
    else:
        _launch_zero(out, s_t, c_t, s_v, c_v, tile)
    return out


# ---------------------------------------------------------------- chunk tables
# ``unpack_rows(src [n*block, *rest], firsts, lens, rows) -> [rows, *rest]``:
#     ``out[firsts[r] + j] = src[r*block + j]`` for ``j < lens[r]``; other rows 0.
# ``pack_rows(src [m, *rest], firsts, lens, block) -> [n*block, *rest]``:
#     ``out[r*block + j] = src[firsts[r] + j]`` for ``j < lens[r]``; other rows 0.
# ``firsts`` / ``lens``: int32 ``[n]`` tensors on the data's device. The two are adjoint.

def _launch_chunks(kernel, src: torch.Tensor, firsts: torch.Tensor, lens: torch.Tensor,
                   block: int, out: torch.Tensor) -> None:
    rows, width = out.shape[0], width_of(out)
    if out.numel() == 0:
        return
    block_r, block_c, warps = _launch.row_blocks(width, _launch.tile_for(rows, width,
                                                                         out.element_size()))
    grid = (-(-rows // block_r), -(-width // block_c))
    kernel_for(kernel, out.device)[grid](
        src, firsts, lens, src.shape[0], rows, firsts.shape[0], block, out, WIDTH=width,
        BLOCK_R=block_r, BLOCK_C=block_c, num_warps=warps)


@torch.library.custom_op("dpx::unpack_rows_out", mutates_args=("out",))
def _unpack_rows_out(src: torch.Tensor, firsts: torch.Tensor, lens: torch.Tensor, block: int,
                     out: torch.Tensor) -> None:
    _launch_chunks(_rows.unpack_rows_kernel, src, firsts, lens, block, out)


@torch.library.custom_op("dpx::pack_rows_out", mutates_args=("out",))
def _pack_rows_out(src: torch.Tensor, firsts: torch.Tensor, lens: torch.Tensor, block: int,
                   out: torch.Tensor) -> None:
    _launch_chunks(_rows.pack_rows_kernel, src, firsts, lens, block, out)


@_unpack_rows_out.register_fake
def _(src, firsts, lens, block, out) -> None:
    return None


@_pack_rows_out.register_fake
def _(src, firsts, lens, block, out) -> None:
    return None


@torch.library.custom_op("dpx::unpack_rows", mutates_args=())
def _unpack_rows(src: torch.Tensor, firsts: torch.Tensor, lens: torch.Tensor, block: int,
                 rows: int) -> torch.Tensor:
    out = src.new_empty((rows, *src.shape[1:]))
    _launch_chunks(_rows.unpack_rows_kernel, src, firsts, lens, block, out)
    return out


@torch.library.custom_op("dpx::pack_rows", mutates_args=())
def _pack_rows(src: torch.Tensor, firsts: torch.Tensor, lens: torch.Tensor,
               block: int) -> torch.Tensor:
    out = src.new_empty((firsts.shape[0] * block, *src.shape[1:]))
    _launch_chunks(_rows.pack_rows_kernel, src, firsts, lens, block, out)
    return out


@_unpack_rows.register_fake
def _(src, firsts, lens, block, rows):
    return src.new_empty((rows, *src.shape[1:]))


@_pack_rows.register_fake
def _(src, firsts, lens, block):
    return src.new_empty((firsts.shape[0] * block, *src.shape[1:]))


def _chunks_ctx(ctx, inputs, output) -> None:
    src, firsts, lens, block = inputs[:4]
    ctx.table, ctx.block, ctx.src_rows = (firsts, lens), block, src.shape[0]


torch.library.register_autograd(
    "dpx::unpack_rows", lambda ctx, g: (_pack_rows(g.contiguous(), *ctx.table, ctx.block),
                                        None, None, None, None), setup_context=_chunks_ctx)
torch.library.register_autograd(
    "dpx::pack_rows", lambda ctx, g: (_unpack_rows(g.contiguous(), *ctx.table, ctx.block,
                                                   ctx.src_rows), None, None, None),
    setup_context=_chunks_ctx)


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
                rows: int) -> torch.Tensor:
    """``src [n*block, *rest] -> [rows, *rest]``: chunk ``r`` (``src[r*block :
    r*block + lens[r]]``, ``block = src rows // n``) moved to rows ``firsts[r]...``;
    every other row is 0. Chunks must not overlap; the kernel masks every access, so a
    wrong table can never read or write out of bounds. Differentiable (adjoint:
    :func:`pack_rows`)."""
    _check_table("unpack_rows", src, firsts, lens, 0)
    n = firsts.shape[0]
    if n == 0 or src.shape[0] % n:
        raise DpxValueError(f"unpack_rows: src has {src.shape[0]} rows; it must be "
                            f"{n} chunks of equal size")
    _check_src_out("unpack_rows", src, rows, None)
    block = src.shape[0] // n
    if torch.compiler.is_compiling() or (src.requires_grad and torch.is_grad_enabled()):
        return _unpack_rows(src, firsts, lens, block, rows)
    out = src.new_empty((rows, *src.shape[1:]))
    _launch_chunks(_rows.unpack_rows_kernel, src, firsts, lens, block, out)
    return out


def pack_rows(src: torch.Tensor, firsts: torch.Tensor, lens: torch.Tensor,
              block: int) -> torch.Tensor:
    """``src [m, *rest] -> [n*block, *rest]``: ``src[firsts[r] : firsts[r] + lens[r]]``
    moved to rows ``r*block...``, zeros after each chunk. Differentiable (adjoint:
    :func:`unpack_rows`)."""
    _check_table("pack_rows", src, firsts, lens, block)
    if torch.compiler.is_compiling() or (src.requires_grad and torch.is_grad_enabled()):
        return _pack_rows(src, firsts, lens, block)
    out = src.new_empty((firsts.shape[0] * block, *src.shape[1:]))
    _launch_chunks(_rows.pack_rows_kernel, src, firsts, lens, block, out)
    return out


def _chunks_into(kernel, op, src: torch.Tensor, firsts: torch.Tensor, lens: torch.Tensor,
                 block: int, out: torch.Tensor) -> torch.Tensor:
    if torch.compiler.is_compiling():
        op(src, firsts, lens, block, out)
    else:
        _launch_chunks(kernel, src, firsts, lens, block, out)
    return out


def unpack_into(src: torch.Tensor, firsts: torch.Tensor, lens: torch.Tensor, block: int,
                out: torch.Tensor) -> torch.Tensor:
    """:func:`unpack_rows` into ``out`` without checks (the interpreter's)."""
    return _chunks_into(_rows.unpack_rows_kernel, _unpack_rows_out, src, firsts, lens, block,
                        out)


def pack_into(src: torch.Tensor, firsts: torch.Tensor, lens: torch.Tensor, block: int,
              out: torch.Tensor) -> torch.Tensor:
    """:func:`pack_rows` into ``out`` without checks (the interpreter's)."""
    return _chunks_into(_rows.pack_rows_kernel, _pack_rows_out, src, firsts, lens, block, out)
