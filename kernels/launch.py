"""Every kernel's launch, for both frontends: one :class:`Launch` description per kernel
(its grid, warps and constexpr arguments, and which runtime arguments are pointers) from
the buffers' shapes, built on the launch shapes below (the tile, the grid, the index
width) -- pure functions of those shapes, so a torch launch and a jax-triton launch of the
same kernel on the same shapes compile to the same program. A frontend passes the runtime
arguments in the kernel's signature order (the output last, jax-triton's convention) and
the description's constexprs by name."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from dpx import wire as W
from dpx.kernels import combine as _combine
from dpx.kernels import counts as _counts
from dpx.kernels import fp4 as _fp4
from dpx.kernels import mask as _mask
from dpx.kernels import peer as _peer
from dpx.kernels import rows as _rows
from dpx.kernels import wire as _wire
from dpx.modes import Wire

__all__ = [
    "block_grid", "block_shape", "BLOCK_SHAPES", "BlockShape", "check_launch",
    "chunks_launch", "DEFAULT_TILE", "dequantize_launch", "dequantize_sum_launch",
    "fp4_scale", "grid", "Launch", "mask_launch", "move_launch", "OUT_KIND",
    "peer_barrier_launch", "peer_move_tile", "peer_put_launch", "PEER_SUM_TILE",
    "peer_sum_launch", "peer_take_launch", "peer_wire_sum_launch", "QUANTIZE_BY_BYTES",
    "quantize_grid", "quantize_launch", "quantize_shape", "QuantizeShape", "row_blocks",
    "STREAM_BYTES", "Tile", "tile_for", "TILES_BY_BYTES", "wide", "zero_launch"
]


def _pow2_at_least(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 1 else 1


@dataclass(frozen=True)
class Tile:
    """How many elements one program moves, with how many warps, and the widest column
    block."""

    elems: int = 4096
    warps: int = 16
    max_block_c: int = 1024
    #: streaming stores (``.cs``: written once, evicted first) instead of write-back ones
    stream: bool = False


DEFAULT_TILE = Tile()

#: The tile of the row kernels by the bytes a launch writes: (up to this many bytes, tile);
#: chosen by ``benchmarks/launch_sweep.py`` on an H200 (see benchmarks/README.md).
TILES_BY_BYTES: tuple[tuple[int, Tile], ...] = (
    (16 * 2**20, DEFAULT_TILE),
    (2**62, Tile(8192, 16, 2048)),
)

#: A pass that writes at least this many bytes, mostly zeros (it reads at most half the
#: rows it writes), stores with ``.cs``: measured by ``benchmarks/place_probe.py`` on an
#: H200, a slot place of 28 / 56 / 112 MiB went from 0.69 / 0.87 / 0.90 to 0.74 / 1.09 /
#: 1.06 of a copy of the same traffic; below 16 MiB it made no difference.
STREAM_BYTES = 16 * 2**20


#: Each tile of :data:`TILES_BY_BYTES` with streaming stores (a constant table).
_STREAMED = {t: replace(t, stream=True) for _, t in TILES_BY_BYTES}
#: Each tile (streamed or not) for rows of 1-byte elements (the quantized wires' rows): twice
#: the elements and the column block, so a thread moves the bytes it moves on 2-byte rows
#: (a tile counts elements: on byte rows it moved half of them).
_BYTE_TILES = {t: replace(t, elems=2 * t.elems, max_block_c=2 * t.max_block_c)
               for t in [*_STREAMED, *_STREAMED.values()]}


def tile_for(rows: int, width: int, itemsize: int, *, src_rows: int | None = None) -> Tile:
    """The launch tile of a row pass writing ``rows x width`` elements of ``itemsize``
    bytes from ``src_rows`` source rows (``0``: a pass that only writes zeros; ``None``:
    unknown), what both frontends launch with unless a caller passes a tile."""
    nbytes = rows * width * itemsize
    for limit, tile in TILES_BY_BYTES:
        if nbytes <= limit:
            break
    else:
        tile = DEFAULT_TILE
    if src_rows is not None and 2 * src_rows <= rows and nbytes >= STREAM_BYTES:
        tile = _STREAMED[tile]
    return _BYTE_TILES[tile] if itemsize == 1 else tile


@dataclass(frozen=True)
class QuantizeShape:
    """fp8 quantize's launch: rows x 128-element groups per program, and warps."""

    block_r: int = 8
    block_g: int = 4
    warps: int = 4


