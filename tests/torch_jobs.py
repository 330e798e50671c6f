"""Jobs run on every rank of a gloo world (see harness.py); each checks against reference.py."""

from __future__ import annotations

import contextlib

import numpy as np
import torch

import dpx
from reference import (global_inputs, held, local_inputs, ref_gather, ref_reduce_scatter,
                       ref_reduce_scatter_rank, ref_scatter_rank)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "int32": torch.int32, "int64": torch.int64}

#: Where this process's jobs put their tensors (``use_device``): CPU, or the one GPU that
#: several gloo ranks share.
DEVICE = torch.device("cpu")


def use_device(ctx, device: str) -> str:
    """Run this world's next jobs on ``device`` tensors (gloo carries CUDA tensors too)."""
    global DEVICE
    DEVICE = torch.device(device)
    if DEVICE.type == "cuda":
        torch.cuda.set_device(DEVICE.index or 0)
    return str(DEVICE)


def use_transport(ctx, transport: str, phase_bytes: int = 1 << 20,
                  timeout: float = 10.0) -> str:
    """Build this world's communicators on ``transport`` from now on (``"peer"``: a
    workspace of ``phase_bytes`` a phase on the jobs' device); returns the choice of the
    first one built."""
    from dpx_torch import PeerOptions

    ctx.defaults = {} if transport == "per_root" else dict(
        transport=transport, peer=PeerOptions(phase_bytes=phase_bytes, timeout=timeout,
                                              device=DEVICE))
    return str(ctx.comm(dpx.DpLayout(ctx.world_size, 1)).transport_choice)


def _t(x: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x)).to(dtype).to(DEVICE)


def _eq(name: str, got: torch.Tensor, want: np.ndarray, dtype: torch.dtype, case) -> None:
    got = got.cpu()
    want_t = _t(want, dtype).cpu()
    if got.shape != want_t.shape or not torch.equal(got, want_t):
        bad = (got.double() - want_t.double()).abs()
        raise AssertionError(f"{name} differs for case {case}: shape {tuple(got.shape)} vs "
                             f"{tuple(want_t.shape)}; max abs diff "
                             f"{bad.max().item() if bad.numel() and got.shape == want_t.shape else 'n/a'}")


def _run_of(plan, case):
    """``(device counts tensor or None, eff)`` of a case: ``run_counts`` are a capacity
    plan's device counts (a shard table for a sharded plan)."""
    run = case.get("run_counts")
    if run is None:
        return None, None
    eff = tuple(tuple(x) for x in run) if plan.sharded else tuple(run)
    return torch.tensor(run, dtype=torch.int32, device=DEVICE), eff


def check_cases(ctx, layout_args, cases, *, rest=(5,)) -> int:
    """Each case: dict(counts, mode, partial, dtype, seed, is_extend, policy, capacity,
    shards, run_counts). Runs gather, scatter and reduce_scatter against the reference;
    none may modify its input. Returns checks done."""
    layout = dpx.DpLayout(*layout_args)
    comm = ctx.comm(layout)
    r = ctx.rank
    d = layout.coords(r).attn_dp_rank
    done = 0
    for case in cases:
        dtype = DTYPES[case.get("dtype", "float32")]
        partial = case.get("partial", True)
        plan, counts_t, eff = _plan_of(layout, case)
        seed = case.get("seed", 0)
        static_rows = plan.slot_rows[d] if plan.is_static else None
        locs = local_inputs(seed, plan, rest, partial=partial, rows=static_rows, eff=eff)
        x = _t(locs[r], dtype)
        x_copy = x.clone()
        got = comm.gather(x, plan, partial=partial, counts=counts_t)
        want = ref_gather(locs, plan, partial=partial, counts=eff)
        _eq("gather", got, want, dtype, case)
        out = torch.full_like(got, 5)
        comm.gather(x, plan, partial=partial, counts=counts_t, out=out)
        _eq("gather(out=)", out, want, dtype, case)
        assert torch.equal(x, x_copy), "gather modified its input"
        sc = comm.scatter(got, plan, counts=counts_t)
        _eq("scatter", sc, ref_scatter_rank(want, plan, r, eff), dtype, case)
        globs = global_inputs(seed, plan, rest)
        g_in = _t(globs[r], dtype)
        g_copy = g_in.clone()
        rs = comm.reduce_scatter(g_in, plan, counts=counts_t)
        _eq("reduce_scatter", rs, ref_reduce_scatter_rank(globs, plan, r, eff), dtype, case)
        if len(rest) == 1:  # the LM-head scatter: rank s holds columns s of the rows
            cols = comm.scatter_columns(g_in, plan, counts=counts_t)
            want_cols = ref_scatter_rank(np.concatenate(globs, axis=1), plan, r, eff)
            _eq("scatter_columns", cols, want_cols, dtype, case)
            prepared = comm.prepare_scatter_columns(g_in, plan, counts=counts_t)
            _eq("prepare_scatter_columns", prepared(g_in, counts=counts_t), want_cols, dtype,
                case)
        assert torch.equal(g_in, g_copy), "reduce_scatter / scatter_columns modified its input"
        done += 4
    return done


