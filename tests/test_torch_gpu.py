"""dpx_torch on one GPU: NCCL at world size 1, CUDA-graph replay with device counts,
torch.compile. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import dpx
from graphs import capture, warm_up
from reference import local_inputs, ref_gather, ref_reduce_scatter, global_inputs

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture()
def nccl1(nccl_comm1):
    return nccl_comm1


def _t(x, dtype):
    return torch.from_numpy(x).to(dtype).cuda()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.int64])
@pytest.mark.parametrize("mode", ["max_len", "sum_len", "gatherv"])
@pytest.mark.parametrize("count", [0, 1, 37])
def test_nccl_world1_matches_reference(nccl1, dtype, mode, count):
    plan = dpx.plan_step([count], nccl1.layout, mode=mode)
    for partial in (True, False):
        locs = local_inputs(count, plan, (70,), partial=partial)
        got = nccl1.gather(_t(locs[0], dtype), plan, partial=partial)
        want = ref_gather(locs, plan, partial=partial)
        assert torch.equal(got.cpu(), torch.from_numpy(want).to(dtype))
        globs = global_inputs(count, plan, (70,))
        rs = nccl1.reduce_scatter(_t(globs[0], dtype), plan)
        assert torch.equal(rs.cpu(), torch.from_numpy(ref_reduce_scatter(globs, plan, 0)).to(dtype))


@pytest.mark.parametrize("mode,cap", [("max_len", 48), ("sum_len", 48)])
def test_cuda_graph_replay_with_new_counts(nccl1, mode, cap):
    H = 96
    plan = dpx.plan_step([1], nccl1.layout, capacity=cap, mode=mode)
    counts = torch.tensor([cap], dtype=torch.int32, device="cuda")
    local = torch.randn(plan.slot_rows[0], H, device="cuda")
    gbuf = torch.empty(plan.global_rows, H, device="cuda")
    glob = torch.randn(plan.global_rows, H, device="cuda")
    rbuf = torch.empty(plan.slot_rows[0], H, device="cuda")
    sbuf = torch.empty(plan.slot_rows[0], H, device="cuda")
    cbuf = torch.empty(plan.slot_rows[0], H, device="cuda")

    def step():
        nccl1.gather(local, plan, partial=True, counts=counts, out=gbuf)
        nccl1.scatter(gbuf, plan, counts=counts, out=sbuf)
        nccl1.reduce_scatter(glob, plan, counts=counts, out=rbuf)
        nccl1.scatter_columns(glob, plan, counts=counts, out=cbuf)

    warm_up(step)
    allocations = nccl1.runner.pool.allocations
    graph, _ = capture(step, warm=False)
    assert nccl1.runner.pool.allocations == allocations, "the pool grew inside capture"
    for n in (3, 0, cap, 17, 1):
        counts.fill_(n)
        local.copy_(torch.randn_like(local))
        glob.copy_(torch.randn_like(glob))
        graph.replay()
        torch.cuda.synchronize()
        want = torch.zeros_like(gbuf)
        want[:n] = local[:n]
        assert torch.equal(gbuf, want), f"gather replay n={n}"
        assert torch.equal(sbuf, want[:sbuf.shape[0]]), f"scatter replay n={n}"
        want_rs = torch.zeros_like(rbuf)
        want_rs[:n] = glob[:n]
        assert torch.equal(rbuf, want_rs), f"reduce_scatter replay n={n}"
        assert torch.equal(cbuf, want_rs), f"scatter_columns replay n={n}"


def test_compile_fullgraph_on_gpu(nccl1):
    torch._dynamo.reset()
    plan = dpx.plan_step([9], nccl1.layout, mode="max_len")
    w = torch.randn(64, 64, device="cuda")

    def step(x):
        return nccl1.reduce_scatter(nccl1.gather(x, plan, partial=True) @ w, plan)

    x = torch.randn(12, 64, device="cuda")
    torch.testing.assert_close(torch.compile(step, fullgraph=True)(x), step(x))


def test_async_overlap_keeps_events_buffers_and_memory_flat(nccl1):
    import random

    rng = random.Random(0)
    H = 4096  # one step's buffers are >= 8 MiB: any regrowth would show
    lay = nccl1.layout
    compute_done = torch.cuda.Event()
    plans = [dpx.plan_step([rng.randint(0, 512)], lay, mode=m)
             for m in ("max_len", "sum_len", "gatherv") for _ in range(100)]
    rng.shuffle(plans)
    # warm-up: the largest step of every mode under both micro-batch keys sizes the pool
    warm = [dpx.plan_step([512], lay, mode=m) for m in ("max_len", "sum_len", "gatherv")
            for _ in range(2)]
    plans = warm + plans
    reserved, buffers, allocations = [], [], []
    xbuf = torch.randn(513, H, device="cuda")
    a, b = torch.randn(64, 64, device="cuda"), torch.randn(64, 64, device="cuda")
    for i, plan in enumerate(plans):
        n = plan.num_tokens[0]
        x = xbuf[:n + 1]
        g, work = nccl1.gather_async(x, plan, partial=True, key=i % 2)
        y = a @ b  # compute of the other micro-batch, overlapping the gather
        work.wait()
        assert torch.equal(g[:n], x[:n]) and not g[n:].any(), f"async gather step {i}"
        rs, work = nccl1.reduce_scatter_async(g, plan, key=i % 2)
        work.wait()
        assert torch.equal(rs[:n], x[:n]) and not rs[n:].any(), f"async rs step {i}"
        compute_done.record()
        del y
        if i >= len(warm):
            reserved.append(torch.cuda.memory_reserved())
            buffers.append(len(nccl1.runner.pool))
            allocations.append(nccl1.runner.pool.allocations)
    assert len(nccl1.runner.overlap.events) == 4, nccl1.runner.overlap.events.keys()
    assert len(set(buffers)) == 1, "pool gained buffers after warm-up"
    assert len(set(allocations)) == 1, "pool reallocated after warm-up"
    # the caching allocator may add one 2 MiB small-allocation segment (for the tiny result
    # tensors of the checks); the pool's own buffers (8+ MiB each) must never regrow
    assert max(reserved) - min(reserved) <= 2 * 2**20, \
        f"reserved memory moved: {min(reserved)}..{max(reserved)}"


@pytest.mark.parametrize("mode", ["max_len", "gatherv"])
def test_two_batch_overlap_replays_under_a_cuda_graph(nccl1, mode):
    """Two micro-batches, each a gather on the comm stream (native, then the fp8 wire)
    overlapping a matmul on the current one, then its reduce_scatter on the comm stream,
    with device counts: captured in one CUDA graph (the comm stream forked from and joined
    to the capture by the calls' own events) and replayed with new counts, every result
    equal to the same calls made eagerly and synchronously."""
    H, cap = 256, 48
    plan = dpx.plan_step([1], nccl1.layout, capacity=cap, mode=mode)
    counts = [torch.tensor([cap], dtype=torch.int32, device="cuda") for _ in range(2)]
    xs = [torch.randn(plan.slot_rows[0], H, device="cuda") for _ in range(2)]
    a = torch.randn(256, 256, device="cuda")
    wires = ("native", "fp8")
    res: dict = {}

    def step():
        for k, wire in enumerate(wires):
            g, work = nccl1.gather_async(xs[k], plan, partial=True, counts=counts[k], key=k,
                                         wire=wire)
            y = a @ a
            work.wait()
            r, work = nccl1.reduce_scatter_async(g, plan, counts=counts[k], key=k)
            work.wait()
            res[k] = (g, r, y)

    graph, _ = capture(step)
    for ns in ((5, 0), (cap, 17), (0, cap), (31, 31)):
        for k in range(2):
            counts[k].fill_(ns[k])
            xs[k].copy_(torch.randn_like(xs[k]))
        graph.replay()
        torch.cuda.synchronize()
        for k, wire in enumerate(wires):
            want = nccl1.gather(xs[k], plan, partial=True, counts=counts[k], wire=wire)
            assert torch.equal(res[k][0], want), (ns, wire)
            assert torch.equal(res[k][1], nccl1.reduce_scatter(want, plan, counts=counts[k])), \
                (ns, wire)
            if mode == "max_len":   # this replica's rows, then zeros
                assert not res[k][0][ns[k]:].any(), (ns, wire)
                if wire == "native":
                    assert torch.equal(res[k][0][:ns[k]], xs[k][:ns[k]]), ns
            assert torch.equal(res[k][2], a @ a)


def test_async_scratch_belongs_to_the_comm_stream(nccl1):
    """An fp8 gather_async queued behind 0.2 s of work on the comm stream, its caches and
    scratch pool dropped while it waits, then compute-stream tensors allocated and filled:
    the scratch was the comm stream's, so neither the result nor those tensors are
    overwritten."""
    plan = dpx.plan_step([1024], nccl1.layout, mode="max_len")
    x = torch.randn(1024, 2048, device="cuda")
    ref = nccl1.gather(x, plan, partial=True, wire="fp8")
    torch.cuda.synchronize()
    for i in range(3):
        nccl1.clear_caches()
        with torch.cuda.stream(nccl1.comm_stream):
            torch.cuda._sleep(200_000_000)
        out, work = nccl1.gather_async(x, plan, partial=True, wire="fp8", key=i)
        nccl1.clear_caches()
        junk = [torch.full((1024 * 2048 // 2,), 7, dtype=torch.int32, device="cuda")
                for _ in range(3)]
        work.wait()
        torch.cuda.synchronize()
        assert torch.equal(out, ref), i
        assert all(bool((j == 7).all()) for j in junk), i


# ---------------------------------------------------------------- serving features
#: (wire, wire_scale) of each quantized wire
WIRES = [("fp8", None), ("nvfp4", 0.75), ("mxfp4", None)]


def _wire_reference(want, real, wire, g):
    """(payload bytes, scale bytes, float32 dequantized) of the reference quantizer."""
    import numpy as np

    from reference import dequantize_fp4, dequantize_fp8, quantize_fp4, quantize_fp8

    if wire == "fp8":
        p, s = quantize_fp8(want, real)
        return p, s.view(np.uint8), dequantize_fp8(p, s)
    p, s = quantize_fp4(want, real, wire, g)
    return p, s, dequantize_fp4(p, s, wire, g)


def _bytes(t: torch.Tensor):
    return t.contiguous().view(torch.uint8).cpu().numpy()


@pytest.mark.parametrize("wire,g", WIRES, ids=[w for w, _ in WIRES])
@pytest.mark.parametrize("mode", ["max_len", "gatherv"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_nccl_world1_wire_gather_matches_reference(nccl1, mode, dtype, wire, g):
    import numpy as np

    from reference import real_rows

    plan = dpx.plan_step([37], nccl1.layout, mode=mode)
    locs = local_inputs(5, plan, (512,), partial=False, floats=True)
    x = _t(locs[0], dtype)
    payload, scales = nccl1.gather(x, plan, partial=True, wire=wire, wire_scale=g,
                                   dequantize=False)
    want = torch.from_numpy(ref_gather(locs, plan, partial=False)).to(dtype).float().numpy()
    rp, rs, rdeq = _wire_reference(want, real_rows(plan), wire, g)
    assert np.array_equal(_bytes(payload), rp)
    assert np.array_equal(_bytes(scales), rs)
    deq = nccl1.gather(x, plan, partial=True, wire=wire, wire_scale=g)
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    ref = torch.from_numpy(rdeq).to(dtype)
    assert torch.equal(deq.cpu().view(bits), ref.view(bits))
    # on the comm stream, overlapping compute on the current one
    a = torch.randn(256, 256, device="cuda")
    on_comm, work = nccl1.gather_async(x, plan, partial=True, wire=wire, wire_scale=g,
                                       key="wire")
    y = a @ a
    work.wait()
    assert torch.equal(on_comm.cpu().view(bits), ref.view(bits)), "gather_async"
    del y


@pytest.mark.parametrize("wire,g", WIRES, ids=[w for w, _ in WIRES])
@pytest.mark.parametrize("mode", ["max_len", "gatherv"])
def test_wire_gather_replays_under_cuda_graphs_with_new_counts(nccl1, mode, wire, g):
    """A capacity plan's quantized gather with device counts, wire rows and dequantized,
    captured once and replayed with new counts: bit for bit the reference every time."""
    import numpy as np

    from reference import real_rows

    H, cap = 512, 48
    plan = dpx.plan_step([1], nccl1.layout, capacity=cap, mode=mode)
    counts = torch.tensor([cap], dtype=torch.int32, device="cuda")
    x = (torch.randn(plan.slot_rows[0], H, device="cuda") * 5).to(torch.bfloat16)
    res = {}

    def step():
        res["wire"] = nccl1.gather(x, plan, partial=True, counts=counts, wire=wire,
                                   wire_scale=g, dequantize=False)
        res["deq"] = nccl1.gather(x, plan, partial=True, counts=counts, wire=wire,
                                  wire_scale=g)

    graph, _ = capture(step)
    for n in (0, 5, cap, 17):
        counts.fill_(n)
        graph.replay()
        torch.cuda.synchronize()
        want = np.zeros((plan.global_rows, H), np.float32)
        want[:n] = x[:n].float().cpu().numpy()
        real = real_rows(plan, (n,))
        rp, rs, rdeq = _wire_reference(want, real, wire, g)
        assert np.array_equal(_bytes(res["wire"][0]), rp), n
        assert np.array_equal(_bytes(res["wire"][1]), rs), n
        ref = torch.from_numpy(rdeq).to(torch.bfloat16)
        assert torch.equal(res["deq"].cpu().view(torch.int16), ref.view(torch.int16)), n


@pytest.mark.parametrize("wire,g", WIRES, ids=[w for w, _ in WIRES])
@pytest.mark.parametrize("mode", ["max_len", "sum_len", "gatherv"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_nccl_world1_combine_matches_reference(nccl1, mode, dtype, wire, g):
    """The quantized combine through the compiled kernels (the quantize, the summing pass)
    on NCCL: bit for bit the reference, edge values included."""
    import numpy as np

    from combine_jobs import inputs
    from reference import bits_of, ref_combine_rank

    plan = dpx.plan_step([37], nccl1.layout, mode=mode)
    globs = inputs(plan, 3, getattr(torch, dtype))
    got = nccl1.reduce_scatter(_t(globs[0], getattr(torch, dtype)), plan, wire=wire,
                               wire_scale=g)
    want = bits_of(ref_combine_rank(globs, plan, 0, wire, dtype, g))
    assert np.array_equal(_bytes(got).view(want.dtype).reshape(want.shape), want)


@pytest.mark.parametrize("wire,g", WIRES, ids=[w for w, _ in WIRES])
@pytest.mark.parametrize("mode", ["max_len", "sum_len"])
def test_combine_replays_under_cuda_graphs_with_new_counts(nccl1, mode, wire, g):
    """A capacity plan's quantized combine with device counts, captured once and replayed
    with new counts: bit for bit the reference every time."""
    import numpy as np

    from reference import bits_of, ref_combine_rank

    H, cap = 512, 48
    plan = dpx.plan_step([1], nccl1.layout, capacity=cap, mode=mode)
    counts = torch.tensor([cap], dtype=torch.int32, device="cuda")
    x = (torch.randn(plan.global_rows, H, device="cuda") * 5).to(torch.bfloat16)
    res = {}

    def step():
        res["out"] = nccl1.reduce_scatter(x, plan, counts=counts, wire=wire, wire_scale=g)

    graph, _ = capture(step)
    glob = [x.float().cpu().numpy()]
    for n in (0, 5, cap, 17):
        counts.fill_(n)
        graph.replay()
        torch.cuda.synchronize()
        want = bits_of(ref_combine_rank(glob, plan, 0, wire, "bfloat16", g, (n,)))
        assert np.array_equal(_bytes(res["out"]).view(np.uint16).reshape(want.shape), want), n


@pytest.mark.parametrize("mode", ["max_len", "gatherv"])
def test_counts_ride_a_captured_gather(nccl1, mode):
    """gather_with_counts captured once in a CUDA graph and replayed with new counts: the
    rows and the counts of the eager gather(counts=exchange_counts(n_local)) every time,
    and the overflow flag for a count over the capacity."""
    cap, H = 48, 256
    plan = dpx.plan_step([1], nccl1.layout, capacity=cap, mode=mode)
    n_local = torch.tensor([cap], dtype=torch.int32, device="cuda")
    x = torch.randn(plan.slot_rows[0], H, device="cuda").to(torch.bfloat16)
    res = {}

    def step():
        res["out"], res["counts"] = nccl1.gather_with_counts(x, plan, partial=True,
                                                             n_local=n_local)

    graph, _ = capture(step)
    for n in (0, 5, cap, 17, cap + 2):
        nccl1.reset_overflow()
        n_local.fill_(n)
        graph.replay()
        torch.cuda.synchronize()
        assert nccl1.overflowed() == (n > cap), n   # the replay's own check
        nccl1.reset_overflow()
        want = nccl1.gather(x, plan, partial=True, counts=nccl1.exchange_counts(n_local))
        assert torch.equal(res["out"], want) and res["counts"].tolist() == [n], n
    nccl1.reset_overflow()


def test_captured_step_exchanges_counts_masks_and_gathers(nccl1):
    """exchange_counts -> capacity-plan gather of (hidden, ids) -> mask_pad_rows, captured
    once in a CUDA graph and replayed with new counts written into n_local."""
    H, cap = 256, 64
    plan = dpx.plan_step([1], nccl1.layout, capacity=cap, mode="max_len")
    n_local = torch.tensor([cap], dtype=torch.int32, device="cuda")
    hidden = torch.randn(cap, H, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, 64, (cap, 8), device="cuda", dtype=torch.int32)
    res = {}

    def step():
        counts = nccl1.exchange_counts(n_local)
        h, i = nccl1.gather((hidden, ids), plan, partial=(True, False), counts=counts,
                            wire=("fp8", "native"))
        res["h"], res["ids"] = h, nccl1.mask_pad_rows(i, plan, counts=counts, fill=-1)

    g, _ = capture(step)
    for n in (0, 5, 64, 17):
        n_local.fill_(n)
        g.replay()
        torch.cuda.synchronize()
        want_ids = torch.full((plan.global_rows, 8), -1, dtype=torch.int32)
        want_ids[:n] = ids[:n].cpu()
        assert torch.equal(res["ids"].cpu(), want_ids)
        assert not res["h"][n:].any()
        assert (res["h"][:n].float() - hidden[:n].float()).abs().le(
            hidden[:n].float().abs() / 12 + 1e-3).all()


def test_a_world_of_one_rank_issues_no_nccl_collective(nccl1):
    """A one-rank world's collectives are copies (``dpx.steps.Step.alone``): NCCL issues
    nothing for a gather of one tensor or of three (whose grouping into one launch needs
    a world of several GPUs to be seen), and the rows are the input's."""
    from torch.profiler import ProfilerActivity, profile

    plan = dpx.plan_step([32], nccl1.layout, mode="max_len")
    xs = (torch.randn(32, 512, device="cuda", dtype=torch.bfloat16),
          torch.randint(0, 9, (32, 8), device="cuda", dtype=torch.int32),
          torch.randn(32, 8, device="cuda"))

    def nccl_collectives(fn) -> list[str]:
        """The collectives ProcessGroupNCCL issued (its ``nccl:*`` profiler ranges)."""
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
            torch.cuda.synchronize()
        return [e.name for e in prof.events() if e.name.startswith("nccl:")]

    control = nccl_collectives(lambda: dist.all_reduce(xs[2], group=nccl1.groups.world))
    assert len(control) == 1, control
    batched = nccl_collectives(lambda: nccl1.gather(xs, plan, partial=(True, False, False)))
    separate = nccl_collectives(lambda: [nccl1.gather(x, plan, partial=False) for x in xs])
    rs = nccl_collectives(lambda: nccl1.reduce_scatter(xs[0], plan))
    assert batched == [] and separate == [] and rs == [], (batched, separate, rs)
    got = nccl1.gather(xs, plan, partial=(True, False, False))
    for g, x in zip(got, xs):
        assert g.dtype == x.dtype and torch.equal(g, x)


@pytest.mark.parametrize("mode", ["max_len", "sum_len", "gatherv"])
def test_mixed_dtype_batches_on_nccl(nccl1, mode):
    """Several tensors of different dtypes in one call on every route, host and device
    counts, at world 1 (copies: no NCCL collective; the grouping by dtype is checked in
    tests/test_torch_hotpath.py): each result equals the tensor's own gather."""
    xs = (torch.randn(64, 64, device="cuda", dtype=torch.bfloat16),
          torch.randint(0, 9, (64, 8), device="cuda"),
          torch.randn(64, 8, device="cuda"))
    for n, capacity in ((40, None), (0, None), (17, 64), (0, 64)):
        plan = dpx.plan_step([0 if capacity else n], nccl1.layout, mode=mode,
                             capacity=capacity)
        counts = torch.tensor([n], dtype=torch.int32, device="cuda") if capacity else None
        local = tuple(x[:max(n, 1)] if capacity is None else x for x in xs)
        for partial in ((True, False, False), (True, True, True)):
            got = nccl1.gather(local, plan, partial=partial, counts=counts)
            for g, x, p in zip(got, local, partial):
                want = nccl1.gather(x, plan, partial=p, counts=counts)
                assert g.dtype == x.dtype and torch.equal(g, want), (mode, n, capacity, p)


@pytest.mark.skipif(not __import__("conftest").jax_gpu_available(), reason="needs JAX on GPU")
@pytest.mark.parametrize("wire,g", WIRES, ids=[w for w, _ in WIRES])
@pytest.mark.parametrize("impl", ["triton", "xla"])
def test_jax_wire_rows_equal_torch_bitwise_on_gpu(nccl1, impl, wire, g):
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import PartitionSpec as P

    import dpx_jax

    if impl == "triton":
        from dpx_jax.triton_shim import jax_triton

        if jax_triton() is None:
            pytest.skip("needs jax-triton")
    plan = dpx.plan_step([37], nccl1.layout, mode="max_len")
    x = torch.randn(plan.max_slot_rows, 384, device="cuda", dtype=torch.bfloat16) * 7
    tp, ts = nccl1.gather(x, plan, partial=True, wire=wire, wire_scale=g, dequantize=False)
    tdeq = nccl1.gather(x, plan, partial=True, wire=wire, wire_scale=g)
    mesh = dpx_jax.make_mesh(plan.layout, jax.devices("gpu"))
    f = jax.jit(jax.shard_map(
        lambda v: (*dpx_jax.gather(v, plan, partial=True, wire=wire, wire_scale=g,
                                   dequantize=False, impl=impl),
                   dpx_jax.gather(v, plan, partial=True, wire=wire, wire_scale=g, impl=impl)),
        mesh=mesh, in_specs=P(dpx_jax.AXES), out_specs=P(dpx_jax.AXES)))
    jp, js, jdeq = f(jnp.asarray(x.float().cpu().numpy(), jnp.bfloat16))
    assert np.array_equal(np.asarray(jp).view(np.uint8), _bytes(tp))
    assert np.array_equal(np.asarray(js).view(np.uint8), _bytes(ts))
    assert np.array_equal(np.asarray(jdeq).view(np.int16), tdeq.view(torch.int16).cpu().numpy())


@pytest.mark.skipif(not __import__("conftest").jax_gpu_available(), reason="needs JAX on GPU")
@pytest.mark.parametrize("wire,g", WIRES, ids=[w for w, _ in WIRES])
@pytest.mark.parametrize("impl", ["triton", "xla"])
def test_jax_combine_equals_torch_bitwise_on_gpu(nccl1, impl, wire, g):
    """The quantized combine on the GPU: jax-triton's kernels and XLA's path give torch's
    bits."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import PartitionSpec as P

    import dpx_jax
    from combine_jobs import inputs

    if impl == "triton":
        from dpx_jax.triton_shim import jax_triton

        if jax_triton() is None:
            pytest.skip("needs jax-triton")
    plan = dpx.plan_step([37], nccl1.layout, mode="gatherv")
    x = inputs(plan, 9, torch.bfloat16)[0]
    tout = nccl1.reduce_scatter(_t(x, torch.bfloat16), plan, wire=wire, wire_scale=g)
    mesh = dpx_jax.make_mesh(plan.layout, jax.devices("gpu"))
    f = jax.jit(jax.shard_map(
        lambda v: dpx_jax.reduce_scatter(v, plan, wire=wire, wire_scale=g, impl=impl),
        mesh=mesh, in_specs=P(dpx_jax.AXES), out_specs=P(dpx_jax.AXES)))
    jout = f(jnp.asarray(x, jnp.bfloat16))
    assert np.array_equal(np.asarray(jout)[:tout.shape[0]].view(np.int16),
                          tout.view(torch.int16).cpu().numpy())


@pytest.mark.skipif(not __import__("conftest").jax_gpu_available(), reason="needs JAX on GPU")
def test_fp4_kernels_compile_to_the_same_ptx_under_torch_and_jax(tmp_path, monkeypatch):
    """The fp4 quantize-and-place and dequantize kernels that jax-triton compiles for a
    gather are, PTX for PTX, the ones the torch launch compiles for the same shapes
    (jax-triton makes a scalar argument equal to 1 a constant, so mxfp4 passes 0.0 for the
    global scale it does not read, and these shapes have no size 1)."""
    import glob

    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    import dpx_jax
    from dpx.kernels import launch
    from dpx.modes import Wire
    from dpx.wire import wire_row_bytes
    from dpx_jax.triton_shim import jax_triton

    if jax_triton() is None:
        pytest.skip("needs jax-triton")
    import jax_triton.triton_lib as lib

    monkeypatch.setattr(lib, "_JAX_TRITON_DUMP_DIR", str(tmp_path))
    plan = dpx.plan_step([45], dpx.DpLayout(1, 1), mode="max_len")
    rows, h = plan.max_slot_rows, 1088
    x = torch.randn(rows, h, device="cuda", dtype=torch.bfloat16)
    mesh = dpx_jax.make_mesh(plan.layout, jax.devices("gpu")[:1])
    for wire, g in (("nvfp4", 0.75), ("mxfp4", None)):
        f = jax.jit(jax.shard_map(
            lambda v: dpx_jax.gather(v, plan, partial=True, wire=wire, wire_scale=g,
                                     impl="triton"),
            mesh=mesh, in_specs=P(dpx_jax.AXES), out_specs=P(dpx_jax.AXES)))
        f(jnp.asarray(x.float().cpu().numpy(), jnp.bfloat16)).block_until_ready()
        w = Wire.parse(wire)
        rb, gv = wire_row_bytes(h, w), launch.fp4_scale(g)
        out = torch.empty(rows, rb, dtype=torch.uint8, device="cuda")
        y = torch.empty_like(x)
        cnt = torch.tensor([rows], dtype=torch.int32, device="cuda")
        lq = launch.quantize_launch(w, rows, rows, h, 2, start_ptr=True, count_ptr=True,
                                    compiled=True)
        ld = launch.dequantize_launch(w, rows, h, "bfloat16", compiled=True)
        q = lq.kernel[lq.grid](x, cnt, cnt, 0, 0, rows, rows, gv, out, **lq.consts,
                               num_warps=lq.warps)
        d = ld.kernel[ld.grid](out, rows, gv, y, **ld.consts, num_warps=ld.warps)
        for name, compiled in (("quantize_fp4_kernel", q), ("dequantize_fp4_kernel", d)):
            jax_ptx = {open(p).read() for p in glob.glob(f"{tmp_path}/*/{name}.ptx")}
            mine = compiled.asm["ptx"]
            near = min(jax_ptx, key=lambda p: len(set(p.splitlines()) ^ set(mine.splitlines())))
            diff = list(__import__("difflib").unified_diff(mine.splitlines(), near.splitlines(),
                                                           "torch", "jax", n=0, lineterm=""))
            assert mine in jax_ptx, (wire, name, len(jax_ptx), "\n".join(diff[:30]))


# ---------------------------------------------------------------- several ranks, one GPU
@pytest.mark.multiproc
@pytest.mark.parametrize("layout", [(2, 2), (2, 1), (4, 2), (4, 1, 2), (4, 2, 2)],
                         ids=lambda l: f"w{l[0]}dp{l[1]}" + (f"cp{l[2]}" if len(l) > 2 else ""))
def test_gloo_with_cuda_tensors_on_one_gpu(gloo_worlds, layout):
    """Worlds of 2 and 4 processes sharing the one GPU over gloo with CUDA tensors: the
    compiled kernels run with real multi-rank offsets -- every mode, partial and
    replicated, capacity plans with device counts, attn-tp and CP layouts (shards too),
    fp8, masks, several tensors, the in-place gather, counts over the capacity."""
    import test_torch_hotpath as hp
    import test_torch_serving as ts

    world = gloo_worlds(layout[0])
    dp, cp = layout[1], (layout[2] if len(layout) > 2 else 1)
    idle = [0 if i % 2 else 3 + 2 * i for i in range(dp)]
    cases = [dict(counts=c, mode=m, partial=p, dtype=d, seed=i)
             for i, (c, m, p, d) in enumerate(
                 (c, m, p, d) for c in (idle, [5] * dp) for m in ("max_len", "sum_len",
                                                                  "gatherv")
                 for p in (True, False) for d in ("bfloat16", "int64"))]
    cases += [dict(counts=[0] * dp, mode=m, capacity=8 * dp, partial=p, seed=7,
                   run_counts=[min(2 + i, 8) for i in range(dp)])
              for m in ("max_len", "sum_len", "gatherv") for p in (True, False)]
    if cp > 1:
        cases += [dict(counts=[5] * dp, shards=[[5 - i, i] + [0] * (cp - 2)
                                                for i in range(dp)], mode=m, partial=p)
                  for m in ("max_len", "gatherv") for p in (True, False)]
    assert world.run("torch_jobs:use_device", "cuda") == ["cuda"] * layout[0]
    try:
        assert world.run("torch_jobs:check_cases", layout, cases, timeout=300)[0] > 0
        assert world.run("serving_jobs:check_serving", layout, ts._fixed_cases(dp, cp),
                         timeout=300)[0] > 0
        cases = hp._in_place_cases(dp, cp)
        assert world.run("hotpath_jobs:in_place", layout, cases,
                         timeout=300) == [len(cases)] * layout[0]
        res = world.run("hotpath_jobs:over_capacity", layout, hp._over_cases(dp, cp))
        assert all(r["flagged"] and r["untouched"] for rank in res for r in rank)
        import test_combine as tc

        assert world.run("combine_jobs:check_combine", layout, tc._cases(dp, cp),
                         timeout=300)[0] > 0
    finally:
        world.run("torch_jobs:use_device", "cpu")


@pytest.mark.multiproc
@pytest.mark.parametrize("spec,created", [("cuda:nccl,cpu:gloo", []), ("nccl", ["gloo"])])
def test_mixed_and_nccl_backends(gloo_worlds, spec, created):
    """A world initialised "cuda:nccl,cpu:gloo" serves host exchanges itself (no gloo group
    made); a plain "nccl" world gets one gloo group, made for host exchanges. At world 1 a
    three-tensor gather issues no NCCL collective (its copies stand in)."""
    r = gloo_worlds(1, spec).run("hotpath_jobs:mixed_backend")[0]
    assert r["ok"] and r["sync"] == (7,) and r["created"] == created, r
    assert r["cpu_is_world"] == (spec != "nccl")
    assert "cuda" in r["devices"]
    assert r["launches"] == [] and len(r["control"]) == 1, (r["launches"], r["control"])


@pytest.mark.multiproc
def test_in_place_gather_and_overflow_flag_under_cuda_graphs(gloo_worlds):
    r = gloo_worlds(1, "nccl").run("hotpath_jobs:graph_checks")[0]
    assert r["equal"] == [True] * 4 and r["clear"], r
    assert r["flagged"] and "MAX_LEN" in r["reason"] and r["sticky"] and r["reset"], r


def test_inductor_compiles_the_serving_ops(nccl1):
    """gather with device counts, several tensors, exchange_counts, mask_pad_rows and
    pad_row_mask under torch.compile(fullgraph=True) with inductor: equal to eager."""
    torch._dynamo.reset()
    plan = dpx.plan_step([0], nccl1.layout, mode="max_len", capacity=16)

    def step(h, ids, n):
        counts = nccl1.exchange_counts(n)
        gh, gi = nccl1.gather((h, ids), plan, partial=(True, False), counts=counts)
        return gh, nccl1.mask_pad_rows(gi, plan, counts=counts), nccl1.pad_row_mask(
            plan, counts=counts)

    h = torch.randn(16, 64, device="cuda")
    ids = torch.arange(32, device="cuda", dtype=torch.int32).reshape(16, 2)
    n = torch.tensor([5], dtype=torch.int32, device="cuda")
    eager = step(h, ids.clone(), n)
    compiled = torch.compile(step, fullgraph=True)(h, ids.clone(), n)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)
    assert (eager[1][5:] == -1).all() and eager[2].tolist() == [False] * 5 + [True] * 11


def test_sglang_layer_on_nccl_and_under_cuda_graphs(nccl1):
    """The layer written against dpx_torch.sglang's names (tests/sglang_layer.py): eager
    steps with host counts in both padding modes, then one captured bucket step replayed
    with new device counts, each against the dense reference; the async gather's
    persistent event."""
    import dpx_torch.sglang as sg
    import sglang_layer as L

    sg.setup(nccl1, hidden_size=L.H, dtype=torch.float32, device="cuda")
    try:
        w = {k: v.cuda() for k, v in L.weights().items()}
        for n, extend in ((5, False), (9, True), (0, False)):
            xs = torch.randn(n, L.H, device="cuda")
            fb, rows = L.prepare([n], extend, "cuda")
            x = torch.zeros(rows, L.H, device="cuda")
            x[:n] = xs
            y = L.layer(x, w, fb)
            assert torch.allclose(y[:n], L.dense(xs, w), atol=1e-4), n
            g = sg.get_global_dp_buffer()
            ev = sg.dp_gather_partial_async(g, x, fb, ("gather", 1))
            assert isinstance(ev, torch.cuda.Event)
            assert sg.dp_gather_partial_async(g, x, fb, ("gather", 1)) is ev  # persistent
            torch.cuda.current_stream().wait_event(ev)
            want = sg.get_global_dp_buffer()
            sg.dp_gather_partial(want, x, fb)
            assert torch.equal(g, want)
        bucket = 16
        counts = torch.tensor([bucket], dtype=torch.int32, device="cuda")
        fb = L.graph_batch(bucket, counts)
        x = torch.zeros(bucket, L.H, device="cuda")
        graph, y = capture(lambda: L.layer(x, w, fb))
        for n in (3, 0, bucket, 11):
            xs = torch.randn(n, L.H, device="cuda")
            counts.fill_(n)
            x.zero_()
            x[:n] = xs
            graph.replay()
            torch.cuda.synchronize()
            assert torch.allclose(y[:n], L.dense(xs, w), atol=1e-4), n
            assert not y[n:].any(), n
    finally:
        sg.teardown()


def test_direct_launches_equal_the_jit_launches():
    """dpx's direct launch of Triton's compiled kernels (dpx_torch.shims.triton_launch)
    writes what the JIT launch writes, for 16-byte aligned and unaligned buffers, host and
    device indices, every kernel (move, zero, pack, unpack, mask, the count check, the fp8
    and fp4 quantize and dequantize); it compiles once per specialisation, and a launch
    hook (a profiler's) sends launches through the JIT path, which calls it."""
    import triton

    from dpx.modes import Wire
    from dpx.wire import wire_row_bytes
    from dpx_torch.shims.triton_launch import Launcher
    from dpx_torch.passes import TritonPasses

    launcher = Launcher()
    direct, jit = TritonPasses(launcher), TritonPasses()
    base = torch.randn(64, 3, device="cuda")          # rows of 12 bytes: views misalign
    dev = lambda v: torch.tensor([v], dtype=torch.int32, device="cuda")  # noqa: E731
    for src in (base, base[1:], base[3:]):
        for lo in (0, 1):
            a = torch.full((30, 3), 7.0, device="cuda")[lo:]
            b = a.clone()
            for ss, ds, n in ((2, 1, 5), (dev(2), 1, dev(5)), (0, 0, 29 - lo)):
                direct.move(src, ss, ds, n, a)
                jit.move(src, ss, ds, n, b)
                assert torch.equal(a, b)
                direct.zero(a, 3, dev(4))
                jit.zero(b, 3, dev(4))
                assert torch.equal(a, b)
    f = torch.tensor([0, 5], dtype=torch.int32, device="cuda")
    ln = torch.tensor([3, 2], dtype=torch.int32, device="cuda")
    u1, u2 = torch.empty(9, 3, device="cuda"), torch.empty(9, 3, device="cuda")
    direct.unpack(base[:8], f, ln, 4, u1)
    jit.unpack(base[:8], f, ln, 4, u2)
    assert torch.equal(u1, u2)
    p1, p2 = torch.empty(8, 3, device="cuda"), torch.empty(8, 3, device="cuda")
    direct.pack(base[:9], f, ln, 4, p1)
    jit.pack(base[:9], f, ln, 4, p2)
    assert torch.equal(p1, p2)
    m1, m2 = base[:9].clone(), base[:9].clone()
    direct.mask(m1, f, ln, -1.0)
    jit.mask(m2, f, ln, -1.0)
    assert torch.equal(m1, m2) and (m1[3:5] == -1).all()
    rule = dpx.plan_step([0, 0], dpx.DpLayout(2, 2), mode="max_len", capacity=4).count_rule
    for counts in ([1, 2], [5, 0], [-1, 3]):
        c = torch.tensor(counts, dtype=torch.int32, device="cuda")
        fl1, fl2 = torch.zeros(1, dtype=torch.int32, device="cuda"), \
            torch.zeros(1, dtype=torch.int32, device="cuda")
        direct.check(c, fl1, rule)
        jit.check(c, fl2, rule)
        assert torch.equal(fl1, fl2) and int(fl1) == rule.flags(counts), counts
    x = torch.randn(10, 256, device="cuda", dtype=torch.bfloat16)
    for wire, g in ((Wire.FP8, None), (Wire.NVFP4, 0.75), (Wire.MXFP4, None)):
        w1 = torch.empty(10, wire_row_bytes(256, wire), dtype=torch.uint8, device="cuda")
        w2 = torch.empty_like(w1)
        direct.quantize(x, 1, dev(8), w1, wire, g)
        jit.quantize(x, 1, dev(8), w2, wire, g)
        assert torch.equal(w1, w2), wire
        y1, y2 = torch.empty_like(x), torch.empty_like(x)
        direct.dequantize(w1, y1, wire, g)
        jit.dequantize(w2, y2, wire, g)
        assert torch.equal(y1.view(torch.int16), y2.view(torch.int16)), wire
    compiled = len(launcher)
    assert compiled > 0
    direct.move(base, 2, 1, 5, torch.empty(30, 3, device="cuda"))
    assert len(launcher) == compiled            # known specialisation: no new compile
    seen = []
    hook = seen.append
    triton.knobs.runtime.launch_enter_hook.add(hook)
    try:
        direct.move(base, 2, 1, 5, torch.empty(30, 3, device="cuda"))
    finally:
        triton.knobs.runtime.launch_enter_hook.remove(hook)
    torch.cuda.synchronize()
    assert len(seen) == 1


def test_prepared_calls_replay_in_graphs_and_rebind_when_the_pool_grows(nccl1):
    """A prepared call (the implicit one DpComm keeps) captured in a CUDA graph replays with
    new device counts; when a larger call regrows the pool's scratch, the prepared call
    rebinds (no stale buffer), and the captured graph still replays correctly."""
    H = 64
    plan = dpx.plan_step([1], nccl1.layout, capacity=16, mode="max_len")
    counts = torch.tensor([16], dtype=torch.int32, device="cuda")
    local = torch.randn(plan.slot_rows[0], H, device="cuda")
    out = torch.empty(plan.global_rows, H, device="cuda")
    step = lambda: nccl1.gather(local, plan, partial=True, counts=counts, out=out)  # noqa: E731
    warm_up(step)
    graph, _ = capture(step, warm=False)
    for n in (3, 16, 0, 9):
        counts.fill_(n)
        out.fill_(5.0)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out[:n], local[:n]) and not out[n:].any()
    big = dpx.plan_step([1], nccl1.layout, capacity=4096, mode="max_len")
    nccl1.gather(torch.randn(big.slot_rows[0], H, device="cuda"), big, partial=True,
                 counts=torch.tensor([7], dtype=torch.int32, device="cuda"))
    counts.fill_(11)
    graph.replay()
    assert torch.equal(out[:11], local[:11]) and not out[11:].any()
    got = step()
    assert torch.equal(got[:11], local[:11]) and not got[11:].any()
