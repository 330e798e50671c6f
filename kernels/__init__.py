"""Triton kernels of dpx (installed as ``dpx.kernels``); see :mod:`dpx.kernels.rows`."""

from dpx.kernels.launch import DEFAULT_TILE, Tile, grid, row_blocks
from dpx.kernels.rows import place_rows_kernel, take_rows_kernel, zero_rows_kernel

__all__ = ["DEFAULT_TILE", "Tile", "grid", "place_rows_kernel", "row_blocks",
           "take_rows_kernel", "zero_rows_kernel"]
