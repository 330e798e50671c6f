"""The peer transport's kernels on one GPU, and the bytes each rank moves.

    python benchmarks/peer.py [--hidden 7168] [--bytes-only] [--plot peer.csv]

One process stands in for ``W`` ranks: ``W`` workspaces in its own memory, the table
holding their addresses (the same kernels and table a rank's world steps use on peers'
CUDA IPC memory). Per size (``n`` real rows per replica, ``W`` replicas of attn-tp 1,
GATHERV, ``G = W * n``, bf16 rows of ``H``), one rank's side of:

  gather : put (its ``n`` rows into every workspace) + take (``G`` rows out of its own)
  combine: stage (its ``G`` input rows into its workspace) + pull-sum (its ``n`` rows from
           every workspace, float32 in rank order), native and on the fp8 wire (+ quantize)

each in a CUDA graph, against NCCL's all_gather / reduce_scatter of the same output bytes
at world 1 (NCCL refuses two ranks on one GPU: its world-1 collective is a copy) and each
kernel against a device-to-device copy of the bytes it reads and writes (``share``, 1.0 =
the copy ceiling). The barrier (``W`` ranks as ``W`` streams of one graph) is one GPU's,
not a link's. Then the bytes table (host only, ``--bytes-only``): what each rank sends in
a step with idle replicas, the peer transport's puts against the per_root transport's
collectives. Writes peer.csv, peer_bytes.csv and peer.png to $OUT or benchmarks/out.
"""

from __future__ import annotations

import argparse
import csv
import tempfile

import dpx
from dpx.cost import estimate_op, peer_bytes
from dpx.wire import wire_row_bytes
from common import out_dir, print_table, pyplot, write_csv


def bytes_table(H: int) -> list[dict]:
    """Per step (gather + combine, bf16 rows of ``H``; fp8 wire rows in the fp8 column):
    the bytes a rank sends on per_root (the cost model's per-rank figure: MAX_LEN's pad rows
    travel) and what it puts + pulls on the peer transport (real rows only: the mean over
    ranks, and the busiest rank), W = 8, decode and prefill, busy and with half the
    replicas idle."""
    rb, wrb = 2 * H, wire_row_bytes(H, dpx.Wire.FP8)
    model = dpx.CostModel()
    rows = []
    W = 8
    lay = dpx.DpLayout(W, W)
    for name, n in (("decode", 64), ("prefill", 4096)):
        for idle in (False, True):
            counts = [0 if idle and d % 2 else n for d in range(W)]
            row = {"size": name, "rows_per_replica": n, "idle_half": idle}
            for mode in ("max_len", "gatherv"):
                plan = dpx.plan_step(counts, lay, mode=mode)
                sent = sum(estimate_op(plan, op, row_bytes=rb, cost_model=model).moved
                           for op in (dpx.Op.GATHER, dpx.Op.REDUCE_SCATTER))
                row[f"per_root_{mode}_MiB"] = sent / 2**20
            plan = dpx.plan_step(counts, lay, mode="gatherv")
            native, fp8 = [], []
            for r in range(W):
                g = peer_bytes(dpx.build_schedule(plan, "gather", rank=r, transport="peer"),
                               row_bytes=rb)
                c = peer_bytes(dpx.build_schedule(plan, "reduce_scatter", rank=r,
                                                  transport="peer"), row_bytes=rb)
                q = peer_bytes(dpx.build_schedule(plan, "reduce_scatter", rank=r,
                                                  transport="peer", wire="fp8"),
                               row_bytes=rb, wire_row_bytes=wrb)
                native.append(sum(g) + sum(c))
                fp8.append(sum(g) + sum(q))
            row["peer_mean_MiB"] = sum(native) / W / 2**20
            row["peer_busiest_MiB"] = max(native) / 2**20
            row["peer_fp8_combine_mean_MiB"] = sum(fp8) / W / 2**20
            row["peer_mean_over_max_len"] = row["peer_mean_MiB"] / row["per_root_max_len_MiB"]
            rows.append(row)
    return rows


