"""Launch shapes shared by the frontends: the tile, the grid and the index width -- pure
functions of the buffers' shapes, so a torch launch and a jax-triton launch of the same
kernel on the same shapes compile to the same program."""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = [
    "DEFAULT_TILE", "FP4_BY_BLOCK", "fp4_grid", "fp4_scale", "fp4_shape", "Fp4Shape", "grid", "QUANTIZE_BY_BYTES",
    "quantize_grid", "quantize_shape",
    "QuantizeShape", "row_blocks", "STREAM_BYTES", "Tile", "tile_for", "TILES_BY_BYTES",
    "wide"
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
        return _STREAMED.get(tile) or replace(tile, stream=True)
    return tile


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
class Fp4Shape:
    """fp4 quantize's and dequantize's launch: blocks per program, and warps."""

    block_b: int = 128
    warps: int = 4


#: fp4 quantize's and dequantize's launch by block size (16: nvfp4, 32: mxfp4): chosen by
#: ``benchmarks/fp4_sweep.py`` on an H200, where nvfp4 ran fastest at 1,024 elements and 2
#: warps a program (0.66 / 0.80 of a copy of the input's bytes, quantize / dequantize, at
#: 42 and 224 MiB) and mxfp4 at 4,096 and 4 warps (0.64 / 0.73).
FP4_BY_BLOCK = {16: Fp4Shape(64, 2), 32: Fp4Shape(128, 4)}


def fp4_shape(rows: int, hidden: int, block: int) -> Fp4Shape:
    """The launch of an fp4 quantize or dequantize of ``rows`` rows of ``hidden`` elements
    in blocks of ``block`` (both frontends launch with it)."""
    return FP4_BY_BLOCK.get(block) or Fp4Shape(max(2048 // block, 1), 4)


def fp4_grid(rows: int, hidden: int, block: int, shape: Fp4Shape) -> tuple[int]:
    """Programs of an fp4 quantize or dequantize of ``rows`` rows of ``hidden`` elements."""
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
