"""Torch launchers of the ``dpx.kernels`` row kernels, registered as ``torch.library`` ops.

``place_rows(src [m, *rest], start, count, rows) -> out [rows, *rest]``:
    ``out[start + j] = src[j]`` for ``j < count``; every other row is 0.
``take_rows(src [m, *rest], start, count, rows) -> out [rows, *rest]``:
    ``out[j] = src[start + j]`` for ``j < count``; rows ``count..`` are 0.

``start`` and ``count`` are each a Python int (checked against the shapes here) or a
one-element int32 tensor on ``src``'s device (read by the kernel: no host sync, CUDA-graph replayable; a
wrong value there is clipped to the buffers by the kernel's masks, never out of bounds).
On CUDA the compiled Triton kernels run; on CPU the same kernels run in Triton's
interpreter. ``tile`` (a :class:`dpx.kernels.Tile`) sets the launch shape. The two are adjoint: ``<place(x), y> == <x, take(y)>`` for equal
``start``/``count``, which is how their gradients are defined.
"""

from __future__ import annotations

import functools
from typing import Callable, Union

import torch

from dpx.errors import DpxTypeError, DpxValueError
from dpx.kernels import launch as _launch
from dpx.kernels import rows as _rows
from dpx.kernels.launch import DEFAULT_TILE, Tile

Index = Union[int, torch.Tensor]


@functools.cache
def _interpreted(module, kernel_name: str) -> Callable:
    from triton.runtime.interpreter import InterpretedFunction

    return InterpretedFunction(getattr(module, kernel_name).fn)


def _kernel_of(module, kernel_name: str, device: torch.device):
    """Kernel ``kernel_name`` of ``module`` (a ``dpx.kernels`` module) for ``device``:
    compiled on CUDA, interpreted on CPU."""
    if device.type == "cuda":
        return getattr(module, kernel_name)
    if device.type == "cpu":
        return _interpreted(module, kernel_name)
    raise DpxValueError(f"device {device} is not supported: dpx kernels run on cuda or cpu")


def _kernel(kernel_name: str, device: torch.device):
    return _kernel_of(_rows, kernel_name, device)


def _width(t: torch.Tensor) -> int:
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


