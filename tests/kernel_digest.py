"""One digest of the machine code of every ``dpx.kernels`` kernel, compiled for an H100/H200
(sm_90) on any machine (Triton compiles to PTX and SASS without a GPU), to compare before
and after a kernel change that must not change the code -- a helper factored out, a
constant taken from elsewhere, a private name replaced.

    python3 tests/kernel_digest.py [--show NAME] [--sass]

Each case is one launch specialisation as ``dpx_torch`` binds it (every pointer 16-byte
aligned, integer arguments unspecialised). Per case it prints the SASS instruction count,
the registers and digests of the SASS and of the PTX with its source locations, debug
labels and comments removed (the code, not where it was written); then one digest over
every case's SASS. ``--show NAME`` prints that
case's normalised PTX (or its SASS with ``--sass``).
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from dpx.kernels import combine, counts, fp4, mask, rows, wire
from dpx.modes import Wire
from dpx.wire import wire_row_bytes

_TARGET = GPUTarget("cuda", 90, 32)
_BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
_SCALAR = {"g": "fp32", "fill": "fp32", "timeout_ns": "i64", "data": "i64", "stride": "i64"}


def _case(name, kernel, ptr_types: dict[str, str], consts: dict, warps: int) -> tuple:
    return name, kernel, ptr_types, consts, warps


def _cases() -> list[tuple]:
    bf, i32, u8 = "*bf16", "*i32", "*u8"
    row = dict(WIDTH=7168, BLOCK_R=1, BLOCK_C=1024)
    out = []
    for dev in (True, False):
        for stream in (False, True):
            p = i32 if dev else bf
            out.append(_case(f"move dev={dev} stream={stream}", rows.move_rows_kernel,
                             dict(src_ptr=bf, src_start_ptr=p, dst_start_ptr=p, count_ptr=p,
                                  out_ptr=bf),
                             dict(row, SRC_START_PTR=dev, DST_START_PTR=dev, COUNT_PTR=dev,
                                  BLOCK_R=4, WIDE=False, STREAM=stream), 16))
    out.append(_case("move wide", rows.move_rows_kernel,
                     dict(src_ptr=bf, src_start_ptr=i32, dst_start_ptr=i32, count_ptr=i32,
                          out_ptr=bf),
                     dict(row, SRC_START_PTR=True, DST_START_PTR=True, COUNT_PTR=True,
                          BLOCK_R=4, WIDE=True, STREAM=False), 16))
    out.append(_case("zero", rows.zero_rows_kernel,
                     dict(start_ptr=i32, count_ptr=i32, out_ptr=bf),
                     dict(row, START_PTR=True, COUNT_PTR=True, BLOCK_R=4, WIDE=False,
                          STREAM=False), 16))
    for k in (rows.pack_rows_kernel, rows.unpack_rows_kernel):
        out.append(_case(k.__name__, k, dict(src_ptr=bf, firsts_ptr=i32, lens_ptr=i32,
                                              out_ptr=bf), dict(row, BLOCK_R=4), 16))
    for dtype in ("*bf16", "*fp32"):
        out.append(_case(f"fp8 quantize {dtype}", wire.quantize_rows_kernel,
                         dict(src_ptr=dtype, start_ptr=i32, count_ptr=i32, out_ptr=u8),
                         dict(H=7168, ROW_BYTES=7168 + 56 * 4, START_PTR=True, COUNT_PTR=True,
                              BLOCK_R=2, BLOCK_G=8, COMPILED=True, WIDE=False), 4))
    for kind, dtype in enumerate(("*fp32", "*bf16", "*fp16")):
        out.append(_case(f"fp8 dequantize {dtype}", wire.dequantize_rows_kernel,
                         dict(src_ptr=u8, out_ptr=dtype),
                         dict(H=7168, ROW_BYTES=7168 + 56 * 4, OUT_KIND=kind, BLOCK_B=16,
                              COMPILED=True, WIDE=False), 4))
    for nv, gs, bb, w in ((True, 16, 64, 2), (False, 32, 128, 4)):
        rb = 7168 // 2 + 7168 // gs
        tag = "nvfp4" if nv else "mxfp4"
        out.append(_case(f"{tag} quantize", fp4.quantize_fp4_kernel,
                         dict(src_ptr="*bf16", start_ptr=i32, count_ptr=i32, out_ptr=u8),
                         dict(H=7168, ROW_BYTES=rb, NV=nv, START_PTR=True, COUNT_PTR=True,
                              BLOCK_B=bb, COMPILED=True, WIDE=False), w))
        for kind, dtype in enumerate(("*fp32", "*bf16", "*fp16")):
            out.append(_case(f"{tag} dequantize {dtype}", fp4.dequantize_fp4_kernel,
                             dict(src_ptr=u8, out_ptr=dtype),
                             dict(H=7168, ROW_BYTES=rb, NV=nv, OUT_KIND=kind, BLOCK_B=bb,
                                  COMPILED=True, WIDE=False), w))
    for tag, fp4_, nv, bb, w in (("fp8", False, False, 16, 4), ("nvfp4", True, True, 64, 2),
                                 ("mxfp4", True, False, 64, 4)):
        rb = 7168 + 56 * 4 if not fp4_ else 7168 // 2 + 7168 // (16 if nv else 32)
        for kind, dtype in enumerate(("*fp32", "*bf16", "*fp16")):
            out.append(_case(f"{tag} dequantize_sum x8 {dtype}", combine.dequantize_sum_kernel,
                             dict(src_ptr=u8, out_ptr=dtype),
                             dict(H=7168, ROW_BYTES=rb, FP4=fp4_, NV=nv, PARTS=8,
                                  OUT_KIND=kind, BLOCK_B=bb, COMPILED=True, WIDE=False), w))
    out.extend(peer_cases())
    out.append(_case("mask", mask.mask_rows_kernel,
                     dict(firsts_ptr=i32, lens_ptr=i32, buf_ptr=bf), dict(row, BLOCK_R=4), 16))
    out.append(_case("check_counts", counts.check_counts_kernel,
                     dict(counts_ptr=i32, flag_ptr=i32),
                     dict(ENTRIES=8, GROUP=2, ALIGN=2, MAX_EACH=64, MAX_SUM=512,
                          HAS_EACH=True, HAS_SUM=True, BLOCK=8, RBLOCK=4), 1))
    return out


def peer_cases(world: int = 8) -> list[tuple]:
    """The peer transport's kernels as ``dpx_torch`` binds them (:mod:`dpx.kernels.launch`'s
    descriptions, W = ``world``, rows of 7,168 bf16 or fp8 / nvfp4 wire bytes, and rows of 8
