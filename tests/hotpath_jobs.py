"""A server's hot path on every rank of a gloo world (see harness.py): counts outside a
capacity plan (raised with validate, flagged without), the in-place gather, a destroyed
communicator, bad counts named, and caches that stay bounded over many distinct steps."""

from __future__ import annotations

import random

import numpy as np
import torch

import dpx
import dpx_torch
from graphs import capture
from reference import held, local_inputs, ref_gather
from harness import raised
import torch_jobs
from torch_jobs import DTYPES, _plan_of, _t


def over_capacity(ctx, layout_args, cases) -> list[dict]:
    """Each case: a capacity plan and device counts it cannot hold. With validate=True every
    rank raises (the out= buffer untouched: no row moved); with validate=False the call
    runs, stays in bounds and sets the overflow flag, which reset clears; valid counts
    leave it clear."""
    layout = dpx.DpLayout(*layout_args)
    strict = ctx.comm(layout, validate=True)
    lax = ctx.comm(layout)
    d = layout.coords(ctx.rank).attn_dp_rank
    out = []
    for case in cases:
        plan = dpx.plan_step(case["counts"], layout, mode=case["mode"],
                             capacity=case["capacity"], cp_shards=case.get("shards"))
        dev = torch_jobs.DEVICE
        bad = torch.tensor(case["bad"], dtype=torch.int32, device=dev)
        good = torch.tensor(case["good"], dtype=torch.int32, device=dev)
        x = torch.ones(plan.slot_rows[d], 3, device=dev)
        sentinel = torch.full((plan.global_rows, 3), 7.0, device=dev)
        res = {"case": case}
        res["gather"] = raised(lambda: strict.gather(x, plan, partial=True, counts=bad,
                                                       out=sentinel))
        res["untouched"] = bool((sentinel == 7).all())
        glob = torch.ones(plan.global_rows, 3, device=dev)
        res["reduce_scatter"] = raised(lambda: strict.reduce_scatter(glob, plan, counts=bad))
        lax.reset_overflow()
        lax.gather(x, plan, partial=False, counts=good)
        lax.reduce_scatter(glob, plan, counts=good)
        res["clear_after_good"] = not lax.overflowed()
        got = lax.gather(x, plan, partial=True, counts=bad)
        res["shape"] = tuple(got.shape)
        res["flagged"] = lax.overflowed()
        res["reason"] = lax.overflow_reason()
        lax.reset_overflow()
        res["cleared"] = not lax.overflowed()
        lax.reduce_scatter(glob, plan, counts=bad)
        res["flagged_rs"] = lax.overflowed()
        lax.reset_overflow()
        out.append(res)
    return out


def exchange_checks(ctx, layout_args, mine: int, plan_args: dict) -> dict:
    """exchange_counts(plan=...): this rank reports ``mine`` (every rank of a replica the
    same), checked against the capacity plan on the host (validate) or the device."""
    layout = dpx.DpLayout(*layout_args)
    plan = dpx.plan_step(**plan_args, layout=layout)
    n = torch.tensor([mine], dtype=torch.int32)
    res = {"strict": raised(lambda: ctx.comm(layout, validate=True).exchange_counts(
        n, plan=plan))}
    lax = ctx.comm(layout)
    lax.reset_overflow()
    got = lax.exchange_counts(n, plan=plan)
    res["counts"] = got.tolist()
    res["flagged"] = lax.overflowed()
    lax.reset_overflow()
    return res


def destroyed(ctx) -> dict:
    """A destroyed communicator refuses every call (before any collective), its methods on
    its slots, schedules, flags, caches and comm stream included: each method's error."""
    layout = dpx.DpLayout(ctx.world_size, ctx.world_size)
    comm = dpx_torch.DpComm(layout)
    plan = dpx.plan_step([1] * ctx.world_size, layout)
    ok = comm.gather(torch.ones(1, 2), plan, partial=True).shape[0] == plan.global_rows
    out = torch.zeros(plan.global_rows, 2)
    comm.destroy()
    calls = dict(
        gather=lambda: comm.gather(torch.ones(1, 2), plan, partial=True),
        sync=lambda: comm.sync_counts(1),
        exchange=lambda: comm.exchange_counts(torch.ones(1, dtype=torch.int32)),
        local_slot=lambda: comm.local_slot(out, plan),
        local_slot_for=lambda: comm.local_slot_for(out, plan, counts=None),
        schedule=lambda: comm.schedule(plan, "gather"),
        overflowed=comm.overflowed, overflow_reason=comm.overflow_reason,
        reset_overflow=comm.reset_overflow, overflow_flag=lambda: comm.overflow_flag("cpu"),
        cache_sizes=comm.cache_sizes, host_bytes=comm.host_bytes,
        clear_caches=comm.clear_caches, comm_stream=lambda: comm.comm_stream,
        mask=lambda: comm.mask_pad_rows(out, plan), mask_of=lambda: comm.pad_row_mask(plan),
        check_peers=comm.check_peers)
    return dict(ok=ok, **{k: raised(fn) for k, fn in calls.items()})


