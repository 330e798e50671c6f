"""Host overhead of a dpx_torch gather against a bare NCCL all_gather_into_tensor, at
world size 1 on one GPU, eager and under CUDA-graph replay (same run, same sizes).

    python benchmarks/torch_step.py

Rows per size (decode 32 rows, mid 512, prefill 4096; hidden 7168 bf16; MAX_LEN):

``same plan``: one plan for every call (a layer loop within a step).
``new counts``: a different count every call, cycling over more plans than the call cache
    holds (``CacheLimits(calls=8)``), so every call finds its template by the plan's
    structure and evaluates it for the new counts -- a serving step's first gather.
    The bare collective moves the same bytes, call by call.
``graph in place``: CUDA-graph replay of a capacity plan's gather with device counts, the
    input being ``comm.local_slot(out, plan)`` (the rows are already where the collective
    reads them).
``graph copy``: the same from a separate input (one pass places the rows first).

``host_us``: wall time per call of N back-to-back calls before the final sync (what the
CPU spends enqueueing); ``total_us`` includes the sync; graph rows time replays. Each is the
median of 7 rounds in which the bare and the dpx call take turns. ``dpx_python_us``: the dpx
call with the collective replaced by a no-op (dpx's own host time).

A second table times the launch paths of one row kernel (``move_rows``, 32 rows): the
direct Triton launch dpx's eager calls use, the ``torch.library`` custom op that
torch.compile traces, and ``torch.library.triton_op`` + ``wrap_triton``.
Writes torch_step.csv and torch_step_launch.csv to $OUT.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist

import dpx
from common import out_dir, print_table, write_csv
from dpx_torch import CacheLimits, DpComm
from dpx_torch import program as program_mod

N = 200


def _timed(fns: dict, rounds: int = 7) -> dict:
    """``{name: (host_us, total_us)}``: per call, median over ``rounds`` rounds, the
    functions taking turns within each round (so slow drift of the host hits all alike).
    Each function is called with the call's index."""
    samples: dict = {k: [] for k in fns}
    for fn in fns.values():
        for i in range(20):
            fn(i)
    torch.cuda.synchronize()
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for i in range(N):
                fn(i)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            samples[name].append(((t1 - t0) * 1e6 / N, (t2 - t0) * 1e6 / N))
    return {k: (statistics.median(h for h, _ in v), statistics.median(t for _, t in v))
            for k, v in samples.items()}


def _graph(fn) -> torch.cuda.CUDAGraph:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def _stub_python(fn) -> float:
    """dpx's own host time: ``fn`` with the collectives replaced by no-ops."""
    real = program_mod.all_gather_single
    program_mod.all_gather_single = lambda *a, **k: None
    try:
        return _timed({"x": fn}, rounds=3)["x"][0]
    finally:
        program_mod.all_gather_single = real


