"""Host cost of dpx_torch's calls against the calls they replace, at world size 1 on one
GPU (NCCL), eager and under CUDA-graph replay. dpx issues no collective on a group of one
rank (a copy or nothing: docs/semantics.md, "A world of one rank"), so Table 1 writes the
sequences it compares with the same way (neither side calls the backend), and Table 2
compares dpx's local copy with the bare NCCL collective.

    python benchmarks/torch_step.py

Sizes: decode 32 rows, mid 512, prefill 4096; hidden 7168 bf16. Every ratio compares
timings of one run in which the compared calls take turns (7 rounds of 200 back-to-back
calls, median; ``host_us`` is the wall time per call before the final sync -- what the CPU
spends enqueueing).

Table 1, **against sglang's calls**: per op and padding mode, the sequence sglang's
``dp_attention`` issues for it, written with stock ops (``sglang``: a SUM_LEN gather is
``fill_(0)`` + a Triton copy kernel reading its offset and count from device memory,
launched through Triton's JIT as sglang's ``memcpy_triton`` is + an in-place
``all_reduce``; a MAX_LEN gather one ``all_gather_into_tensor``; a scatter ``fill_(0)`` +
the copy kernel; ``dp_reduce_scatter_tensor`` one ``reduce_scatter_tensor``; at world 1
the all-reduce is left out and the other two are a ``copy_``), the same op
through ``dpx_torch.sglang`` with a forward batch of host counts (``drop_in``), and
through ``DpComm`` with ``out=`` (``comm``). The sequences lack sglang's own Python around
them, so they are a lower bound of its host time.

Table 2, **against the bare collective**: ``DpComm.gather`` (MAX_LEN, the input its whole
slot: one ``all_gather_into_tensor``) with one plan (``same``), and with a new count every
call (``new``: 32 plans cycling through a call cache of 8 -- a serving step's first
gather); ``dpx_python_us``: the dpx call with the collective a no-op (everything else dpx
does per call); ``graph_*``: replay
of a captured capacity-plan gather with device counts, in place (``local_slot``) and
from a separate input, against the captured bare collective.

Table 3, **kernel launches** (host µs per launch of one row kernel, 32 rows): Triton's
JIT launch (``kernel[grid](...)``), dpx's direct launch of the compiled kernel
(``dpx_torch.shims.triton_launch``), the ``torch.library`` custom op torch.compile traces,
and a stock ``copy_`` of the same rows.

Writes torch_step_sglang.csv, torch_step.csv and torch_step_launch.csv to $OUT.
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist
import triton
import triton.language as tl

import dpx
from common import out_dir, print_table, write_csv
from dpx_torch import CacheLimits, DpComm
from dpx_torch import collectives

N = 200
H = 7168
SIZES = (("decode", 32), ("mid", 512), ("prefill", 4096))


@triton.jit
def _copy_rows(dst_ptr, src_ptr, offset_ptr, size_ptr, OFFSET_SRC: tl.constexpr, chunk,
               BLOCK: tl.constexpr):
    """A flat copy of ``size * chunk`` elements at an offset read from device memory (the
    kind of kernel sglang launches for its gathers and scatters)."""
    pid = tl.program_id(0).to(tl.int64)
    offset = tl.load(offset_ptr).to(tl.int64) * chunk
    size = tl.load(size_ptr).to(tl.int64) * chunk
    i = pid * BLOCK + tl.arange(0, BLOCK)
    mask = i < size
    if OFFSET_SRC:
        tl.store(dst_ptr + i, tl.load(src_ptr + offset + i, mask=mask), mask=mask)
    else:
        tl.store(dst_ptr + offset + i, tl.load(src_ptr + i, mask=mask), mask=mask)


def _copy(dst, src, offset, size, offset_src: bool) -> None:
    n = min(src.numel(), dst.numel())
    _copy_rows[(triton.cdiv(n, 8192),)](dst, src, offset, size, offset_src, src.shape[1], 8192)


def _timed(fns: dict, rounds: int = 7) -> dict:
    """``{name: (host_us, total_us)}``: per call, median over ``rounds`` rounds, the
    functions taking turns within each round. Each function gets the call's index."""
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


def _noop(*args, **kwargs):
    return None


