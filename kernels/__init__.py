"""Triton kernels of dpx (installed as ``dpx.kernels``): row passes (:mod:`.rows`), the fp8
wire (:mod:`.wire`), pad-row masking (:mod:`.mask`) and the device check of a step's counts
(:mod:`.counts`); :mod:`.launch` holds the launch shapes both frontends use."""

from dpx.kernels.counts import check_counts_kernel
from dpx.kernels.launch import DEFAULT_TILE, Tile, grid, row_blocks
from dpx.kernels.mask import mask_rows_kernel
from dpx.kernels.rows import (move_rows_kernel, pack_rows_kernel, unpack_rows_kernel,
                              zero_rows_kernel)
from dpx.kernels.wire import dequantize_rows_kernel, quantize_rows_kernel

__all__ = ["DEFAULT_TILE", "Tile", "check_counts_kernel", "dequantize_rows_kernel", "grid",
           "mask_rows_kernel", "move_rows_kernel", "pack_rows_kernel",
           "quantize_rows_kernel", "row_blocks", "unpack_rows_kernel", "zero_rows_kernel"]