def check_grads(ctx, layout_args, cases, *, rest=(4,)) -> int:
    """Gradients of gather (partial and replicated) and reduce_scatter against the adjoint
    computed from the reference: every attn-tp rank receives its replica's slot gradient."""
    layout = dpx.DpLayout(*layout_args)
    comm = ctx.comm(layout)
    W = layout.world_size
    d = layout.coords(ctx.rank).attn_dp_rank
    for case in cases:
        plan = dpx.plan_step(case["counts"], layout, mode=case["mode"])
        n, off = plan.num_tokens[d], plan.offsets[d]
        rng = np.random.default_rng(case.get("seed", 0))
        wg = [rng.integers(-4, 5, (plan.global_rows, *rest)).astype(np.float64) for _ in range(W)]
        ws = [rng.integers(-4, 5, (plan.slot_rows[layout.coords(r).attn_dp_rank], *rest))
              .astype(np.float64) for r in range(W)]
        for partial in (True, False):
            local = torch.ones((n + 2, *rest), dtype=torch.float32, requires_grad=True)
            (comm.gather(local, plan, partial=partial) * _t(wg[ctx.rank], torch.float32)).sum().backward()
            want = np.zeros((n + 2, *rest))
            want[:n] = sum(wg)[off:off + n]
            _eq("gather grad", local.grad, want, torch.float32, (case, partial))
        glob = torch.ones((plan.global_rows, *rest), dtype=torch.float32, requires_grad=True)
        (comm.reduce_scatter(glob, plan) * _t(ws[ctx.rank], torch.float32)).sum().backward()
        want = np.zeros((plan.global_rows, *rest))
        for e in range(layout.dp_size):
            ne, oe = plan.num_tokens[e], plan.offsets[e]
            want[oe:oe + ne] = sum(ws[r][:ne] for r in layout.replica_ranks(e))
        _eq("reduce_scatter grad", glob.grad, want, torch.float32, case)
        # the LM-head scatter: each rank's weights back at its rows, summed over the ranks
        # sharing them, this rank's columns
        C = rest[0]
        wc = [rng.integers(-4, 5, (plan.slot_rows[layout.coords(r).attn_dp_rank], W * C))
              .astype(np.float64) for r in range(W)]
        shard = torch.ones((plan.global_rows, C), dtype=torch.float32, requires_grad=True)
        (comm.scatter_columns(shard, plan) * _t(wc[ctx.rank], torch.float32)).sum().backward()
        want = np.zeros((plan.global_rows, W * C))
        for r in range(W):
            e = layout.coords(r).attn_dp_rank
            ne, oe = plan.num_tokens[e], plan.offsets[e]
            want[oe:oe + ne] += wc[r][:ne]
        _eq("scatter_columns grad", shard.grad, want[:, ctx.rank * C:(ctx.rank + 1) * C],
            torch.float32, case)
    return len(cases)