class _LocalMemory:
    """``W`` workspaces in this process standing in for the ranks' (the attributes the
    peer passes read of a :class:`dpx_torch.peer_memory.PeerMemory`)."""

    def __init__(self, W: int, phase_bytes: int, rank: int, bufs=None) -> None:
        import torch

        self.layout = dpx.PeerLayout(W, phase_bytes)
        self.rank, self.device = rank, torch.device("cuda", torch.cuda.current_device())
        self.bufs = bufs or [torch.zeros(self.layout.total_bytes, dtype=torch.uint8,
                                         device="cuda") for _ in range(W)]
        self.err = torch.zeros(1, dtype=torch.int64, pin_memory=True)
        self.error = self.err.numpy()
        self.table = torch.tensor([b.data_ptr() for b in self.bufs] + [self.err.data_ptr()],
                                  dtype=torch.int64, device="cuda")


def kernels(H: int) -> list[dict]:
    import torch
    import torch.distributed as dist

    from common import copy_us, cuda_time_us
    from dpx.kernels import launch as L
    from dpx_torch.peer_passes import CudaPeerPasses
    from dpx_torch.passes import TritonPasses
    from dpx_torch.shims.triton_launch import Launcher

    init = tempfile.mktemp(prefix="dpx-peer-bench-")
    dist.init_process_group("nccl", init_method=f"file://{init}", rank=0, world_size=1)
    launcher = Launcher()
    local = TritonPasses(launcher)
    copies: dict = {}
    rows = []
    bf = torch.bfloat16
    rb, wrb = 2 * H, wire_row_bytes(H, dpx.Wire.FP8)
    for W in (4, 8):
        for name, n in (("decode", 64), ("decode", 256), ("prefill", 2048)):
            G = W * n
            mem = _LocalMemory(W, G * rb, 0)
            p = CudaPeerPasses(mem, 2.0, launcher)
            # every workspace's epoch even: the puts write phase 1, the takes read phase 0;
            # fill both phases' rows so the reads read data
            for b in mem.bufs:
                b[mem.layout.ctrl:].random_(0, 120)
            chunk = torch.randn(n, H, device="cuda").to(bf)
            x = torch.randn(G, H, device="cuda").to(bf)
            firsts = torch.arange(W, dtype=torch.int32, device="cuda") * n
            lens = torch.full((W,), n, dtype=torch.int32, device="cuda")
            out = torch.empty(G, H, dtype=bf, device="cuda")
            part = torch.empty(n, H, dtype=bf, device="cuda")
            wire = torch.empty(G, wrb, dtype=torch.uint8, device="cuda")
            put = p.bind_put(L.PEER_CHUNK, n, n, H, bf)
            take = p.bind_take(L.PEER_CHUNK, G, n, H, bf)
            stage = p.bind_put(L.PEER_STAGE, G, n, H, bf)
            pull = p.bind_sum(n, H, bf, dpx.Wire.NATIVE, None)
            wstage = p.bind_put(L.PEER_STAGE, G, n, wrb, torch.uint8)
            wpull = p.bind_sum(n, H, bf, dpx.Wire.FP8, None)
            quant = local.bind_quantize(G, G, H, bf, x.device, 0, G, dpx.Wire.FP8)
            t = {
                "put": cuda_time_us(lambda: put(chunk, firsts, lens, None)),
                "take": cuda_time_us(lambda: take(out, firsts, lens, None)),
                "stage": cuda_time_us(lambda: stage(x, firsts, lens, None)),
                "pull_sum": cuda_time_us(lambda: pull(part, firsts, lens)),
                "quantize": cuda_time_us(lambda: quant(x, wire)),
                "stage_fp8": cuda_time_us(lambda: wstage(wire, firsts, lens, None)),
                "pull_sum_fp8": cuda_time_us(lambda: wpull(part, firsts, lens)),
            }
            # bytes read + written: the put reads its chunk once and writes it W times
            moved = {"put": n * rb + W * n * rb, "take": 2 * G * rb, "stage": 2 * G * rb,
                     "pull_sum": W * n * rb + n * rb, "quantize": G * rb + G * wrb,
                     "stage_fp8": 2 * G * wrb, "pull_sum_fp8": W * n * wrb + n * rb}
            ag_in = torch.randn(G, H, device="cuda").to(bf)
            ag_out = torch.empty_like(ag_in)
            nccl_ag = cuda_time_us(lambda: dist.all_gather_into_tensor(ag_out, ag_in))
            nccl_rs = cuda_time_us(lambda: dist.reduce_scatter_tensor(ag_out, ag_in))
            row = {"W": W, "size": name, "rows_per_replica": n, "global_rows": G}
            for k, us in t.items():
                row[f"{k}_us"] = us
                row[f"{k}_share"] = copy_us(moved[k], copies) / us
            row["gather_us"] = t["put"] + t["take"]
            row["combine_us"] = t["stage"] + t["pull_sum"]
            row["combine_fp8_us"] = t["quantize"] + t["stage_fp8"] + t["pull_sum_fp8"]
            row["nccl_all_gather_us"] = nccl_ag
            row["nccl_reduce_scatter_us"] = nccl_rs
            row["gather_over_nccl"] = row["gather_us"] / nccl_ag
            row["combine_over_nccl"] = row["combine_us"] / nccl_rs
            rows.append(row)
            del mem, p
    rows.append(barrier_row(launcher))
    dist.destroy_process_group()
    return rows


