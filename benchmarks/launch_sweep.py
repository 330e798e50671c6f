"""The sweep that picks the row kernels' launch tile by size, and the fp8 quantize kernel's
launch shape: every candidate timed on every size, against a device-to-device copy of the
same bytes in the same run (GPU only).

    python benchmarks/launch_sweep.py [--hidden 7168] [--dp 8] [--byte-rows]

Sizes: a DP step's global buffer of ``dp * n`` rows, ``n`` = 32 .. 8192 per replica.
Kernels: ``place_slot`` (one ``n``-row slot placed at row ``3n`` of a zero ``dp*n``-row
buffer, device start/count: what a capacity plan's gather runs), ``place_full`` (every
row), ``take_slot`` (a slot taken back out), and fp8 ``quantize`` of every row. Prints, per
kernel and size, each candidate's ratio to the copy, and the best; writes
``launch_sweep.csv`` to ``$OUT``. ``dpx.kernels.launch.tile_for`` holds the choice
(``TILES_BY_BYTES``, ``STREAM_BYTES``); ``chosen`` rows are that choice. ``--byte-rows``:
the row kernels on uint8 rows of the fp8 wire's row bytes (what a quantized gather or
combine places, takes and stages; a candidate counts elements, so on byte rows it moves
half the bytes a thread it moves on bf16 rows, while ``chosen`` doubles them) instead of
bf16 rows, and no quantize; writes ``launch_sweep_bytes.csv``.
"""

from __future__ import annotations

import argparse

import torch

from common import copy_us, cuda_time_us, out_dir, print_table, write_csv
from dpx.kernels import Tile
from dpx.kernels import wire as wire_kernels
from dpx_torch import place_rows, take_rows
from dpx_torch.passes import TritonPasses

TILES = [None, Tile(2048, 4), Tile(2048, 8), Tile(4096, 8), Tile(4096, 16), Tile(8192, 8),
         Tile(8192, 16), Tile(16384, 16), Tile(16384, 32), Tile(8192, 16, 2048),
         Tile(16384, 32, 2048), Tile(32768, 32, 2048), Tile(4096, 16, stream=True),
         Tile(8192, 16, 2048, stream=True), Tile(16384, 32, 2048, stream=True)]
#: with ``--byte-rows``, also the byte-row tile of the large tile 8192/16/2048 (twice its
#: elements and column block: on byte rows, the bytes a thread that tile moves on bf16 rows)
BYTE_TILES = [Tile(16384, 16, 4096), Tile(16384, 16, 4096, stream=True)]


def _name(t: Tile | None) -> str:
    """``elems/warps/max_block_c[/cs]``; ``chosen``: the library's own choice by size."""
    if t is None:
        return "chosen"
    return f"{t.elems}/{t.warps}/{t.max_block_c}" + ("/cs" if t.stream else "")
QUANT = [None, (8, 4, 4), (4, 4, 4), (8, 2, 4), (16, 2, 8), (8, 4, 8), (4, 8, 8), (16, 4, 8),
         (2, 8, 4), (32, 1, 8)]


def _quantize(src, out, shape: tuple[int, int, int] | None) -> None:
    """The quantize kernel at ``(rows, groups, warps)``; ``None``: the library's own choice
    by size."""
    from dpx import wire as W

    rows, H = out.shape[0], src.shape[1]
    if shape is None:
        TritonPasses().quantize(src, 0, rows, out)
        return
    br, bg, warps = shape
    wire_kernels.quantize_rows_kernel[(-(-rows // br), -(-(H // W.GROUP) // bg))](
        src, src, src, 0, rows, src.shape[0], rows, out, H=H, ROW_BYTES=out.shape[1],
        START_PTR=False, COUNT_PTR=False, BLOCK_R=br, BLOCK_G=bg, COMPILED=True,
        WIDE=False, num_warps=warps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--dp", type=int, default=8)
    ap.add_argument("--max-n", type=int, default=8192)
    ap.add_argument("--byte-rows", action="store_true",
                    help="uint8 rows of the fp8 wire's row bytes instead of bf16 rows")
    args = ap.parse_args()
    from dpx.wire import wire_row_bytes

    H, dp = args.hidden, args.dp
    rb = wire_row_bytes(H) if args.byte_rows else H * 2
    copies: dict = {}
    rows = []
    n = 32
    while n <= args.max_n:
        G = dp * n
        big = (torch.randint(0, 256, (G, rb), dtype=torch.uint8, device="cuda")
               if args.byte_rows else torch.randn(G, H, device="cuda").to(torch.bfloat16))
        slot = big[:n].clone()
        out = torch.empty_like(big)
        small = torch.empty_like(slot)
        s_dev = torch.tensor([3 * n], dtype=torch.int32, device="cuda")
        n_dev = torch.tensor([n], dtype=torch.int32, device="cuda")
        cases = {
            "place_slot": (lambda t: place_rows(slot, s_dev, n_dev, G, out=out, tile=t),
                           (n + G) * rb),
            "place_full": (lambda t: place_rows(big, 0, G, G, out=out, tile=t), 2 * G * rb),
            "take_slot": (lambda t: take_rows(big, s_dev, n_dev, n, out=small, tile=t),
                          2 * n * rb),
        }
        for kernel, (fn, nbytes) in cases.items():
            copy = copy_us(nbytes, copies)
            for t in TILES + (BYTE_TILES if args.byte_rows else []):
                us = cuda_time_us(lambda: fn(t))
                rows.append(dict(kernel=kernel, n=n, MiB=round(G * rb / 2**20, 2),
                                 config=_name(t), us=us,
                                 copy_ratio=copy / us))
        wout = torch.empty(G, wire_row_bytes(H), device="cuda", dtype=torch.uint8)
        qbytes = G * rb + G * wire_row_bytes(H)
        copy = copy_us(qbytes, copies)
        for shape in [] if args.byte_rows else QUANT:
            us = cuda_time_us(lambda: _quantize(big, wout, shape))
            name = "chosen" if shape is None else "{}x{}/{}".format(*shape)
            rows.append(dict(kernel="quantize", n=n, MiB=round(qbytes / 2**20, 2),
                             config=name, us=us, copy_ratio=copy / us))
        del big, slot, out, small, wout
        torch.cuda.empty_cache()
        n *= 2
    best = []
    for kernel in ("place_slot", "place_full", "take_slot") + (() if args.byte_rows
                                                              else ("quantize",)):
        for size in sorted({r["n"] for r in rows if r["kernel"] == kernel}):
            cand = [r for r in rows if r["kernel"] == kernel and r["n"] == size]
            top = max(cand, key=lambda r: r["copy_ratio"])
            chosen = cand[0]
            best.append(dict(kernel=kernel, n=size, MiB=top["MiB"], best=top["config"],
                             best_ratio=top["copy_ratio"], chosen=chosen["config"],
                             chosen_ratio=chosen["copy_ratio"]))
    what = f"uint8 rows of {rb} bytes" if args.byte_rows else f"hidden {H} bf16"
    print(f"device: {torch.cuda.get_device_name()}  {what}, dp {dp}: the best "
          f"launch per kernel and size (ratio to a D2D copy of the same bytes)")
    print_table(best, list(best[0]))
    write_csv(out_dir() / ("launch_sweep_bytes.csv" if args.byte_rows else "launch_sweep.csv"),
              rows)


if __name__ == "__main__":
    main()
