"""The peer transport (docs/semantics.md, "The peer transport") on the CPU: the choice of
transport, the workspace's layout and the bytes each rank moves (planner), then dpx_torch's
calls with the world steps as puts, barriers and pulls in host shared memory -- gloo worlds
of 4 and 3 ranks -- against the NumPy reference (the per_root transport's tests check
the same cases), every call form and promise, a dead peer, clean exits."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

import dpx
from dpx.cost import peer_bytes
from dpx.transport import RankFacts, choose_transport, confirm_peer

IDS = lambda l: f"w{l[0]}dp{l[1]}" + (f"cp{l[2]}" if len(l) > 2 else "")  # noqa: E731
SCRIPT = os.path.join(os.path.dirname(__file__), "peer_script.py")


# ---------------------------------------------------------------- planner
def test_the_transport_is_chosen_from_every_rank_and_says_why():
    host = lambda h="a", dev="cuda", mem=("driver", "torch"), why="": RankFacts(  # noqa
        h, dev, mem, why)
    ok = choose_transport("peer", [host(), host(), host()])
    assert ok.transport is dpx.Transport.PEER and ok.memory == "driver", ok
    assert choose_transport("per_root", []).transport is dpx.Transport.PER_ROOT
    cases = {
        "the ranks span 2 hosts": [host(), host("b"), host()],
        "the ranks' devices differ": [host(), host(dev="cpu")],
        "rank 1 cannot share memory (no driver)": [host(), host(mem=(), why="no driver")],
        "no kind of shared memory every rank has": [host(mem=("driver",)),
                                                    host(mem=("torch",))],
        "more than the 63": [host()] * 64,
    }
    for why, facts in cases.items():
        c = choose_transport("peer", facts)
        assert c.transport is dpx.Transport.PER_ROOT and why in c.reason, (why, c)
        assert c.requested is dpx.Transport.PEER and "per_root taken" in str(c)
    # the first kind of rank 0's order that every rank has
    assert choose_transport("peer", [host(mem=("driver", "torch")),
                                     host(mem=("torch",))]).memory == "torch"
    assert confirm_peer(ok, ["", ""]) is ok
    fell = confirm_peer(ok, ["", "OSError: no", "x"])
    assert fell.transport is dpx.Transport.PER_ROOT
    assert "rank 1 could not open its peers' memory (and 1 more): OSError: no" in fell.reason
    with pytest.raises(dpx.DpxValueError, match="'ragged' and 'equal' are JAX's"):
        choose_transport("ragged", [host()])


def test_workspace_layout():
    lay = dpx.PeerLayout(world_size=5, phase_bytes=1000)
    assert (lay.flags, lay.epoch, lay.ctrl, lay.header) == (0, 40, 256, 256)
    assert lay.stride == 256 + 1024 and lay.data == 512
    assert lay.total_bytes == 256 + 2 * lay.stride
    assert all(v % 256 == 0 for v in (lay.ctrl, lay.header, lay.stride, lay.data))
    assert dpx.peer_phase_bytes(4096, 7168 * 2) == 4096 * 14336
    # docs/semantics.md: the default 64 MiB phase holds a gather of 4,681 bf16 rows of 7,168
    default = __import__("dpx_torch").PeerOptions().phase_bytes
    assert default == 64 << 20
    assert dpx.peer_phase_bytes(4681, 14336) <= default < dpx.peer_phase_bytes(4682, 14336)
    with pytest.raises(dpx.DpxValueError):
        dpx.PeerLayout(world_size=0, phase_bytes=8)


def test_peer_options_name_bad_types_and_values():
    """docs/errors.md: a bad type is a DpxTypeError (also a TypeError), a bad value a
    DpxValueError (also a ValueError), each naming the option."""
    from dpx_torch import PeerOptions

    for kw in ({"timeout": "2"}, {"timeout": True}, {"timeout": None},
               {"phase_bytes": "64"}, {"phase_bytes": 1.5}):
        with pytest.raises(dpx.DpxTypeError, match=rf"PeerOptions\({next(iter(kw))}"):
            PeerOptions(**kw)
    for kw in ({"timeout": 0}, {"timeout": -1.0}, {"timeout": 1e6}, {"timeout": float("nan")},
               {"phase_bytes": -1}):
        with pytest.raises(dpx.DpxValueError, match=rf"PeerOptions\({next(iter(kw))}"):
            PeerOptions(**kw)
    assert PeerOptions(timeout=2, phase_bytes=0).timeout == 2


@pytest.mark.parametrize("layout", [(4, 4), (4, 2), (8, 2, 2), (6, 3)], ids=IDS)
def test_only_real_rows_travel(layout):
    """Per rank, a gather puts its chunk's real rows into every other rank's workspace and
    a combine pulls its chunk's real rows from every other rank's: over the world, every
    real row once to each other rank, in every mode (MAX_LEN's pad rows and the alignment
    rows never travel), with host or device counts, native or on a wire."""
    lay = dpx.DpLayout(*layout)
    W, rb, wrb = lay.world_size, 7168 * 2, 7168 + 56 * 4
    for counts in ([5, 0, 9, 1, 0, 3][:lay.dp_size], [0] * lay.dp_size,
                   [16] * lay.dp_size):
        shards = [[n // lay.cp_size + (c < n % lay.cp_size) for c in range(lay.cp_size)]
                  for n in counts] if lay.cp_size > 1 else None
        for mode, cap in itertools.product(("max_len", "sum_len", "gatherv"), (None, 64)):
            plan = dpx.plan_step(counts, lay, mode=mode, capacity=cap, cp_shards=shards)
            real = sum(counts) * (W - 1)
            for op, wire in (("gather", "native"), ("gather", "fp8"),
                             ("reduce_scatter", "native"), ("reduce_scatter", "fp8")):
                if op == "gather" and wire == "fp8" and mode == "sum_len":
                    continue
                moved = [peer_bytes(dpx.build_schedule(
                    plan, op, rank=r, transport="peer", device_counts=cap is not None,
                    wire=wire), row_bytes=rb, wire_row_bytes=wrb) for r in range(W)]
                unit = rb if wire == "native" else wrb
                side = 0 if op == "gather" else 1
                assert sum(m[side] for m in moved) == real * unit, (counts, mode, op, wire)
                assert sum(m[1 - side] for m in moved) == 0


# ---------------------------------------------------------------- torch on host memory
@pytest.fixture(scope="module")
def peer_worlds(tmp_path_factory):
    """``get(size)``: a gloo world whose communicators run on the peer transport."""
    from harness import GlooWorld

    worlds: dict[int, GlooWorld] = {}
    root = tmp_path_factory.mktemp("peer")

    def get(size: int) -> GlooWorld:
        w = worlds.get(size)
        if w is None or not w.alive:
            w = worlds[size] = GlooWorld(size, root / f"w{size}-{len(worlds)}")
            choices = w.run("torch_jobs:use_transport", "peer")
            assert all(c.startswith("peer (host memory)") for c in choices), choices
        return w

    yield get
    for w in worlds.values():
        w.close()


@pytest.mark.multiproc
@pytest.mark.parametrize("layout", [(4, 4), (4, 2), (4, 1), (4, 1, 2), (4, 2, 2), (3, 3),
                                    (3, 1)], ids=IDS)
def test_every_op_matches_the_reference(peer_worlds, layout):
    """gather (partial and replicated), scatter, reduce_scatter, scatter_columns and its
    prepared form, in every mode with idle replicas, host and device counts, attn-tp and
    CP (shards too); the wires (fp8, nvfp4, mxfp4: payloads and dequantized rows bit for
    bit), several tensors in one call, pad masks, the in-place gather, the quantized
    combine in every mode and its other call forms (prepared, async, the gradient), the
    count exchange (a world step too) and counts riding the gather -- the jobs of the
    per_root transport's tests, on the peer one."""
    import test_combine as tc
    import test_torch_hotpath as hp
    import test_torch_serving as ts

    world = peer_worlds(layout[0])
    dp, cp = layout[1], (layout[2] if len(layout) > 2 else 1)
    rep = world.run("peer_jobs:report", layout)
    assert all(r["transport"] == "peer" for r in rep), rep
    assert rep[0]["kinds"][0][-1] == "all_gather_v" and "reduce_scatter_v" in rep[0]["kinds"][1]
    idle = [0 if i % 2 else 3 + 2 * i for i in range(dp)]
    cases = [dict(counts=c, mode=m, partial=p, dtype=d, seed=i)
             for i, (c, m, p, d) in enumerate(itertools.product(
                 (idle, [5] * dp), ("max_len", "sum_len", "gatherv"), (True, False),
                 ("bfloat16", "int64")))]
    cases += [dict(counts=[0] * dp, mode=m, capacity=8 * dp, partial=p, seed=7,
                   run_counts=[min(2 + i, 8) for i in range(dp)])
              for m in ("max_len", "sum_len", "gatherv") for p in (True, False)]
    if cp > 1:
        cases += [dict(counts=[5] * dp, shards=[[5 - i, i] + [0] * (cp - 2) for i in range(dp)],
                       mode=m, partial=p) for m in ("max_len", "gatherv") for p in (True, False)]
    n = layout[0]
    assert world.run("torch_jobs:check_cases", layout, cases) == [4 * len(cases)] * n
    assert world.run("serving_jobs:check_serving", layout, ts._fixed_cases(dp, cp))[0] > 0
    c = hp._in_place_cases(dp, cp)
    assert world.run("hotpath_jobs:in_place", layout, c) == [len(c)] * n
    assert world.run("combine_jobs:check_combine", layout, tc._cases(dp, cp))[0] > 0
    counts = [[0] * dp, [3 + 2 * i for i in range(dp)], [0 if i % 2 else 9 for i in range(dp)]]
    res = world.run("serving_jobs:check_exchange_counts", layout, counts,
                    [[[c + e for c in range(cp)] for e in range(dp)]])
    assert all(r["good"] == [4] * dp for r in res) and len({r["counts"] for r in res}) == 1
    if 8 % (n // dp) == 0:   # (the job's rows are a capacity of 8, aligned)
        ride = ts.ride_cases(dp, cp)
        ts.check_ride_results(world.run("serving_jobs:check_ride", layout, ride), layout,
                              ride)


@pytest.mark.multiproc
def test_autograd_async_validate_and_several_tensors(peer_worlds):
    """Gradients (every op, device counts), rows of several trailing dims or none,
    overlapped calls, and validate=True on the peer transport: every call form (implicit,
    prepared, scatter, scatter_columns, async, the sglang drop-in, a several-tensor
    gather, validate switched on after prepared calls) raises the same error on every
    rank, of the class the rejected input's own error has."""
    import test_torch_comm as tcomm
    import test_trust as tt

    world = peer_worlds(4)
    layout = (4, 2)
    cases = [dict(counts=c, mode=m, seed=i) for i, (c, m) in enumerate(itertools.product(
        tcomm._count_sets(2, 7)[1:4], ("max_len", "sum_len", "gatherv")))]
    world.run("torch_jobs:check_grads", layout, cases)
    # rows of several trailing dims, and of none (1-D inputs): the rows the kernels address
    nd = [dict(counts=[3, 0], mode=m, partial=p, seed=5) for m in ("max_len", "gatherv")
          for p in (True, False)]
    nd += [dict(counts=[0, 0], mode="max_len", capacity=8, run_counts=[5, 0], partial=True)]
    for rest in ((2, 3), ()):
        assert world.run("torch_jobs:check_cases", layout, nd, rest=rest) == [4 * len(nd)] * 4
    auto = [dict(counts=[0, 0], mode=m, capacity=8, run_counts=[5, 0], seed=3)
            for m in ("max_len", "gatherv")]
    world.run("torch_jobs:check_autograd", layout, auto)
    steps = [[3, 0], [8, 2], [0, 0], [5, 5], [1, 9]] * 2
    world.run("torch_jobs:check_async_matches_sync", layout, steps)
    out = world.run("torch_jobs:check_validate")
    for key in out[0]:
        assert len({o[key] for o in out}) == 1, (key, out)
    assert out[0]["ok"] and out[0]["same_scale"] == "no error"
    assert all(v != "no error" for k, v in out[0].items() if k not in ("ok", "same_scale"))
    tt.check_validate_forms(world.run("trust_jobs:validate_forms", timeout=120))
    tt.check_validate_kinds(world.run("trust_jobs:validate_kinds"))


@pytest.mark.multiproc
def test_steps_compile_fullgraph(peer_worlds):
    """torch.compile(fullgraph=True) over gather -> matmul -> combines -> LM-head scatter:
    GATHERV (no traceable form on per_root) with device counts, and a MAX_LEN and a SUM_LEN
    gather and reduce_scatter with host counts, the eager step's bits (tests/test_peer_gpu.py: every mode, host and
    device counts, on a GPU)."""
    assert peer_worlds(4).run("peer_jobs:compiled_steps", (4, 2), [("gatherv", True)],
                              timeout=300) == [1] * 4
    assert peer_worlds(3).run("peer_jobs:compiled_ops", (3, 3), ["max_len", "sum_len"],
                              timeout=300) == [2] * 3


@pytest.mark.multiproc
def test_explain_states_the_transport_its_reason_and_the_phase(peer_worlds):
    """docs/semantics.md, "The peer transport": ``comm.explain(plan)`` prints the
    communicator's transport and why, and on the peer transport the phase the plan needs
    (its gathered rows at explain's default row of 7,168 bf16 elements)."""
    for r in peer_worlds(3).run("peer_jobs:explained", (3, 3)):
        peer, plain = r["world"], r["per_root"]
        assert peer["transport"] == "peer" and plain["transport"] == "per_root", r
        assert f"transport: {peer['choice']}" in peer["text"], peer
        assert peer["choice"].startswith("peer (host memory)"), peer
        # MAX_LEN slots of 7 rows (the largest count) on 3 replicas: 21 rows of 14,336 B
        assert "peer   : a phase of >= 294.00 KiB (21 rows x 14336 B" in peer["text"], peer
        assert f"transport: {plain['choice']}" in plain["text"], plain
        assert plain["choice"] == "per_root: requested" and "peer   :" not in plain["text"]


@pytest.mark.multiproc
def test_counts_riding_a_gather_do_not_trace_on_the_peer_transport(peer_worlds):
    """docs/semantics.md, "The peer transport" (torch.compile): the counts' reports are read
    back on the host, so ``gather_with_counts`` does not trace there -- under
    ``fullgraph=True`` compiling fails, torch's error quoting the dpx error that names the
    rule; without it the call runs at a graph break, the eager call's rows and counts."""
    for r in peer_worlds(3).run("peer_jobs:compiled_ride", (3, 3), timeout=300):
        assert "DpxValueError" in r["fullgraph"], r
        assert "counts ride a gather outside torch.compile" in r["fullgraph"], r
        assert r["broken_equal"] and r["counts"] == [3, 4, 3], r


@pytest.mark.multiproc
def test_native_combine_sums_in_float32_in_rank_order(peer_worlds):
    """The native reduce_scatter on the peer transport is the float32 sum in rank order
    from +0.0, rounded once, bit for bit (random magnitudes, -0.0, a NaN); the backend's
    (per_root, its own order and roundings) differs from it within the two sums' rounding
    errors, ``W * eps * sum |x|`` per element."""
    res = peer_worlds(4).run("peer_jobs:native_sum_order", (4, 2),
                             ("float32", "bfloat16", "float16"))
    assert all(r["checked"] == 6 for r in res)
    assert max(r["worst"] for r in res) <= 1.0, res


@pytest.mark.multiproc
def test_bytes_moved_are_the_planned_real_rows(peer_worlds):
    """What each rank wrote into its peers' workspaces and read from theirs, counted by the
    host passes, equals :func:`dpx.cost.peer_bytes` of the schedule -- host and device
    counts, idle replicas, MAX_LEN's pad rows left out."""
    cases = [dict(counts=[5, 0], mode="max_len"), dict(counts=[3, 7], mode="sum_len"),
             dict(counts=[0, 9], mode="gatherv"),
             dict(counts=[0, 0], mode="max_len", capacity=12, run_counts=[9, 1]),
             dict(counts=[0, 0], mode="gatherv", capacity=24, run_counts=[0, 6])]
    res = peer_worlds(4).run("peer_jobs:traffic", (4, 2), cases)
    for rank in res:
        for mode, op, wire, moved, planned in rank:
            assert tuple(moved) == tuple(planned), (mode, op, wire, moved, planned)
    assert any(m[3][0] for m in res[0]) and any(m[3][1] for m in res[0])


@pytest.mark.multiproc
def test_fallbacks_and_workspace_limits(peer_worlds):
    """Where the peer transport cannot run every rank falls back to per_root alike, saying
    why; ranks given different PeerOptions raise the same error; a call whose rows exceed
    a phase raises the same DpxCapacityError everywhere before any step."""
    res = peer_worlds(3).run("peer_jobs:fallbacks")
    for name, why in (("mixed", "the ranks' devices differ"),
                      ("none", "cannot share memory")):
        assert len({r[name] for r in res}) == 1, res
        transport, reason, ok = res[0][name]
        assert transport == "per_root" and why in reason and ok, res[0][name]
    assert "'ragged' and 'equal' are JAX's" in res[0]["jax"]
    assert len({r["mismatch"] for r in res}) == 1, res
    assert res[0]["mismatch"].startswith("DpxMismatchValueError: transport='peer': the "
                                         "ranks' PeerOptions differ"), res[0]["mismatch"]
    assert "timeout" in res[0]["options"]
    small = peer_worlds(3).run("peer_jobs:too_small")
    assert len({r["error"] for r in small}) == 1 and small[0]["small"]
    assert small[0]["error"].startswith("DpxCapacityError: peer transport: all_gather_v")


def _torchrun(n: int, device: str, variant: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         str(n), SCRIPT, device, variant], capture_output=True, text=True, timeout=240,
        env={**os.environ, "OMP_NUM_THREADS": "1"})


