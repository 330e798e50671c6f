"""Triton kernels of dpx (installed as ``dpx.kernels``): row passes (:mod:`.rows`), the fp8
wire (:mod:`.wire`), the fp4 wires (:mod:`.fp4`), the quantized combine's summing pass
(:mod:`.combine`), pad-row masking (:mod:`.mask`), the
device check of a step's counts
(:mod:`.counts`) and the peer transport's puts, barrier, takes and pulls (:mod:`.peer`);
:mod:`.launch` holds the launch shapes both frontends use."""

import sys

if __name__ == "kernels":
    # This folder is installed as ``dpx.kernels``. Imported as a top-level ``kernels`` --
    # from the source root, which Python puts first on sys.path -- it stands aside for the
    # package of that name installed beside it (Hugging Face's ``kernels``, which
    # transformers imports), or says there is none.
    import importlib.machinery
    import importlib.util
    import os

    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _spec = importlib.machinery.PathFinder.find_spec(
        "kernels", [p for p in sys.path if os.path.abspath(p or os.curdir) != _root])
    if _spec is None or _spec.loader is None:
        raise ModuleNotFoundError("No module named 'kernels' (this source tree's kernels/ "
                                  "folder is dpx's Triton kernels: import dpx.kernels)",
                                  name="kernels")
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["kernels"] = _module
    _spec.loader.exec_module(_module)
else:
    from dpx.kernels.combine import dequantize_sum_kernel
    from dpx.kernels.counts import check_counts_kernel
    from dpx.kernels.fp4 import dequantize_fp4_kernel, quantize_fp4_kernel
    from dpx.kernels.launch import DEFAULT_TILE, Tile, grid, row_blocks
    from dpx.kernels.mask import mask_rows_kernel
    from dpx.kernels.peer import (peer_barrier_kernel, peer_put_kernel, peer_sum_kernel,
                                  peer_take_kernel, peer_wire_sum_kernel)
    from dpx.kernels.rows import (move_rows_kernel, pack_rows_kernel, unpack_rows_kernel,
                                  zero_rows_kernel)
    from dpx.kernels.wire import dequantize_rows_kernel, quantize_rows_kernel

    __all__ = ["DEFAULT_TILE", "Tile", "check_counts_kernel", "dequantize_fp4_kernel",
               "dequantize_rows_kernel", "dequantize_sum_kernel", "grid", "mask_rows_kernel",
               "move_rows_kernel", "peer_barrier_kernel", "peer_put_kernel", "peer_sum_kernel",
               "peer_take_kernel", "peer_wire_sum_kernel",
               "pack_rows_kernel", "quantize_fp4_kernel", "quantize_rows_kernel",
               "row_blocks", "unpack_rows_kernel", "zero_rows_kernel"]
