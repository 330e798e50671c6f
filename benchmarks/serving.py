"""Serving features: bytes on the wire (bf16 vs fp8, nvfp4 and mxfp4, from the schedules) of
the gather and of the combine (the quantized reduce_scatter), and on a GPU the fused
quantize-and-place kernels, the combine's summing pass and the whole combine, pad-row
masking, a three-tensor gather and the device count exchange, each against its baseline
measured in the same run.

    python benchmarks/serving.py            # the wire-bytes table only (no GPU needed)
    python benchmarks/serving.py --gpu      # plus the GPU tables (one H200: world size 1)

GPU tables (hidden 7168 bf16; device times from one CUDA graph of 50 calls, median of 7):
  quantize : per wire (fp8, nvfp4, mxfp4) the fused quantize-and-place pass (reads ``n``
             bf16 rows once, writes ``n`` wire rows) vs a device-to-device copy of as many
             bytes (read + written: ``vs_copy``), vs a copy of the input's bytes (``n``
             bf16 rows read and written: ``vs_input_copy``) and vs two launches (quantize
             into a scratch, then place the wire rows); and the dequantize of those wire
             rows back to bf16 vs a copy of its output bytes (``n`` bf16 rows read and
             written);
  combine  : the combine's summing pass (``dequantize_sum``: ``parts`` wire copies of ``n``
             rows read, ``n`` bf16 rows written; simulated sources, one rank's receive
             buffer) at parts 2, 4, 8 vs a copy of its input's bytes (read and written:
             ``vs_input_copy``) and vs a copy of the bytes it reads and writes
             (``vs_copy``); the whole ``reduce_scatter(wire=...)`` at NCCL world 1, CUDA
             graph of 50 calls, vs the native ``reduce_scatter`` (``vs_native``);
  decode   : mask_pad_rows at decode (8 replicas x 32 rows x 8 ids, device counts); a
             three-tensor gather (hidden, top-k ids, top-k weights) vs three gathers, and
             the NCCL collectives each issues (ProcessGroupNCCL's ``nccl:*`` profiler
             ranges); exchange_counts replayed in a graph vs sync_counts eager (host wall
             time per call).
Writes serving_wire.csv, serving_combine_bytes.csv, serving_quantize.csv,
serving_combine.csv, serving_combine_rs.csv, serving_decode.csv, serving.png and
serving_combine.png to $OUT
or benchmarks/out. The quantize kernel's launch shapes are swept by launch_sweep.py.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import dpx
from common import NV_SCALE, copy_us, out_dir, print_table, pyplot, write_csv
from dpx.cost import price
from dpx.cost_model import CostModel
from dpx.schedule import build_schedule
from dpx.wire import wire_row_bytes

H = 7168
SIZES = (("decode", 32), ("mid", 512), ("prefill", 4096))


#: The quantized wires of the tables
WIRES = ("fp8", "nvfp4", "mxfp4")


def _bytes_table(op: str, modes: tuple[str, ...]) -> list[dict]:
    """Bytes each rank sends in one ``op`` per mode, bf16 vs each quantized wire (the
    slowest rank of the schedules dpx_torch runs; attn-tp 1 and 2, every replica busy or
    half of them idle)."""
    rows = []
    model = CostModel()
    for world, dp in ((8, 8), (8, 4)):
        lay = dpx.DpLayout(world, dp)
        for size, n in SIZES:
            for pattern, counts in (("busy", [n] * dp),
                                    ("half idle", [n if i % 2 == 0 else 0 for i in range(dp)])):
                for mode in modes:
                    plan = dpx.plan_step(counts, lay, mode=mode)
                    sent = {}
                    for wire in ("native", *WIRES):
                        w = dpx.Wire.parse(wire)
                        sent[wire] = max(
                            sum(s.moved for s in price(
                                build_schedule(plan, op, rank=r, partial=True, wire=w),
                                row_bytes=2 * H, cost_model=model,
                                wire_row_bytes=None if wire == "native"
                                else wire_row_bytes(H, w)))
                            for r in range(world))
                    row = dict(layout=lay.describe(), size=size, pattern=pattern, mode=mode,
                               bf16_MiB=sent["native"] / 2**20)
                    for wire in WIRES:
                        row[f"{wire}_MiB"] = sent[wire] / 2**20
                        row[f"{wire}_vs_bf16"] = sent[wire] / sent["native"]
                    rows.append(row)
    return rows


def wire_table() -> list[dict]:
    """The gather's bytes per rank (the copy modes: SUM_LEN cannot carry a wire)."""
    return _bytes_table("gather", ("max_len", "gatherv"))


def combine_table() -> list[dict]:
    """The combine's bytes per rank: the bf16 reduce-scatter vs the quantized one."""
    return _bytes_table("reduce_scatter", ("max_len", "sum_len", "gatherv"))


