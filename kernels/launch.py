"""Launch shapes shared by the frontends: the tile, the grid and the index width -- pure
functions of the buffers' shapes, so a torch launch and a jax-triton launch of the same
kernel on the same shapes compile to the same program."""

from __future__ import annotations

from dataclasses import dataclass


def _pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


@dataclass(frozen=True)
class Tile:
    """How many elements one program moves, with how many warps, and the widest column
    block."""

    elems: int = 4096
    warps: int = 16
    max_block_c: int = 1024


DEFAULT_TILE = Tile()

#: The tile of the row kernels by the bytes a launch writes: (up to this many bytes, tile);
#: chosen by ``benchmarks/launch_sweep.py`` on an H200 (see benchmarks/README.md).
TILES_BY_BYTES: tuple[tuple[int, Tile], ...] = (
    (2**62, DEFAULT_TILE),
)


def tile_for(rows: int, width: int, itemsize: int) -> Tile:
    """The launch tile of a row pass writing ``rows x width`` elements of ``itemsize``
    bytes (what both frontends launch with unless a caller passes a tile)."""
    nbytes = rows * width * itemsize
    for limit, tile in TILES_BY_BYTES:
        if nbytes <= limit:
            return tile
    return DEFAULT_TILE


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
