"""PyTorch frontend of dpx: the DP-attention communicator ``DpComm``, its row kernels and
the pad-row helpers.

Layer: public. Imports dpx, the shims, passes, transports, runner and call paths layers
and the modules before it in its own row (docs/semantics.md, "Where things live").
"""

from dpx_torch.comm import DpComm, counts_tensor
from dpx_torch.overlap import DpWork
from dpx_torch.padrows import mask_pad_rows, pad_row_mask
from dpx_torch.peer import PeerOptions
from dpx_torch.program import DeviceTables
from dpx_torch.runner import CacheLimits
from dpx_torch.rows import pack_rows, place_rows, take_rows, unpack_rows, zero_rows_
from dpx_torch.wire import split_wire

__all__ = ["CacheLimits", "DeviceTables", "DpComm", "DpWork", "counts_tensor",
           "mask_pad_rows", "pack_rows", "pad_row_mask", "PeerOptions", "place_rows", "split_wire",
           "take_rows", "unpack_rows", "zero_rows_"]
