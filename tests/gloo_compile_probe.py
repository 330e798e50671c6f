"""Does torch.compile(fullgraph=True, backend="aot_eager") of a gloo all-gather of CUDA
tensors run, with several processes on one GPU?  ``python tests/gloo_compile_probe.py
[world]``: prints, per rank, the eager result's check and the compiled one's (or what it
raised), then each process's exit code. A probe of torch + gloo alone; dpx is not
imported. On an H100 with torch 2.11 (benchmarks/results/peer_gpu_tests.txt) the eager
all-gather is right and the compiled one kills every rank with SIGSEGV (exit code -11),
with and without MPS."""

from __future__ import annotations

import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank: int, world: int, init: str) -> None:
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    x = torch.full((4, 8), float(rank), device="cuda")

    def step(x):
        out = x.new_empty(world * x.shape[0], x.shape[1])
        dist.all_gather_into_tensor(out, x)
        return out * 2

    want = torch.arange(world, device="cuda").repeat_interleave(4)[:, None].float().expand(-1, 8) * 2
    print(f"rank {rank} eager ok: {torch.equal(step(x), want)}", flush=True)
    try:
        got = torch.compile(step, fullgraph=True, backend="aot_eager")(x)
        torch.cuda.synchronize()
        print(f"rank {rank} compiled ok: {torch.equal(got, want)}", flush=True)
    except Exception as e:  # the probe's answer, whatever it is
        print(f"rank {rank} compiled raised {type(e).__name__}: {str(e)[:1500]}", flush=True)
    dist.destroy_process_group()


def main() -> None:
    world = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    init = os.path.join(tempfile.mkdtemp(), "rdv")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, world, init)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
    print(f"world {world}: " + (f"ranks {hung} did not finish within 120 s" if hung
                                else "every rank finished") +
          f"; exit codes {[p.exitcode for p in procs]}", flush=True)


if __name__ == "__main__":
    main()
