"""A DeepSeek-style decoder layer served with DP attention through dpx_torch.

    torchrun --standalone --nproc-per-node 4 examples/torch_serving.py [--attn-tp 2]

Every replica (``attn_tp`` ranks) runs attention on its own requests with attn-TP: each
rank holds a slice of the heads and of the output projection, so its attention output is
a partial sum. The layer then gathers every replica's tokens (``partial=True``), routes
them (top-k of ``E`` experts), runs a tensor-parallel MoE over the gathered buffer (every
rank a slice of every expert's intermediate) and reduce-scatters the result back to the
replicas. One prefill step, then decode steps:

- one capacity plan per step kind (prefill, and each decode bucket), its real counts
  exchanged on the device (``exchange_counts``), so shapes never change;
- pad rows' top-k ids set to -1 (``mask_pad_rows``) and skipped by the MoE;
- the prefill gather moves fp8 rows (``wire="fp8"``);
- hidden states, top-k ids and top-k weights of a decode step in one gather call;
- on GPUs (NCCL), one CUDA graph per decode bucket, replayed with new counts; on CPU (gloo,
  the default) the same steps run eagerly.

Every rank checks its outputs against a dense single-process reference of the same layer
and prints ``RESULT: serving steps match the dense reference`` when all do.
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.distributed as dist

import dpx
from dpx.wire import EPS, FP8_MAX, GROUP
from dpx_torch import DpComm

H, HEADS, E, TOPK, FFN = 256, 8, 8, 2, 64


def weights(world: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, scale=1.0: torch.randn(*s, generator=g) * scale
    return dict(wq=r(H, H, scale=H ** -0.5), wk=r(H, H, scale=H ** -0.5),
                wv=r(H, H, scale=H ** -0.5), wo=r(H, H, scale=H ** -0.5),
                router=r(H, E), w1=r(E, H, FFN * world, scale=H ** -0.5),
                w2=r(E, FFN * world, H, scale=(FFN * world) ** -0.5))


def attention(x: torch.Tensor, w: dict, heads: slice) -> torch.Tensor:
    """Causal attention over one replica's tokens for the heads in ``heads``; returns the
    heads' share of the output projection (a partial sum over head slices)."""
    d = H // HEADS
    cols = slice(heads.start * d, heads.stop * d)
    q, k, v = (x @ w[n][:, cols] for n in ("wq", "wk", "wv"))
    n, nh = x.shape[0], heads.stop - heads.start
    q, k, v = (t.view(n, nh, d).transpose(0, 1) for t in (q, k, v))
    mask = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
    a = torch.softmax((q @ k.transpose(1, 2) / math.sqrt(d)).masked_fill(~mask, -1e9), -1)
    return (a @ v).transpose(0, 1).reshape(n, nh * d) @ w["wo"][cols]


def route(g: torch.Tensor, w: dict) -> tuple[torch.Tensor, torch.Tensor]:
    vals, ids = torch.topk(g @ w["router"], TOPK, dim=-1)
    return ids.to(torch.int32), torch.softmax(vals, -1)


def moe(g, ids, wts, w: dict, cols: slice, dense: bool | None = None) -> torch.Tensor:
    """The MoE on the intermediate columns ``cols`` of every expert (a partial sum over
    column slices); rows whose ids are -1 (pad rows) get no expert. Eagerly each expert
    runs on its routed rows only, so pad rows cost no expert work; while a CUDA graph is
    captured (no data-dependent shapes there) every expert runs on every row, weighted
    by its gate, which is 0 for pad rows (``dense`` forces one form)."""
    out = torch.zeros_like(g)
    capturing = (g.is_cuda and torch.cuda.is_current_stream_capturing()) if dense is None \
        else dense
    for e in range(E):
        if capturing:
            gate = (wts * (ids == e)).sum(-1, keepdim=True)
            out += gate * (torch.relu(g @ w["w1"][e][:, cols]) @ w["w2"][e][cols])
            continue
        rows, slot = (ids == e).nonzero(as_tuple=True)
        if rows.numel():
            h = torch.relu(g[rows] @ w["w1"][e][:, cols]) @ w["w2"][e][cols]
            out.index_add_(0, rows, h * wts[rows, slot, None])
    return out


