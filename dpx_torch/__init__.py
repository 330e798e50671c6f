"""PyTorch frontend of dpx: row kernels and the DP-attention communicator ``DpComm``."""

from dpx_torch.comm import DpComm, counts_tensor
from dpx_torch.overlap import DpWork
from dpx_torch.rows import pack_rows, place_rows, take_rows, unpack_rows, zero_rows_

__all__ = ["DpComm", "DpWork", "counts_tensor", "pack_rows", "place_rows", "take_rows",
           "unpack_rows", "zero_rows_"]