def sync_bad(ctx) -> str:
    """One rank passes a float count: every rank names that rank and its value."""
    comm = ctx.comm(dpx.DpLayout(ctx.world_size, ctx.world_size))
    return raised(lambda: comm.sync_counts(2.5 if ctx.rank == 1 else 3))


def in_place(ctx, layout_args, cases, *, rest=(4,), transport=None) -> int:
    """Per case: the rank's rows written into local_slot(out, plan) (pad rows of the slot
    hold garbage) and gathered in place equal, bitwise, the gather from a separate input
    (on the case's ``wire``, default native); the same through a prepared op and
    gather_async; local_slot refuses plans whose rows
    lie where device counts decide. ``transport``: the communicator's (default
    per_root)."""
    layout = dpx.DpLayout(*layout_args)
    comm = ctx.comm(layout) if transport is None else ctx.comm(layout, transport=transport)
    r = ctx.rank
    done = 0
    for case in cases:
        dtype = DTYPES[case.get("dtype", "float32")]
        partial = case["partial"]
        plan, counts_t, eff = _plan_of(layout, case)
        d = layout.coords(r).attn_dp_rank
        rows = plan.slot_rows[d] if plan.is_static else held(plan, r, eff)[1]
        locs = local_inputs(case.get("seed", 0), plan, rest, partial=partial, eff=eff,
                            rows=plan.max_slot_rows if plan.is_static else None)
        x = _t(np.ascontiguousarray(locs[r][:rows]), dtype)
        wire = dict(wire=case.get("wire", "native"), wire_scale=case.get("wire_scale"))
        want = comm.gather(x, plan, partial=partial, counts=counts_t, **wire)
        if case.get("refused"):
            o = torch.empty_like(want)
            msg = raised(lambda: comm.local_slot_for(o, plan, counts=counts_t))
            assert "lie at a place the device counts decide" in msg, msg
            done += 1
            continue
        for run in ("sync", "prepared", "async"):
            out = torch.full((plan.global_rows, *rest), float("nan"),
                             device=torch_jobs.DEVICE).to(dtype)
            if not dtype.is_floating_point:
                out.fill_(-77)
            slot = comm.local_slot_for(out, plan, counts=counts_t)
            n = held(plan, r, eff)[1]
            slot[:n] = x[:n]
            if run == "sync":
                got = comm.gather(slot, plan, partial=partial, counts=counts_t, out=out,
                                  **wire)
            elif run == "prepared":
                got = comm.prepare_gather(slot, plan, partial=partial, counts=counts_t,
                                          out=out, **wire)(slot, counts=counts_t, out=out)
            else:
                got, work = comm.gather_async(slot, plan, partial=partial, counts=counts_t,
                                              out=out, key="in-place", **wire)
                work.wait()
            assert got is out
            if not torch.equal(got, want):
                raise AssertionError(f"in-place {run} gather differs for {case}: "
                                     f"{(got.double() - want.double()).abs().max()}")
        done += 1
    return done


def in_place_steps(ctx, layout_args, cases) -> list[list[str]]:
    """The step kinds of each case's in-place gather on this rank (no row moves locally
    where the route allows)."""
    layout = dpx.DpLayout(*layout_args)
    comm = ctx.comm(layout)
    out = []
    for case in cases:
        plan, counts_t, eff = _plan_of(layout, case)
        first, rows = dpx.local_rows(plan, ctx.rank, device_counts=counts_t is not None)
        sched = comm.schedule(plan, "gather", partial=case["partial"],
                              device_counts=counts_t is not None, in_rows=rows, in_place=True)
        out.append([s.kind for s in sched.steps])
    return out