def barrier_row(launcher) -> dict:
    """W ranks' barriers on W streams of one graph, one GPU: µs per barrier (the flags'
    round trip in one GPU's memory, not a link's)."""
    import torch

    from common import cuda_time_us
    from dpx_torch.peer_passes import CudaPeerPasses

    W = 4
    first = _LocalMemory(W, 0, 0)
    mems = [first] + [_LocalMemory(W, 0, r, first.bufs) for r in range(1, W)]
    passes = [CudaPeerPasses(m, 2.0, launcher) for m in mems]
    streams = [torch.cuda.Stream() for _ in range(W)]

    def step():
        main = torch.cuda.current_stream()
        for s, p in zip(streams, passes):
            s.wait_stream(main)
            with torch.cuda.stream(s):
                p.barrier()
        for s in streams:
            main.wait_stream(s)

    us = cuda_time_us(step, reps=20)
    return {"W": W, "size": "barrier", "barrier_us": us,
            "errors": int(sum(int(m.error[0]) for m in mems))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--bytes-only", action="store_true")
    ap.add_argument("--plot", metavar="CSV", help="only plot a kept peer.csv into peer.png")
    args = ap.parse_args()
    out = out_dir()
    if args.plot:
        with open(args.plot) as f:
            plot(list(csv.DictReader(f)), args.hidden, out / "peer.png")
        return
    table = bytes_table(args.hidden)
    write_csv(out / "peer_bytes.csv", table)
    print_table(table, list(table[0]))
    if args.bytes_only:
        return
    import torch

    print(torch.cuda.get_device_name(), "NCCL", ".".join(map(str, torch.cuda.nccl.version())))
    rows = kernels(args.hidden)
    write_csv(out / "peer.csv", [r for r in rows if "global_rows" in r])
    cols = ["W", "size", "rows_per_replica", "put_us", "put_share", "take_us", "take_share",
            "gather_us", "nccl_all_gather_us", "gather_over_nccl", "stage_us", "stage_share",
            "pull_sum_us", "pull_sum_share", "combine_us", "nccl_reduce_scatter_us",
            "combine_over_nccl", "stage_fp8_us", "stage_fp8_share", "pull_sum_fp8_us",
            "pull_sum_fp8_share", "combine_fp8_us"]
    print_table([r for r in rows if "global_rows" in r], cols)
    print(rows[-1])
    plot([r for r in rows if "global_rows" in r], args.hidden, out / "peer.png")


def plot(rows: list[dict], hidden: int, path) -> None:
    """Each kernel's share of the copy ceiling against the global buffer's size, W = 8."""
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for key in ("put_share", "take_share", "stage_share", "pull_sum_share", "stage_fp8_share",
                "pull_sum_fp8_share"):
        pts = [(int(r["global_rows"]) * 2 * hidden / 2**20, float(r[key])) for r in rows
               if int(r["W"]) == 8]
        ax.plot(*zip(*pts), marker="o", label=key)
    ax.set_xscale("log")
    ax.set_xlabel("global buffer (MiB, W = 8)")
    ax.set_ylabel("share of the copy ceiling")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
