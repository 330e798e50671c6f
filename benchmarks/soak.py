"""A long soak of one communicator: new host counts every step, every mode, capacity plans
with device counts, masks, the fp8 wire, several tensors in one call, async calls. What
must stay flat after warm-up: the entries of every cache, the bytes they hold, the events
and pooled buffers, the process's resident memory and (on GPU) the device memory.

    python benchmarks/soak.py [--steps 100000]                  # NCCL world 1, CUDA
    python benchmarks/soak.py --device cpu --steps 3000 --hidden 128   # gloo, interpreter

World 1 (one GPU; on CPU one process). A world of one rank calls no collective (dpx emits
copies), so what grows is dpx's own. ``--control N`` then runs, in the same process and
on the same process group, N bare backend pairs (``all_gather_into_tensor`` +
``reduce_scatter_tensor`` of the same sizes, the backend called directly) as the control:
its growth is the backend's. Prints a table of the figures at each checkpoint
and writes ``soak.csv`` and ``soak.txt`` to ``$OUT`` (default ``benchmarks/out``).
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
import warnings

import torch
import torch.distributed as dist

import dpx
from common import out_dir, print_table, write_csv
from dpx_torch import DpComm


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--checkpoints", type=int, default=10)
    ap.add_argument("--control", type=int, default=0,
                    help="bare backend all_gather + reduce_scatter pairs run after the soak")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(0)
    dist.init_process_group("nccl" if cuda else "gloo",
                            init_method=f"file://{os.path.join(tempfile.mkdtemp(), 'r')}",
                            rank=0, world_size=1)
    lay = dpx.DpLayout(1, 1)
    comm = DpComm(lay)  # default cache limits
    rng = random.Random(0)
    H, dev = args.hidden, args.device
    src = torch.randn(1024, H, device=dev)
    ids = torch.randint(0, 1000, (1024, 8), device=dev)
    counts_t = torch.zeros(1, dtype=torch.int32, device=dev)
    bad = 0

    def step(i: int) -> None:
        nonlocal bad
        n = rng.randint(0, 1024)
        mode = rng.choice(("max_len", "sum_len", "gatherv"))
        if rng.random() < 0.25:  # a capacity plan, counts on the device
            plan = dpx.plan_step([0], lay, mode=mode, capacity=1024)
            counts_t.fill_(n)
            c, x, xi = counts_t, src, ids
        else:  # new host counts: a plan never seen before, most steps
            plan = dpx.plan_step([n], lay, mode=mode)
            c, x, xi = None, src[:max(n, 1)], ids[:max(n, 1)]
        g = comm.gather(x, plan, partial=True, counts=c)
        rs = comm.reduce_scatter(g, plan, counts=c)
        gh, gi = comm.gather((x, xi), plan, partial=(True, False), counts=c)
        comm.mask_pad_rows(gi, plan, counts=c)
        if mode != "sum_len":
            comm.gather(x, plan, partial=False, counts=c, wire="fp8")
        a, work = comm.gather_async(x, plan, partial=True, counts=c, key=i % 2)
        work.wait()
        if i % 997 == 0:
            bad += not torch.equal(rs[:n], src[:n]) or not torch.equal(gh[:n], src[:n])

    def figures(i: int, secs: float) -> dict:
        if cuda:
            torch.cuda.synchronize()
        s = comm.cache_sizes()
        return dict(step=i, seconds=round(secs, 1), prepared=s["prepared"],
                    templates=s["templates"],
                    variants=s["variants"], programs=s["programs"], tables=s["tables"],
                    pool_buffers=s["pool_buffers"], events=s["events"],
                    cache_bytes=comm.host_bytes(), rss_mib=round(_rss() / 2**20, 1),
                    device_mib=round(torch.cuda.memory_allocated() / 2**20, 1) if cuda else 0)

    warm = max(args.steps // args.checkpoints, 1)
    t0 = time.perf_counter()
    rows = []
    for i in range(args.steps):
        step(i)
        if (i + 1) % warm == 0:
            rows.append(figures(i + 1, time.perf_counter() - t0))
    text = (f"{args.steps} steps on {dev} (new host counts 0..1024 every step, a capacity "
            f"plan with device counts one step in four; gather, reduce_scatter, a two-tensor "
            f"gather, a mask, an fp8 gather (copy modes), an async gather; hidden {H} fp32; "
            f"default CacheLimits), spot checks failed: {bad}")
    print(text)
    table = print_table(rows, list(rows[0]))
    first, last = rows[0], rows[-1]
    growth = {k: last[k] - first[k] for k in ("cache_bytes", "rss_mib", "device_mib")}
    print(f"after the first checkpoint (warm-up) to the last: {growth}")
    out = out_dir()
    write_csv(out / "soak.csv", rows)
    (out / "soak.txt").write_text(f"{text}\n{table}\ngrowth after warm-up: {growth}\n")
    if args.control:
        control = _control(args.control, args.checkpoints, src, cuda)
        text_c = (f"control: {args.control} bare {dist.get_backend()} all_gather_into_tensor + "
                  f"reduce_scatter_tensor pairs at world 1, same process, same sizes")
        print(text_c)
        table_c = print_table(control, list(control[0]))
        growth_c = round(control[-1]["rss_mib"] - control[0]["rss_mib"], 2)
        per = (control[-1]["rss_mib"] - control[0]["rss_mib"]) * 2**20 / max(
            control[-1]["pair"] - control[0]["pair"], 1)
        line = f"control growth after warm-up: {growth_c} MiB ({per:.0f} bytes a pair)"
        print(line)
        write_csv(out / "soak_control.csv", control)
        with open(out / "soak.txt", "a") as f:
            f.write(f"{text_c}\n{table_c}\n{line}\n")
    comm.destroy()
    dist.destroy_process_group()


def _control(pairs: int, checkpoints: int, src: torch.Tensor, cuda: bool) -> list[dict]:
    """The backend's own growth: ``pairs`` bare world-1 all-gather + reduce-scatter pairs."""
    warnings.filterwarnings("ignore", category=FutureWarning)  # the names torch >= 2.12 renamed
    rng = random.Random(1)
    out = torch.empty_like(src)
    every = max(pairs // checkpoints, 1)
    rows = []
    t0 = time.perf_counter()
    for i in range(pairs):
        n = rng.randint(1, src.shape[0])
        dist.all_gather_into_tensor(out[:n], src[:n])
        dist.reduce_scatter_tensor(out[:n], src[:n])
        if (i + 1) % every == 0:
            if cuda:
                torch.cuda.synchronize()
            rows.append(dict(pair=i + 1, seconds=round(time.perf_counter() - t0, 1),
                             rss_mib=round(_rss() / 2**20, 1)))
    return rows


if __name__ == "__main__":
    main()