def check_async_matches_sync(ctx, layout_args, steps) -> dict:
    """Many async gather/reduce_scatter steps (two micro-batch keys, varying sizes) equal the
    synchronous path; returns the pool's buffer count after each step."""
    layout = dpx.DpLayout(*layout_args)
    comm = ctx.comm(layout)
    d = layout.coords(ctx.rank).attn_dp_rank
    sizes = []
    for i, counts in enumerate(steps):
        plan = dpx.plan_step(counts, layout, mode=("max_len", "sum_len", "gatherv")[i % 3])
        locs = local_inputs(i, plan, (6,), partial=True)
        x = _t(locs[ctx.rank], torch.float32)
        g, work = comm.gather_async(x, plan, partial=True, key=i % 2)
        work.wait()
        assert torch.equal(g, comm.gather(x, plan, partial=True)), f"gather step {i}"
        rs, work = comm.reduce_scatter_async(g, plan, key=i % 2)
        work.wait()
        assert torch.equal(rs, comm.reduce_scatter(g, plan)), f"reduce_scatter step {i}"
        assert rs.shape[0] == plan.slot_rows[d]
        sizes.append(len(comm.runner.pool))
    return dict(buffers=sizes, allocations=comm.runner.pool.allocations)


def outputs(ctx, layout_args, cases, *, rest=(5,), transport: str = "per_root") -> list[dict]:
    """Per case, this rank's gather / scatter / reduce_scatter outputs (float64 NumPy) and
    the gradients of gather and reduce_scatter for small-integer cotangents, on the
    communicator of ``transport`` (``"peer"``: a workspace on the jobs' device)."""
    from dpx_torch import PeerOptions

    layout = dpx.DpLayout(*layout_args)
    comm = ctx.comm(layout) if transport == "per_root" else ctx.comm(
        layout, transport=transport, peer=PeerOptions(phase_bytes=1 << 20, timeout=30.0,
                                                      device=DEVICE))
    assert comm.transport.value == transport, comm.transport_choice
    res = []
    for case in cases:
        dtype = DTYPES[case.get("dtype", "float32")]
        plan, ct, eff = _plan_of(layout, case)
        floats = case.get("floats", False)
        locs = local_inputs(case["seed"], plan, rest, partial=case["partial"],
                            rows=plan.max_slot_rows, floats=floats, eff=eff)
        globs = global_inputs(case["seed"], plan, rest, floats=floats)
        x = _t(locs[ctx.rank], dtype)
        g = comm.gather(x, plan, partial=case["partial"], counts=ct)
        out = dict(gather=g.double().numpy(), scatter=comm.scatter(g, plan, counts=ct).double().numpy(),
                   reduce_scatter=comm.reduce_scatter(_t(globs[ctx.rank], dtype), plan,
                                                      counts=ct).double().numpy())
        if case.get("grads") and dtype.is_floating_point and ct is None:
            rng = np.random.default_rng(case["seed"] + 1)
            wg = [rng.integers(-4, 5, (plan.global_rows, *rest)) for _ in range(layout.world_size)]
            ws = [rng.integers(-4, 5, (plan.max_slot_rows, *rest)) for _ in range(layout.world_size)]
            xg = x.clone().requires_grad_()
            (comm.gather(xg, plan, partial=case["partial"]) * _t(wg[ctx.rank], dtype)).sum().backward()
            gg = _t(globs[ctx.rank], dtype).requires_grad_()
            rs = comm.reduce_scatter(gg, plan)
            (rs * _t(ws[ctx.rank][:rs.shape[0]], dtype)).sum().backward()
            out.update(grad_gather=xg.grad.double().numpy(), grad_rs=gg.grad.double().numpy())
            # the LM-head scatter and its gradient (the JAX side's weights, this rank's rows)
            W, L = layout.world_size, plan.max_slot_rows
            wc = np.random.default_rng(case["seed"] + 2).integers(-4, 5, (W * L, W * rest[0]))
            gc = _t(globs[ctx.rank], dtype).requires_grad_()
            cols = comm.scatter_columns(gc, plan)
            mine = wc[ctx.rank * L:ctx.rank * L + cols.shape[0]]
            (cols * _t(mine, dtype)).sum().backward()
            out.update(columns=cols.detach().double().numpy(),
                       grad_columns=gc.grad.double().numpy())
        res.append(out)
    return res


