"""Jobs of the peer transport on every rank of a gloo world (see harness.py): what its
communicators chose, the order of the native combine's sum, the bytes moved against the
planner's, its fallbacks. The other jobs (torch_jobs, serving_jobs, ...) run on it through
``torch_jobs.use_transport``."""

from __future__ import annotations

import numpy as np
import torch

import dpx
import torch_jobs
from dpx.cost import peer_bytes
from dpx.wire import CANONICAL_NAN
from dpx_torch import DpComm, PeerOptions
from harness import raised
from torch_jobs import _t


def report(ctx, layout_args) -> dict:
    """The transport of this world's communicator of the layout, and the step kinds of a
    gather and a reduce_scatter it runs."""
    layout = dpx.DpLayout(*layout_args)
    comm = ctx.comm(layout)
    plan = dpx.plan_step([2] * layout.dp_size, layout, mode="max_len")
    kinds = [[s.kind for s in comm.schedule(plan, op).steps]
             for op in ("gather", "reduce_scatter")]
    return {"transport": comm.transport.value, "choice": str(comm.transport_choice),
            "kinds": kinds}


_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
#: the canonical quiet NaNs' bits (as the int dtypes of _BITS hold them)
_NAN = {dt: CANONICAL_NAN[str(dt).replace("torch.", "")] for dt in _BITS}


def native_sum_order(ctx, layout_args, dtypes) -> dict:
    """The native reduce_scatter on the peer transport: random floats of mixed magnitudes
    (and -0.0, a NaN in one source) summed in float32 in rank order from +0.0, rounded
    once -- bit for bit against that sum made here with torch ops -- and the per_root
    transport's (the backend's order and roundings) within both sums' rounding errors:
    ``|peer - per_root| <= W * eps * sum_s |x_s|`` per element (eps of the dtype)."""
    layout = dpx.DpLayout(*layout_args)
    comm = ctx.comm(layout)
    ref = ctx.comm(layout, transport="per_root")
    W, r = layout.world_size, ctx.rank
    d = layout.coords(r).attn_dp_rank
    checked = 0
    worst = 0.0
    for dtype in (torch_jobs.DTYPES[t] for t in dtypes):
        for mode, counts in (("gatherv", [3 + i for i in range(layout.dp_size)]),
                             ("max_len", [0 if i % 2 else 5 for i in range(layout.dp_size)])):
            plan = dpx.plan_step(counts, layout, mode=mode)
            parts = []
            for s in range(W):
                g = torch.Generator().manual_seed(1000 * s + 17)
                x = (torch.randn(plan.global_rows, 24, generator=g) *
                     torch.exp2(torch.randint(-12, 12, (plan.global_rows, 1), generator=g)))
                x[0, 0] = -0.0   # -0.0 from every source sums to +0.0
                if s == W - 1 and plan.global_rows > 1:
                    x[1, 1] = float("nan")
                parts.append(x.to(dtype))
            got = comm.reduce_scatter(parts[r].to(torch_jobs.DEVICE), plan).cpu()
            first, n = plan.offsets[d], plan.num_tokens[d]
            acc = torch.zeros(n, 24, dtype=torch.float32)
            for x in parts:
                acc = acc + x[first:first + n].float()
            want = torch.zeros_like(got)
            want[:n] = acc.to(dtype)   # a NaN as the dtype's canonical one (torch's CPU
            want.view(_BITS[dtype])[:n][acc.isnan()] = _NAN[dtype]   # writes bf16's as 0xFFFF)
            gb, wb = got.view(_BITS[dtype]), want.view(_BITS[dtype])
            if not torch.equal(gb, wb):
                at = (gb != wb).nonzero().tolist()
                raise AssertionError((dtype, mode, counts, len(at), [
                    (i, j, hex(int(gb[i, j]) & 0xFFFFFFFF), hex(int(wb[i, j]) & 0xFFFFFFFF),
                     [float(x[first + i, j]) for x in parts] if i < n else None)
                    for i, j in at[:6]]))
            backend = ref.reduce_scatter(parts[r].to(torch_jobs.DEVICE), plan).cpu()
            assert torch.equal(got.isnan(), backend.isnan()), (dtype, mode)
            mass = sum(x[first:first + n].double().abs() for x in parts)
            bound = W * torch.finfo(dtype).eps * mass
            diff = (got[:n].double() - backend[:n].double()).abs()
            ok = ~got[:n].isnan()
            if ok.any():
                worst = max(worst, (diff[ok] / bound[ok].clamp(min=1e-300)).max().item())
            checked += 1
    return {"checked": checked, "worst": worst}


