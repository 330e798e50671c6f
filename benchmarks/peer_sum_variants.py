"""The peer transport's wire pull-sum (:func:`dpx.kernels.peer.peer_wire_sum_kernel`) against
its variants, the combine's summing pass over the same bytes, and the copy ceiling (one
GPU; the kernels' every difference from dpx's, taken one at a time):

    python benchmarks/peer_sum_variants.py              # needs a CUDA GPU
    TRITON_INTERPRET=1 python benchmarks/peer_sum_variants.py --interpret   # bits only, CPU

For each wire (fp8, nvfp4, mxfp4), W (4, 8) and rows a rank pulls (64, 256, 2,048; rows of
7,168), one process stands in for the W ranks (``peer._LocalMemory``: W workspaces, each
holding quantized rows in the phase the pull reads) and prints, as shares of a
device-to-device copy of the bytes read + written (1.0: the copy ceiling):

- ``dpx``: the library's kernel and launch;
- ``combine_sum``: :func:`dpx.kernels.combine.dequantize_sum_kernel` on the same wire rows
  in one buffer (the same arithmetic with its pointers known to the compiler);
- ``v<S><I><A>_b<B>w<N>``: the variant kernel below with ``S`` 1: a select of each masked
  row's values to 0 (0: none), ``I`` 64 / 32: index math in int64 / int32, ``A`` 1: the
  rows' alignment told to the compiler (:func:`dpx.kernels.peer.row_starts`), ``B`` blocks
  a program and ``N`` warps: ``v1640`` and ``v0320`` at dpx's launch, ``v0321`` (dpx's
  kernel) at six other launches. ``v1640`` is the library's kernel before it told the
  compiler the alignment and dropped the select.

Every variant's output is compared with dpx's bit for bit (``DIFF`` where not); with
``--interpret`` the variants' pull reads from row 1 of its source and stops two rows
short, so masked rows differ from read ones. Writes ``peer_sum_variants.csv`` to
$OUT or benchmarks/out.
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

import dpx
from common import copy_us, cuda_time_us, out_dir, write_csv
from dpx.kernels import launch as L
from dpx.kernels.blocks import block_index
from dpx.kernels.blocks import add_rn
from dpx.kernels.combine import dequantize_sum_kernel, store_sum, wire_block_values
from dpx.kernels.constants import GROUP, MX_BLOCK, NV_BLOCK
from dpx.kernels.peer import peer_base, peer_wire_sum_kernel, phase_offset, row_starts
from dpx.wire import wire_row_bytes
from dpx_torch.passes import TritonPasses
from dpx_torch.shims.triton_launch import Launcher
from peer import _LocalMemory


@triton.jit(do_not_specialize=["me", "out_rows", "ws_rows", "data", "stride", "g"])
def variant_kernel(table_ptr, firsts_ptr, lens_ptr, me, out_rows, ws_rows, data, stride, g,
                   out_ptr, H: tl.constexpr, ROW_BYTES: tl.constexpr, FP4: tl.constexpr,
                   NV: tl.constexpr, W: tl.constexpr, OUT_KIND: tl.constexpr,
                   EPOCH: tl.constexpr, BLOCK_B: tl.constexpr, COMPILED: tl.constexpr,
                   WIDE: tl.constexpr, SELECT: tl.constexpr, ALIGNED: tl.constexpr):
    """:func:`dpx.kernels.peer.peer_wire_sum_kernel` with its choices as switches."""
    GS: tl.constexpr = (NV_BLOCK if NV else MX_BLOCK) if FP4 else GROUP
    NB: tl.constexpr = H // GS
    f = block_index(0, BLOCK_B, WIDE)
    row = f // NB
    grp = f % NB
    src = tl.load(firsts_ptr + me) + row
    ok = row < out_rows
    real = ok & (row < tl.load(lens_ptr + me)) & (src >= 0) & (src < ws_rows)
    off = phase_offset(table_ptr, me, data, stride, EPOCH, True)
    acc = tl.full([BLOCK_B, GS], 0.0, tl.float32)
    for p in tl.static_range(W):
        if ALIGNED:
            base = row_starts(peer_base(table_ptr, p) + off, src.to(tl.int64), ROW_BYTES)
        else:
            base = peer_base(table_ptr, p) + off + src.to(tl.int64) * ROW_BYTES
        v = wire_block_values(base, grp, real, g, H, ROW_BYTES, FP4, NV, BLOCK_B, COMPILED)
        if SELECT:
            v = tl.where(real[:, None], v, 0.0)
        acc = add_rn(acc, v, COMPILED)
    offs = (f * GS)[:, None] + tl.arange(0, GS)[None, :]
    store_sum(acc, out_ptr, offs, ok[:, None], OUT_KIND, COMPILED)


class _HostMemory:
    """``W`` workspaces on the CPU (Triton's interpreter), as ``peer._LocalMemory``."""

    def __init__(self, W: int, phase_bytes: int, rank: int) -> None:
        self.layout = dpx.PeerLayout(W, phase_bytes)
        self.bufs = [torch.zeros(self.layout.total_bytes, dtype=torch.uint8) for _ in range(W)]
        self.err = torch.zeros(1, dtype=torch.int64)
        self.table = torch.tensor([b.data_ptr() for b in self.bufs] + [self.err.data_ptr()],
                                  dtype=torch.int64)


def main(interpret: bool) -> list[dict]:
    dev, H = ("cpu", 256) if interpret else ("cuda", 7168)
    time_it = (lambda fn: 1.0) if interpret else cuda_time_us
    local = TritonPasses(Launcher())
    rows, copies = [], {}
    bf = torch.bfloat16
    for wire in (dpx.Wire.FP8, dpx.Wire.NVFP4, dpx.Wire.MXFP4):
        wrb, gs = wire_row_bytes(H, wire), dpx.wire.block(wire)
        g = 1.0 / 3.0 if wire is dpx.Wire.NVFP4 else None
        for W in (2,) if interpret else (4, 8):
            for n in (5,) if interpret else (64, 256, 2048):
                mem = (_HostMemory if interpret else _LocalMemory)(W, W * n * 2 * H, 0)
                lay = mem.layout
                x = (torch.randn(W * n, H, device=dev) * 3).to(bf)
                wbuf = torch.empty(W * n, wrb, dtype=torch.uint8, device=dev)
                local.quantize(x, 0, W * n, wbuf, wire, g)
                for p, b in enumerate(mem.bufs):   # rank p's rows, in the phase read
                    b[lay.data:lay.data + n * wrb].copy_(wbuf[p * n:(p + 1) * n].reshape(-1))
                firsts = torch.zeros(W, dtype=torch.int32, device=dev)
                lens = torch.full((W,), n, dtype=torch.int32, device=dev)
                ws_rows = lay.phase_bytes // wrb
                lt = L.peer_wire_sum_launch(wire, n, H, "bfloat16", W, lay.epoch,
                                            ws_rows=ws_rows, compiled=not interpret)
                ints = (0, n, ws_rows, lay.data, lay.stride, L.fp4_scale(g))
                ref = torch.empty(n, H, dtype=bf, device=dev)

                def dpx_sum():
                    peer_wire_sum_kernel[lt.grid](mem.table, firsts, lens, *ints, ref,
                                                  num_warps=lt.warps, **lt.consts)
                dpx_sum()
                cu = 1.0 if interpret else copy_us(W * n * wrb + n * 2 * H, copies)
                row = {"wire": wire.value, "W": W, "rows": n, "dpx": cu / time_it(dpx_sum)}
                dl = L.dequantize_sum_launch(wire, n, W, H, "bfloat16", compiled=not interpret)
                outd = torch.empty(n, H, dtype=bf, device=dev)

                def combine_sum():
                    dequantize_sum_kernel[dl.grid](wbuf, n, L.fp4_scale(g), outd,
                                                   num_warps=dl.warps, **dl.consts)
                combine_sum()
                row["combine_sum"] = (cu / time_it(combine_sum)
                                      if torch.equal(outd.view(torch.int16), ref.view(torch.int16))
                                      else "DIFF")
                if interpret:   # the variants: rows past the count and a source offset
                    firsts[0], lens[0] = 1, n - 2
                    dpx_sum()
                b0, w0 = lt.consts["BLOCK_B"], lt.warps
                cands = [(1, True, 0, b0, w0), (0, False, 0, b0, w0)] + [
                    (0, False, 1, b, w) for b, w in ((8, 4), (32, 4), (16, 8), (64, 4), (32, 8),
                                                     (16, 4)) if (b, w) != (b0, w0)]
                for select, wide, aligned, b, w in cands:
                    consts = dict(lt.consts, BLOCK_B=b, WIDE=wide, SELECT=select,
                                  ALIGNED=aligned)
                    grid = (-(-n * (H // gs) // b),)
                    out = torch.empty(n, H, dtype=bf, device=dev)

                    def variant(out=out, consts=consts, grid=grid, w=w):
                        variant_kernel[grid](mem.table, firsts, lens, *ints, out, num_warps=w,
                                             **consts)
                    variant()
                    key = f"v{select}{64 if wide else 32}{aligned}_b{b}w{w}"
                    row[key] = (cu / time_it(variant)
                                if torch.equal(out.view(torch.int16), ref.view(torch.int16))
                                else "DIFF")
                print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()},
                      flush=True)
                rows.append(row)
                del mem
    return rows


if __name__ == "__main__":
    result = main("--interpret" in sys.argv)
    if "--interpret" in sys.argv:
        bad = [r for r in result if "DIFF" in r.values()]
        print("every variant equal to dpx bit for bit" if not bad else f"DIFF: {bad}")
        sys.exit(1 if bad else 0)
    write_csv(out_dir() / "peer_sum_variants.csv", result)