def _raises(fn) -> str:
    try:
        fn()
    except dpx.DpxMismatchError as exc:
        return str(exc)
    return "no error"


def check_validate(ctx) -> dict:
    """Mismatched calls under validate=True: every rank raises the same DpxMismatchError.
    Returns this rank's message per scenario."""
    layout = dpx.DpLayout(4, 2)
    comm = ctx.comm(layout, validate=True)
    r = ctx.rank
    plan = dpx.plan_step([3, 2], layout)
    other = dpx.plan_step([3, 3], layout)
    x = torch.arange(4 * 6, dtype=torch.float32).reshape(4, 6)
    g = torch.zeros(plan.global_rows, 6)
    out = {}
    out["plan"] = _raises(lambda: comm.gather(x, other if r == 3 else plan, partial=True))
    out["dtype"] = _raises(lambda: comm.gather(x.to(torch.bfloat16) if r == 1 else x, plan,
                                               partial=True))
    out["rows"] = _raises(lambda: comm.gather(x[:1] if r == 2 else x, plan, partial=True))
    out["width"] = _raises(lambda: comm.gather(torch.zeros(4, 7) if r == 0 else x, plan,
                                               partial=True))
    out["partial"] = _raises(lambda: comm.gather(x, plan, partial=(r != 2)))
    out["op"] = _raises(lambda: comm.reduce_scatter(g, plan) if r == 0 else
                        comm.gather(x, plan, partial=True))
    out["replicated"] = _raises(lambda: comm.gather(x + 1 if r == 1 else x, plan, partial=False))
    out["columns"] = _raises(lambda: comm.scatter_columns(
        torch.zeros(plan.global_rows, 3 if r == 2 else 2), plan))
    out["columns_op"] = _raises(lambda: comm.scatter_columns(g, plan) if r == 1 else
                                comm.reduce_scatter(g, plan))
    wx = torch.randn(4, 32)
    out["wire_scale"] = _raises(lambda: comm.gather(wx, plan, partial=True, wire="nvfp4",
                                                    wire_scale=2.0 if r == 3 else 1.0))
    out["grad_many"] = _raises(lambda: comm.gather(
        (x.clone().requires_grad_(r == 1), x), plan, partial=True))
    out["same_scale"] = _raises(lambda: comm.gather(wx, plan, partial=True, wire="nvfp4",
                                                    wire_scale=2 if r == 3 else 2.0))
    out["wire"] = _raises(lambda: comm.gather(wx, plan, partial=True,
                                              wire="mxfp4" if r == 0 else "nvfp4",
                                              wire_scale=None if r == 0 else 1.0))
    # the world is still usable, and consistent calls pass validation
    got = comm.gather(x, plan, partial=False)
    cols = comm.scatter_columns(got[:, r:r + 1].contiguous(), plan)  # rank r: column r
    full = got[:, :4].contiguous()
    out["ok"] = bool(torch.equal(got[:3], x[:3]) and torch.equal(got[4:6], x[:2])
                     and torch.equal(cols, comm.scatter(full, plan)))
    return out


def check_validate_columns(ctx) -> dict:
    """validate=True on the LM-head scatter's variable all-to-all (a SUM_LEN plan, one rank
    a replica, host counts): mismatched calls make every rank raise the same error before
    the all-to-all; a consistent call gives the scatter of the full-width rows."""
    layout = dpx.DpLayout(4, 4)
    comm = ctx.comm(layout, validate=True)
    r = ctx.rank
    plan = dpx.plan_step([3, 0, 2, 1], layout, mode="sum_len")
    other = dpx.plan_step([3, 1, 2, 1], layout, mode="sum_len")
    full = torch.arange(plan.global_rows * 8, dtype=torch.float32).reshape(-1, 8)
    mine = full[:, 2 * r:2 * r + 2].contiguous()
    sched = dpx.build_schedule(plan, "scatter_columns", rank=r, in_rows=plan.global_rows)
    out = {"route": [st.kind for st in sched.steps] == ["all_to_all_v", "join_columns"]}
    out["width"] = _raises(lambda: comm.scatter_columns(
        torch.zeros(plan.global_rows, 3) if r == 1 else mine, plan))
    out["plan"] = _raises(lambda: comm.scatter_columns(
        torch.zeros(other.global_rows, 2) if r == 3 else mine, other if r == 3 else plan))
    out["ok"] = bool(torch.equal(comm.scatter_columns(mine, plan), comm.scatter(full, plan)))
    return out