def traffic(ctx, layout_args, cases) -> list[tuple]:
    """Per case (a plan, host or device counts): the bytes this rank put into and pulled
    from its peers' workspaces in one gather (native and fp8) and one combine (native and
    fp8), against :func:`dpx.cost.peer_bytes` of the schedules it ran."""
    layout = dpx.DpLayout(*layout_args)
    comm = ctx.comm(layout)
    passes = comm.runner.peer.passes
    out = []
    H = 128
    for case in cases:
        plan, counts_t, eff = torch_jobs._plan_of(layout, case)
        d = layout.coords(ctx.rank).attn_dp_rank
        rows = plan.slot_rows[d] if plan.is_static else plan.num_tokens[d]
        x = _t(np.ones((rows, H)), torch.bfloat16)
        g = _t(np.ones((plan.global_rows, H)), torch.bfloat16)
        for op, wire, call in (
                ("gather", "native", lambda: comm.gather(x, plan, partial=True, counts=counts_t)),
                ("gather", "fp8", lambda: comm.gather(x, plan, partial=True, counts=counts_t,
                                                      wire="fp8")),
                ("reduce_scatter", "native", lambda: comm.reduce_scatter(g, plan,
                                                                        counts=counts_t)),
                ("reduce_scatter", "fp8", lambda: comm.reduce_scatter(g, plan, counts=counts_t,
                                                                      wire="fp8"))):
            if op == "gather" and wire == "fp8" and plan.mode is dpx.PaddingMode.SUM_LEN:
                continue
            before = list(passes.traffic)
            call()
            moved = (passes.traffic[0] - before[0], passes.traffic[1] - before[1])
            sched = dpx.build_schedule(plan, op, rank=ctx.rank, partial=True,
                                       device_counts=counts_t is not None, wire=wire,
                                       transport="peer", in_rows=rows if op == "gather" else
                                       plan.global_rows)
            planned = peer_bytes(sched, row_bytes=2 * H, wire_row_bytes=H + 4,
                                 counts=None if eff is None else
                                 tuple(np.ravel(eff).tolist()))
            out.append((case.get("mode"), op, wire, moved, planned))
    return out


def fallbacks(ctx) -> dict:
    """The peer transport where it cannot run, alike on every rank: rank 0's workspace
    asked on a device the others do not use; every rank's on a device that cannot share
    memory here. Both fall back to per_root, with the reason, and run."""
    W = ctx.world_size
    layout = dpx.DpLayout(W, W)
    out = {}
    for name, dev in (("mixed", "cuda" if ctx.rank == 0 else "cpu"), ("none", "meta")):
        comm = DpComm(layout, transport="peer", peer=PeerOptions(device=dev))
        plan = dpx.plan_step([2] * W, layout, mode="gatherv")
        got = comm.gather(torch.full((2, 3), float(ctx.rank)), plan, partial=True)
        out[name] = (comm.transport.value, str(comm.transport_choice),
                     bool(torch.equal(got[2 * W - 2:], torch.full((2, 3), W - 1.0))))
        comm.destroy()
    # ranks that disagree on the workspace: the same error everywhere, nothing opened
    out["mismatch"] = raised(lambda: DpComm(layout, transport="peer", peer=PeerOptions(
        phase_bytes=4096 * (1 + (ctx.rank == 0)), device="cpu")))
    out["jax"] = raised(lambda: DpComm(layout, transport="ragged"))
    out["options"] = raised(lambda: PeerOptions(timeout=0))
    return out


def too_small(ctx) -> dict:
    """A call whose rows do not fit the workspace's phase: the same DpxCapacityError on
    every rank, before any step (the communicator then runs a call that fits)."""
    layout = dpx.DpLayout(ctx.world_size, ctx.world_size)
    comm = ctx.comm(layout, peer=PeerOptions(phase_bytes=4096, timeout=10.0,
                                             device=torch_jobs.DEVICE))
    plan = dpx.plan_step([40] * ctx.world_size, layout, mode="gatherv")
    x = _t(np.ones((40, 64)), torch.float32)
    big = raised(lambda: comm.gather(x, plan, partial=True))
    small = comm.gather(x[:2], dpx.plan_step([2] * ctx.world_size, layout, mode="gatherv"),
                        partial=True)
    return {"error": big, "small": bool(torch.equal(small, torch.ones_like(small)))}


