"""The sweep that picks the launch shapes of the passes over scale blocks
(``dpx.kernels.launch.BLOCK_SHAPES``: the fp4 quantize, every dequantize, the summing
pass): each candidate (elements per program, warps) timed on bf16 rows of ``--hidden``
elements against a device-to-device copy of the same bytes (read + written) in the same
run (GPU only).

    python benchmarks/wire_sweep.py [--hidden 7168] [--sizes 512,4096,16384]

Prints, per pass, wire and size, each candidate's share of the copy (``chosen``: the
library's own entry); writes ``wire_sweep.csv`` to ``$OUT``. The summing pass is timed at
4 parts.
"""

from __future__ import annotations

import argparse

import torch

from common import NV_SCALE, copy_us, cuda_time_us, out_dir, print_table, write_csv
from dpx import wire as W
from dpx.kernels import launch as L
from dpx.modes import Wire
from dpx_torch.passes import TritonPasses

#: (elements per program, warps)
CANDIDATES = [(1024, 2), (1024, 4), (2048, 2), (2048, 4), (2048, 8), (4096, 4), (4096, 8),
              (8192, 8), (8192, 16)]
PARTS = 4


def _cases(wire: Wire) -> list[str]:
    return ["dequantize", "sum"] if wire is Wire.FP8 else ["quantize", "dequantize", "sum"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--sizes", default="512,4096,16384")
    args = ap.parse_args()
    h = args.hidden
    copies: dict = {}
    rows_out = []
    for wire in (Wire.FP8, Wire.NVFP4, Wire.MXFP4):
        gs, rb = W.block(wire), W.wire_row_bytes(h, wire)
        g = NV_SCALE if wire is Wire.NVFP4 else None
        for n in (int(s) for s in args.sizes.split(",")):
            x = torch.randn(PARTS * n, h, device="cuda", dtype=torch.bfloat16)
            wbuf = torch.empty(PARTS * n, rb, device="cuda", dtype=torch.uint8)
            TritonPasses().quantize(x, 0, PARTS * n, wbuf, wire, g)
            y = torch.empty(n, h, device="cuda", dtype=torch.bfloat16)
            for kind in _cases(wire):
                moved = {"quantize": n * h * 2 + n * rb, "dequantize": n * rb + n * h * 2,
                         "sum": PARTS * n * rb + n * h * 2}[kind]
                t_copy = copy_us(moved, copies)
                row = dict(kind=kind, wire=wire.value, rows=n, MiB=moved / 2**20)
                chosen = L.BLOCK_SHAPES[(kind, gs)]
                for cand in [None, *CANDIDATES]:
                    elems, warps = cand or (0, 0)
                    shape = chosen if cand is None else L.BlockShape(elems // gs, warps)
                    if shape.block_b < 1:
                        continue
                    L.BLOCK_SHAPES[(kind, gs)] = shape
                    p = TritonPasses()
                    fn = {"quantize": lambda: p.quantize(x, 0, n, wbuf[:n], wire, g),
                          "dequantize": lambda: p.dequantize(wbuf[:n], y, wire, g),
                          "sum": lambda: p.dequantize_sum(wbuf, y, PARTS, wire, g)}[kind]
                    name = "chosen" if cand is None else f"{elems}/{warps}"
                    row[name] = t_copy / cuda_time_us(fn)
                L.BLOCK_SHAPES[(kind, gs)] = chosen
                rows_out.append(row)
            torch.cuda.empty_cache()
    cols = ["kind", "wire", "rows", "MiB", "chosen", *(f"{e}/{w}" for e, w in CANDIDATES)]
    print(f"share of a D2D copy of the same bytes (higher is faster), "
          f"{torch.cuda.get_device_name()}")
    print_table(rows_out, cols)
    write_csv(out_dir() / "wire_sweep.csv", rows_out)


if __name__ == "__main__":
    main()