def _dpx_python(layout, make_fn) -> float:
    """dpx's own host time: a communicator whose prepared calls were bound while every
    collective was a no-op (the bound steps keep the no-ops)."""
    names = ("bind_all_gather", "bind_reduce_scatter", "bind_all_reduce")
    saved = [getattr(collectives, n) for n in names]
    for n in names:
        setattr(collectives, n, lambda group: _noop)
    try:
        comm = DpComm(layout, limits=CacheLimits(calls=8))
        t = _timed({"x": make_fn(comm)}, rounds=3)["x"][0]
    finally:
        for n, fn in zip(names, saved):
            setattr(collectives, n, fn)
    comm.destroy()
    return t


def _sglang_rows(comm: DpComm, layout) -> list[dict]:
    """Table 1 (see the module docstring)."""
    from dpx_torch import sglang as sg

    att = sg.setup(comm, hidden_size=H, dtype=torch.bfloat16, device="cuda")
    alone = dist.get_world_size() == 1
    rows = []
    for name, n in SIZES:
        local = torch.randn(n, H, device="cuda", dtype=torch.bfloat16)
        glob = torch.empty(n, H, device="cuda", dtype=torch.bfloat16)
        small = torch.empty(n, H, device="cuda", dtype=torch.bfloat16)
        start = torch.zeros((), dtype=torch.int32, device="cuda")
        count = torch.full((), n, dtype=torch.int32, device="cuda")
        for mode, pm in (("sum_len", sg.DpPaddingMode.SUM_LEN),
                         ("max_len", sg.DpPaddingMode.MAX_LEN)):
            plan = dpx.plan_step([n], layout, mode=mode)
            batch = SimpleNamespace(global_num_tokens_cpu=[n], global_num_tokens_gpu=count,
                                    dp_padding_mode=pm, dp_local_start_pos=None,
                                    dp_local_num_tokens=None)
            # on one rank each collective is what it does there (an all-reduce nothing, an
            # all-gather or reduce-scatter a copy), as dpx's schedules are: neither side
            # calls the backend
            if mode == "sum_len":
                def sg_gather(i):
                    glob.fill_(0)
                    _copy(glob, local, start, count, False)
                    if not alone:
                        dist.all_reduce(glob)
            else:
                def sg_gather(i):
                    if alone:
                        glob.copy_(local)
                    else:
                        dist.all_gather_into_tensor(glob, local)

            def sg_scatter(i):
                small.fill_(0)
                _copy(small, glob, start, count, True)

            cases = {
                "dp_gather_partial": (sg_gather,
                                      lambda i: sg.dp_gather_partial(glob, local, batch),
                                      lambda i: comm.gather(local, plan, partial=True,
                                                            out=glob)),
                "dp_scatter": (sg_scatter, lambda i: sg.dp_scatter(small, glob, batch),
                               lambda i: comm.scatter(glob, plan, out=small)),
            }
            if mode == "max_len":
                att.set_dp_buffer_len(n, n, True, [n])
                cases["dp_reduce_scatter_tensor"] = (
                    (lambda i: small.copy_(glob)) if alone
                    else (lambda i: dist.reduce_scatter_tensor(small, glob)),
                    lambda i: sg.dp_reduce_scatter_tensor(small, glob),
                    lambda i: comm.reduce_scatter(glob, plan, out=small))
            for op, (a, b, c) in cases.items():
                t = _timed({"sglang": a, "drop_in": b, "comm": c})
                rows.append(dict(op=op, mode=mode, size=name, rows=n,
                                 sglang_host_us=t["sglang"][0], drop_in_host_us=t["drop_in"][0],
                                 comm_host_us=t["comm"][0],
                                 drop_in_ratio=t["drop_in"][0] / t["sglang"][0],
                                 comm_ratio=t["comm"][0] / t["sglang"][0],
                                 sglang_total_us=t["sglang"][1],
                                 drop_in_total_us=t["drop_in"][1]))
    sg.teardown()
    return rows