def force_ipc(ctx, kind: str) -> str:
    """This process's CUDA IPC from now on: only ``kind`` (``"torch"``: the fallback)."""
    from dpx_torch.shims import ipc

    ipc.kinds = (lambda: (kind,))
    return kind


def graph_replays(ctx, layout_args, replays: int) -> dict:
    """One CUDA graph -- a replicated gather of a MAX_LEN capacity plan, a native combine
    and an fp8 combine of a GATHERV capacity plan, all with device counts -- captured once
    and replayed ``replays`` times back to back, new counts and rows before each replay
    (device copies, no host sync); after the last one, every replay's outputs against the
    eager calls of the same inputs (bit for bit) and the gather against the reference."""
    from graphs import capture

    layout = dpx.DpLayout(*layout_args)
    comm = ctx.comm(layout)
    dev = torch_jobs.DEVICE
    dp, r = layout.dp_size, ctx.rank
    d = layout.coords(r).attn_dp_rank
    H, cap = 256, 16
    pm = dpx.plan_step([0] * dp, layout, mode="max_len", capacity=cap)
    pg = dpx.plan_step([0] * dp, layout, mode="gatherv", capacity=cap * dp)
    g = torch.Generator().manual_seed(5)
    cm = torch.randint(0, cap + 1, (replays, dp), generator=g, dtype=torch.int32)
    cg = torch.randint(0, cap + 1, (replays, dp), generator=g, dtype=torch.int32)
    # replicated rows: the same on every rank of a replica (seeded by it)
    xs = torch.stack([torch.randint(-8, 9, (cap, H), generator=torch.Generator().manual_seed(
        1000 * i + d)) for i in range(replays)]).float().to(dev)
    gs = torch.randn(replays, pg.global_rows, H, generator=torch.Generator().manual_seed(r)
                     ).to(dev)
    counts_m = cm[0].to(dev)
    counts_g = cg[0].to(dev)
    x, gin = xs[0].clone(), gs[0].clone()
    gin16 = gin.bfloat16()
    go = torch.empty(pm.global_rows, H, device=dev)
    ro = torch.empty(pg.slot_rows[d], H, device=dev)
    fo = torch.empty(pg.slot_rows[d], H, dtype=torch.bfloat16, device=dev)

    def step():
        comm.gather(x, pm, partial=False, counts=counts_m, out=go)
        comm.reduce_scatter(gin, pg, counts=counts_g, out=ro)
        comm.reduce_scatter(gin16, pg, counts=counts_g, out=fo, wire="fp8")

    graph, _ = capture(step)
    hist = [torch.empty(replays, *t.shape, dtype=t.dtype, device=dev) for t in (go, ro, fo)]
    cm_d, cg_d = cm.to(dev), cg.to(dev)
    for i in range(replays):
        counts_m.copy_(cm_d[i])
        counts_g.copy_(cg_d[i])
        x.copy_(xs[i])
        gin.copy_(gs[i])
        gin16.copy_(gs[i].bfloat16())
        graph.replay()
        for h, t in zip(hist, (go, ro, fo)):
            h[i].copy_(t)
    torch.cuda.synchronize()
    bad = []
    for i in range(replays):
        counts_m.copy_(cm_d[i])
        counts_g.copy_(cg_d[i])
        want = [comm.gather(xs[i], pm, partial=False, counts=counts_m),
                comm.reduce_scatter(gs[i], pg, counts=counts_g),
                comm.reduce_scatter(gs[i].bfloat16(), pg, counts=counts_g, wire="fp8")]
        ref = torch.zeros(pm.global_rows, H)
        for e in range(dp):
            n = int(cm[i, e])
            ref[e * cap:e * cap + n] = torch.randint(
                -8, 9, (cap, H), generator=torch.Generator().manual_seed(1000 * i + e))[:n]
        ok = torch.equal(hist[0][i].cpu(), ref) and all(
            torch.equal(h[i].view(torch.int16 if h.dtype == torch.bfloat16 else torch.int32),
                        w.view(torch.int16 if w.dtype == torch.bfloat16 else torch.int32))
            for h, w in zip(hist, want))
        if not ok:
            bad.append(i)
    return {"replays": replays, "bad": bad, "overflowed": comm.overflowed()}


