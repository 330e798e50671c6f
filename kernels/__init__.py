"""Triton kernels of dpx (installed as ``dpx.kernels``); see :mod:`dpx.kernels.rows`."""

from dpx.kernels.launch import DEFAULT_TILE, Tile, grid, row_blocks
from dpx.kernels.rows import (pack_rows_kernel, place_rows_kernel, take_rows_kernel,
                             unpack_rows_kernel, zero_rows_kernel)

__all__ = ["DEFAULT_TILE", "Tile", "grid", "pack_rows_kernel", "place_rows_kernel",
           "row_blocks", "take_rows_kernel", "unpack_rows_kernel", "zero_rows_kernel"]