def check_scripts(device: str) -> None:
    """The peer script's variants (tests/peer_script.py), two at once: a dead peer is
    named on every live rank within the timeout (1 s, plus the step's own time) and every
    call form then raises; a rank that skips a call is named by the ranks that made every
    call (its later barriers pair with their earlier ones: a barrier counts arrivals, it
    cannot tell a skipped call from a late one) and no destroy() waits past the timeout;
    a rank that rejects its input and leaves (destroy()) is named at once by the others'
    step, which does not pair with its leaving;
    150 steps with ranks out of step reuse the phases correctly; exit 0 with and without
    destroy(), no warning of shared memory still held, and no workspace file left
    behind."""
    before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    runs = [(3, "dead"), (3, "phases"), (3, "skip"), (3, "leave"), (2, "destroy"),
            (2, "no_destroy")]
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda a: _torchrun(a[0], device, a[1]), runs))
    for (n, variant), p in zip(runs, done):
        out = p.stdout + p.stderr
        assert p.returncode == 0, (variant, out[-3000:])
        assert out.count("transport ") == n and "transport 0 peer" in out, (variant, out)
        assert "Producer process" not in out and "leaked" not in out, (variant, out)
        if variant == "dead":
            dead = [ln.split() for ln in p.stdout.splitlines() if ln.startswith("dead ")]
            assert len(dead) == n - 1, out
            assert all(float(s) < 1.0 + 3.0 and r == f"[{n - 1}]" for _, _, s, r in dead), dead
            refused = [ln for ln in p.stdout.splitlines() if ln.startswith("refused ")]
            assert len(refused) == n - 1 and all(
                ln.split()[2] == ln.split()[4] for ln in refused), refused
        elif variant == "phases":
            assert p.stdout.count("phases ") == n, out
        elif variant == "skip":
            skips = {int(ln.split()[1]): ln.split(maxsplit=2)[2] for ln in
                     p.stdout.splitlines() if ln.startswith("skip ")}
            assert len(skips) == n, out
            # the ranks that made every call name the one that skipped one
            assert all(skips[r].startswith(f"[{n - 1}]") for r in range(n - 1)), skips
            assert all(float(v.split()[-1]) < 1.0 + 3.0 for v in skips.values()), skips
        elif variant == "leave":   # named at once: well within the 30 s timeout
            left = {int(ln.split()[1]): ln.split(maxsplit=2)[2] for ln in
                    p.stdout.splitlines() if ln.startswith("leave ")}
            assert len(left) == n and left[n - 1].startswith("None"), out
            assert all(left[r].startswith(f"[{n - 1}]") for r in range(n - 1)), left
            assert all(float(v.split()[-1]) < 10.0 for v in left.values()), left
        else:
            assert p.stdout.count("ok ") == n, out
    after = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    assert not [f for f in after - before if f.startswith("dpx-peer")], after - before


