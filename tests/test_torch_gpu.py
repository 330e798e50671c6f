"""dpx_torch on one GPU: NCCL at world size 1, CUDA-graph replay with device counts,
torch.compile. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

import dpx
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

    def step():
        nccl1.gather(local, plan, partial=True, counts=counts, out=gbuf)
        nccl1.scatter(gbuf, plan, counts=counts, out=sbuf)
        nccl1.reduce_scatter(glob, plan, counts=counts, out=rbuf)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm-up: kernels compiled, pool sized
    torch.cuda.current_stream().wait_stream(s)
    allocations = nccl1.pool.allocations
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    assert nccl1.pool.allocations == allocations, "the pool grew inside capture"
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
            buffers.append(len(nccl1.pool))
            allocations.append(nccl1.pool.allocations)
    assert len(nccl1.overlap.events) == 4, nccl1.overlap.events.keys()
    assert len(set(buffers)) == 1, "pool gained buffers after warm-up"
    assert len(set(allocations)) == 1, "pool reallocated after warm-up"
    # the caching allocator may add one 2 MiB small-allocation segment (for the tiny result
    # tensors of the checks); the pool's own buffers (8+ MiB each) must never regrow
    assert max(reserved) - min(reserved) <= 2 * 2**20, \
        f"reserved memory moved: {min(reserved)}..{max(reserved)}"
