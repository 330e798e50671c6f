"""The peer transport on one GPU (docs/semantics.md, "The peer transport"): worlds of 2, 3
and 4 processes sharing the GPU (gloo for the host exchanges; run under MPS by
benchmarks/run_gpu.sh), their world steps the :mod:`dpx.kernels.peer` kernels on CUDA
IPC memory: every op, mode, layout and wire against the NumPy reference (the same jobs as
tests/test_peer.py's on host memory), one CUDA graph replayed 100 times with new device
counts, the IPC fallback, a dead peer and clean exits. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

import test_peer as tp

pytestmark = [pytest.mark.gpu, pytest.mark.multiproc,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def cuda_peer_worlds(tmp_path_factory):
    """``get(size, ipc=None)``: a gloo world on the GPU whose communicators run on the peer
    transport (``ipc``: force that kind of CUDA IPC)."""
    from harness import GlooWorld

    worlds: dict = {}
    root = tmp_path_factory.mktemp("cuda_peer")

    def get(size: int, ipc: str | None = None):
        w = worlds.get((size, ipc))
        if w is None or not w.alive:
            w = worlds[(size, ipc)] = GlooWorld(size, root / f"w{size}-{ipc}-{len(worlds)}")
            w.run("torch_jobs:use_device", "cuda")
            if ipc:
                w.run("peer_jobs:force_ipc", ipc)
            choices = w.run("torch_jobs:use_transport", "peer", 1 << 22, 60.0, timeout=180)
            want = f"peer ({ipc or 'driver'} memory)"
            assert all(c.startswith(want) for c in choices), choices
        return w

    yield get
    for w in worlds.values():
        w.close()


@pytest.mark.parametrize("layout", [(4, 4), (4, 2), (4, 1, 2), (4, 2, 2), (3, 3), (3, 1),
                                    (2, 2), (2, 1)], ids=tp.IDS)
def test_every_op_matches_the_reference_on_the_gpu(cuda_peer_worlds, layout):
    tp.test_every_op_matches_the_reference(cuda_peer_worlds, layout)


def test_native_combine_order_on_the_gpu(cuda_peer_worlds):
    """The kernels' float32 sum in rank order, bit for bit as on the host."""
    tp.test_native_combine_sums_in_float32_in_rank_order(cuda_peer_worlds)


def test_steps_compile_fullgraph_on_the_gpu(cuda_peer_worlds):
    """Every mode, host and device counts among them, in a layout of attn_tp 1: an
    attn-tp group's steps are its backend's, and gloo's all-gather of CUDA tensors does not
    run compiled with several processes on one GPU (tests/gloo_compile_probe.py;
    docs/semantics.md, "The peer transport"). tests/test_peer.py compiles layout (4, 2) on
    host memory."""
    which = [("max_len", False), ("sum_len", True), ("gatherv", True)]
    assert cuda_peer_worlds(4).run("peer_jobs:compiled_steps", (4, 4), which,
                                   timeout=300) == [3] * 4


def test_one_graph_replays_with_new_device_counts(cuda_peer_worlds):
    """Layouts of attn_tp 1: an attn-tp group's steps are its backend's, gloo's here, which
    a graph cannot capture (docs/semantics.md, "The peer transport")."""
    for size, layout in ((4, (4, 4)), (3, (3, 3))):
        res = cuda_peer_worlds(size).run("peer_jobs:graph_replays", layout, 100, timeout=300)
        assert all(r["replays"] == 100 and not r["bad"] for r in res), res


def test_torch_ipc_fallback(cuda_peer_worlds):
    """torch's own CUDA tensor sharing, where the driver library cannot be used: the same
    results (a layout of each kind)."""
    for layout in ((2, 1), (2, 2)):
        tp.test_every_op_matches_the_reference(lambda n: cuda_peer_worlds(n, "torch"), layout)


def test_dead_peer_phases_and_exits_on_the_gpu():
    tp.check_scripts("cuda")