def _bare_rows(comm: DpComm, layout) -> list[dict]:
    """Table 2 (see the module docstring)."""
    rows = []
    for name, n in SIZES:
        local = torch.randn(n, H, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(n, H, device="cuda", dtype=torch.bfloat16)
        plan = dpx.plan_step([n], layout, mode="max_len")
        sizes = [n - (i % 32) * max(n // 64, 1) for i in range(32)]
        plans = [dpx.plan_step([k], layout, mode="max_len") for k in sizes]
        outs = [out[:k] for k in sizes]
        ins = [local[:k] for k in sizes]

        def ours(c):
            return lambda i: c.gather(local, plan, partial=True, out=out)

        def ours_new(c):
            return lambda i: c.gather(ins[i % 32], plans[i % 32], partial=True,
                                      out=outs[i % 32])

        t = _timed({"bare": lambda i: dist.all_gather_into_tensor(out, local),
                    "ours": ours(comm),
                    "bare_new": lambda i: dist.all_gather_into_tensor(outs[i % 32],
                                                                      ins[i % 32]),
                    "ours_new": ours_new(comm)})
        hp, hp_new = _dpx_python(layout, ours), _dpx_python(layout, ours_new)
        cplan = dpx.plan_step([n], layout, mode="max_len", capacity=n)
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
    return rows


def _launch_rows() -> list[dict]:
    """Table 3: host µs per launch of the move kernel (32 rows x H bf16) by each path."""
    from dpx.kernels import launch, rows as kernels
    from dpx_torch import ops
    from dpx_torch.shims.triton_launch import Launcher
    from dpx_torch.passes import TritonPasses

    n = 32
    src = torch.randn(n, H, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(n, H, device="cuda", dtype=torch.bfloat16)
    block_r, block_c, warps = launch.row_blocks(H)
    grid = launch.grid(n, H)
    direct = TritonPasses(Launcher()).bind_move(n, n, H, src.dtype, src.device, 0, 0, n)
    fns = {
        "triton JIT launch": lambda i: kernels.move_rows_kernel[grid](
            src, src, src, src, 0, 0, n, n, n, out, WIDTH=H, SRC_START_PTR=False,
            DST_START_PTR=False, COUNT_PTR=False, BLOCK_R=block_r, BLOCK_C=block_c,
            WIDE=False, STREAM=False, num_warps=warps),
        "dpx direct launch": lambda i: direct(src, out),
        "torch.library custom op": lambda i: ops.move_rows_out(src, None, None, None, 0, 0,
                                                               n, out, []),
        "stock copy_": lambda i: out.copy_(src),
    }
    t = _timed(fns)
    base = t["triton JIT launch"][0]
    return [dict(path=k, host_us=v[0], total_us=v[1], vs_jit=v[0] / base)
            for k, v in t.items()]


def _geomean(xs) -> float:
    xs = list(xs)
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def main() -> None:
    torch.cuda.set_device(0)
    init = os.path.join(tempfile.mkdtemp(), "rdv")
    dist.init_process_group("nccl", init_method=f"file://{init}", rank=0, world_size=1)
    layout = dpx.DpLayout(1, 1)
    comm = DpComm(layout, limits=CacheLimits(calls=8))
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  triton "
          f"{triton.__version__}  NCCL world 1, hidden {H} bf16, {N} back-to-back calls "
          f"(dpx from {dpx.__file__})")
    sg_rows = _sglang_rows(DpComm(layout), layout)
    print("against sglang's call sequences (host µs per call):")
    print_table(sg_rows, ["op", "mode", "size", "sglang_host_us", "drop_in_host_us",
                          "comm_host_us", "drop_in_ratio", "comm_ratio"])
    print(f"geometric mean drop_in / sglang: {_geomean(r['drop_in_ratio'] for r in sg_rows):.3f}"
          f"; comm / sglang: {_geomean(r['comm_ratio'] for r in sg_rows):.3f}; worst "
          f"drop_in / sglang: {max(r['drop_in_ratio'] for r in sg_rows):.3f}")
    rows = _bare_rows(comm, layout)
    print("against the bare collective:")
    print_table(rows, ["name", "MiB", "bare_host_us", "dpx_host_us", "host_ratio",
                       "dpx_python_us", "new_bare_host_us", "new_dpx_host_us",
                       "new_host_ratio", "new_dpx_python_us"])
    print_table(rows, ["name", "MiB", "bare_total_us", "dpx_total_us", "graph_bare_us",
                       "graph_in_place_us", "graph_in_place_ratio", "graph_copy_us",
                       "graph_copy_ratio"])
    launches = _launch_rows()
    print("launch paths of one row kernel (host µs per call):")
    print_table(launches, list(launches[0]))
    write_csv(out_dir() / "torch_step_sglang.csv", sg_rows)
    write_csv(out_dir() / "torch_step.csv", rows)
    write_csv(out_dir() / "torch_step_launch.csv", launches)
    comm.destroy()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
