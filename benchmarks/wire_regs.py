"""The fp4 passes under register bounds and launch shapes, and the GPU's NaN conversions
(GPU only).

    python benchmarks/wire_regs.py

First the float32 -> bfloat16 / float16 conversion of the compiled kernels (Triton's
``.to``) on NaNs of either sign and several payloads, and on the values beside them:
the bits it writes. Then every fp4 summing pass (2 and 8 sources), dequantize and
quantize of nvfp4 and mxfp4 at 2,048 and 16,384 rows of 7,168 bf16 elements (28 / 224
MiB): the launch dpx makes (``dpx.kernels.launch``) and two other shapes, each with no
register bound and with PTX ``.maxnreg`` bounds (Triton's ``maxnreg`` launch option), as
the share of a device-to-device copy of the same bytes in this run (``share``), and
whether the output equals the library's own launch bit for bit (``same``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from common import NV_SCALE, copy_us, cuda_time_us
from dpx import wire as W
from dpx.kernels import launch as L
from dpx.modes import Wire
from dpx_torch.passes import TritonPasses

HIDDEN = 7168
#: float32 bits: NaNs (either sign, quiet and signalling, several payloads), then numbers
PROBE = [0x7FC00000, 0x7FFFFFFF, 0x7F800001, 0x7FA00000, 0x7FC00001, 0xFFC00000, 0xFFFFFFFF,
         0xFF800001, 0xFFA00000, 0x3F800000, 0xBF800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000,
         0xFF800000, 0]


@triton.jit
def _convert(src, out_bf, out_h, N: tl.constexpr):
    o = tl.arange(0, N)
    v = tl.load(src + o).to(tl.float32, bitcast=True)
    tl.store(out_bf + o, v.to(tl.bfloat16).to(tl.int16, bitcast=True))
    tl.store(out_h + o, v.to(tl.float16).to(tl.int16, bitcast=True))


def probe() -> None:
    src = torch.tensor([b - (1 << 32) if b >= 1 << 31 else b for b in PROBE],
                       dtype=torch.int32, device="cuda")
    ob = torch.empty(len(PROBE), dtype=torch.int16, device="cuda")
    oh = torch.empty_like(ob)
    _convert[(1,)](src, ob, oh, N=len(PROBE))
    for b, x, y in zip(PROBE, ob.tolist(), oh.tolist()):
        print(f"probe f32 {b:08x} -> bf16 {x & 0xFFFF:04x} f16 {y & 0xFFFF:04x}")


def _launch(lt: L.Launch, args: tuple, block_b: int, warps: int, maxnreg: int | None):
    grid = (-(-lt.grid[0] * lt.consts["BLOCK_B"] // block_b),)
    kw = dict(lt.consts, BLOCK_B=block_b, num_warps=warps)
    if maxnreg:
        kw["maxnreg"] = maxnreg
    return lambda: lt.kernel[grid](*args, **kw)


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    probe()
    h, copies, passes = HIDDEN, {}, TritonPasses()
    for wire in (Wire.NVFP4, Wire.MXFP4):
        g = NV_SCALE if wire is Wire.NVFP4 else None
        rb, gs, gv = W.wire_row_bytes(h, wire), W.block(wire), L.fp4_scale(g)
        for n in (2048, 16384):
            x = torch.randn(8 * n, h, device="cuda", dtype=torch.bfloat16)
            wbuf = torch.empty(8 * n, rb, device="cuda", dtype=torch.uint8)
            passes.quantize(x, 0, 8 * n, wbuf, wire, g)
            y, ref = (torch.empty(n, h, device="cuda", dtype=torch.bfloat16) for _ in "yr")
            wq = torch.empty(n, rb, device="cuda", dtype=torch.uint8)
            cases = [(f"sum x{p}", L.dequantize_sum_launch(wire, n, p, h, "bfloat16",
                                                           compiled=True),
                      (wbuf, n, gv, y), p * n * rb + n * h * 2,
                      lambda p=p: passes.dequantize_sum(wbuf[:p * n], ref, p, wire, g))
                     for p in (2, 8)]
            cases.append(("dequantize", L.dequantize_launch(wire, n, h, "bfloat16",
                                                            compiled=True),
                          (wbuf, n, gv, y), n * rb + n * h * 2,
                          lambda: passes.dequantize(wbuf[:n], ref, wire, g)))
            cases.append(("quantize", L.quantize_launch(wire, 8 * n, n, h, 2, start_ptr=False,
                                                        count_ptr=False, compiled=True),
                          (x, x, x, 0, n, 8 * n, n, gv, wq), n * h * 2 + n * rb, None))
            for kind, lt, args, moved, lib in cases:
                t_copy = copy_us(moved, copies)
                base = (lt.consts["BLOCK_B"], lt.warps)
                shapes = [base] + [s for s in ((2048 // gs, 4), (1024 // gs, 4)) if s != base]
                for bb, w in shapes:
                    for mr in (None, 32, 40, 48, 56) if (bb, w) == base else (None, 40, 48):
                        fn = _launch(lt, args, bb, w, mr)
                        fn()
                        if lib is not None:
                            lib()
                            same = torch.equal(y.view(torch.int16), ref.view(torch.int16))
                        else:
                            same = torch.equal(wq, wbuf[:n])
                        t = cuda_time_us(fn)
                        print(f"{wire.value:6s} {kind:10s} n={n:6d} bb={bb:4d} w={w:2d} "
                              f"maxnreg={mr} share={t_copy / t:.3f} us={t:.1f} same={same}",
                              flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
