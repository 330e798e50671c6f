"""The peer transport's row kernels under every candidate tile, against a copy of their bytes.

    python benchmarks/peer_tiles.py [--hidden 7168]

One process stands in for ``W`` ranks, as in ``benchmarks/peer.py``. Per ``W`` (4, 8),
``n`` rows a replica (64, 256, 2,048) and row kind (bf16 rows of ``H``; uint8 rows of the
fp8 wire's row bytes, what a quantized gather puts and takes and a quantized combine
stages), each of the kernels

  put_chunk : the chunk put (one rank's ``n`` rows into every workspace: the fan)
  stage     : the stage put (``W * n`` rows into the rank's own workspace)
  a2a_put   : the blocks put of an all-to-all (``n`` rows into each workspace)
  take      : the chunk take (``W * n`` rows out of the rank's own workspace)
  pull_sum  : the native pull-sum (bf16 rows only: ``n`` rows from every workspace)

is bound with the library's own tile (``chosen``: :func:`dpx.kernels.launch.tile_for` of
the rows a launch writes for the fan, ``PEER_SUM_TILE`` for the pull-sum,
``peer_move_tile`` for the others)
and with each candidate tile as given (elements / warps / widest column block; on byte rows
an element is a byte), and timed in a CUDA graph; ``share``: a device-to-device copy of the
bytes the kernel reads and writes over its time. Writes peer_tiles.csv to $OUT or
benchmarks/out and prints each kernel's shares by tile (GPU only).
"""

from __future__ import annotations

import argparse
import tempfile

import dpx
from common import copy_us, cuda_time_us, out_dir, print_table, write_csv
from dpx.kernels import launch as L
from dpx.kernels.launch import Tile
from dpx.wire import wire_row_bytes
from peer import _LocalMemory

TILES = [Tile(2048, 4), Tile(4096, 8), Tile(4096, 16), Tile(8192, 16, 2048),
         Tile(16384, 16, 4096), Tile(16384, 32, 4096), Tile(8192, 8, 4096),
         Tile(32768, 16, 8192), Tile(65536, 16, 8192)]


def _name(t: Tile) -> str:
    return f"{t.elems}/{t.warps}/{t.max_block_c}"


def _bind_with(tile: Tile | None, bind):
    """``bind()`` with every peer launch's tile ``tile`` (``None``: the library's)."""
    if tile is None:
        return bind()
    saved = L.tile_for, L.peer_move_tile, L.PEER_SUM_TILE
    L.tile_for = lambda *a, **k: tile
    L.peer_move_tile = lambda itemsize: tile
    L.PEER_SUM_TILE = tile
    try:
        return bind()
    finally:
        L.tile_for, L.peer_move_tile, L.PEER_SUM_TILE = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=7168)
    args = ap.parse_args()
    import torch
    import torch.distributed as dist

    from dpx_torch.peer_passes import CudaPeerPasses
    from dpx_torch.shims.triton_launch import Launcher

    init = tempfile.mktemp(prefix="dpx-peer-tiles-")
    dist.init_process_group("nccl", init_method=f"file://{init}", rank=0, world_size=1)
    launcher = Launcher()
    H, copies, rows = args.hidden, {}, []
    print(torch.cuda.get_device_name())
    for W in (4, 8):
        for n in (64, 256, 2048):
            G = W * n
            for dt, width in ((torch.bfloat16, H),
                              (torch.uint8, wire_row_bytes(H, dpx.Wire.FP8))):
                rb = width * dt.itemsize
                mem = _LocalMemory(W, G * 2 * H, 0)
                p = CudaPeerPasses(mem, 2.0, launcher)
                for b in mem.bufs:
                    b[mem.layout.ctrl:].random_(0, 120)
                firsts = torch.arange(W, dtype=torch.int32, device="cuda") * n
                lens = torch.full((W,), n, dtype=torch.int32, device="cuda")
                chunk = torch.randint(0, 100, (n, width), device="cuda").to(dt)
                src = torch.randint(0, 100, (G, width), device="cuda").to(dt)
                big = torch.empty(G, width, device="cuda", dtype=dt)
                part = torch.empty(n, width, device="cuda", dtype=dt)
                cases = {
                    "put_chunk": (lambda: p.bind_put(L.PEER_CHUNK, n, n, width, dt),
                                  lambda f: f(chunk, firsts, lens, None), n * rb + W * n * rb),
                    "stage": (lambda: p.bind_put(L.PEER_STAGE, G, n, width, dt),
                              lambda f: f(src, firsts, lens, None), 2 * G * rb),
                    "a2a_put": (lambda: p.bind_put(L.PEER_BLOCKS, G, n, width, dt, src_step=n),
                                lambda f: f(src, None, None, None), 2 * G * rb),
                    "take": (lambda: p.bind_take(L.PEER_CHUNK, G, n, width, dt),
                             lambda f: f(big, firsts, lens, None), 2 * G * rb),
                }
                if dt == torch.bfloat16:
                    cases["pull_sum"] = (lambda: p.bind_sum(n, width, dt, dpx.Wire.NATIVE, None),
                                         lambda f: f(part, firsts, lens), W * n * rb + n * rb)
                for kernel, (bind, call, moved) in cases.items():
                    row = {"kernel": kernel, "W": W, "n": n, "rows": str(dt)[6:]}
                    for tile in [None] + TILES:
                        f = _bind_with(tile, bind)
                        us = cuda_time_us(lambda: call(f))
                        row[_name(tile) if tile else "chosen"] = copy_us(moved, copies) / us
                    rows.append(row)
    dist.destroy_process_group()
    write_csv(out_dir() / "peer_tiles.csv", rows)
    print("share of a D2D copy of the bytes each kernel moves, by tile")
    print_table(rows, list(rows[0]))


if __name__ == "__main__":
    main()
