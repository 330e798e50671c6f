"""Why a slot place is slower than a copy of the same bytes at decode sizes (GPU only).

    python benchmarks/place_probe.py [--hidden 7168] [--dp 8]

A slot place writes a whole ``dp*n``-row buffer (``n`` copied rows, the rest zeros) and
reads ``n`` rows; the copy it is compared with reads and writes half of that traffic each.
This times, against that copy: a plain ``zero_`` of the buffer (the write-only ceiling),
the library's place, and variants of the place kernel (programs wholly outside the slot
skip the load; streaming stores; a persistent grid). Writes ``place_probe.csv``.
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from common import copy_us, cuda_time_us, out_dir, print_table, write_csv
from dpx.kernels import Tile
from dpx.kernels.launch import row_blocks
from dpx_torch import place_rows


@triton.jit
def _place_split(src_ptr, dst_start_ptr, count_ptr, out_rows, out_ptr, WIDTH: tl.constexpr,
                 BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, STREAM: tl.constexpr):
    dst_start = tl.load(dst_start_ptr)
    count = tl.load(count_ptr)
    r0 = tl.program_id(0) * BLOCK_R
    rows = r0 + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < WIDTH
    ptrs = out_ptr + rows[:, None] * WIDTH + cols[None, :]
    smask = (rows < out_rows)[:, None] & col_ok[None, :]
    if (r0 + BLOCK_R <= dst_start) | (r0 >= dst_start + count):
        zeros = tl.zeros((BLOCK_R, BLOCK_C), dtype=out_ptr.dtype.element_ty)
        if STREAM:
            tl.store(ptrs, zeros, mask=smask, cache_modifier=".cs")
        else:
            tl.store(ptrs, zeros, mask=smask)
    else:
        j = rows - dst_start
        real = (j >= 0) & (j < count)
        vals = tl.load(src_ptr + j[:, None] * WIDTH + cols[None, :],
                       mask=real[:, None] & col_ok[None, :], other=0)
        if STREAM:
            tl.store(ptrs, vals, mask=smask, cache_modifier=".cs")
        else:
            tl.store(ptrs, vals, mask=smask)


@triton.jit
def _place_persistent(src_ptr, dst_start_ptr, count_ptr, out_rows, out_ptr,
                      WIDTH: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                      N_COLB: tl.constexpr):
    dst_start = tl.load(dst_start_ptr)
    count = tl.load(count_ptr)
    n_tiles = tl.cdiv(out_rows, BLOCK_R) * N_COLB
    for t in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        rows = (t // N_COLB) * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = (t % N_COLB) * BLOCK_C + tl.arange(0, BLOCK_C)
        j = rows - dst_start
        real = (j >= 0) & (j < count)
        col_ok = cols < WIDTH
        vals = tl.load(src_ptr + j[:, None] * WIDTH + cols[None, :],
                       mask=real[:, None] & col_ok[None, :], other=0)
        tl.store(out_ptr + rows[:, None] * WIDTH + cols[None, :], vals,
                 mask=(rows < out_rows)[:, None] & col_ok[None, :])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--dp", type=int, default=8)
    args = ap.parse_args()
    H, dp = args.hidden, args.dp
    rb = H * 2
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows_out = []
    for n in (32, 64, 128, 256, 512, 1024, 2048):
        G = dp * n
        slot = torch.randn(n, H, device="cuda").to(torch.bfloat16)
        out = torch.empty(G, H, device="cuda", dtype=torch.bfloat16)
        s_dev = torch.tensor([3 * n], dtype=torch.int32, device="cuda")
        n_dev = torch.tensor([n], dtype=torch.int32, device="cuda")
        ref = torch.zeros_like(out)
        ref[3 * n:4 * n] = slot
        copy = copy_us((n + G) * rb)
        row = dict(n=n, MiB=round(G * rb / 2**20, 2), copy_us=copy)

        def check(name):
            assert torch.equal(out, ref), name
            out.fill_(7)

        def add(name, fn):
            out.fill_(7)
            fn()
            check(name)
            us = cuda_time_us(fn)
            row[name] = copy / us

        row["zero_"] = copy / cuda_time_us(lambda: out.zero_())
        add("two_launch", lambda: (out.zero_(), out[3 * n:4 * n].copy_(slot)))
        add("library", lambda: place_rows(slot, s_dev, n_dev, G, out=out))
        for tile in (Tile(4096, 16), Tile(8192, 16, 2048), Tile(16384, 32, 2048)):
            br, bc, warps = row_blocks(H, tile)
            grid = (triton.cdiv(G, br), triton.cdiv(H, bc))
            for stream in (False, True):
                name = f"split{'_cs' if stream else ''}_{tile.elems}"
                add(name, lambda br=br, bc=bc, warps=warps, grid=grid, stream=stream:
                    _place_split[grid](slot, s_dev, n_dev, G, out, WIDTH=H, BLOCK_R=br,
                                       BLOCK_C=bc, STREAM=stream, num_warps=warps))
        for per_sm in (2, 4, 8):
            br, bc, warps = row_blocks(H, Tile(4096, 16))
            ncolb = triton.cdiv(H, bc)
            progs = min(sms * per_sm, triton.cdiv(G, br) * ncolb)
            add(f"persist_{per_sm}", lambda progs=progs, br=br, bc=bc, warps=warps, ncolb=ncolb:
                _place_persistent[(progs,)](slot, s_dev, n_dev, G, out, WIDTH=H,
                                            BLOCK_R=br, BLOCK_C=bc, N_COLB=ncolb,
                                            num_warps=warps))
        rows_out.append(row)
        del slot, out, ref
        torch.cuda.empty_cache()
    cols = list(rows_out[0])
    print(f"device: {torch.cuda.get_device_name()}  hidden {H} bf16, dp {dp}: slot place, "
          "ratio to a copy of the same traffic")
    print_table(rows_out, cols)
    write_csv(out_dir() / "place_probe.csv", rows_out)


if __name__ == "__main__":
    main()