def combine_gpu(copies: dict) -> list[dict]:
    """The combine's summing pass against copies, and the whole combine against the native
    reduce_scatter at NCCL world 1 (the caller's process group)."""
    import torch

    from common import cuda_time_us
    from dpx_torch import DpComm
    from dpx_torch.passes import TritonPasses

    kernels = TritonPasses()
    comm = DpComm(dpx.DpLayout(1, 1))
    out = []
    for wire in WIRES:
        w = dpx.Wire.parse(wire)
        g = NV_SCALE if w is dpx.Wire.NVFP4 else None
        wrb = wire_row_bytes(H, w)
        for parts in (2, 4, 8):
            for n in (3072, 6144, 16384):   # 42, 84, 224 MiB of bf16 output
                src = torch.empty(parts * n, wrb, device="cuda", dtype=torch.uint8)
                kernels.quantize(torch.randn(parts * n, H, device="cuda",
                                             dtype=torch.bfloat16), 0, parts * n, src, w, g)
                y = torch.empty(n, H, device="cuda", dtype=torch.bfloat16)
                t = cuda_time_us(lambda: kernels.dequantize_sum(src, y, parts, w, g))
                read = parts * n * wrb
                out.append(dict(what=f"dequantize_sum x{parts}", wire=wire, rows=n,
                                input_MiB=read / 2**20, us=t,
                                vs_input_copy=copy_us(2 * read, copies) / t,
                                vs_copy=copy_us(read + n * H * 2, copies) / t))
        for n in (32, 512, 4096):
            plan = dpx.plan_step([n], comm.layout, mode="max_len")
            x = torch.randn(plan.global_rows, H, device="cuda", dtype=torch.bfloat16)
            t = cuda_time_us(lambda: comm.reduce_scatter(x, plan, wire=w, wire_scale=g))
            t_native = cuda_time_us(lambda: comm.reduce_scatter(x, plan))
            out.append(dict(what="reduce_scatter world 1", wire=wire, rows=n,
                            input_MiB=n * H * 2 / 2**20, us=t, native_us=t_native,
                            vs_native=t_native / t))
    comm.destroy()
    return out


