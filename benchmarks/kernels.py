"""Bandwidth of the dpx row kernels on a GPU, against a device-to-device copy of the same
bytes and the two-pass (zero-fill, then copy) baseline, all measured in the same run.

    python benchmarks/kernels.py [--hidden 7168] [--dtype bfloat16]

Scenario per size (``G`` global rows, ``dp = 8`` replicas, ``n = G / 8`` rows per slot):
  place_full  : place ``G`` rows into a ``G``-row buffer (reads G, writes G rows)
  place_slot  : place one ``n``-row slot at offset ``3n`` into a zero ``G``-row buffer (the
                SUM_LEN gather's local step: reads n, writes G rows); ``two_pass`` does
                ``out.zero_(); out[3n:4n].copy_(src)``
  take_slot   : take one slot of ``n`` rows out of ``G`` (the scatter: reads n, writes n)
  *_dev       : the same with start/count read from device memory (graph-replayable)
``copy_ratio`` = kernel bandwidth / copy bandwidth for the same byte count (copy of as many
bytes as the kernel reads + writes). Writes kernels.csv and kernels.png to $OUT or
benchmarks/out.
"""

from __future__ import annotations

import argparse

import torch

from common import copy_us, cuda_time_us, out_dir, print_table, pyplot, write_csv
from dpx_torch import place_rows, take_rows


def _kernel_launches(fn) -> int:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type.name == "CUDA")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--dp", type=int, default=8)
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    H, dp = args.hidden, args.dp
    item = torch.empty(0, dtype=dtype).element_size()
    rb = H * item
    named = {dp * 32: "decode", dp * 512: "mid", dp * 4096: "prefill"}
    sizes = sorted(set([dp * 32 * 2**k for k in range(0, 10)] + list(named)))
    copy_cache: dict = {}
    rows_out = []
    for G in sizes:
        n = G // dp
        big = torch.randn(G, H, device="cuda").to(dtype)
        slot = big[:n].clone()
        out = torch.empty_like(big)
        small = torch.empty_like(slot)
        s_dev = torch.tensor([3 * n], dtype=torch.int32, device="cuda")
        n_dev = torch.tensor([n], dtype=torch.int32, device="cuda")
        G_dev = torch.tensor([G], dtype=torch.int32, device="cuda")
        z_dev = torch.tensor([0], dtype=torch.int32, device="cuda")

        def two_pass():
            out.zero_()
            out[3 * n:4 * n].copy_(slot)

        cases = {
            "place_full": (lambda: place_rows(big, 0, G, G, out=out), 2 * G * rb),
            "place_full_dev": (lambda: place_rows(big, z_dev, G_dev, G, out=out), 2 * G * rb),
            "place_slot": (lambda: place_rows(slot, 3 * n, n, G, out=out), (n + G) * rb),
            "place_slot_dev": (lambda: place_rows(slot, s_dev, n_dev, G, out=out), (n + G) * rb),
            "two_pass": (two_pass, (n + G) * rb),
            "take_slot": (lambda: take_rows(big, 3 * n, n, n, out=small), 2 * n * rb),
            "take_slot_dev": (lambda: take_rows(big, s_dev, n_dev, n, out=small), 2 * n * rb),
        }
        t = {k: cuda_time_us(fn) for k, (fn, _) in cases.items()}
        # correctness guard: the benchmarked calls produce the reference result
        ref = torch.zeros_like(big)
        ref[3 * n:4 * n] = slot
        place_rows(slot, s_dev, n_dev, G, out=out)
        assert torch.equal(out, ref), "place_slot result wrong"
        row = {"name": named.get(G, ""), "global_rows": G, "MiB": round(G * rb / 2**20, 2)}
        for k, (_, nbytes) in cases.items():
            copy = copy_us(nbytes, copy_cache)
            row[f"{k}_us"] = t[k]
            row[f"{k}_copy_ratio"] = copy / t[k]
        row["place_slot_vs_two_pass"] = t["two_pass"] / t["place_slot"]
        rows_out.append(row)
        del big, slot, out, small
    dec_src = torch.ones(32, H, device="cuda", dtype=dtype)
    dec_out = torch.empty(dp * 32, H, device="cuda", dtype=dtype)
    launches = _kernel_launches(lambda: place_rows(dec_src, 0, 32, dp * 32, out=dec_out))
    cols = ["name", "global_rows", "MiB", "place_full_copy_ratio", "place_full_dev_copy_ratio",
            "place_slot_copy_ratio", "place_slot_dev_copy_ratio", "two_pass_copy_ratio",
            "place_slot_vs_two_pass", "take_slot_copy_ratio", "take_slot_dev_copy_ratio",
            "place_slot_us", "two_pass_us"]
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  "
          f"hidden={H} {args.dtype}  dp={dp}")
    print_table(rows_out, cols)
    print(f"CUDA kernel launches in one decode-size place_rows call (profiler): {launches}")
    od = out_dir()
    write_csv(od / "kernels.csv", rows_out)
    plt = pyplot()
    if plt is not None:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        x = [r["MiB"] for r in rows_out]
        for k in ("place_full", "place_slot", "two_pass", "take_slot"):
            ax.plot(x, [r[f"{k}_copy_ratio"] for r in rows_out], marker="o", label=k)
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_xlabel("global buffer (MiB)")
        ax.set_ylabel("bandwidth / D2D copy bandwidth")
        ax.set_title(f"dpx row kernels, {torch.cuda.get_device_name()}, hidden {H} {args.dtype}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(od / "kernels.png", dpi=120)


if __name__ == "__main__":
    main()