def fp8_round_trip(x: torch.Tensor) -> torch.Tensor:
    """The fp8 wire's quantize + dequantize (docs/semantics.md), with stock torch ops."""
    g = x.view(x.shape[0], -1, GROUP)
    s = g.abs().amax(-1, keepdim=True).clamp(min=EPS) / FP8_MAX
    return ((g / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float() * s).view_as(x)


def dense_step(xs: list[torch.Tensor], w: dict, fp8: bool) -> list[torch.Tensor]:
    """The reference: the whole layer in one process, replica by replica."""
    att = [attention(x, w, slice(0, HEADS)) for x in xs]
    g = torch.cat(att)
    if fp8:
        g = fp8_round_trip(g)
    ids, wts = route(g, w)
    out = moe(g, ids, wts, w, slice(0, w["w1"].shape[2]))
    return list(out.split([x.shape[0] for x in xs]))


def requests(step: int, dp: int, cap: int) -> list[torch.Tensor]:
    """Every replica's tokens this step (some replicas idle), the same on every rank."""
    g = torch.Generator().manual_seed(1000 + step)
    n = [int(torch.randint(0, cap + 1, (1,), generator=g)) if (d + step) % 3 else 0
         for d in range(dp)]
    n[step % dp] = cap  # one replica full
    return [torch.randn(k, H, generator=g) for k in n]


class Server:
    """One rank's layer: its head and expert slices, its communicator, its plans. The
    engine owns the attn-tp group (it all-reduces attention in decode) and hands it to
    dpx, which creates no group of its own."""

    def __init__(self, lay: dpx.DpLayout, rank: int, w: dict) -> None:
        c = lay.coords(rank)
        self.attn_tp_group = None
        for ranks in lay.attn_tp_groups():  # every group on every rank, in order
            g = dist.new_group(list(ranks)) if len(ranks) > 1 else None
            if rank in ranks:
                self.attn_tp_group = g
        self.comm = DpComm(lay, attn_tp_group=self.attn_tp_group)
        self.w, self.lay, self.d = w, lay, c.attn_dp_rank
        per = HEADS // lay.attn_tp_size
        self.heads = slice(c.attn_tp_rank * per, (c.attn_tp_rank + 1) * per)
        self.cols = slice(rank * FFN, (rank + 1) * FFN)

    def prefill(self, x: torch.Tensor, n_local: torch.Tensor,
                plan: dpx.DpPlan) -> torch.Tensor:
        """x: this replica's tokens padded to its slot; n_local: its real count (device
        int32 (1,)). The partial attention output is summed and gathered on the fp8 wire;
        every rank routes the gathered tokens."""
        comm = self.comm
        counts = comm.exchange_counts(n_local)
        att = attention(x, self.w, self.heads)
        g = comm.gather(att, plan, partial=True, counts=counts, wire="fp8")
        ids, wts = route(g, self.w)
        comm.mask_pad_rows(ids, plan, counts=counts, fill=-1)
        return comm.reduce_scatter(moe(g, ids, wts, self.w, self.cols), plan, counts=counts)

    def decode(self, x: torch.Tensor, n_local: torch.Tensor,
               plan: dpx.DpPlan) -> torch.Tensor:
        """Attention all-reduced on the engine's attn-tp group, routed on the replica's own
        rows, then hidden states, top-k ids and top-k weights gathered in one call."""
        comm = self.comm
        counts = comm.exchange_counts(n_local)
        att = attention(x, self.w, self.heads)
        if self.attn_tp_group is not None:
            dist.all_reduce(att, group=self.attn_tp_group)
        ids, wts = route(att, self.w)
        g, ids, wts = comm.gather((att, ids, wts), plan, partial=False, counts=counts)
        comm.mask_pad_rows(ids, plan, counts=counts, fill=-1)
        return comm.reduce_scatter(moe(g, ids, wts, self.w, self.cols), plan, counts=counts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--attn-tp", type=int, default=2)
    ap.add_argument("--decode-steps", type=int, default=3)
    ap.add_argument("--time", action="store_true",
                    help="also time each decode bucket's step: eager, and (GPU) graph replay")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    tp = args.attn_tp if world % args.attn_tp == 0 else 1
    lay = dpx.DpLayout(world, world // tp)
    dev = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    w = weights(world)
    server = Server(lay, rank, {k: v.to(dev) for k, v in w.items()})
    worst = 0.0
    # (step, capacity per replica, fp8): one prefill, then decode buckets of 4 and 8 rows
    schedule = [(0, 16, True)] + [(s, 4 if s % 2 else 8, False)
                                  for s in range(1, 1 + args.decode_steps)]
    plans = {cap: dpx.plan_step([0] * lay.dp_size, lay, mode="max_len", capacity=cap)
             for _, cap, _ in schedule}
    graphs: dict[int, tuple] = {}
    for step, cap, fp8 in schedule:
        xs = requests(step, lay.dp_size, cap)
        plan = plans[cap]
        mine = xs[server.d]
        x = torch.zeros(plan.slot_rows[server.d], H)
        x[:mine.shape[0]] = mine
        n = torch.tensor([mine.shape[0]], dtype=torch.int32)
        x, n = x.to(dev), n.to(dev)
        if cuda and not fp8:  # one CUDA graph per decode bucket, replayed with new data
            if cap not in graphs:
                bx, bn = x.clone(), n.clone()
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    server.decode(bx, bn, plan)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    out_buf = server.decode(bx, bn, plan)
                graphs[cap] = (graph, bx, bn, out_buf)
            graph, bx, bn, out_buf = graphs[cap]
            bx.copy_(x)
            bn.copy_(n)
            graph.replay()
            out = out_buf.clone()
        else:
            out = (server.prefill if fp8 else server.decode)(x, n, plan)
        want = dense_step(xs, w, fp8)[server.d]
        got = out[:mine.shape[0]].float().cpu()
        if fp8:  # fp8 rows: within the wire's rounding, measured on the norm
            err = ((got - want).norm() / want.norm().clamp(min=1e-6)).item()
            ok = err <= 2 ** -4
        else:
            err = (got - want).abs().max().item() if got.numel() else 0.0
            ok = torch.allclose(got, want, rtol=1e-4, atol=1e-4)
        worst = max(worst, err)
        assert ok, f"rank {rank} step {step}: error {err}"
        assert not out[mine.shape[0]:].any(), "rows past the real ones must be zero"
    if args.time:
        decode = {cap: plans[cap] for _, cap, fp8 in schedule if not fp8}
        _time_decode(server, decode, graphs, dev, rank)
    if rank == 0:
        print(f"{lay.describe()}, {1 + args.decode_steps} steps "
              f"({'NCCL, CUDA graphs for decode' if cuda else 'gloo, eager'}); worst error "
              f"{worst:.2e}")
        print("RESULT: serving steps match the dense reference")
    dist.barrier()
    dist.destroy_process_group()


def _time_decode(server: Server, plans: dict, graphs: dict, dev, rank: int,
                 reps: int = 20) -> None:
    """Per decode bucket: the step's time eagerly and, on GPUs, as a graph replay (the same
    inputs; CUDA events on GPUs, wall clock on CPU)."""
    import time

    for cap, plan in sorted(plans.items()):
        if cap not in graphs and dev.type == "cuda":
            continue
        x = torch.randn(plan.slot_rows[server.d], H, device=dev)
        n = torch.tensor([cap], dtype=torch.int32, device=dev)
        timed = {"eager": lambda: server.decode(x, n, plan)}
        if cap in graphs:
            timed["graph replay"] = graphs[cap][0].replay
        for name, fn in timed.items():
            fn()
            dist.barrier()
            if dev.type == "cuda":
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(reps):
                    fn()
                torch.cuda.synchronize()
            else:
                t0 = time.perf_counter()
                for _ in range(reps):
                    fn()
            us = (time.perf_counter() - t0) / reps * 1e6
            if rank == 0:
                print(f"decode bucket {cap} rows/replica: {name} {us:.0f} us per step")


if __name__ == "__main__":
    main()