def gpu_tables() -> tuple[list[dict], list[dict], list[dict]]:
    import torch
    import torch.distributed as dist

    from common import cuda_time_us
    from dpx_torch import DeviceTables, DpComm, mask_pad_rows
    from dpx_torch.passes import TritonPasses

    kernels = TritonPasses()

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{tempfile.mkdtemp()}/rdv", rank=0,
                            world_size=1)
    quant = []
    copies: dict = {}
    for wire in WIRES:
        w = dpx.Wire.parse(wire)
        g = NV_SCALE if w is dpx.Wire.NVFP4 else None
        wrb = wire_row_bytes(H, w)
        for n in (256, 2048, 3072, 4096, 8192, 16384):
            x = torch.randn(n, H, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(n, wrb, device="cuda", dtype=torch.uint8)
            tmp = torch.empty_like(out)
            moved = n * H * 2 + n * wrb
            t_copy = copy_us(moved, copies)
            t_in_copy = copy_us(2 * n * H * 2, copies)
            t_fused = cuda_time_us(lambda: kernels.quantize(x, 0, n, out, w, g))
            t_two = cuda_time_us(lambda: (kernels.quantize(x, 0, n, tmp, w, g),
                                          kernels.move(tmp, 0, 0, n, out)))
            back = torch.empty_like(x)
            kernels.quantize(x, 0, n, out, w, g)
            t_deq = cuda_time_us(lambda: kernels.dequantize(out, back, w, g))
            quant.append(dict(wire=wire, rows=n, input_MiB=n * H * 2 / 2**20,
                              MiB=moved / 2**20, fused_us=t_fused, copy_us=t_copy,
                              two_launch_us=t_two, vs_copy=t_copy / t_fused,
                              vs_input_copy=t_in_copy / t_fused,
                              vs_two_launch=t_two / t_fused,
                              fused_GBs=moved / t_fused / 1e3, dequantize_us=t_deq,
                              dequantize_vs_copy=t_in_copy / t_deq))
    quant_combine = combine_gpu(copies)
    comm = DpComm(dpx.DpLayout(1, 1))
    dec = []
    lay8 = dpx.DpLayout(8, 8)
    plan8 = dpx.plan_step([0] * 8, lay8, mode="max_len", capacity=32)
    counts8 = torch.tensor([32, 0, 5, 32, 1, 0, 17, 9], dtype=torch.int32, device="cuda")
    ids8 = torch.zeros(plan8.global_rows, 8, dtype=torch.int32, device="cuda")
    tables = DeviceTables()  # made in the warm-up call, before the timing graph's capture
    dec.append(dict(what="mask_pad_rows 8x32 rows x 8 ids", us=cuda_time_us(
        lambda: mask_pad_rows(ids8, plan8, counts=counts8, tables=tables)), baseline="-",
        baseline_us=0.0, ratio=0.0))
    n = 32
    plan = dpx.plan_step([n], comm.layout, mode="max_len")
    xs = (torch.randn(n, H, device="cuda", dtype=torch.bfloat16),
          torch.randint(0, 256, (n, 8), device="cuda", dtype=torch.int32),
          torch.rand(n, 8, device="cuda"))
    t_batch = cuda_time_us(lambda: comm.gather(xs, plan, partial=(True, False, False)))
    t_three = cuda_time_us(lambda: [comm.gather(x, plan, partial=False) for x in xs])
    dec.append(dict(what="gather((hidden, ids, weights)) decode", us=t_batch,
                    baseline="three gathers", baseline_us=t_three, ratio=t_three / t_batch))
    launches = {}
    from torch.profiler import ProfilerActivity, profile
    for name, fn in (("one call", lambda: comm.gather(xs, plan, partial=(True, False, False))),
                     ("three calls", lambda: [comm.gather(x, plan, partial=False)
                                              for x in xs])):
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
            torch.cuda.synchronize()
        launches[name] = [e.name for e in prof.events() if e.name.startswith("nccl:")]
    print(f"NCCL collectives per three-tensor gather: one call {launches['one call']}, "
          f"three calls {launches['three calls']}")
    n_local = torch.tensor([n], dtype=torch.int32, device="cuda")
    t_ex = cuda_time_us(lambda: comm.exchange_counts(n_local))
    for _ in range(20):
        comm.sync_counts(n)
    reps = 200
    t0 = time.perf_counter()
    for _ in range(reps):
        comm.sync_counts(n)
    t_sync = (time.perf_counter() - t0) / reps * 1e6
    dec.append(dict(what="exchange_counts (graph replay, device us)", us=t_ex,
                    baseline="sync_counts eager (host us)", baseline_us=t_sync,
                    ratio=t_sync / t_ex))
    dist.destroy_process_group()
    return quant, quant_combine, dec


def _plot(quant: list[dict], path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for wire in WIRES:
        rows = [r for r in quant if r["wire"] == wire]
        x = [r["input_MiB"] for r in rows]
        ax.plot(x, [r["vs_copy"] for r in rows], "o-", label=f"{wire} fused / copy ceiling")
        ax.plot(x, [r["vs_two_launch"] for r in rows], "s--",
                label=f"{wire} fused vs two launches")
        ax.plot(x, [r["dequantize_vs_copy"] for r in rows], "^:",
                label=f"{wire} dequantize / copy")
    ax.axhline(0.9, ls=":", c="gray")
    ax.axhline(1.5, ls="--", c="gray")
    ax.set_xscale("log")
    ax.set_xlabel("MiB of bf16 input")
    ax.set_ylabel("speed ratio (same run)")
    ax.set_title(f"quantize-and-place and dequantize, hidden {H} bf16")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _plot_combine(rows: list[dict], path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for wire in WIRES:
        for parts in (2, 4, 8):
            sel = [r for r in rows if r["wire"] == wire and r["what"] == f"dequantize_sum x{parts}"]
            ax.plot([r["input_MiB"] for r in sel], [r["vs_input_copy"] for r in sel], "o-",
                    label=f"{wire} x{parts}")
    ax.axhline(0.9, ls=":", c="gray")
    ax.set_xscale("log")
    ax.set_xlabel("MiB of wire rows read")
    ax.set_ylabel("speed vs a copy of the input (same run)")
    ax.set_title(f"the combine's summing pass, hidden {H}, bf16 out")
    ax.legend(ncol=3, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", action="store_true", help="also run the GPU tables")
    args = ap.parse_args()
    od = out_dir()
    wire = wire_table()
    print_table(wire, ["layout", "size", "pattern", "mode", "bf16_MiB",
                       *(f"{w}_{k}" for w in WIRES for k in ("MiB", "vs_bf16"))])
    write_csv(od / "serving_wire.csv", wire)
    comb = combine_table()
    print_table(comb, ["layout", "size", "pattern", "mode", "bf16_MiB",
                       *(f"{w}_{k}" for w in WIRES for k in ("MiB", "vs_bf16"))])
    write_csv(od / "serving_combine_bytes.csv", comb)
    if not args.gpu:
        return
    quant, quant_combine, dec = gpu_tables()
    print_table([r for r in quant_combine if "vs_copy" in r],
                ["what", "wire", "rows", "input_MiB", "us", "vs_input_copy", "vs_copy"])
    print_table([r for r in quant_combine if "vs_native" in r],
                ["what", "wire", "rows", "input_MiB", "us", "native_us", "vs_native"])
    write_csv(od / "serving_combine.csv", [r for r in quant_combine if "vs_copy" in r])
    write_csv(od / "serving_combine_rs.csv", [r for r in quant_combine if "vs_native" in r])
    _plot_combine(quant_combine, od / "serving_combine.png")
    print_table(quant, ["wire", "rows", "input_MiB", "fused_us", "copy_us", "two_launch_us",
                        "vs_copy", "vs_input_copy", "vs_two_launch", "dequantize_us",
                        "dequantize_vs_copy"])
    print_table(dec, ["what", "us", "baseline", "baseline_us", "ratio"])
    write_csv(od / "serving_quantize.csv", quant)
    write_csv(od / "serving_decode.csv", dec)
    _plot(quant, od / "serving.png")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