def check_sync_counts(ctx) -> dict:
    layout = dpx.DpLayout(4, 2)
    comm = ctx.comm(layout)
    d = layout.coords(ctx.rank).attn_dp_rank
    counts, ext = comm.sync_counts([7, 0][d], is_extend=ctx.rank == 3)
    msg = _raises(lambda: comm.sync_counts(5 + (ctx.rank == 1)))
    return dict(counts=counts, is_extend=ext, mismatch=msg)


@contextlib.contextmanager
def recording(comm, log: list[str]):
    """Record every local pass (by kind) and every torch.distributed call the communicator's
    prepared calls make (its caches are cleared before and after, so every call binds
    anew through the recorders)."""
    import dpx_torch.binders as it
    from dpx_torch.passes import TorchPasses

    class Recorder(TorchPasses):
        def check(self, *a, **k):
            log.append("check_counts")
            return super().check(*a, **k)

    for kind in ("move", "zero", "pack", "unpack", "quantize", "dequantize"):
        def make(kind=kind):
            real_bind = getattr(TorchPasses, f"bind_{kind}")

            def bind(self, *a, **k):
                go = real_bind(self, *a, **k)

                def rec(*a2, **k2):
                    log.append(kind)
                    return go(*a2, **k2)
                return rec
            return bind
        setattr(Recorder, f"bind_{kind}", make())
    import dpx_torch.collectives as coll

    binders = {"bind_all_gather": "all_gather", "bind_reduce_scatter": "reduce_scatter",
               "bind_all_reduce": "all_reduce"}
    saved = {n: getattr(coll, n) for n in binders}
    dist_saved = {n: getattr(it.dist, n) for n in ("broadcast", "reduce")}

    def recorder(name, fn):
        def wrapped(*a, **k):
            log.append(name)
            return fn(*a, **k)
        return wrapped

    def bind_recorder(name, bind):
        return lambda group: recorder(name, bind(group))

    real_passes = comm.runner.passes["cpu"]
    comm.clear_caches()
    comm.runner.passes["cpu"] = Recorder()
    for n, short in binders.items():
        setattr(coll, n, bind_recorder(short, saved[n]))
    for n, fn in dist_saved.items():
        setattr(it.dist, n, recorder(n, fn))
    try:
        yield log
    finally:
        comm.runner.passes["cpu"] = real_passes
        for n, fn in saved.items():
            setattr(coll, n, fn)
        for n, fn in dist_saved.items():
            setattr(it.dist, n, fn)
        comm.clear_caches()


def count_row_launches(ctx, counts) -> dict:
    """MAX_LEN, attn_tp 1: row passes of one gather and one reduce_scatter on this rank (a
    replica whose host count fills its slot sends its input as is), plus whether both
    results match the reference."""
    layout = dpx.DpLayout(len(counts), len(counts))
    comm = ctx.comm(layout)
    d = layout.coords(ctx.rank).attn_dp_rank
    plan = dpx.plan_step(counts, layout, mode="max_len")
    locs = local_inputs(9, plan, (3,), partial=True, rows=plan.slot_rows[d])
    globs = global_inputs(9, plan, (3,))
    log: list[str] = []
    with recording(comm, log):
        got = comm.gather(_t(locs[ctx.rank], torch.float32), plan, partial=True)
        rs = comm.reduce_scatter(_t(globs[ctx.rank], torch.float32), plan)
    ok = torch.equal(got, _t(ref_gather(locs, plan, partial=True), torch.float32)) and \
        torch.equal(rs, _t(ref_reduce_scatter(globs, plan, d, plan.num_tokens), torch.float32))
    return dict(move=log.count("move"), zero=log.count("zero"), ok=ok)