int32)."""
    from dpx.kernels import launch as L

    H, ep = 7168, 8 * world
    tab = {"table_ptr": "*i64", "firsts_ptr": "*i32", "lens_ptr": "*i32"}
    out = []
    for mode, name, step in ((L.PEER_CHUNK, "chunk", 0), (L.PEER_STAGE, "stage", 0),
                             (L.PEER_BLOCKS, "blocks", 0), (L.PEER_BLOCKS, "all_to_all", 64)):
        lt = L.peer_put_launch(mode, 64, H, 2, world, ep, report=mode == L.PEER_BLOCKS,
                               src_step=step)
        out.append(_case(f"peer put {name}", lt.kernel,
                         dict(tab, src_ptr="*bf16", count_ptr="*i32"), lt.consts, lt.warps))
    lt = L.peer_barrier_launch(world, ep)
    out.append(_case("peer barrier", lt.kernel, {"table_ptr": "*i64"}, lt.consts, lt.warps))
    for mode, name in ((L.PEER_CHUNK, "chunk"), (L.PEER_BLOCKS, "blocks")):
        lt = L.peer_take_launch(mode, 512, H, 2, world, ep, report=mode == L.PEER_BLOCKS)
        out.append(_case(f"peer take {name}", lt.kernel,
                         dict(tab, reports_ptr="*i32", out_ptr="*bf16"), lt.consts, lt.warps))
    lt = L.peer_sum_launch(64, H, "bfloat16", world, ep, compiled=True)
    out.append(_case("peer sum bf16", lt.kernel, dict(tab, out_ptr="*bf16"), lt.consts,
                     lt.warps))
    for w in (Wire.FP8, Wire.NVFP4, Wire.MXFP4):
        lt = L.peer_wire_sum_launch(w, 64, H, "bfloat16", world, ep, ws_rows=4096,
                                    compiled=True)
        out.append(_case(f"peer sum {w.value}", lt.kernel, dict(tab, out_ptr="*bf16"),
                         lt.consts, lt.warps))
    # wire rows as bytes: a quantized gather's chunk put and take, a combine's stage
    rb = wire_row_bytes(H, Wire.FP8)
    for mode, name in ((L.PEER_CHUNK, "chunk"), (L.PEER_STAGE, "stage")):
        lt = L.peer_put_launch(mode, 64, rb, 1, world, ep, report=False, src_step=0)
        out.append(_case(f"peer put {name} fp8 rows", lt.kernel,
                         dict(tab, src_ptr="*u8", count_ptr="*i32"), lt.consts, lt.warps))
    lt = L.peer_take_launch(L.PEER_CHUNK, 512, rb, 1, world, ep, report=False)
    out.append(_case("peer take chunk fp8 rows", lt.kernel,
                     dict(tab, reports_ptr="*i32", out_ptr="*u8"), lt.consts, lt.warps))
    # narrow rows: a router's top-8 expert ids, int32 (the moves' tile holds 2,048 of them)
    lt = L.peer_put_launch(L.PEER_STAGE, 64, 8, 4, world, ep, report=False, src_step=0)
    out.append(_case("peer put stage topk rows", lt.kernel,
                     dict(tab, src_ptr="*i32", count_ptr="*i32"), lt.consts, lt.warps))
    lt = L.peer_take_launch(L.PEER_CHUNK, 512, 8, 4, world, ep, report=False)
    out.append(_case("peer take chunk topk rows", lt.kernel,
                     dict(tab, reports_ptr="*i32", out_ptr="*i32"), lt.consts, lt.warps))
    return out


def compile_case(kernel, ptr_types: dict[str, str], consts: dict, warps: int):
    """The compiled kernel of one case (sm_90)."""
    names = list(inspect.signature(kernel.fn).parameters)
    sig, attrs = {}, {}
    for i, n in enumerate(names):
        if n in consts:
            sig[n] = "constexpr"
        elif n in ptr_types:
            sig[n] = ptr_types[n]
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[n] = _SCALAR.get(n, "i32")
    return triton.compile(ASTSource(kernel, sig, consts, attrs=attrs), target=_TARGET,
                          options={"num_warps": warps})


def normalised_ptx(ptx: str) -> str:
    """PTX without source locations, debug sections and comments."""
    keep = []
    skip = False
    for line in ptx.splitlines():
        s = line.strip()
        if s.startswith(".section") and "debug" in s:
            skip = True
        if skip:
            if s == "}":
                skip = False
            continue
        if s.startswith((".loc", ".file", "//")) or not s or re.fullmatch(r"\$L__tmp\d+:", s):
            continue
        keep.append(re.sub(r"\s*//.*$", "", line))
    return "\n".join(keep)


def sass(cubin: bytes) -> tuple[list[str], int]:
    """The SASS instructions of a cubin and its registers per thread."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([os.path.join(_BIN, "cuobjdump"), "-sass", "-res-usage",
                               f.name], capture_output=True, text=True, check=True).stdout
    regs = int(re.search(r"REG:(\d+)", text).group(1))
    ins = [re.sub(r"^\s*/\*[0-9a-f]+\*/\s*", "", ln).split(";")[0].strip()
           for ln in text.splitlines() if re.match(r"^\s*/\*[0-9a-f]{4}\*/", ln)]
    return ins, regs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--show")
    ap.add_argument("--sass", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    total = hashlib.sha256()
    for name, kernel, ptrs, consts, warps in _cases():
        k = compile_case(kernel, ptrs, consts, warps)
        ptx = normalised_ptx(k.asm["ptx"])
        ins, regs = sass(k.asm["cubin"])
        h = hashlib.sha256(ptx.encode()).hexdigest()[:12]
        code = "\n".join(ins)
        total.update(f"{name}\n{code}\n".encode())
        print(f"{name:32s} sass={len(ins):5d} regs={regs:4d} "
              f"code={hashlib.sha256(code.encode()).hexdigest()[:12]} ptx={h}")
        if args.show == name:
            print("\n".join(ins) if args.sass else ptx)
    print(f"all: {total.hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