@pytest.mark.multiproc
def test_dead_peer_phases_and_exits():
    check_scripts("cpu")


@pytest.mark.multiproc
def test_a_rank_killed_while_opening_leaves_no_file():
    """tests/peer_kill_init.py: the last of 3 ranks is killed once its peers' workspaces
    are mapped, before the files are removed; the others' DpComm raises, and no
    workspace file is left behind (theirs nor the dead rank's)."""
    from dpx_torch.peer_memory import host_path

    p = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__),
                                                     "peer_kill_init.py"), "3"],
                       capture_output=True, text=True, timeout=240,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "exit 0 0" in out and "exit 1 0" in out, out[-3000:]
    assert f"exit 2 {-signal.SIGKILL}" in out, out[-3000:]
    assert out.count("raised ") == 2, out[-3000:]
    token = next(ln.split()[1] for ln in p.stdout.splitlines() if ln.startswith("token "))
    left = [r for r in range(3) if os.path.exists(host_path(token, r))]
    assert not left, (token, left)


def test_a_cuda_workspace_without_cuda_says_why():
    """A rank asked for a CUDA workspace where torch has no CUDA device reports why (the
    transport's choice then names it), and choosing the device raises nothing."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    from dpx_torch import PeerOptions
    from dpx_torch.peer_memory import rank_facts

    for name in ("cuda", "cuda:0"):
        facts = rank_facts(PeerOptions(device=name).workspace_device())
        assert facts.memory == () and "no CUDA device here" in facts.why, facts
        assert "rank 0 cannot share memory (no CUDA device here" in choose_transport(
            "peer", [facts]).reason


@pytest.mark.multiproc
@pytest.mark.parametrize("layout", [(4, 2), (4, 4)], ids=IDS)
def test_sglang_dropin_on_the_peer_transport(peer_worlds, layout):
    """``dpx_torch.sglang.setup(DpComm(layout, transport="peer"), ...)``: every drop-in
    function equals the dpx call (both on the peer transport), the quantized combine, and
    a layer written against sglang's names against the dense reference."""
    import test_sglang as tsg

    world = peer_worlds(layout[0])
    dp, n = layout[1], layout[0]
    cases = tsg._cases(dp, n // dp)
    assert world.run("sglang_jobs:dropin_matches_native", layout, cases) == [len(cases)] * n
    steps = []
    for s in tsg.STEPS:
        s = dict(s)
        s["counts"] = ([(5 * e + 3) % 13 for e in range(dp)] if s.get("bucket") else
                       [4 + e for e in range(dp)] if s["mode"] == "MAX_LEN" else
                       [7] + [0] * (dp - 1))
        steps.append(s)
    assert max(world.run("sglang_jobs:layer_matches_dense", layout, steps)) < 1e-4


def test_peer_kernels_compile_for_sm90():
    """Every peer kernel as dpx_torch launches it compiles for an H100/H200 (sm_90, no GPU
    needed): the barrier reads the global clock and orders its flags at system scope, the
    sums add with ``add.rn.f32`` (the combine's rounding, never fused into a multiply-add;
    nvfp4's with ``fma.rn.f32`` of an exact product, the same bits),
    no kernel spills to local memory, and every access to a workspace row moves whole
    vectors (the rows' alignment, :func:`dpx.kernels.peer.row_starts`: a pointer read from
    the table has none the compiler knows, and the rows' bytes went one load or store an
    element)."""
    pytest.importorskip("triton")
    import re

    import kernel_digest as kd

    for name, kernel, ptrs, consts, warps in kd.peer_cases():
        k = kd.compile_case(kernel, ptrs, consts, warps)
        ptx = kd.normalised_ptx(k.asm["ptx"])
        assert ".local" not in ptx and "ld.local" not in ptx, name
        if name != "peer barrier":
            # scalar accesses: none of bytes or halves but the fp4 sums' scale bytes (one a
            # block and source); of words, only the count loads and the fp8 sum's scales
            small = re.findall(r"(?:ld|st)\.global\.b(?:8|16)\b", ptx)
            words = re.findall(r"(?:ld|st)\.global\.b32\b", ptx)
            vector = re.findall(r"(?:ld|st)\.global\.v[24]\.b32", ptx)
            fp4 = name in ("peer sum nvfp4", "peer sum mxfp4")
            assert vector and len(small) <= (8 if fp4 else 0), (name, small, vector)
            if name.startswith("peer sum") and name != "peer sum bf16":
                assert len(words) <= (2 if fp4 else 2 + 8), (name, words)
            if name.startswith(("peer put", "peer take")):
                # the row moves, byte rows too, move 16 bytes an access (a tile of elements
                # gave byte rows 8: launch.tile_for's byte tiles, peer_move_tile)
                widths = set(re.findall(r"(?:ld|st)\.global\.(v[248])\.b32", ptx))
                assert widths == {"v4"}, (name, widths)
        if name == "peer barrier":
            assert "%globaltimer" in ptx and ".sys" in ptx and "release" in ptx, ptx[-2000:]
        if name == "peer sum nvfp4":
            assert "fma.rn.f32" in ptx and "add.rn.f32" not in ptx, name
        elif name.startswith("peer sum"):
            assert "add.rn.f32" in ptx and "fma.rn.f32" not in ptx, name


class _Workspaces:
    """``W`` workspaces in this process on the CPU, seen from rank ``rank`` (what the peer
    passes read of a :class:`dpx_torch.peer_memory.PeerMemory`)."""

    def __init__(self, layout, rank, bufs):
        import numpy as np
        import torch

        self.layout, self.rank, self.device = layout, rank, torch.device("cpu")
        self.views = bufs
        self.error = np.zeros(1, np.int64)
        self.table = torch.tensor([b.data_ptr() for b in bufs] + [self.error.ctypes.data],
                                  dtype=torch.int64)


def test_a_workspace_the_kernels_cannot_address_is_named(monkeypatch):
    """The kernels take every workspace base as a multiple of ``dpx.workspace.ALIGN``
    bytes: a mapping that is not is this rank's reason not to open (every rank then falls
    back to per_root naming it, as for any failure to map), naming the ranks and
    addresses -- here a host workspace whose view starts 64 bytes into its mapping."""
    torch = pytest.importorskip("torch")
    import os
    import uuid

    import dpx_torch.peer_memory as pm
    from dpx.workspace import ALIGN

    assert pm.unaligned([0, ALIGN, 7 * ALIGN]) == ""
    why = pm.unaligned([ALIGN, 3 * ALIGN + 64, 5 * ALIGN, 16])
    assert why.startswith("the workspaces of ranks [1, 3] are not 256-byte aligned"), why
    assert hex(3 * ALIGN + 64) in why and "0x10" in why, why
    frombuffer = torch.frombuffer
    monkeypatch.setattr(torch, "frombuffer", lambda buf, dtype: frombuffer(buf, dtype=dtype)[64:])
    token = uuid.uuid4().hex
    try:
        mem, why = pm.open_memory("host", dpx.PeerLayout(1, 4096), 0, torch.device("cpu"),
                                  lambda handle: [handle], token)
        assert mem is None and why.startswith("the workspaces of ranks [0] are not 256-byte"), why
    finally:
        pm.remove_host_files(token, 1)
    assert not os.path.exists(pm.host_path(token, 0))


def test_the_barrier_kernel_names_whom_the_host_barrier_names():
    """The barrier kernel in Triton's interpreter (its wait counted in polls instead of
    the GPU's clock) against :class:`HostPeerPasses`' barrier on a copy of the same
    workspaces (W 4, rank 1 at epoch 5): every peer arrived; one alive and late (named at
    the timeout); one that left before this barrier (named at once -- alone, while
    another is still late, and long before a timeout of 10**7 polls or 30 s) or after it
    (arrived); a failure already recorded (nothing waits, the flags are written); and the
    leaving (``destroy()``): every peer gone, one still there (named at the timeout), a
    failure already recorded. The same error word and every byte of every workspace."""
    pytest.importorskip("triton")
    import time

    import torch

    from dpx.kernels import launch as L
    from dpx.workspace import LEFT
    from dpx_torch.peer_passes import HostPeerPasses
    from dpx_torch.shims.triton_launch import Launcher

    W, me, epoch = 4, 1, 5
    layout = dpx.PeerLayout(W, 256)
    launcher = Launcher()
    lt = L.peer_barrier_launch(W, layout.epoch, clock=False)
    kernel = launcher.bind(lt.kernel, torch.device("cpu"), lt.consts, lt.warps,
                           ((0, torch.int64),)).tensors
    cases = [  # (leave, rank 1's flags of peers 0, 2, 3, error word before, bits after)
        (False, (6, 6, 6), 0, 0), (False, (6, 5, 6), 0, 0b100),
        (False, (6, LEFT + 5, 5), 0, 0b100), (False, (LEFT + 6, 6, 6), 0, 0),
        (False, (5, 5, 5), 0b1000, 0b1000), (True, (LEFT + 5, LEFT + 3, LEFT + 9), 0, 0),
        (True, (LEFT + 5, 6, LEFT + 5), 0, 0b100), (True, (5, 5, 5), 0b1, 0b1)]
    for leave, peers, err, bits in cases:
        base = [torch.zeros(layout.total_bytes, dtype=torch.uint8) for _ in range(W)]
        for b in base:
            b[layout.epoch:layout.epoch + 8].view(torch.int64)[0] = epoch
        own = base[me][:8 * W].view(torch.int64)
        for p, v in zip((0, 2, 3), peers):
            own[p] = v
        A, B = [b.clone() for b in base], [b.clone() for b in base]
        a, b = _Workspaces(layout, me, A), _Workspaces(layout, me, B)
        a.error[0] = b.error[0] = err
        at_once = any(LEFT <= v < LEFT + epoch + 1 for v in peers) and not leave
        t0 = time.monotonic()
        kernel((1,), (a.table, me, 10**7 if at_once else 30, int(leave)))
        host = HostPeerPasses(b, 30.0 if at_once else 0.05)
        host.leave() if leave else host.barrier()
        case = (leave, peers, err)
        assert not at_once or time.monotonic() - t0 < 5.0, case
        assert int(a.error[0]) == int(b.error[0]) == bits, (case, a.error, b.error)
        assert all(torch.equal(x, y) for x, y in zip(A, B)), case
        mark = LEFT + epoch if leave else epoch + 1
        assert all(int(x[:8 * W].view(torch.int64)[me]) == mark for x in A), case


@pytest.mark.parametrize("wide", [False, True], ids=["int32", "int64"])
def test_peer_kernels_in_the_interpreter_give_the_host_passes_bytes(monkeypatch, wide):
    """The peer kernels (:mod:`dpx.kernels.peer`, as :class:`CudaPeerPasses` binds them)
    run by Triton's interpreter on CPU workspaces, against the torch ops of
    :class:`HostPeerPasses` on a copy of the same bytes: every put mode (the chunk put
    and an all-gather of blocks writing each tile into every workspace, the stage, an
    all-to-all of blocks; reports), the take's modes, the native sum (float and integer
    dtypes) and the fp8 / nvfp4 / mxfp4 wire sums, with chunk tables that reach past the
    block, the source and the phase. Every byte of every workspace, output and report;
    ``int64``: every launch's index math as for buffers past 2**31 elements."""
    pytest.importorskip("triton")
    import random

    import torch

    from dpx.kernels import launch as L
    if wide:
        monkeypatch.setattr(L, "wide", lambda *elements: True)
    assert L.peer_wire_sum_launch(dpx.Wire.FP8, 1, 128, "float32", 2, 16, ws_rows=1,
                                  compiled=False).consts["WIDE"] is wide
    from dpx.wire import wire_row_bytes
    from dpx_torch.peer_passes import CudaPeerPasses, HostPeerPasses
    from dpx_torch.shims.triton_launch import Launcher

    rng = random.Random(11)
    gen = torch.Generator().manual_seed(11)
    launcher = Launcher()

    def same(a, b):
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))

    def rand(shape, dtype):
        if dtype.is_floating_point:
            return (torch.randn(shape, generator=gen) * 40).to(dtype)
        return torch.randint(0, 100, shape, generator=gen).to(dtype)

    puts = takes = sums = 0
    for case in range(36):
        W, block = rng.choice([1, 2, 3, 4, 5]), rng.choice([1, 3, 8, 40])
        me = rng.randrange(W)
        wire = rng.choice([dpx.Wire.NATIVE] * 2 + [dpx.Wire.FP8, dpx.Wire.NVFP4,
                                                    dpx.Wire.MXFP4])
        native = wire is dpx.Wire.NATIVE
        width = rng.choice([1, 24, 130, 2100]) if native else 128   # (1-3 column tiles)
        dtype = rng.choice([torch.float32, torch.bfloat16, torch.float16] +
                           ([torch.int32, torch.uint8] if native else []))
        rb = width * dtype.itemsize if native else wire_row_bytes(width, wire)
        rows = W * block + rng.choice([0, 3])
        layout = dpx.PeerLayout(W, rows * max(rb, width * dtype.itemsize))
        base = [torch.randint(0, 256, (layout.total_bytes,), dtype=torch.uint8, generator=gen)
                for _ in range(W)]
        epoch = rng.randrange(4)
        for b in base:
            b[:layout.ctrl].zero_()
            b[layout.epoch:layout.epoch + 8].view(torch.int64)[0] = epoch
        A, B = [b.clone() for b in base], [b.clone() for b in base]
        kern = CudaPeerPasses(_Workspaces(layout, me, A), 2.0, launcher)
        host = HostPeerPasses(_Workspaces(layout, me, B), 2.0)
        firsts = torch.tensor([rng.randint(-2, rows) for _ in range(W)], dtype=torch.int32)
        lens = torch.tensor([rng.randint(0, block + 2) for _ in range(W)], dtype=torch.int32)
        count = torch.tensor([rng.randint(0, 99)], dtype=torch.int32)
        # puts: every mode, into the next phase
        for mode, step, report in ((L.PEER_CHUNK, 0, False), (L.PEER_STAGE, 0, False),
                                   (L.PEER_BLOCKS, 0, True), (L.PEER_BLOCKS, block, case % 2 == 1)):
            src_rows = rng.choice([block, W * block, rows, 2])
            src = rand((src_rows, width), dtype)
            for p in (kern, host):
                p.bind_put(mode, src_rows, block, width, dtype, src_step=step,
                           report=report)(src, firsts, lens, count if report else None)
            assert all(same(a, b) for a, b in zip(A, B)), (case, W, me, mode, step, dtype)
            puts += 1
        # takes: from this phase
        for mode, report in ((L.PEER_CHUNK, False), (L.PEER_BLOCKS, True)):
            out_rows = W * block if mode == L.PEER_BLOCKS else rows
            outs = [torch.full((out_rows, width), 7, dtype=dtype) for _ in range(2)]
            reps = [torch.full((W,), -1, dtype=torch.int32) for _ in range(2)]
            for p, out, rep in zip((kern, host), outs, reps):
                p.bind_take(mode, out_rows, block, width, dtype, report=report)(
                    out, firsts, lens, rep if report else None)
            assert same(*outs) and same(*reps), (case, W, me, mode, dtype)
            takes += 1
        # a combine's pull and sum (wire rows: every scale byte a quantize writes)
        if not dtype.is_floating_point and not native:
            continue
        if wire is dpx.Wire.NVFP4:   # (the sign bit of a scale byte is never written)
            start = layout.data + (epoch & 1) * layout.stride
            for v in A + B:
                v[start:start + layout.phase_bytes // rb * rb].view(-1, rb)[:, width // 2:] &= 0x7F
        outs = [torch.full((block, width), 7, dtype=dtype) for _ in range(2)]
        g = 0.37 if wire is dpx.Wire.NVFP4 else None
        for p, out in zip((kern, host), outs):
            p.bind_sum(block, width, dtype, wire, g)(out, firsts, lens)
        assert same(*outs), (case, W, me, wire, dtype)
        sums += 1
    assert puts == 4 * 36 and takes == 2 * 36 and sums > 20, (puts, takes, sums)


def test_the_cuda_pull_sum_binds_every_wire_as_the_combine_sums():
    """:class:`dpx_torch.peer_passes.CudaPeerPasses`' wire pull-sum as it binds it (the
    launch, its pointers' dtypes, nvfp4's global scale), run by Triton's interpreter on
    workspaces in host memory: every rank's wire rows, offset by ``firsts[me]``, summed as
    the combine's summing pass sums the same rows, bit for bit, zeros past ``lens[me]``."""
    pytest.importorskip("triton")
    from types import SimpleNamespace

    import torch

    from dpx.wire import wire_row_bytes
    from dpx_torch.passes import TritonPasses
    from dpx_torch.peer_passes import CudaPeerPasses
    from dpx_torch.shims.triton_launch import JIT

    W, n, H, first = 3, 5, 128, 2
    torch.manual_seed(0)
    for wire, g in ((dpx.Wire.FP8, None), (dpx.Wire.NVFP4, 0.37), (dpx.Wire.MXFP4, None)):
        rb = wire_row_bytes(H, wire)
        lay = dpx.PeerLayout(W, (first + n) * rb)
        bufs = [torch.zeros(lay.total_bytes, dtype=torch.uint8) for _ in range(W)]
        err = torch.zeros(1, dtype=torch.int64)
        table = torch.tensor([b.data_ptr() for b in bufs] + [err.data_ptr()], dtype=torch.int64)
        mem = SimpleNamespace(layout=lay, device=torch.device("cpu"), table=table, rank=1)
        passes = TritonPasses()
        x = torch.randn(W * n, H) * 3
        wbuf = torch.empty(W * n, rb, dtype=torch.uint8)
        passes.quantize(x, 0, W * n, wbuf, wire, g)
        for p, b in enumerate(bufs):   # rank p's rows at rows first.., in the phase read
            b[lay.data + first * rb:lay.data + (first + n) * rb].copy_(
                wbuf[p * n:(p + 1) * n].reshape(-1))
        firsts = torch.tensor([0, first, 0], dtype=torch.int32)
        lens = torch.tensor([0, n - 1, 0], dtype=torch.int32)
        out = torch.full((n, H), 7.0, dtype=torch.bfloat16)
        CudaPeerPasses(mem, 1.0, JIT).bind_sum(n, H, torch.bfloat16, wire, g)(out, firsts, lens)
        want = torch.empty(n, H, dtype=torch.bfloat16)
        passes.dequantize_sum(wbuf, want, W, wire, g)
        assert torch.equal(out[:n - 1].view(torch.int16), want[:n - 1].view(torch.int16)), wire
        assert not out[n - 1:].any(), wire
