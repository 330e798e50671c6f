"""Launch shapes shared by the frontends: the tile and the grid (static in shapes)."""

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
    block. The default (4096 elements, 16 warps: one 16-byte vector of bf16 per thread)
    was chosen by the tile sweep in ``benchmarks/kernels.py`` on an H200."""

    elems: int = 4096
    warps: int = 16
    max_block_c: int = 1024


DEFAULT_TILE = Tile()


def row_blocks(width: int, tile: Tile = DEFAULT_TILE) -> tuple[int, int, int]:
    """``(BLOCK_R, BLOCK_C, num_warps)`` for rows of ``width`` elements."""
    block_c = min(_pow2_at_least(max(width, 1)), tile.max_block_c)
    block_r = max(1, tile.elems // block_c)
    return block_r, block_c, tile.warps if block_r * block_c >= 4096 else 4


def grid(out_rows: int, width: int, tile: Tile = DEFAULT_TILE) -> tuple[int, int]:
    """Programs for an output of ``out_rows x width`` (depends only on the shape)."""
    block_r, block_c, _ = row_blocks(width, tile)
    return (-(-out_rows // block_r), -(-width // block_c))
