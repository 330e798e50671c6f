"""Launch constants shared by the frontends: tile sizes and the grid (static in shapes)."""


def _pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


#: Elements one program moves; with WARPS=16 each thread moves one 16-byte vector of
#: bf16 (chosen by the tile sweep in benchmarks/kernels.py on an H200).
TILE_ELEMS = 4096
#: Widest column block.
MAX_BLOCK_C = 1024
#: Warps of a full tile (smaller tiles use 4).
WARPS = 16


def row_blocks(width: int) -> tuple[int, int, int]:
    """``(BLOCK_R, BLOCK_C, num_warps)`` for rows of ``width`` elements."""
    block_c = min(_pow2_at_least(max(width, 1)), MAX_BLOCK_C)
    block_r = max(1, TILE_ELEMS // block_c)
    return block_r, block_c, WARPS if block_r * block_c >= 4096 else 4


def grid(out_rows: int, width: int) -> tuple[int, int]:
    """Programs for an output of ``out_rows x width`` (depends only on the shape)."""
    block_r, block_c, _ = row_blocks(width)
    return (-(-out_rows // block_r), -(-width // block_c))