def _launch_rows(kernel_name: str, src: torch.Tensor | None, start: torch.Tensor | None,
                 count: torch.Tensor | None, start_val: int, count_val: int,
                 out: torch.Tensor, tile: Tile = DEFAULT_TILE) -> None:
    rows, width = out.shape[0], _width(out)
    if out.numel() == 0:
        return
    block_r, block_c, warps = _launch.row_blocks(width, tile)
    grid = (-(-rows // block_r), -(-width // block_c))
    anchor = out if src is None else src
    sp = anchor if start is None else start
    cp = anchor if count is None else count
    flags = dict(START_PTR=start is not None, COUNT_PTR=count is not None)
    kern = _kernel(kernel_name, out.device)
    if src is None:
        kern[grid](sp, cp, start_val, count_val, rows, out, WIDTH=width, **flags,
                   BLOCK_R=block_r, BLOCK_C=block_c, num_warps=warps)
    else:
        kern[grid](src, sp, cp, start_val, count_val, src.shape[0], rows, out, WIDTH=width,
                   **flags, BLOCK_R=block_r, BLOCK_C=block_c, num_warps=warps)


# ---------------------------------------------------------------- torch.library ops
# Out-variants mutate ``out``; functional variants allocate and are differentiable.
# ``tile`` travels as ``[elems, warps, max_block_c]`` (a custom op takes no dataclass).

def _tile(t: list[int]) -> Tile:
    return Tile(*t)


def _tile_list(t: Tile) -> list[int]:
    return [t.elems, t.warps, t.max_block_c]


@torch.library.custom_op("dpx::place_rows_out", mutates_args=("out",))
def _place_rows_out(src: torch.Tensor, start: torch.Tensor | None, count: torch.Tensor | None,
                    start_val: int, count_val: int, out: torch.Tensor, tile: list[int]) -> None:
    _launch_rows("place_rows_kernel", src, start, count, start_val, count_val, out, _tile(tile))


@torch.library.custom_op("dpx::take_rows_out", mutates_args=("out",))
def _take_rows_out(src: torch.Tensor, start: torch.Tensor | None, count: torch.Tensor | None,
                   start_val: int, count_val: int, out: torch.Tensor, tile: list[int]) -> None:
    _launch_rows("take_rows_kernel", src, start, count, start_val, count_val, out, _tile(tile))


@torch.library.custom_op("dpx::zero_rows_", mutates_args=("out",))
def _zero_rows_(out: torch.Tensor, start: torch.Tensor | None, count: torch.Tensor | None,
                start_val: int, count_val: int, tile: list[int]) -> None:
    _launch_rows("zero_rows_kernel", None, start, count, start_val, count_val, out, _tile(tile))


@_place_rows_out.register_fake
def _(src, start, count, start_val, count_val, out, tile) -> None:
    return None


@_take_rows_out.register_fake
def _(src, start, count, start_val, count_val, out, tile) -> None:
    return None


@_zero_rows_.register_fake
def _(out, start, count, start_val, count_val, tile) -> None:
    return None


@torch.library.custom_op("dpx::place_rows", mutates_args=())
def _place_rows(src: torch.Tensor, start: torch.Tensor | None, count: torch.Tensor | None,
                start_val: int, count_val: int, rows: int, tile: list[int]) -> torch.Tensor:
    out = src.new_empty((rows, *src.shape[1:]))
    _launch_rows("place_rows_kernel", src, start, count, start_val, count_val, out, _tile(tile))
    return out


@torch.library.custom_op("dpx::take_rows", mutates_args=())
def _take_rows(src: torch.Tensor, start: torch.Tensor | None, count: torch.Tensor | None,
               start_val: int, count_val: int, rows: int, tile: list[int]) -> torch.Tensor:
    out = src.new_empty((rows, *src.shape[1:]))
    _launch_rows("take_rows_kernel", src, start, count, start_val, count_val, out, _tile(tile))
    return out


@_place_rows.register_fake
def _(src, start, count, start_val, count_val, rows, tile):
    return src.new_empty((rows, *src.shape[1:]))


@_take_rows.register_fake
def _(src, start, count, start_val, count_val, rows, tile):
    return src.new_empty((rows, *src.shape[1:]))


def _setup_ctx(ctx, inputs, output) -> None:
    src, start, count, start_val, count_val, rows, tile = inputs
    ctx.src_rows = src.shape[0]
    ctx.index = (start, count, start_val, count_val)
    ctx.tile = tile


def _place_backward(ctx, grad):
    g = _take_rows(grad.contiguous(), *ctx.index, ctx.src_rows, ctx.tile)
    return g, None, None, None, None, None, None


def _take_backward(ctx, grad):
    g = _place_rows(grad.contiguous(), *ctx.index, ctx.src_rows, ctx.tile)
    return g, None, None, None, None, None, None


torch.library.register_autograd("dpx::place_rows", _place_backward, setup_context=_setup_ctx)
torch.library.register_autograd("dpx::take_rows", _take_backward, setup_context=_setup_ctx)


# ---------------------------------------------------------------- public launchers

_KERNEL_OF = {_place_rows_out: "place_rows_kernel", _take_rows_out: "take_rows_kernel"}


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


def _call(functional, out_op, src, start, count, rows, out, tile: Tile):
    s_t, s_v = _split_index("start", start, src.device)
    c_t, c_v = _split_index("count", count, src.device)
    if not torch.compiler.is_compiling() and not (src.requires_grad and torch.is_grad_enabled()):
        # eager fast path: launch directly (the torch.library dispatch costs ~20 us a call)
        if out is None:
            out = src.new_empty((rows, *src.shape[1:]))
        _launch_rows(_KERNEL_OF[out_op], src, s_t, c_t, s_v, c_v, out, tile)
        return out
    if out is None:
        return functional(src, s_t, c_t, s_v, c_v, rows, _tile_list(tile))
    out_op(src, s_t, c_t, s_v, c_v, out, _tile_list(tile))
    return out


def place_rows(src: torch.Tensor, start: Index, count: Index, rows: int, *,
               out: torch.Tensor | None = None, tile: Tile = DEFAULT_TILE) -> torch.Tensor:
    """``src [m, *rest] -> out [rows, *rest]`` with ``out[start:start+count] = src[:count]``,
    zeros elsewhere. Python-int ``start``/``count`` must satisfy ``count <= m`` and
    ``start + count <= rows``."""
    _check_src_out("place_rows", src, rows, out)
    if _both_ints(start, count):
        if count > src.shape[0] or start + count > rows:
            raise DpxValueError(
                f"place_rows: start={start}, count={count} must satisfy count <= src rows "
                f"({src.shape[0]}) and start + count <= rows ({rows})")
    return _call(_place_rows, _place_rows_out, src, start, count, rows, out, tile)


def take_rows(src: torch.Tensor, start: Index, count: Index, rows: int, *,
              out: torch.Tensor | None = None, tile: Tile = DEFAULT_TILE) -> torch.Tensor:
    """``src [m, *rest] -> out [rows, *rest]`` with ``out[:count] = src[start:start+count]``,
    zeros elsewhere. Python-int ``start``/``count`` must satisfy ``start + count <= m`` and
    ``count <= rows``."""
    _check_src_out("take_rows", src, rows, out)
    if _both_ints(start, count):
        if start + count > src.shape[0] or count > rows:
            raise DpxValueError(
                f"take_rows: start={start}, count={count} must satisfy start + count <= src "
                f"rows ({src.shape[0]}) and count <= rows ({rows})")
    return _call(_take_rows, _take_rows_out, src, start, count, rows, out, tile)


def _into(kernel: str, op, src: torch.Tensor, start: Index, count: Index,
          out: torch.Tensor) -> torch.Tensor:
    s_t, s_v = (start, 0) if isinstance(start, torch.Tensor) else (None, start)
    c_t, c_v = (count, 0) if isinstance(count, torch.Tensor) else (None, count)
    if torch.compiler.is_compiling():
        op(src, s_t, c_t, s_v, c_v, out, _tile_list(DEFAULT_TILE))
    else:
        _launch_rows(kernel, src, s_t, c_t, s_v, c_v, out)
    return out


def place_into(src: torch.Tensor, start: Index, count: Index, out: torch.Tensor) -> torch.Tensor:
    """:func:`place_rows` into ``out`` without argument checks, for callers that validated
    already (``DpComm``'s interpreter); not differentiable."""
    return _into("place_rows_kernel", _place_rows_out, src, start, count, out)


def take_into(src: torch.Tensor, start: Index, count: Index, out: torch.Tensor) -> torch.Tensor:
    """:func:`take_rows` into ``out`` without argument checks (see :func:`place_into`)."""
    return _into("take_rows_kernel", _take_rows_out, src, start, count, out)


def zero_from_(out: torch.Tensor, start: Index) -> torch.Tensor:
    """In place, unchecked: zero rows ``j >= start`` of ``out``."""
    s_t, s_v = (start, 0) if isinstance(start, torch.Tensor) else (None, start)
    if torch.compiler.is_compiling():
        _zero_rows_(out, s_t, None, s_v, 0, _tile_list(DEFAULT_TILE))
    else:
        _launch_rows("zero_rows_kernel", None, s_t, None, s_v, 0, out)
    return out


def zero_rows_(out: torch.Tensor, start: Index, count: Index, *,
               tile: Tile = DEFAULT_TILE) -> torch.Tensor:
    """In place: zero rows ``j >= start + count`` of ``out`` (the pad tail of a slot)."""
    s_t, s_v = _split_index("start", start, out.device)
    c_t, c_v = _split_index("count", count, out.device)
    if torch.compiler.is_compiling():
        _zero_rows_(out, s_t, c_t, s_v, c_v, _tile_list(tile))
    else:
        _launch_rows("zero_rows_kernel", None, s_t, c_t, s_v, c_v, out, tile)
    return out


# ---------------------------------------------------------------- chunk tables
# ``unpack_rows(src [n*block, *rest], firsts, lens, rows) -> [rows, *rest]``:
#     ``out[firsts[r] + j] = src[r*block + j]`` for ``j < lens[r]``; other rows 0.
# ``pack_rows(src [m, *rest], firsts, lens, block) -> [n*block, *rest]``:
#     ``out[r*block + j] = src[firsts[r] + j]`` for ``j < lens[r]``; other rows 0.
# ``firsts`` / ``lens``: int32 ``[n]`` tensors on the data's device. The two are adjoint.

def _launch_chunks(kernel_name: str, src: torch.Tensor, firsts: torch.Tensor,
                   lens: torch.Tensor, block: int, out: torch.Tensor,
                   tile: Tile = DEFAULT_TILE) -> None:
    rows, width = out.shape[0], _width(out)
    if out.numel() == 0:
        return
    block_r, block_c, warps = _launch.row_blocks(width, tile)
    grid = (-(-rows // block_r), -(-width // block_c))
    _kernel(kernel_name, out.device)[grid](
        src, firsts, lens, src.shape[0], rows, firsts.shape[0], block, out, WIDTH=width,
        BLOCK_R=block_r, BLOCK_C=block_c, num_warps=warps)


@torch.library.custom_op("dpx::unpack_rows_out", mutates_args=("out",))
def _unpack_rows_out(src: torch.Tensor, firsts: torch.Tensor, lens: torch.Tensor, block: int,
                     out: torch.Tensor) -> None:
    _launch_chunks("unpack_rows_kernel", src, firsts, lens, block, out)


@torch.library.custom_op("dpx::pack_rows_out", mutates_args=("out",))
def _pack_rows_out(src: torch.Tensor, firsts: torch.Tensor, lens: torch.Tensor, block: int,
                   out: torch.Tensor) -> None:
    _launch_chunks("pack_rows_kernel", src, firsts, lens, block, out)


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
    _launch_chunks("unpack_rows_kernel", src, firsts, lens, block, out)
    return out


@torch.library.custom_op("dpx::pack_rows", mutates_args=())
def _pack_rows(src: torch.Tensor, firsts: torch.Tensor, lens: torch.Tensor,
               block: int) -> torch.Tensor:
    out = src.new_empty((firsts.shape[0] * block, *src.shape[1:]))
    _launch_chunks("pack_rows_kernel", src, firsts, lens, block, out)
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
    _launch_chunks("unpack_rows_kernel", src, firsts, lens, block, out)
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
    _launch_chunks("pack_rows_kernel", src, firsts, lens, block, out)
    return out


def _chunks_into(kernel: str, op, src: torch.Tensor, firsts: torch.Tensor, lens: torch.Tensor,
                 block: int, out: torch.Tensor) -> torch.Tensor:
    if torch.compiler.is_compiling():
        op(src, firsts, lens, block, out)
    else:
        _launch_chunks(kernel, src, firsts, lens, block, out)
    return out


def unpack_into(src: torch.Tensor, firsts: torch.Tensor, lens: torch.Tensor, block: int,
                out: torch.Tensor) -> torch.Tensor:
    """:func:`unpack_rows` into ``out`` without checks (the interpreter's)."""
    return _chunks_into("unpack_rows_kernel", _unpack_rows_out, src, firsts, lens, block, out)


def pack_into(src: torch.Tensor, firsts: torch.Tensor, lens: torch.Tensor, block: int,
              out: torch.Tensor) -> torch.Tensor:
    """:func:`pack_rows` into ``out`` without checks (the interpreter's)."""
    return _chunks_into("pack_rows_kernel", _pack_rows_out, src, firsts, lens, block, out)