#: fp8 quantize's launch by the bytes it moves (bf16/fp32 rows read + wire rows written):
#: (up to this many bytes, shape); chosen by ``benchmarks/launch_sweep.py`` on an H200,
#: where 2 rows x 8 groups beat 8 x 4 below 24 MiB (0.71 against 0.64 of a copy at 5 MiB)
#: and from 512 MiB up.
QUANTIZE_BY_BYTES: tuple[tuple[int, QuantizeShape], ...] = (
    (24 * 2**20, QuantizeShape(2, 8, 4)),
    (512 * 2**20, QuantizeShape(8, 4, 4)),
    (2**62, QuantizeShape(2, 8, 4)),
)


def quantize_shape(rows: int, hidden: int, itemsize: int) -> QuantizeShape:
    """The launch of an fp8 quantize writing ``rows`` wire rows of ``hidden`` elements read
    at ``itemsize`` bytes (both frontends launch with it)."""
    nbytes = rows * (hidden * itemsize + hidden + hidden // 128 * 4)
    return next((q for limit, q in QUANTIZE_BY_BYTES if nbytes <= limit), QuantizeShape())


def quantize_grid(rows: int, hidden: int, q: QuantizeShape) -> tuple[int, int]:
    """Programs of an fp8 quantize writing ``rows`` wire rows."""
    return -(-rows // q.block_r), -(-(hidden // 128) // q.block_g)


@dataclass(frozen=True)
class BlockShape:
    """A launch over whole scale blocks (the fp4 kernels, the fp8 dequantize, the summing
    passes): blocks per program, and warps."""

    block_b: int
    warps: int


#: The launch of each pass over scale blocks by (pass, elements per block: 128 fp8's groups,
#: 16 nvfp4, 32 mxfp4), chosen by ``benchmarks/wire_sweep.py`` on an H100
#: (its section of benchmarks/README.md: The wire kernels); ``sum`` is the combine's
#: summing pass (and the peer transport's).
BLOCK_SHAPES: dict[tuple[str, int], BlockShape] = {
    ("quantize", 16): BlockShape(64, 2), ("quantize", 32): BlockShape(128, 4),
    ("dequantize", 128): BlockShape(16, 4), ("dequantize", 16): BlockShape(64, 2),
    ("dequantize", 32): BlockShape(128, 4),
    ("sum", 128): BlockShape(16, 4), ("sum", 16): BlockShape(64, 2), ("sum", 32): BlockShape(64, 4),
}


def block_shape(kind: str, block: int) -> BlockShape:
    """The launch of pass ``kind`` (``"quantize"``, ``"dequantize"``, ``"sum"``) over
    blocks of ``block`` elements (both frontends launch with it)."""
    return BLOCK_SHAPES[(kind, block)]


def block_grid(rows: int, hidden: int, block: int, shape: BlockShape) -> tuple[int]:
    """Programs of a pass over the blocks of ``rows`` rows of ``hidden`` elements."""
    return (-(-rows * (hidden // block) // shape.block_b),)


def fp4_scale(g: float | None) -> float:
    """The kernels' global-scale argument: nvfp4's ``g``, else 0.0 (mxfp4 reads none; not
    1.0, which jax-triton would compile as a constant, other PTX than torch's launch)."""
    return 0.0 if g is None else g


def wide(*elements: int) -> bool:
    """Whether a kernel over buffers of these element counts needs int64 index math."""
    return max(elements, default=0) >= 2**31 - 1


def row_blocks(width: int, tile: Tile = DEFAULT_TILE) -> tuple[int, int, int]:
    """``(BLOCK_R, BLOCK_C, num_warps)`` for rows of ``width`` elements."""
    block_c = min(_pow2_at_least(max(width, 1)), tile.max_block_c)
    block_r = max(1, tile.elems // block_c)
    return block_r, block_c, tile.warps if block_r * block_c >= 4096 else 4


def grid(out_rows: int, width: int, tile: Tile = DEFAULT_TILE) -> tuple[int, int]:
    """Programs for an output of ``out_rows x width`` (depends only on the shape)."""
    block_r, block_c, _ = row_blocks(width, tile)
    return (-(-out_rows // block_r), -(-width // block_c))


# ---------------------------------------------------------------- launch descriptions
class Launch(NamedTuple):
    """One kernel launch as both frontends make it: ``kernel[grid](*runtime_args,
    **consts, num_warps=warps)``, the runtime arguments in the kernel's signature order,
    of which those at ``pointers`` are buffers (or int32 device scalars)."""

    kernel: Any
    grid: tuple[int, ...]
    warps: int
    consts: dict[str, Any]
    pointers: tuple[int, ...]


#: The dequantize kernels' ``OUT_KIND`` by output dtype name.
OUT_KIND = {"float32": 0, "bfloat16": 1, "float16": 2}


def _rows_launch(kernel, rows: int, width: int, tile: Tile, consts: dict,
                 pointers: tuple[int, ...]) -> Launch:
    block_r, block_c, warps = row_blocks(width, tile)
    return Launch(kernel, grid(rows, width, tile), warps,
                  dict(WIDTH=width, **consts, BLOCK_R=block_r, BLOCK_C=block_c), pointers)


def move_launch(src_rows: int, out_rows: int, width: int, itemsize: int, *,
                src_start_ptr: bool, dst_start_ptr: bool, count_ptr: bool,
                tile: Tile | None = None) -> Launch:
    """:func:`~dpx.kernels.rows.move_rows_kernel` of ``src [src_rows, width] -> out
    [out_rows, width]``; ``*_ptr``: that index is read from device memory."""
    t = tile or tile_for(out_rows, width, itemsize, src_rows=src_rows)
    lt = _rows_launch(_rows.move_rows_kernel, out_rows, width, t, dict(
        SRC_START_PTR=src_start_ptr, DST_START_PTR=dst_start_ptr, COUNT_PTR=count_ptr),
        (0, 1, 2, 3, 9))
    lt.consts.update(WIDE=wide(src_rows * width, out_rows * width), STREAM=t.stream)
    return lt


def zero_launch(out_rows: int, width: int, itemsize: int, *, start_ptr: bool,
                count_ptr: bool, tile: Tile | None = None) -> Launch:
    """:func:`~dpx.kernels.rows.zero_rows_kernel` of ``out [out_rows, width]``."""
    t = tile or tile_for(out_rows, width, itemsize, src_rows=0)
    lt = _rows_launch(_rows.zero_rows_kernel, out_rows, width, t,
                      dict(START_PTR=start_ptr, COUNT_PTR=count_ptr), (0, 1, 5))
    lt.consts.update(WIDE=wide(out_rows * width), STREAM=t.stream)
    return lt


def chunks_launch(pack: bool, out_rows: int, width: int, itemsize: int) -> Launch:
    """:func:`~dpx.kernels.rows.pack_rows_kernel` (``pack``) or ``unpack_rows_kernel``
    writing ``out [out_rows, width]``."""
    kernel = _rows.pack_rows_kernel if pack else _rows.unpack_rows_kernel
    return _rows_launch(kernel, out_rows, width, tile_for(out_rows, width, itemsize), {},
                        (0, 1, 2, 7))


def mask_launch(rows: int, width: int) -> Launch:
    """:func:`~dpx.kernels.mask.mask_rows_kernel` of ``buf [rows, width]``."""
    return _rows_launch(_mask.mask_rows_kernel, rows, width, DEFAULT_TILE, {}, (0, 1, 5))


def check_launch(entries: int, group: int, align: int, max_each: int | None,
                 max_sum: int | None) -> Launch:
    """:func:`~dpx.kernels.counts.check_counts_kernel` of a :class:`dpx.CountRule`'s
    fields."""
    return Launch(_counts.check_counts_kernel, (1,), 1, dict(
        ENTRIES=entries, GROUP=group, ALIGN=align, MAX_EACH=max_each or 0,
        MAX_SUM=max_sum or 0, HAS_EACH=max_each is not None, HAS_SUM=max_sum is not None,
        BLOCK=_pow2_at_least(entries), RBLOCK=_pow2_at_least(entries // group)), (0, 1))


def quantize_launch(wire: Wire, src_rows: int, out_rows: int, hidden: int, itemsize: int, *,
                    start_ptr: bool, count_ptr: bool, compiled: bool) -> Launch:
    """The quantize-and-take kernel of ``wire`` (fp8: :func:`~dpx.kernels.wire.
    quantize_rows_kernel`; nvfp4, mxfp4: :func:`~dpx.kernels.fp4.quantize_fp4_kernel`,
    whose runtime arguments include :func:`fp4_scale`) writing ``out_rows`` wire rows of
    ``hidden`` elements read at ``itemsize`` bytes; ``compiled``: a GPU build."""
    rb = W.wire_row_bytes(hidden, wire)
    big = wide(src_rows * hidden, out_rows * rb)
    if wire is Wire.FP8:
        q = quantize_shape(out_rows, hidden, itemsize)
        return Launch(_wire.quantize_rows_kernel, quantize_grid(out_rows, hidden, q), q.warps,
                      dict(H=hidden, ROW_BYTES=rb, START_PTR=start_ptr, COUNT_PTR=count_ptr,
                           BLOCK_R=q.block_r, BLOCK_G=q.block_g, COMPILED=compiled, WIDE=big),
                      (0, 1, 2, 7))
    f = block_shape("quantize", W.block(wire))
    return Launch(_fp4.quantize_fp4_kernel, block_grid(out_rows, hidden, W.block(wire), f),
                  f.warps, dict(H=hidden, ROW_BYTES=rb, NV=wire is Wire.NVFP4,
                                START_PTR=start_ptr, COUNT_PTR=count_ptr, BLOCK_B=f.block_b,
                                COMPILED=compiled, WIDE=big), (0, 1, 2, 8))


def dequantize_launch(wire: Wire, rows: int, hidden: int, out_dtype: str, *,
                      compiled: bool) -> Launch:
    """The dequantize kernel of ``wire`` (fp8: :func:`~dpx.kernels.wire.
    dequantize_rows_kernel`; fp4: :func:`~dpx.kernels.fp4.dequantize_fp4_kernel`, whose
    runtime arguments include :func:`fp4_scale`) of ``rows`` wire rows into ``[rows,
    hidden]`` of ``out_dtype`` (a name: ``"bfloat16"``)."""
    rb = W.wire_row_bytes(hidden, wire)
    big = wide(rows * rb, rows * hidden)
    if wire is Wire.FP8:
        f = block_shape("dequantize", W.GROUP)
        return Launch(_wire.dequantize_rows_kernel, block_grid(rows, hidden, W.GROUP, f),
                      f.warps, dict(H=hidden, ROW_BYTES=rb, OUT_KIND=OUT_KIND[out_dtype],
                                    BLOCK_B=f.block_b, COMPILED=compiled, WIDE=big), (0, 2))
    f = block_shape("dequantize", W.block(wire))
    return Launch(_fp4.dequantize_fp4_kernel, block_grid(rows, hidden, W.block(wire), f),
                  f.warps, dict(H=hidden, ROW_BYTES=rb, NV=wire is Wire.NVFP4,
                                OUT_KIND=OUT_KIND[out_dtype], BLOCK_B=f.block_b,
                                COMPILED=compiled, WIDE=big), (0, 3))


def dequantize_sum_launch(wire: Wire, rows: int, parts: int, hidden: int, out_dtype: str, *,
                          compiled: bool) -> Launch:
    """:func:`~dpx.kernels.combine.dequantize_sum_kernel` of ``parts * rows`` wire rows
    into ``[rows, hidden]`` of ``out_dtype`` (runtime arguments: the source, ``rows``,
    :func:`fp4_scale`, the output)."""
    rb = W.wire_row_bytes(hidden, wire)
    gs = W.block(wire)
    f = block_shape("sum", gs)
    return Launch(_combine.dequantize_sum_kernel, block_grid(rows, hidden, gs, f), f.warps,
                  dict(H=hidden, ROW_BYTES=rb, FP4=wire is not Wire.FP8,
                       NV=wire is Wire.NVFP4, PARTS=parts, OUT_KIND=OUT_KIND[out_dtype],
                       BLOCK_B=f.block_b, COMPILED=compiled,
                       WIDE=wide(parts * rows * rb, rows * hidden)), (0, 3))


# ---------------------------------------------------------------- the peer transport
#: :func:`~dpx.kernels.peer.peer_put_kernel`'s and ``peer_take_kernel``'s modes
PEER_CHUNK, PEER_STAGE, PEER_BLOCKS = 0, 1, 2
#: :func:`~dpx.kernels.peer.peer_sum_kernel`'s ``KIND`` of an integer dtype
PEER_INT_KIND = 3


def peer_move_tile(itemsize: int) -> Tile:
    """The tile of a peer move that reads one row for each row it writes (the stage, the
    put of an all-to-all, the take) of elements of ``itemsize`` bytes: 128 bytes a thread
    (64 on byte rows), one column block a row of 7,168 bf16. Chosen on an H100
    (benchmarks/README.md, "The peer transport"): these kernels read a table, the chunk
    bounds and the epoch before their rows, and the default tile's 16 bytes a thread (8 on
    byte rows) left them at 0.24-0.49 of the copy at most decode sizes, byte rows at
    0.41-0.42 at 2,048 rows."""
    e = max(itemsize, 2)
    return Tile(65536 // e, 16, 16384 // e)


#: The native pull-sum's tile (it reads ``W`` rows for each row it writes): 2,048 elements
#: of 4 warps, chosen on an H100 (benchmarks/README.md, "The peer transport"; 0.66-1.06 of the
#: copy against 0.67-0.97 with :func:`tile_for`'s).
PEER_SUM_TILE = Tile(2048, 4)


def peer_put_launch(mode: int, block: int, width: int, itemsize: int, world: int,
                    epoch: int, *, report: bool = False, src_step: int = 0) -> Launch:
    """:func:`~dpx.kernels.peer.peer_put_kernel` of entries of at most ``block`` rows of
    ``width`` elements (runtime arguments: source, table, firsts, lens, count, then the
    ints of its signature); ``src_step``: the blocks mode's (0: an all-gather). Where every
    rank receives the same rows (the chunk mode, an all-gather of blocks), one entry writes
    each tile it reads into every workspace (``FAN``), with the tile of the ``world *
    block`` rows it writes; else :func:`peer_move_tile`'s."""
    fan = mode == PEER_CHUNK or (mode == PEER_BLOCKS and src_step == 0)
    block_r, block_c, warps = row_blocks(
        width, tile_for(world * block, width, itemsize) if fan else peer_move_tile(itemsize))
    # (at least one program an entry: an empty block still carries its report)
    return Launch(_peer.peer_put_kernel,
                  ((1 if fan else world) * max(-(-block // block_r), 1),
                   max(-(-width // block_c), 1)), warps,
                  dict(WIDTH=width, W=world, MODE=mode, REPORT=report, FAN=fan, EPOCH=epoch,
                       BLOCK_R=block_r, BLOCK_C=block_c), (0, 1, 2, 3, 4))


def peer_take_launch(mode: int, out_rows: int, width: int, itemsize: int, world: int,
                     epoch: int, *, report: bool = False) -> Launch:
    """:func:`~dpx.kernels.peer.peer_take_kernel` writing ``out [out_rows, width]``."""
    lt = _rows_launch(_peer.peer_take_kernel, out_rows, width, peer_move_tile(itemsize),
                      dict(W=world, MODE=mode, REPORT=report, EPOCH=epoch), (0, 1, 2, 3, 11))
    lt.consts["BLOCK_W"] = _pow2_at_least(world)
    return lt


def peer_sum_launch(out_rows: int, width: int, dtype: str, world: int, epoch: int, *,
                    compiled: bool) -> Launch:
    """:func:`~dpx.kernels.peer.peer_sum_kernel` writing ``out [out_rows, width]`` of
    ``dtype`` (a name; an integer dtype sums in itself)."""
    return _rows_launch(_peer.peer_sum_kernel, out_rows, width, PEER_SUM_TILE,
                        dict(W=world, KIND=OUT_KIND.get(dtype, PEER_INT_KIND), EPOCH=epoch,
                             COMPILED=compiled), (0, 1, 2, 8))


def peer_wire_sum_launch(wire: Wire, out_rows: int, hidden: int, out_dtype: str, world: int,
                         epoch: int, *, ws_rows: int, compiled: bool) -> Launch:
    """:func:`~dpx.kernels.peer.peer_wire_sum_kernel` of ``wire`` rows into ``[out_rows,
    hidden]`` of ``out_dtype`` (the combine's summing pass's shapes), from phases of
    ``ws_rows`` wire rows."""
    gs = W.block(wire)
    f = block_shape("sum", gs)
    return Launch(_peer.peer_wire_sum_kernel, block_grid(out_rows, hidden, gs, f), f.warps,
                  dict(H=hidden, ROW_BYTES=W.wire_row_bytes(hidden, wire),
                       FP4=wire is not Wire.FP8, NV=wire is Wire.NVFP4, W=world,
                       OUT_KIND=OUT_KIND[out_dtype], EPOCH=epoch, BLOCK_B=f.block_b,
                       COMPILED=compiled, WIDE=wide(out_rows * hidden, ws_rows)),
                  (0, 1, 2, 9))


def peer_barrier_launch(world: int, epoch: int, *, clock: bool = True) -> Launch:
    """:func:`~dpx.kernels.peer.peer_barrier_kernel`: one program of one warp (runtime
    arguments: table, this rank, the timeout in nanoseconds -- in polls without ``clock``,
    for Triton's interpreter -- and 1 for this rank's leaving, else 0)."""
    return Launch(_peer.peer_barrier_kernel, (1,), 1,
                  dict(W=world, BLOCK_W=max(32, _pow2_at_least(world)), EPOCH=epoch,
                       CLOCK=clock), (0,))
