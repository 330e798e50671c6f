"""dpx's own host time per call, without a GPU: every collective and every kernel launch
replaced by a no-op, so what is left is the Python a serving step pays per call.

    python benchmarks/host_path.py [--calls N] [--rounds R] [--call-cache C]

gloo world 1 on CPU tensors (hidden 7168 bf16; ``decode`` 32 rows, ``mid`` 512, ``prefill``
4096), the calls a model layer makes: ``DpComm`` with ``out=`` (``comm``), the sglang drop-in
with a forward batch of host counts (``dropin``), each with one plan for every call
(``same``) and with a new count every call (``new``: 32 counts cycling, more than the
call cache holds: a new call of a known plan structure, bound from its class;
``--call-cache 0`` keeps no prepared op or class, so every call takes the full path).
Launches are stubbed at the last host step before the driver, so the table shows the GPU
path's Python (argument checks, lookups, launch arguments) on any machine. The fastest of
``R`` rounds of ``N`` calls, µs per call. Writes host_path.csv to $OUT.

The same script runs against an older checkout (``PYTHONPATH=<checkout>``): it stubs the
names either version uses.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import tempfile
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dpx  # noqa: E402
from common import out_dir, print_table, write_csv  # noqa: E402

H = 7168
SIZES = (("decode", 32), ("mid", 512), ("prefill", 4096))


def _noop(*args, **kwargs):
    return None


class _NoLaunch:
    """Stands in for a Triton kernel: ``k[grid](...)`` and ``k.run(...)`` do nothing."""

    def __getitem__(self, grid):
        return _noop

    run = staticmethod(_noop)


@contextlib.contextmanager
def stubbed():
    """Collectives and kernel launches as no-ops (the names of this and earlier versions)."""
    saved = []

    def patch(module_name: str, attr: str, value) -> None:
        try:
            mod = importlib.import_module(module_name)
        except ImportError:
            return
        if hasattr(mod, attr):
            saved.append((mod, attr, getattr(mod, attr)))
            setattr(mod, attr, value)

    for name in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce", "broadcast",
                 "reduce", "all_gather_single", "reduce_scatter_single"):
        patch("torch.distributed", name, _noop)
    for name in ("all_gather_single", "reduce_scatter_single"):   # earlier versions
        patch("dpx_torch.program", name, _noop)
    for name in ("bind_all_gather", "bind_reduce_scatter", "bind_all_reduce"):
        patch("dpx_torch.collectives", name, lambda group: _noop)
    for mod in ("dpx_torch.rows", "dpx_torch.wire", "dpx_torch.flags"):
        patch(mod, "kernel_for", lambda kernel, device: _NoLaunch())
    try:
        yield
    finally:
        for mod, attr, value in reversed(saved):
            setattr(mod, attr, value)


def _gpu_path_on_cpu(comm) -> None:
    """Make ``comm`` run its CPU tensors through the GPU path -- the Triton passes and the
    direct launcher -- with the launch itself a no-op (this version's names)."""
    try:
        from dpx_torch.shims.triton_launch import Launcher
        from dpx_torch.passes import TritonPasses
    except ImportError:   # an earlier version: kernel_for is stubbed instead
        return

    class _Spec:
        run = staticmethod(_noop)
        function = metadata = None
        checked = True

    class StubLauncher(Launcher):
        direct = ("cpu", "cuda")

        def __init__(self):
            super().__init__()
            self._raw_stream = lambda index: 0                  # earlier versions
            self.stream = SimpleNamespace(fn=lambda index: 0)

        def hooks(self):
            return False

        def spec(self, bound, grid, align, args):
            return _Spec()

    comm.runner.passes["cpu"] = TritonPasses(StubLauncher())


def _time(fn, calls: int, rounds: int) -> float:
    """The fastest of ``rounds`` rounds (µs per call): host timings on a shared machine are
    noisy upwards only."""
    for i in range(20):
        fn(i)
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for i in range(calls):
            fn(i)
        samples.append((time.perf_counter() - t0) * 1e6 / calls)
    return min(samples)


def _cases(comm, layout, n: int):
    """``{(op, mode, counts): fn(i)}`` for one size (``counts``: same / new)."""
    from dpx_torch import sglang as sg

    local = torch.zeros(n, H, dtype=torch.bfloat16)
    sizes = [n - (i % 32) * max(n // 64, 1) for i in range(32)]
    cases = {}
    for mode in ("sum_len", "max_len"):
        plan = dpx.plan_step([n], layout, mode=mode)
        plans = [dpx.plan_step([k], layout, mode=mode) for k in sizes]
        out = torch.zeros(plan.global_rows, H, dtype=torch.bfloat16)
        outs = [out[:p.global_rows] for p in plans]
        ins = [local[:k] for k in sizes]
        cases[("gather partial", mode, "same")] = (
            lambda i, plan=plan, out=out: comm.gather(local, plan, partial=True, out=out))
        cases[("gather partial", mode, "new")] = (
            lambda i, plans=plans, outs=outs, ins=ins: comm.gather(
                ins[i % 32], plans[i % 32], partial=True, out=outs[i % 32]))
        sl = torch.zeros(n, H, dtype=torch.bfloat16)
        cases[("scatter", mode, "same")] = (
            lambda i, plan=plan, out=out, sl=sl: comm.scatter(out, plan, out=sl))
        cases[("scatter", mode, "new")] = (
            lambda i, plans=plans, outs=outs, sl=sl: comm.scatter(
                outs[i % 32], plans[i % 32], out=sl[:plans[i % 32].slot_rows[0]]))
        if mode == "max_len":
            cases[("reduce_scatter", mode, "same")] = (
                lambda i, plan=plan, out=out, sl=sl: comm.reduce_scatter(out, plan, out=sl))
    # the drop-in: sglang's names, a forward batch of host counts
    sg.setup(comm, hidden_size=H, dtype=torch.bfloat16, device="cpu")
    for mode, pm in (("sum_len", sg.DpPaddingMode.SUM_LEN), ("max_len", sg.DpPaddingMode.MAX_LEN)):
        batches = [SimpleNamespace(global_num_tokens_cpu=[k], global_num_tokens_gpu=None,
                                   dp_padding_mode=pm, dp_local_start_pos=None,
                                   dp_local_num_tokens=None) for k in sizes]
        glob = torch.zeros(n, H, dtype=torch.bfloat16)
        sl = torch.zeros(n, H, dtype=torch.bfloat16)
        views = {k: (glob[:k], local[:k], sl[:k]) for k in sizes}

        def gather(i, b):
            g, x, _ = views[b.global_num_tokens_cpu[0]]
            sg.dp_gather_partial(g, x, b)

        def scatter(i, b):
            g, _, s = views[b.global_num_tokens_cpu[0]]
            sg.dp_scatter(s, g, b)

        cases[("dropin gather partial", mode, "same")] = (
            lambda i, b=batches[0], f=gather: f(i, b))
        cases[("dropin gather partial", mode, "new")] = (
            lambda i, bs=batches, f=gather: f(i, bs[i % 32]))
        cases[("dropin scatter", mode, "same")] = (
            lambda i, b=batches[0], f=scatter: f(i, b))
    return cases


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes", default="decode,mid,prefill")
    ap.add_argument("--call-cache", type=int, default=8,
                    help="CacheLimits(calls=...): 0 sends every call down the full path")
    args = ap.parse_args()
    init = os.path.join(tempfile.mkdtemp(), "rdv")
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=0, world_size=1)
    from dpx_torch import CacheLimits, DpComm

    layout = dpx.DpLayout(1, 1)
    comm = DpComm(layout, limits=CacheLimits(calls=args.call_cache))
    _gpu_path_on_cpu(comm)
    rows = []
    want = set(args.sizes.split(","))
    with stubbed():
        for name, n in SIZES:
            if name not in want:
                continue
            for (op, mode, counts), fn in _cases(comm, layout, n).items():
                us = _time(fn, args.calls, args.rounds)
                rows.append(dict(size=name, op=op, mode=mode, counts=counts,
                                 python_us=round(us, 2)))
    print(f"dpx from {os.path.dirname(dpx.__file__)}; torch {torch.__version__}; "
          f"collectives and launches stubbed; µs per call")
    print_table(rows, ["size", "op", "mode", "counts", "python_us"])
    write_csv(out_dir() / "host_path.csv", rows)
    comm.destroy()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
