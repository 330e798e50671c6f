"""The sweep that picks the fp4 kernels' launch shape (blocks per program, warps): every
candidate timed quantizing and dequantizing bf16 rows, against a device-to-device copy of
the input's bytes (read and written) in the same run (GPU only).

    python benchmarks/fp4_sweep.py [--hidden 7168]

Prints, per wire, kernel and size, each candidate's ratio to the copy (``chosen``: the
library's own choice, ``dpx.kernels.launch.fp4_shape``); writes ``fp4_sweep.csv`` to
``$OUT``.
"""

from __future__ import annotations

import argparse

import torch

from common import copy_us, cuda_time_us, out_dir, print_table, write_csv
from dpx import wire as W
from dpx.kernels import fp4 as K
from dpx.modes import Wire
from dpx_torch.passes import TritonPasses

#: (elements per program, warps); None: the library's choice
CANDIDATES = [None, (1024, 2), (1024, 4), (2048, 4), (2048, 8), (4096, 4), (4096, 8),
              (8192, 8), (8192, 16)]


def _run(kind: str, wire: Wire, x, wbuf, y, shape) -> None:
    g = 1.5 if wire is Wire.NVFP4 else 1.0
    if shape is None:
        if kind == "quantize":
            TritonPasses().quantize(x, 0, x.shape[0], wbuf, wire, g)
        else:
            TritonPasses().dequantize(wbuf, y, wire, g)
        return
    elems, warps = shape
    rows, h = x.shape
    bb = elems // W.block(wire)
    grid = (-(-rows * (h // W.block(wire)) // bb),)
    if kind == "quantize":
        K.quantize_fp4_kernel[grid](x, x, x, 0, rows, rows, rows, g, wbuf, H=h,
                                    ROW_BYTES=wbuf.shape[1], NV=wire is Wire.NVFP4,
                                    START_PTR=False, COUNT_PTR=False, BLOCK_B=bb,
                                    COMPILED=True, WIDE=False, num_warps=warps)
    else:
        K.dequantize_fp4_kernel[grid](wbuf, rows, g, y, H=h, ROW_BYTES=wbuf.shape[1],
                                      NV=wire is Wire.NVFP4, OUT_KIND=1, BLOCK_B=bb,
                                      COMPILED=True, WIDE=False, num_warps=warps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=7168)
    args = ap.parse_args()
    h = args.hidden
    rows_out = []
    copies: dict = {}
    for wire in (Wire.NVFP4, Wire.MXFP4):
        for n in (512, 3072, 16384):
            x = torch.randn(n, h, device="cuda", dtype=torch.bfloat16)
            wbuf = torch.empty(n, W.wire_row_bytes(h, wire), device="cuda", dtype=torch.uint8)
            y = torch.empty_like(x)
            t_copy = copy_us(2 * n * h * 2, copies)
            TritonPasses().quantize(x, 0, n, wbuf, wire, 1.5)
            for kind in ("quantize", "dequantize"):
                row = dict(wire=wire.value, kind=kind, rows=n, input_MiB=n * h * 2 / 2**20)
                for shape in CANDIDATES:
                    name = "chosen" if shape is None else f"{shape[0]}/{shape[1]}"
                    row[name] = t_copy / cuda_time_us(
                        lambda: _run(kind, wire, x, wbuf, y, shape))
                rows_out.append(row)
    cols = ["wire", "kind", "rows", "input_MiB", "chosen",
            *(f"{e}/{w}" for e, w in (c for c in CANDIDATES if c))]
    print("ratio to a D2D copy of the input's bytes (higher is faster)")
    print_table(rows_out, cols)
    write_csv(out_dir() / "fp4_sweep.csv", rows_out)


if __name__ == "__main__":
    main()
