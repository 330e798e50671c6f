"""Host overhead of a dpx_torch gather against a bare NCCL all_gather_into_tensor, at
world size 1 on one GPU, eager and under CUDA-graph replay (same run, same sizes).

    python benchmarks/torch_step.py [--tag NAME]

``--tag`` names the CSV (``torch_step_NAME.csv``): run it once more with another dpx on
``PYTHONPATH`` (e.g. a previous release's ``dpx``, ``dpx/kernels`` and ``dpx_torch``) to
compare releases in one session; ``dpx_python_us`` is then left out where that dpx has no
schedule interpreter to stub.

``host_us``: wall time per call of N back-to-back calls measured before the final sync
(what the CPU spends enqueueing). ``total_us``: wall time per call including the sync.
Each is the median of 7 rounds in which the bare and the dpx call take turns.
Ratios are dpx / bare all-gather. ``dpx_python_us``: the same dpx call with the collective
replaced by a no-op, i.e. dpx's own host time (checks, schedule lookup, interpreter).
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
from dpx_torch import DpComm

try:
    from dpx_torch import interpreter
except ImportError:  # a dpx without schedules: no stub column
    interpreter = None

N = 200


def _timed(fns: dict, rounds: int = 7) -> dict:
    """``{name: (host_us, total_us)}``: per call, median over ``rounds`` rounds, the
    functions taking turns within each round (so slow drift of the host hits all alike).
    host = N back-to-back calls before the sync; total = including the sync."""
    samples: dict = {k: [] for k in fns}
    for fn in fns.values():
        for _ in range(20):
            fn()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(N):
                fn()
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


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--tag", default="", help="CSV name suffix (torch_step_TAG.csv)")
    args = ap.parse_args()
    torch.cuda.set_device(0)
    init = os.path.join(tempfile.mkdtemp(), "rdv")
    dist.init_process_group("nccl", init_method=f"file://{init}", rank=0, world_size=1)
    lay = dpx.DpLayout(1, 1)
    comm = DpComm(lay)
    H = 7168
    rows = []
    for name, n in (("decode", 32), ("mid", 512), ("prefill", 4096)):
        local = torch.randn(n, H, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(n, H, device="cuda", dtype=torch.bfloat16)
        plan = dpx.plan_step([n], lay, mode="max_len")
        cplan = dpx.plan_step([n], lay, mode="max_len", capacity=n)
        counts = torch.tensor([n], dtype=torch.int32, device="cuda")

        def bare():
            dist.all_gather_into_tensor(out, local)

        def ours():
            comm.gather(local, plan, partial=True, out=out)

        def ours_dev():
            comm.gather(local, cplan, partial=True, counts=counts, out=out)

        t = _timed({"bare": bare, "ours": ours})
        (hb, tb), (ho, to) = t["bare"], t["ours"]
        hp = float("nan")
        if interpreter is not None:
            real = interpreter.all_gather_single
            interpreter.all_gather_single = lambda *a, **k: None
            try:
                hp = _timed({"ours": ours}, rounds=3)["ours"][0]
            finally:
                interpreter.all_gather_single = real
        gb, go = _graph(bare), _graph(ours_dev)
        g = _timed({"bare": gb.replay, "ours": go.replay})
        tgb, tgo = g["bare"][1], g["ours"][1]
        rows.append(dict(name=name, rows=n, MiB=round(n * H * 2 / 2**20, 1),
                         bare_host_us=hb, dpx_host_us=ho, host_ratio=ho / hb,
                         dpx_python_us=hp,
                         bare_total_us=tb, dpx_total_us=to, total_ratio=to / tb,
                         graph_bare_us=tgb, graph_dpx_us=tgo, graph_ratio=tgo / tgb))
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  NCCL world 1, "
          f"hidden {H} bf16, {N} back-to-back calls  (dpx from {dpx.__file__})")
    print_table(rows, list(rows[0]))
    write_csv(out_dir() / f"torch_step{'_' + args.tag if args.tag else ''}.csv", rows)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