def _plan_of(layout, case):
    """``(plan, device counts tensor or None, eff)`` of a case (see :func:`_run_of`)."""
    plan = dpx.plan_step(case["counts"], layout, mode=case.get("mode"),
                         is_extend=case.get("is_extend", False),
                         policy=case.get("policy", "sglang"), capacity=case.get("capacity"),
                         cp_shards=case.get("shards"))
    counts_t, eff = _run_of(plan, case)
    return plan, counts_t, eff


def check_autograd(ctx, layout_args, cases, *, rest=(3,)) -> int:
    """For each case (host or capacity plans, device counts, CP shards): every op's output
    has a grad_fn and its gradient equals the adjoint computed from the reference; the
    adjoint identity <gather(x), y> * copies == <x, reduce_scatter(y)> (summed over ranks;
    ``copies`` = the CP ranks holding the same rows, 1 for shards) holds on random normal
    inputs; no op modifies its input (rows past the count included)."""
    import torch.distributed as dist

    layout = dpx.DpLayout(*layout_args)
    comm = ctx.comm(layout)
    W, r = layout.world_size, ctx.rank
    d = layout.coords(r).attn_dp_rank
    done = 0
    for case in cases:
        plan, ct, eff = _plan_of(layout, case)
        G, S = plan.global_rows, plan.slot_rows[d]
        first, n = held(plan, r, eff)
        regions = [held(plan, q, eff) for q in range(W)]
        rng = np.random.default_rng(case.get("seed", 0))
        L = S if plan.is_static else n + 2
        # small integers: exact sums, so gradients compare bitwise
        wg = [rng.integers(-4, 5, (G, *rest)).astype(np.float64) for _ in range(W)]
        ws = [rng.integers(-4, 5, (plan.slot_rows[layout.coords(q).attn_dp_rank], *rest))
              .astype(np.float64) for q in range(W)]
        for partial in (True, False):
            x = _t(rng.integers(-4, 5, (L, *rest)).astype(np.float64), torch.float32)
            x_copy = x.clone()
            xg = x.clone().requires_grad_()
            out = comm.gather(xg, plan, partial=partial, counts=ct)
            assert out.grad_fn is not None, "gather output has no grad_fn"
            (out * _t(wg[r], torch.float32)).sum().backward()
            want = np.zeros((L, *rest))
            want[:n] = sum(wg)[first:first + n]
            _eq("gather grad", xg.grad, want, torch.float32, (case, partial))
            comm.gather(x, plan, partial=partial, counts=ct)
            assert torch.equal(x, x_copy), f"gather(partial={partial}) modified its input"
        # scatter: a local take; its gradient places the slot gradient back at the offset
        g_in = _t(rng.integers(-4, 5, (G, *rest)).astype(np.float64), torch.float32)
        g_copy = g_in.clone()
        gg = g_in.clone().requires_grad_()
        sc = comm.scatter(gg, plan, counts=ct)
        assert sc.grad_fn is not None, "scatter output has no grad_fn"
        (sc * _t(ws[r], torch.float32)).sum().backward()
        want = np.zeros((G, *rest))
        want[first:first + n] = ws[r][:n]
        _eq("scatter grad", gg.grad, want, torch.float32, case)
        comm.scatter(g_in, plan, counts=ct)
        assert torch.equal(g_in, g_copy), "scatter modified its input"
        # reduce_scatter: its gradient is gather(partial=True) of the output gradient
        gg = g_in.clone().requires_grad_()
        rs = comm.reduce_scatter(gg, plan, counts=ct)
        assert rs.grad_fn is not None, "reduce_scatter output has no grad_fn"
        (rs * _t(ws[r], torch.float32)).sum().backward()
        want = np.zeros((G, *rest))  # every rank's cotangent lands on the rows it came from
        for q, (f, k) in enumerate(regions):
            want[f:f + k] += ws[q][:k]
        _eq("reduce_scatter grad", gg.grad, want, torch.float32, case)
        comm.reduce_scatter(g_in, plan, counts=ct)
        assert torch.equal(g_in, g_copy), "reduce_scatter modified its input"
        if len(rest) == 1:  # the LM-head scatter: every rank's weights at its rows, summed
            C = rest[0]
            same = np.random.default_rng((case.get("seed", 0), 7))  # alike on every rank
            wc = [same.integers(-4, 5, (plan.slot_rows[layout.coords(q).attn_dp_rank], W * C))
                  .astype(np.float64) for q in range(W)]
            gg = g_in.clone().requires_grad_()
            cols = comm.scatter_columns(gg, plan, counts=ct)
            assert cols.grad_fn is not None, "scatter_columns output has no grad_fn"
            (cols * _t(wc[r], torch.float32)).sum().backward()
            want = np.zeros((G, W * C))
            for q, (f, k) in enumerate(regions):
                want[f:f + k] += wc[q][:k]
            _eq("scatter_columns grad", gg.grad, want[:, r * C:(r + 1) * C], torch.float32,
                case)
            comm.scatter_columns(g_in, plan, counts=ct)
            assert torch.equal(g_in, g_copy), "scatter_columns modified its input"
        # the adjoint identity on random normal inputs, summed over ranks
        xn = torch.from_numpy(rng.standard_normal((L, *rest))).float()
        xn[n:] = 0  # rows past the count take no part in either side
        yn = torch.from_numpy(rng.standard_normal((G, *rest))).float()
        lhs = (comm.gather(xn, plan, partial=True, counts=ct).double() * yn.double()).sum()
        rhs = (xn[:S].double() * comm.reduce_scatter(yn, plan, counts=ct)[:L].double()).sum()
        both = torch.stack([lhs, rhs])
        dist.all_reduce(both)
        copies = 1 if plan.sharded else layout.cp_size
        scale = float(torch.stack([xn.abs().sum(), yn.abs().sum()]).max()) * W * copies
        assert abs(float(both[0] * copies - both[1])) <= 1e-5 * max(scale, 1.0), \
            f"adjoint identity: {float(both[0])} x {copies} vs {float(both[1])} for {case}"
        done += 1
    return done