def _rss() -> int:
    """This process's resident memory in bytes (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def soak(ctx, layout_args, steps: int, seed: int) -> dict:
    """Many steps with new host counts every step -- every mode, CP shards, capacity plans
    with device counts, masks, the fp8 wire, several tensors in one call, async calls --
    then: every cache within its bound, the bytes the caches hold at the end about what
    they held half way, and the process's resident memory grown by little in the second
    half."""
    layout = dpx.DpLayout(*layout_args)
    limits = dpx_torch.CacheLimits(calls=32, templates=16, variants=4, programs=32, batches=8,
                                   tables=32)
    comm = dpx_torch.DpComm(layout, limits=limits)
    rng = random.Random(seed)  # every rank draws the same steps
    H = 128
    r, d = ctx.rank, layout.coords(ctx.rank).attn_dp_rank

    def one(i: int) -> None:
        dp, cp = layout.dp_size, layout.cp_size
        counts = [rng.randint(0, 9) for _ in range(dp)]
        mode = rng.choice(["max_len", "sum_len", "gatherv"])
        shards = None
        if cp > 1 and rng.random() < 0.5:
            shards = []
            for c in counts:
                cut = rng.randint(0, c)
                shards.append([cut, c - cut] + [0] * (cp - 2))
        if rng.random() < 0.3:
            cap = 12 * dp
            plan = dpx.plan_step([0] * dp, layout, mode=mode, capacity=cap,
                                 cp_shards=[[0] * cp] * dp if shards else None)
            dev = torch.tensor(shards if shards else counts, dtype=torch.int32)
            x = torch.randn(plan.slot_rows[d], H)
        else:
            plan = dpx.plan_step(counts, layout, mode=mode, cp_shards=shards)
            dev = None
            x = torch.randn(held(plan, r)[1] + 1, H)
        g = comm.gather(x, plan, partial=True, counts=dev)
        comm.reduce_scatter(g, plan, counts=dev)
        ids = torch.randint(0, 50, (x.shape[0], 2), dtype=torch.int64)
        many = comm.gather((x, ids), plan, partial=(True, False), counts=dev)
        comm.mask_pad_rows(many[1], plan, counts=dev)
        if mode != "sum_len":
            comm.gather(x, plan, partial=False, counts=dev, wire="fp8")
        a, work = comm.gather_async(x, plan, partial=True, counts=dev, key=i % 2)
        work.wait()

    for i in range(steps // 2):
        one(i)
    mid_bytes, mid_rss = comm.host_bytes(), _rss()
    for i in range(steps // 2, steps):
        one(i)
    res = dict(sizes=comm.cache_sizes(), limits=limits.__dict__,
               host_bytes=comm.host_bytes(), mid_bytes=mid_bytes,
               rss_growth=_rss() - mid_rss, builds=comm.runner.schedules.builds)
    comm.destroy()
    return res


def _comm_and_groups_made(layout) -> tuple:
    """A ``validate=True`` DpComm, and the backend of every group its set-up created."""
    import torch.distributed as dist

    made: list = []
    real = dist.new_group

    def counting(*a, **k):
        made.append(k.get("backend"))
        return real(*a, **k)

    dist.new_group = counting
    try:
        return dpx_torch.DpComm(layout, validate=True), made
    finally:
        dist.new_group = real


def backend_checks(ctx, layout_args, device: str) -> dict:
    """On this world's backend (the spec a launcher used): what the groups carry, which
    group serves host exchanges, the groups DpComm created, and a gather / reduce_scatter /
    validate round on ``device`` tensors against the reference."""
    import torch.distributed as dist

    layout = dpx.DpLayout(*layout_args)
    comm, made = _comm_and_groups_made(layout)
    plan = dpx.plan_step([3 + i for i in range(layout.dp_size)], layout, mode="gatherv")
    locs = local_inputs(1, plan, (4,), partial=True)
    x = _t(locs[ctx.rank], torch.float32).to(device)
    got = comm.gather(x, plan, partial=True)
    want = _t(ref_gather(locs, plan, partial=True), torch.float32)
    res = dict(devices=sorted(comm.groups.devices), cpu_is_world=comm.groups.cpu is
               comm.groups.world, created=made, spec=str(dist.get_backend()),
               ok=bool(torch.equal(got.cpu(), want)), device=str(got.device),
               counts=comm.sync_counts(3)[0])
    comm.destroy()
    return res


def mixed_backend(ctx) -> dict:
    """A world initialised as a launcher would ("cuda:nccl,cpu:gloo", or plain "nccl"):
    what the groups carry, which group serves host exchanges, the groups DpComm made, and
    a three-tensor gather of CUDA tensors with validate (the NCCL collectives it issues)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.set_device(0)
    lay = dpx.DpLayout(1, 1)
    comm, made = _comm_and_groups_made(lay)
    plan = dpx.plan_step([32], lay, mode="max_len")
    xs = (torch.randn(32, 512, device="cuda", dtype=torch.bfloat16),
          torch.randint(0, 9, (32, 8), device="cuda", dtype=torch.int32),
          torch.randn(32, 8, device="cuda"))
    comm.gather(xs, plan, partial=(True, False, False))
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        got = comm.gather(xs, plan, partial=(True, False, False))
        torch.cuda.synchronize()
    launches = [e.name for e in prof.events() if e.name.startswith("nccl:")]
    with profile(activities=[ProfilerActivity.CPU]) as prof:   # the probe sees NCCL
        torch.distributed.all_reduce(torch.ones(4, device="cuda"), group=comm.groups.world)
        torch.cuda.synchronize()
    control = [e.name for e in prof.events() if e.name.startswith("nccl:")]
    res = dict(devices=sorted(comm.groups.devices), cpu_is_world=comm.groups.cpu is
               comm.groups.world, created=made, launches=launches, control=control,
               ok=all(torch.equal(g, x) for g, x in zip(got, xs)),
               sync=comm.sync_counts(7)[0])
    comm.destroy()
    return res


