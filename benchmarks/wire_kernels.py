"""The wire kernels against the copy ceiling: every quantize-and-place, dequantize and
summing pass (``dequantize_sum``) of the fp8, nvfp4 and mxfp4 wires, each as the *share*
of a device-to-device copy of the same bytes (read + written) it reaches, with the
compiled kernel's registers, spills and SASS instructions per element (GPU only).

    python benchmarks/wire_kernels.py [--hidden 7168] [--sizes 256,2048,16384]

Per wire and size (``n`` rows of ``hidden`` bf16 elements; 256 / 2,048 / 16,384 rows are
3.5 / 28 / 224 MiB at hidden 7,168):

  quantize       : ``n`` bf16 rows read, ``n`` wire rows written (into a buffer of ``n``
                   rows: the pass the gather and the combine run);
  dequantize     : ``n`` wire rows read, ``n`` bf16 rows written;
  sum xP         : the combine's summing pass, ``P`` wire copies of ``n`` rows read,
                   ``n`` bf16 rows written (P = 2 and 8).

``share = copy_us(read + written) / kernel_us`` (1.0: the kernel moves its bytes as fast
as the copy; device times from one CUDA graph of 50 calls, median of 7, both sides in
this run). The kernel statistics come from the kernel compiled for this GPU with the
launch dpx uses (``dpx.kernels.launch``): ``regs`` and ``spills`` per thread, ``sass``
the static SASS instruction count, ``sass_per_elem`` that count over the elements one
thread handles (the program's elements / its threads). Writes ``wire_kernels.csv`` and
``wire_kernels.png`` to ``$OUT`` or benchmarks/out.
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import subprocess
import tempfile

import torch

from common import NV_SCALE, copy_us, cuda_time_us, out_dir, print_table, pyplot, write_csv
from dpx import wire as W
from dpx.kernels import launch as L
from dpx.modes import Wire
from dpx_torch.passes import TritonPasses

_SCALARS = {"g": "fp32"}


def kernel_stats(lt: L.Launch, ptr_types: dict[str, str]) -> dict:
    """Registers, spills and SASS instructions of ``lt``'s kernel compiled for this GPU."""
    import triton
    from triton.compiler import ASTSource

    names = list(inspect.signature(lt.kernel.fn).parameters)
    sig, attrs = {}, {}
    for i, n in enumerate(names):
        if n in lt.consts:
            sig[n] = "constexpr"
        elif i in lt.pointers:
            sig[n] = ptr_types.get(n, "*i32")
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[n] = _SCALARS.get(n, "i32")
    target = triton.runtime.driver.active.get_current_target()
    k = triton.compile(ASTSource(lt.kernel, sig, lt.consts, attrs=attrs), target=target,
                       options={"num_warps": lt.warps})
    k._init_handles()
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        text = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout
    sass = sum(1 for ln in text.splitlines() if re.match(r"^\s*/\*[0-9a-f]{4}\*/", ln))
    return dict(regs=k.n_regs, spills=k.n_spills, sass=sass)


def _elements_per_thread(lt: L.Launch, hidden: int, wire: Wire) -> int:
    c = lt.consts
    if "BLOCK_B" in c:
        per_program = c["BLOCK_B"] * W.block(wire)
    else:   # fp8 quantize: rows x groups
        per_program = c["BLOCK_R"] * c.get("BLOCK_G", 1) * W.GROUP
    return max(per_program // (32 * lt.warps), 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--sizes", default="256,2048,16384")
    args = ap.parse_args()
    h = args.hidden
    sizes = [int(s) for s in args.sizes.split(",")]
    passes = TritonPasses()
    copies: dict = {}
    rows, stats = [], {}
    for wire in (Wire.FP8, Wire.NVFP4, Wire.MXFP4):
        g = NV_SCALE if wire is Wire.NVFP4 else None
        rb = W.wire_row_bytes(h, wire)
        for n in sizes:
            x = torch.randn(8 * n, h, device="cuda", dtype=torch.bfloat16)
            wbuf = torch.empty(8 * n, rb, device="cuda", dtype=torch.uint8)
            passes.quantize(x, 0, 8 * n, wbuf, wire, g)
            y = torch.empty(n, h, device="cuda", dtype=torch.bfloat16)
            cases = {
                "quantize": (lambda: passes.quantize(x, 0, n, wbuf[:n], wire, g),
                             n * h * 2 + n * rb,
                             L.quantize_launch(wire, 8 * n, n, h, 2, start_ptr=False,
                                               count_ptr=False, compiled=True),
                             {"src_ptr": "*bf16", "out_ptr": "*u8"}),
                "dequantize": (lambda: passes.dequantize(wbuf[:n], y, wire, g),
                               n * rb + n * h * 2,
                               L.dequantize_launch(wire, n, h, "bfloat16", compiled=True),
                               {"src_ptr": "*u8", "out_ptr": "*bf16"}),
            }
            for parts in (2, 8):
                cases[f"sum x{parts}"] = (
                    lambda parts=parts: passes.dequantize_sum(wbuf[:parts * n], y, parts,
                                                              wire, g),
                    parts * n * rb + n * h * 2,
                    L.dequantize_sum_launch(wire, n, parts, h, "bfloat16", compiled=True),
                    {"src_ptr": "*u8", "out_ptr": "*bf16"})
            for kind, (fn, moved, lt, ptrs) in cases.items():
                t = cuda_time_us(fn)
                key = (wire, kind)
                if key not in stats:
                    st = kernel_stats(lt, ptrs)
                    st["sass_per_elem"] = st["sass"] / _elements_per_thread(lt, h, wire)
                    stats[key] = st
                rows.append(dict(kernel=kind, wire=wire.value, rows=n,
                                 MiB=moved / 2**20, us=t,
                                 share=copy_us(moved, copies) / t, **stats[key]))
            torch.cuda.empty_cache()
    print(f"share of a device-to-device copy of the same bytes (read + written), "
          f"{torch.cuda.get_device_name()}")
    print_table(rows, ["kernel", "wire", "rows", "MiB", "us", "share", "regs", "spills",
                       "sass", "sass_per_elem"])
    od = out_dir()
    write_csv(od / "wire_kernels.csv", rows)
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(8, 5))
    for kind in dict.fromkeys(r["kernel"] for r in rows):
        for wire, style in (("fp8", "o-"), ("nvfp4", "s--"), ("mxfp4", "^:")):
            sel = [r for r in rows if r["kernel"] == kind and r["wire"] == wire]
            ax.plot([r["MiB"] for r in sel], [r["share"] for r in sel], style,
                    label=f"{kind} {wire}")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("MiB read + written")
    ax.set_ylabel("share of a D2D copy of the same bytes")
    ax.set_title(f"wire kernels, hidden {h} bf16, {torch.cuda.get_device_name()}")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(od / "wire_kernels.png", dpi=120)


if __name__ == "__main__":
    main()