def check_async_refuses_grad(ctx) -> list[str]:
    layout = dpx.DpLayout(ctx.world_size, ctx.world_size)
    comm = ctx.comm(layout)
    plan = dpx.plan_step([2] * ctx.world_size, layout)
    x = torch.ones(2, 3, requires_grad=True)
    msgs = []
    for fn in (lambda: comm.gather_async(x, plan, partial=True),
               lambda: comm.reduce_scatter_async(torch.ones(plan.global_rows, 3,
                                                            requires_grad=True), plan)):
        try:
            fn()
            msgs.append("no error")
        except dpx.DpxValueError as exc:
            msgs.append(str(exc))
    # without grad it runs, and matches the synchronous form
    with torch.no_grad():
        out, work = comm.gather_async(x, plan, partial=True)
        work.wait()
        assert torch.equal(out, comm.gather(x, plan, partial=True))
    return msgs


def record_primitives(ctx, layout_args, cases) -> list[tuple]:
    """Run gather (partial and replicated), scatter and reduce_scatter for each case while
    recording every kernel launch, copy and torch.distributed call the interpreter makes;
    return, per call, (the schedule's steps expanded to primitives, what ran)."""
    layout = dpx.DpLayout(*layout_args)
    comm = ctx.comm(layout)
    d = layout.coords(ctx.rank).attn_dp_rank
    log: list[str] = []
    out = []
    with recording(comm, log):
        for case in cases:
            plan, ct, eff = _plan_of(layout, case)
            L = (plan.slot_rows[d] if plan.is_static
                 else held(plan, ctx.rank, eff)[1] + case.get("extra", 0))
            x = torch.ones(L, 3)
            g = torch.ones(plan.global_rows, 3)
            calls = [("gather", True, lambda: comm.gather(x, plan, partial=True, counts=ct)),
                     ("gather", False, lambda: comm.gather(x, plan, partial=False, counts=ct)),
                     ("scatter", True, lambda: comm.scatter(g, plan, counts=ct)),
                     ("reduce_scatter", True, lambda: comm.reduce_scatter(g, plan, counts=ct))]
            for op, partial, fn in calls:
                sched = comm.schedule(plan, op, partial=partial, device_counts=ct is not None,
                                      in_rows=L if op == "gather" else plan.global_rows)
                want = []
                for s in sched.steps:
                    if s.kind in ("broadcast_v", "reduce_v"):  # one call per non-empty chunk
                        want += [s.kind[:-2]] * sum(1 for n in s.lens if n)
                    else:
                        want.append(s.kind)
                log.clear()
                fn()
                out.append((case, op, partial, want, list(log)))
    return out