def graph_checks(ctx) -> dict:
    """NCCL world 1 under CUDA graphs: an in-place capacity gather replays with new counts
    bitwise equal to the out-of-place one; counts over the capacity set the overflow flag
    inside a replay (rows beyond the slot are lost, never written out of bounds), and the
    flag stays set until reset."""
    torch.cuda.set_device(0)
    comm = ctx.comm(dpx.DpLayout(1, 1))
    H, cap = 256, 48
    plan = dpx.plan_step([0], comm.layout, mode="max_len", capacity=cap)
    counts = torch.tensor([cap], dtype=torch.int32, device="cuda")
    src = torch.randn(cap, H, device="cuda")
    out_in = torch.empty(plan.global_rows, H, device="cuda")
    out_ref = torch.empty_like(out_in)
    slot = comm.local_slot(out_in, plan)

    def step():
        slot.copy_(src)  # the layer writing its rows where the gather reads them
        comm.gather(slot, plan, partial=True, counts=counts, out=out_in)
        comm.gather(src, plan, partial=True, counts=counts, out=out_ref)

    g, _ = capture(step)
    equal = []
    for n in (3, 0, cap, 17):
        counts.fill_(n)
        src.copy_(torch.randn_like(src))
        g.replay()
        torch.cuda.synchronize()
        want = torch.zeros_like(out_ref)
        want[:n] = src[:n]
        equal.append(bool(torch.equal(out_in, want) and torch.equal(out_ref, want)))
    clear = not comm.overflowed()
    counts.fill_(cap + 5)
    g.replay()
    torch.cuda.synchronize()
    flagged, reason = comm.overflowed(), comm.overflow_reason()
    counts.fill_(4)
    g.replay()
    still = comm.overflowed()
    comm.reset_overflow()
    g.replay()
    torch.cuda.synchronize()
    return dict(equal=equal, clear=clear, flagged=flagged, reason=reason, sticky=still,
                reset=not comm.overflowed())


def grouped_launches(ctx, layout_args, mode: str = "max_len") -> dict:
    """A four-tensor gather (bf16, int32, fp32, bf16; partial but the int32) of a ``mode``
    plan on a backend taken to coalesce (the runner's grouped blocks recorded instead of NCCL's):
    each collective's binder and the block it ran in (None: outside one), and whether
    the results equal the tensors' calls alone."""
    import contextlib

    from dpx_torch.comm import DpComm

    layout = dpx.DpLayout(*layout_args)
    comm = DpComm(layout)
    runner = comm.runner
    log: list = []
    state = {"blocks": 0, "inside": None}

    @contextlib.contextmanager
    def coalescing(pg, device):
        state["blocks"] += 1
        state["inside"] = state["blocks"]
        yield
        state["inside"] = None

    bind = runner.collective

    def collective(binder, group):
        fn = bind(binder, group)

        def logged(*a):
            log.append((binder.__name__, state["inside"]))
            return fn(*a)
        return logged

    runner.groups._coalesce["cpu"] = True   # as NCCL answers for CUDA tensors
    runner.coalescing, runner.collective = coalescing, collective
    plan = dpx.plan_step([3 + d for d in range(layout.dp_size)], layout, mode=mode)
    rows = plan.slot_rows[layout.coords(ctx.rank).attn_dp_rank]
    g = torch.Generator().manual_seed(ctx.rank)
    xs = (torch.randn(rows, 8, generator=g).bfloat16(),
          torch.randint(0, 9, (rows, 4), generator=g, dtype=torch.int32),
          torch.randn(rows, 8, generator=g), torch.randn(rows, 16, generator=g).bfloat16())
    flags = (True, False, True, True)
    got = comm.gather(xs, plan, partial=flags)
    batched = list(log)
    equal = all(torch.equal(a, comm.gather(x, plan, partial=p))
                for a, x, p in zip(got, xs, flags))
    comm.destroy()
    return dict(equal=equal, log=batched)