def compiled_steps(ctx, layout_args, which, *, fullgraph: bool = True) -> int:
    """torch.compile(fullgraph=fullgraph) of a step -- gather, a matmul, the combine
    (native and fp8), the LM-head scatter -- on the world's transport, for each ``(mode,
    device counts)`` of ``which`` (on the peer transport GATHERV too: its world steps are
    one custom op each): equal to the eager step bit for bit."""
    layout = dpx.DpLayout(*layout_args)
    comm = ctx.comm(layout)
    d = layout.coords(ctx.rank).attn_dp_rank
    dev = torch_jobs.DEVICE
    w = torch.randn(128, 128, generator=torch.Generator().manual_seed(1)).to(dev)
    done = 0
    for mode, device in which:
        for cap in [8 * layout.dp_size] if device else [None]:
            plan = dpx.plan_step([3 + e % 2 for e in range(layout.dp_size)], layout, mode=mode,
                                 capacity=cap)
            counts = None if cap is None else torch.tensor(
                [2 + e for e in range(layout.dp_size)], dtype=torch.int32, device=dev)

            def step(x):
                g = comm.gather(x, plan, partial=True, counts=counts)
                y = torch.tanh(g @ w)
                return (comm.reduce_scatter(y, plan, counts=counts),
                        comm.reduce_scatter(y.bfloat16(), plan, counts=counts, wire="fp8"),
                        comm.scatter_columns(y[:, :16].contiguous(), plan, counts=counts))

            torch._dynamo.reset()
            rows = plan.slot_rows[d] if plan.is_static else plan.num_tokens[d]
            x = torch.randn(rows, 128, generator=torch.Generator().manual_seed(ctx.rank)).to(dev)
            eager = step(x)
            compiled = torch.compile(step, fullgraph=fullgraph, backend="aot_eager")(x)
            for a, b in zip(eager, compiled):
                assert torch.equal(a, b), (mode, cap)
            done += 1
    return done


def compiled_ride(ctx, layout_args) -> dict:
    """``gather_with_counts`` under torch.compile on this world's transport (a MAX_LEN
    capacity plan): with ``fullgraph=True`` the text of the compile error (torch's class,
    which quotes the dpx error it observed); without, the compiled call's rows and counts
    against the eager call's."""
    layout = dpx.DpLayout(*layout_args)
    comm = ctx.comm(layout)
    dev = torch_jobs.DEVICE
    plan = dpx.plan_step([0] * layout.dp_size, layout, mode="max_len", capacity=8)
    n = torch.tensor([3 + ctx.rank % 2], dtype=torch.int32, device=dev)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(ctx.rank)).to(dev)

    def step(v, c):
        return comm.gather_with_counts(v, plan, partial=True, n_local=c)

    eager = step(x, n)
    torch._dynamo.reset()
    res: dict = {"fullgraph": ""}
    try:
        torch.compile(step, fullgraph=True, backend="aot_eager")(x, n)
    except Exception as exc:
        res["fullgraph"] = str(exc)
    torch._dynamo.reset()
    got = torch.compile(step, backend="aot_eager")(x, n)
    res["broken_equal"] = all(torch.equal(a, b) for a, b in zip(got, eager))
    res["counts"] = eager[1].tolist()
    return res


def explained(ctx, layout_args) -> dict:
    """``comm.explain(plan)`` on this world's transport and on ``per_root``, with each
    communicator's ``transport`` and ``transport_choice``."""
    layout = dpx.DpLayout(*layout_args)
    plan = dpx.plan_step([5 + e for e in range(layout.dp_size)], layout, mode="max_len")
    res = {}
    for name, comm in (("world", ctx.comm(layout)),
                       ("per_root", DpComm(layout, transport="per_root"))):
        res[name] = dict(transport=comm.transport.value, choice=str(comm.transport_choice),
                         text=comm.explain(plan))
    return res


def compiled_ops(ctx, layout_args, modes) -> int:
    """torch.compile(fullgraph=True) of a gather and a reduce_scatter alone (host counts) on
    this world's transport, for each mode of ``modes``: equal to eager bit for bit."""
    layout = dpx.DpLayout(*layout_args)
    comm = ctx.comm(layout)
    d = layout.coords(ctx.rank).attn_dp_rank
    done = 0
    for mode in modes:
        plan = dpx.plan_step([3 + e % 2 for e in range(layout.dp_size)], layout, mode=mode)
        x = torch.randn(plan.num_tokens[d], 16,
                        generator=torch.Generator().manual_seed(ctx.rank)).to(torch_jobs.DEVICE)

        def step(v):
            g = comm.gather(v, plan, partial=True)
            return g, comm.reduce_scatter(g * 2, plan)

        torch._dynamo.reset()
        eager = step(x)
        compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(x)
        assert all(torch.equal(a, b) for a, b in zip(eager, compiled)), mode
        done += 1
    return done