def _launch_paths(H: int) -> list[dict]:
    """Host µs per launch of the move kernel by each path (32 rows x H bf16)."""
    from dpx_torch.rows import _launch_move

    n = 32
    src = torch.randn(n, H, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(n, H, device="cuda", dtype=torch.bfloat16)
    fns = {"direct launch (eager dpx)": lambda i: _launch_move(src, None, None, None, 0, 0, n,
                                                                out),
           "torch.library custom op": lambda i: torch.ops.dpx.move_rows_out(
               src, None, None, None, 0, 0, n, out, [4096, 16, 1024, 0])}
    try:
        from torch.library import triton_op, wrap_triton

        from dpx.kernels import launch, rows as kernels

        @triton_op("dpx_bench::move_rows_triton", mutates_args={"out"})
        def move_triton(src: torch.Tensor, count: int, out: torch.Tensor) -> None:
            block_r, block_c, warps = launch.row_blocks(out.shape[1])
            wrap_triton(kernels.move_rows_kernel)[launch.grid(*out.shape)](
                src, src, src, src, 0, 0, count, src.shape[0], out.shape[0], out,
                WIDTH=out.shape[1], SRC_START_PTR=False, DST_START_PTR=False,
                COUNT_PTR=False, BLOCK_R=block_r, BLOCK_C=block_c, WIDE=False, STREAM=False,
                num_warps=warps)

        fns["torch.library.triton_op + wrap_triton"] = lambda i: move_triton(src, n, out)
    except ImportError as exc:
        print(f"triton_op unavailable: {exc}")
    t = _timed(fns)
    base = t["direct launch (eager dpx)"][0]
    return [dict(path=k, host_us=v[0], total_us=v[1], vs_direct=v[0] / base)
            for k, v in t.items()]


def main() -> None:
    torch.cuda.set_device(0)
    init = os.path.join(tempfile.mkdtemp(), "rdv")
    dist.init_process_group("nccl", init_method=f"file://{init}", rank=0, world_size=1)
    lay = dpx.DpLayout(1, 1)
    comm = DpComm(lay, limits=CacheLimits(calls=8))
    H = 7168
    rows = []
    for name, n in (("decode", 32), ("mid", 512), ("prefill", 4096)):
        local = torch.randn(n, H, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(n, H, device="cuda", dtype=torch.bfloat16)
        plan = dpx.plan_step([n], lay, mode="max_len")
        # new counts every call: 32 distinct plans (more than the call cache's 8)
        sizes = [n - (i % 32) * max(n // 64, 1) for i in range(32)]
        plans = [dpx.plan_step([k], lay, mode="max_len") for k in sizes]
        outs = [out[:k] for k in sizes]
        ins = [local[:k] for k in sizes]

        def bare(i):
            dist.all_gather_into_tensor(out, local)

        def ours(i):
            comm.gather(local, plan, partial=True, out=out)

        def bare_new(i):
            k = i % 32
            dist.all_gather_into_tensor(outs[k], ins[k])

        def ours_new(i):
            k = i % 32
            comm.gather(ins[k], plans[k], partial=True, out=outs[k])

        t = _timed({"bare": bare, "ours": ours, "bare_new": bare_new, "ours_new": ours_new})
        hp, hp_new = _stub_python(ours), _stub_python(ours_new)

        cplan = dpx.plan_step([n], lay, mode="max_len", capacity=n)
        counts = torch.tensor([n], dtype=torch.int32, device="cuda")
        gout = torch.empty(cplan.global_rows, H, device="cuda", dtype=torch.bfloat16)
        slot = comm.local_slot(gout, cplan)
        slot.copy_(local)
        g_bare = _graph(lambda: dist.all_gather_into_tensor(out, local))
        g_in = _graph(lambda: comm.gather(slot, cplan, partial=True, counts=counts, out=gout))
        g_copy = _graph(lambda: comm.gather(local, cplan, partial=True, counts=counts,
                                            out=out))
        g = _timed({"bare": lambda i: g_bare.replay(), "in_place": lambda i: g_in.replay(),
                    "copy": lambda i: g_copy.replay()})
        (hb, tb), (ho, to) = t["bare"], t["ours"]
        (hbn, _), (hon, _) = t["bare_new"], t["ours_new"]
        rows.append(dict(
            name=name, rows=n, MiB=round(n * H * 2 / 2**20, 1),
            bare_host_us=hb, dpx_host_us=ho, host_ratio=ho / hb, dpx_python_us=hp,
            new_bare_host_us=hbn, new_dpx_host_us=hon, new_host_ratio=hon / hbn,
            new_dpx_python_us=hp_new, bare_total_us=tb, dpx_total_us=to,
            graph_bare_us=g["bare"][1], graph_in_place_us=g["in_place"][1],
            graph_in_place_ratio=g["in_place"][1] / g["bare"][1],
            graph_copy_us=g["copy"][1], graph_copy_ratio=g["copy"][1] / g["bare"][1]))
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  NCCL world 1, "
          f"hidden {H} bf16, {N} back-to-back calls  (dpx from {dpx.__file__})")
    print_table(rows, ["name", "MiB", "bare_host_us", "dpx_host_us", "host_ratio",
                       "dpx_python_us", "new_bare_host_us", "new_dpx_host_us",
                       "new_host_ratio", "new_dpx_python_us"])
    print_table(rows, ["name", "MiB", "bare_total_us", "dpx_total_us", "graph_bare_us",
                       "graph_in_place_us", "graph_in_place_ratio", "graph_copy_us",
                       "graph_copy_ratio"])
    launches = _launch_paths(H)
    print("launch paths of one row kernel (host µs per call):")
    print_table(launches, list(launches[0]))
    write_csv(out_dir() / "torch_step.csv", rows)
    write_csv(out_dir() / "torch_step_launch.csv", launches)
    comm.destroy()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