def check_validate_cp(ctx) -> dict:
    """validate=True with context parallelism (dp 1 x cp 2 x tp 2): every rank raises the
    same DpxMismatchError for CP copies that differ, for shard tables that differ, and for
    device shard counts that differ; consistent calls pass."""
    layout = dpx.DpLayout(4, 1, 2)
    comm = ctx.comm(layout, validate=True)
    r = ctx.rank
    c = layout.coords(r)
    x = torch.arange(5 * 3, dtype=torch.float32).reshape(5, 3)
    plan = dpx.plan_step([5], layout)
    out = {}
    out["copies"] = _raises(lambda: comm.gather(x + (c.attn_cp_rank == 1), plan, partial=False))
    mine = dpx.plan_step([5], layout, cp_shards=[(2, 3)] if r != 3 else [(3, 2)])
    out["shards"] = _raises(lambda: comm.gather(x, mine, partial=True))
    cap = dpx.plan_step([0], layout, capacity=8, cp_shards=[(0, 0)])
    dev = torch.tensor([[2, 3]] if r != 0 else [[1, 4]], dtype=torch.int32)
    out["device"] = _raises(lambda: comm.gather(torch.ones(8, 3), cap, partial=True,
                                                counts=dev))
    # shards may differ between CP ranks' rows when the plan says so: this passes
    sharded = dpx.plan_step([5], layout, cp_shards=[(2, 3)])
    rows = x[:2] if c.attn_cp_rank == 0 else x[2:] * 2
    got = comm.gather(rows, sharded, partial=False)
    out["ok"] = bool(torch.equal(got[:2], x[:2]) and torch.equal(got[2:5], x[2:] * 2))
    return out


def check_several_with_grad(ctx, layout_args) -> dict:
    """A three-tensor gather (float32 requiring grad, int32 ids, a bf16 tensor that does
    not) in every mode: each result and the first tensor's gradient equal those of the
    tensor gathered alone (docs/semantics.md, "Several tensors in one call")."""
    layout = dpx.DpLayout(*layout_args)
    comm = ctx.comm(layout)
    d = layout.coords(ctx.rank).attn_dp_rank
    res = {}
    for mode in ("max_len", "sum_len", "gatherv"):
        plan = dpx.plan_step([3 + e % 2 for e in range(layout.dp_size)], layout, mode=mode)
        n = plan.num_tokens[d]
        g = torch.Generator().manual_seed(ctx.rank)
        a = torch.randn(n, 4, generator=g)
        ids = torch.randint(0, 99, (n, 2), generator=g, dtype=torch.int32)
        h = torch.randn(n, 8, generator=g).bfloat16()
        w = torch.randn(plan.global_rows, 4, generator=torch.Generator().manual_seed(7))
        a1 = a.clone().requires_grad_()
        got = comm.gather((a1, ids, h), plan, partial=(True, False, False))
        (got[0] * w).sum().backward()
        a2 = a.clone().requires_grad_()
        alone = comm.gather(a2, plan, partial=True)
        (alone * w).sum().backward()
        res[mode] = (torch.equal(got[0], alone) and got[0].requires_grad
                     and torch.equal(a1.grad, a2.grad)
                     and torch.equal(got[1], comm.gather(ids, plan, partial=False))
                     and torch.equal(got[2], comm.gather(h, plan, partial=False)))
    return res
