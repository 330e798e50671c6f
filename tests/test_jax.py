"""dpx_jax on simulated CPU devices (shard_map, jit, grad), against reference.py."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import dpx  # noqa: E402
import dpx_jax  # noqa: E402
from conftest import jax_gpu_available  # noqa: E402
from jax_harness import SPEC, columns_fn, mesh_for, shard, step_fn, unstack  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from reference import (global_inputs, held, local_inputs, offsets_of, ref_gather,  # noqa: E402
                       ref_reduce_scatter_rank, ref_scatter_rank)

MODES = ["max_len", "sum_len", "gatherv"]
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16,
          "int32": jnp.int32}


def _counts(dp: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randint(1, 9) for _ in range(dp)],
            [0 if i % 2 else rng.randint(1, 11) for i in range(dp)],
            [13] + [0] * (dp - 1)]


def run_case(plan, partial, dtype="float32", rest=(3,), seed=0, counts=None, impl="auto"):
    """gather, scatter and reduce_scatter of ``plan`` in one jitted program against the
    reference. ``counts``: a capacity plan's device counts (a shard table for a sharded
    plan)."""
    lay = plan.layout
    eff = None
    if counts is not None:
        eff = tuple(tuple(x) for x in counts) if plan.sharded else tuple(counts)
    locs = local_inputs(seed, plan, rest, partial=partial, rows=plan.max_slot_rows, eff=eff)
    globs = global_inputs(seed, plan, rest)
    mesh = mesh_for(lay)
    f = step_fn(plan, partial, impl, counts is not None)
    c = jnp.asarray(plan.num_tokens if eff is None else eff, jnp.int32)
    g, sc, rs = f(shard(mesh, locs, DTYPES[dtype]), shard(mesh, globs, DTYPES[dtype]), c)
    g, sc, rs = (unstack(a, lay.world_size) for a in (g, sc, rs))
    want = ref_gather(locs, plan, partial=partial, counts=eff)
    for r in range(lay.world_size):
        rows = plan.slot_rows[lay.coords(r).attn_dp_rank]
        np.testing.assert_array_equal(g[r], want, err_msg=f"gather rank {r}")
        np.testing.assert_array_equal(sc[r][:rows], ref_scatter_rank(want, plan, r, eff),
                                      err_msg=f"scatter rank {r}")
        np.testing.assert_array_equal(rs[r][:rows],
                                      ref_reduce_scatter_rank(globs, plan, r, eff),
                                      err_msg=f"reduce_scatter rank {r}")
        assert not np.any(sc[r][rows:]) and not np.any(rs[r][rows:]), "rows past the slot"
    return f


@pytest.mark.parametrize("layout", [(8, 8), (8, 4), (8, 2), (8, 1), (4, 2), (2, 1), (4, 4),
                                    (6, 3), (1, 1)], ids=lambda l: f"w{l[0]}dp{l[1]}")
def test_every_mode_partial_and_replicated(layout):
    lay = dpx.DpLayout(*layout)
    for i, (counts, mode, partial) in enumerate(itertools.product(
            _counts(lay.dp_size, sum(layout)), MODES, (True, False))):
        run_case(dpx.plan_step(counts, lay, mode=mode), partial, seed=i)


def test_all_idle_and_policies():
    lay = dpx.DpLayout(8, 4)
    for mode in MODES:
        run_case(dpx.plan_step([0, 0, 0, 0], lay, mode=mode), True)
    for counts in ([40, 0, 0, 1], [5, 5, 6, 4]):
        for policy, ext in itertools.product(("sglang", "cost"), (False, True)):
            run_case(dpx.plan_step(counts, lay, policy=policy, is_extend=ext), True)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "int32"])
def test_dtypes(dtype):
    lay = dpx.DpLayout(8, 4)
    for mode, partial in itertools.product(MODES, (True, False)):
        run_case(dpx.plan_step([3, 0, 6, 2], lay, mode=mode), partial, dtype=dtype)


def test_trailing_dims():
    lay = dpx.DpLayout(4, 2)
    for mode in MODES:
        run_case(dpx.plan_step([3, 1], lay, mode=mode), False, rest=(2, 3))


@pytest.mark.parametrize("mode,cap", [("max_len", 8), ("sum_len", 24), ("gatherv", 24)])
def test_capacity_plan_no_recompile(mode, cap):
    lay = dpx.DpLayout(8, 4)
    plan = dpx.plan_step([1, 1, 1, 1], lay, capacity=cap, mode=mode)
    f = None
    for i, counts in enumerate(([3, 0, 8, 5], [0, 0, 0, 0], [8, 8, 8, 0], [1, 2, 3, 4])):
        f = run_case(plan, i % 2 == 0, counts=counts, seed=i)
        run_case(plan, i % 2 == 1, counts=counts, seed=i)
    assert f._cache_size() == 1, "new counts must not recompile"


# ---------------------------------------------------------------- rows
def test_rows_xla_edges():
    x = jnp.arange(20, dtype=jnp.float32).reshape(5, 4) + 1
    # a slot at the very end is not moved (dynamic_update_slice would clamp it)
    out = dpx_jax.place_rows(x, 6, 3, 9, impl="xla")
    assert np.array_equal(out[6:], x[:3]) and not np.any(out[:6])
    # traced start/count, out-of-range counts are clipped, never wrap
    f = jax.jit(lambda s, c: dpx_jax.take_rows(x, s, c, 7, impl="xla"))
    got = np.asarray(f(jnp.int32(3), jnp.int32(100)))
    assert np.array_equal(got[:2], x[3:]) and not np.any(got[2:])
    assert dpx_jax.place_rows(jnp.zeros((0, 4)), 0, 0, 3, impl="xla").shape == (3, 4)
    assert dpx_jax.take_rows(x, 0, 0, 0, impl="xla").shape == (0, 4)


def test_place_and_take_rows_are_each_others_adjoints():
    """docs/semantics.md: place_rows and take_rows are differentiable, each the other's
    adjoint at equal start/count: <place(x), y> = <x, take(y)>, and jax.grad of one is the
    other applied to the cotangent (host and traced start/count)."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((5, 3)), jnp.float32)
    y = jnp.asarray(rng.standard_normal((9, 3)), jnp.float32)
    for start, count in ((0, 5), (4, 3), (6, 3), (2, 0)):
        for s, c in ((start, count), (jnp.int32(start), jnp.int32(count))):
            gx = jax.grad(lambda v: jnp.vdot(dpx_jax.place_rows(v, s, c, 9, impl="xla"), y))(x)
            assert np.array_equal(gx, dpx_jax.take_rows(y, s, c, 5, impl="xla"))
            gy = jax.grad(lambda v: jnp.vdot(dpx_jax.take_rows(v, s, c, 5, impl="xla"), x))(y)
            assert np.array_equal(gy, dpx_jax.place_rows(x, s, c, 9, impl="xla"))
            want = np.zeros((5, 3), np.float32)
            want[:count] = np.asarray(y)[start:start + count]
            assert np.array_equal(gx, want), (start, count)


def test_rows_bad_inputs():
    x = jnp.zeros((4, 3))
    with pytest.raises(dpx.DpxValueError, match=r"start \+ count <= rows \(4\)"):
        dpx_jax.place_rows(x, 2, 3, 4)
    with pytest.raises(dpx.DpxValueError, match="impl='cuda'"):
        dpx_jax.place_rows(x, 0, 1, 4, impl="cuda")
    with pytest.raises(dpx.DpxTypeError, match="count"):
        dpx_jax.take_rows(x, 0, 1.5, 4)
    if not jax_gpu_available():
        with pytest.raises(dpx.DpxValueError, match="jax-triton"):
            dpx_jax.place_rows(x, 0, 1, 4, impl="triton")


def test_ops_bad_inputs():
    lay = dpx.DpLayout(4, 2)
    plan = dpx.plan_step([3, 1], lay)
    mesh = mesh_for(lay)
    x = shard(mesh, [np.zeros((2, 3))] * 4, jnp.float32)

    def run(fn):
        return jax.shard_map(fn, mesh=mesh, in_specs=SPEC, out_specs=SPEC)(x)

    with pytest.raises(dpx.DpxValueError, match="local has 2 rows per device; the plan needs at least 3"):
        run(lambda l: dpx_jax.gather(l, plan, partial=True))
    with pytest.raises(dpx.DpxValueError, match="global_ has 2 rows"):
        run(lambda l: dpx_jax.reduce_scatter(l, plan))
    with pytest.raises(dpx.DpxValueError, match="capacity plan"):
        run(lambda l: dpx_jax.scatter(l, plan, counts=jnp.zeros(2, jnp.int32)))
    with pytest.raises(dpx.DpxTypeError, match="partial"):
        run(lambda l: dpx_jax.gather(l, plan, partial=1))
    # not an array (bad types: DpxTypeError), a pytree of them too; a scalar array's shape
    # is a bad value
    for call, name in ((lambda v: dpx_jax.gather(v, plan, partial=True), "local"),
                       (lambda v: dpx_jax.scatter(v, plan), "global_"),
                       (lambda v: dpx_jax.reduce_scatter(v, plan), "global_"),
                       (lambda v: dpx_jax.scatter_columns(v, plan), "shard"),
                       (lambda v: dpx_jax.mask_pad_rows(v, plan), "t"),
                       (lambda v: dpx_jax.place_rows(v, 0, 1, 4), "src")):
        with pytest.raises(dpx.DpxTypeError, match=f"{name}.* must be an array"):
            call(1.0)
        with pytest.raises(dpx.DpxValueError, match=f"{name}"):
            call(jnp.float32(1.0))
    for tree in ([[1.0, 2.0]], {"h": 3}, (x, 2.0)):
        with pytest.raises(dpx.DpxTypeError, match="a pytree of arrays; a leaf is"):
            dpx_jax.gather(tree, plan, partial=True)


def test_counts_errors_name_the_dtype_and_shape():
    lay = dpx.DpLayout(4, 2)
    plan = dpx.plan_step([0, 0], lay, capacity=8)
    mesh = mesh_for(lay)
    x = shard(mesh, [np.zeros((8, 3))] * 4, jnp.float32)

    def run(c):
        return jax.shard_map(lambda v: dpx_jax.gather(v, plan, partial=True, counts=c),
                             mesh=mesh, in_specs=SPEC, out_specs=SPEC)(x)

    with pytest.raises(dpx.DpxTypeError, match=r"must be an integer array .*got dtype float32"):
        run(jnp.zeros(2, jnp.float32))
    with pytest.raises(dpx.DpxTypeError, match=r"shape \(2,\) .*got shape \(3,\)"):
        run(jnp.zeros(3, jnp.int32))


@pytest.mark.parametrize("mode,cap,bad,why", [
    ("max_len", 8, [12, 0, 0, 0], "exceed the MAX_LEN capacity 8"),
    ("max_len", 8, [-1, 2, 0, 0], "negative entry"),
    ("sum_len", 16, [6, 6, 6, 0], "sum past the capacity's 16 rows"),
    ("gatherv", 16, [9, 9, 0, 0], "sum past the capacity's 16 rows")])
def test_checkify_reports_counts_outside_the_capacity(mode, cap, bad, why):
    """Device counts a capacity plan cannot hold are a checkify check inside the ops:
    ``checkify.checkify(f)`` reports them (from every device); valid counts report
    nothing; without checkify the program runs, inside its buffers."""
    from jax.experimental import checkify

    lay = dpx.DpLayout(4, 4)
    plan = dpx.plan_step([0] * 4, lay, mode=mode, capacity=cap)
    mesh = mesh_for(lay)
    f = jax.shard_map(lambda v, c: dpx_jax.gather(v, plan, partial=True, counts=c),
                      mesh=mesh, in_specs=(SPEC, P()), out_specs=SPEC)
    x = shard(mesh, [np.ones((plan.max_slot_rows, 2))] * 4, jnp.float32)
    checked = jax.jit(checkify.checkify(f))
    err, _ = checked(x, jnp.asarray(bad, jnp.int32))
    assert err.get() is not None and why in err.get()
    err, out = checked(x, jnp.asarray([1, 0, 2, 0], jnp.int32))
    assert err.get() is None and out.shape[0] == 4 * plan.global_rows
    assert jax.jit(f)(x, jnp.asarray(bad, jnp.int32)).shape == out.shape


# ---------------------------------------------------------------- gradients
def _ref_global(X, plan, partial):
    """Plain jnp reference of gather on stacked inputs X [world, L, H] -> [G, H]."""
    lay = plan.layout
    out = jnp.zeros((plan.global_rows, X.shape[-1]), X.dtype)
    for d in range(lay.dp_size):
        n, ranks = plan.num_tokens[d], lay.replica_ranks(d)
        val = sum(X[r, :n] for r in ranks) if partial else X[ranks[0], :n]
        out = out.at[plan.offsets[d]:plan.offsets[d] + n].set(val)
    return out


def _ref_rs(Y, plan):
    """Plain jnp reference of reduce_scatter on stacked [world, G, H] -> [world, L, H]."""
    lay = plan.layout
    total = Y.sum(0)
    rows = []
    for r in range(lay.world_size):
        d = lay.coords(r).attn_dp_rank
        n, o = plan.num_tokens[d], plan.offsets[d]
        rows.append(jnp.zeros((plan.max_slot_rows, Y.shape[-1]), Y.dtype).at[:n].set(total[o:o + n]))
    return jnp.stack(rows)


def _jit_grad(f):
    """``jax.grad(f)`` compiled as one program (eager op-by-op dispatch of the jnp
    references would compile every small op separately)."""
    return jax.jit(jax.grad(f))


@pytest.mark.parametrize("mode", MODES)
def test_gradients_match_reference(mode):
    lay = dpx.DpLayout(8, 4)
    plan = dpx.plan_step([3, 0, 6, 2], lay, mode=mode)
    mesh = mesh_for(lay)
    W, L, G = lay.world_size, plan.max_slot_rows, plan.global_rows
    rng = np.random.default_rng(0)
    X = jnp.asarray(rng.integers(-4, 5, (W, L, 3)), jnp.float32)
    Wg = jnp.asarray(rng.integers(-4, 5, (W, G, 3)), jnp.float32)
    Ws = jnp.asarray(rng.integers(-4, 5, (W, L, 3)), jnp.float32)
    grad = _jit_grad
    for partial in (True, False):
        def loss(x):
            f = jax.shard_map(lambda l: dpx_jax.gather(l, plan, partial=partial), mesh=mesh,
                              in_specs=SPEC, out_specs=SPEC)
            return jnp.sum(f(x.reshape(W * L, 3)).reshape(W, G, 3) * Wg)

        # replicated (partial=False): the attn-tp copies are one value, which the reference
        # reads from the first copy; JAX's gradient of it is the first copy's alone
        got = np.asarray(grad(loss)(X))
        np.testing.assert_array_equal(got, grad(
            lambda x: jnp.sum(_ref_global(x, plan, partial)[None] * Wg))(X))
        assert np.any(got[0]) and np.any(got[1]) == partial

    def loss_rs(y):
        f = jax.shard_map(lambda g: dpx_jax.reduce_scatter(g, plan), mesh=mesh,
                          in_specs=SPEC, out_specs=SPEC)
        return jnp.sum(f(y.reshape(W * G, 3)).reshape(W, L, 3) * Ws)

    np.testing.assert_array_equal(grad(loss_rs)(Wg), grad(
        lambda y: jnp.sum(_ref_rs(y, plan) * Ws))(Wg))

    def loss_sc(y):
        f = jax.shard_map(lambda g: dpx_jax.scatter(g, plan), mesh=mesh, in_specs=SPEC,
                          out_specs=SPEC)
        return jnp.sum(f(y.reshape(W * G, 3)).reshape(W, L, 3) * Ws)

    def ref_sc(y):
        outs = []
        for r in range(W):
            d = lay.coords(r).attn_dp_rank
            n, o = plan.num_tokens[d], plan.offsets[d]
            outs.append(jnp.zeros((L, 3)).at[:n].set(y[r, o:o + n]))
        return jnp.sum(jnp.stack(outs) * Ws)

    np.testing.assert_array_equal(grad(loss_sc)(Wg), grad(ref_sc)(Wg))


# ---------------------------------------------------------------- GPU (jax-triton)
@pytest.mark.gpu
@pytest.mark.skipif(not jax_gpu_available(), reason="needs a JAX GPU backend")
def test_triton_matches_xla_bitwise_on_gpu():
    rng = np.random.default_rng(1)
    for dtype in (jnp.float32, jnp.bfloat16, jnp.float16, jnp.int32):
        for m, rest, start, count, rows in [(5, (7,), 2, 4, 9), (40, (130,), 17, 33, 50),
                                            (0, (11,), 0, 0, 4), (6, (1029,), 3, 6, 9)]:
            x = jnp.asarray(rng.integers(-100, 100, (m, *rest)), dtype)
            for fn in (dpx_jax.place_rows, dpx_jax.take_rows):
                s, c = (start, count) if fn is dpx_jax.place_rows else (0, min(count, m))
                a = fn(x, jnp.int32(s), jnp.int32(c), rows, impl="triton")
                b = fn(x, jnp.int32(s), jnp.int32(c), rows, impl="xla")
                assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))
    for firsts, lens, block, rows in [([0, 2, 2, 4], [2, 0, 2, 2], 2, 8),
                                      ([1, 7], [4, 0], 5, 9), ([0, 9], [9, 3], 9, 20)]:
        f, ln = jnp.asarray(firsts, jnp.int32), jnp.asarray(lens, jnp.int32)
        for dtype in (jnp.float32, jnp.bfloat16, jnp.int32):
            x = jnp.asarray(rng.integers(-100, 100, (len(firsts) * block, 1029)), dtype)
            a = dpx_jax.unpack_rows(x, f, ln, rows, impl="triton")
            b = dpx_jax.unpack_rows(x, f, ln, rows, impl="xla")
            assert np.array_equal(np.asarray(a), np.asarray(b))
            y = jnp.asarray(rng.integers(-100, 100, (rows, 130)), dtype)
            a = dpx_jax.pack_rows(y, f, ln, block, impl="triton")
            b = dpx_jax.pack_rows(y, f, ln, block, impl="xla")
            assert np.array_equal(np.asarray(a), np.asarray(b))
    lay = dpx.DpLayout(1, 1)
    for mode in MODES:
        for partial in (True, False):
            run_case(dpx.plan_step([5], lay, mode=mode), partial, impl="triton")


@pytest.mark.parametrize("mode", MODES)
def test_adjoint_identity_and_device_count_gradients(mode):
    """On random normal inputs, <gather(x), y> == <x, reduce_scatter(y)> summed over
    devices, and with a capacity plan and device counts the gradients of gather (both
    partial values), scatter and reduce_scatter equal the reference adjoints."""
    lay = dpx.DpLayout(8, 4)
    cap = 8 if mode == "max_len" else 24
    plan = dpx.plan_step([0, 0, 0, 0], lay, capacity=cap, mode=mode)
    counts = (5, 0, 8, 3)
    c = jnp.asarray(counts, jnp.int32)
    mesh = mesh_for(lay)
    W, L, G = lay.world_size, plan.max_slot_rows, plan.global_rows
    rng = np.random.default_rng(7)
    dp_of = np.asarray([lay.coords(r).attn_dp_rank for r in range(W)])
    mask = (np.arange(L)[None, :] < np.asarray(counts)[dp_of][:, None])[..., None]
    x = np.where(mask, rng.standard_normal((W, L, 3)), 0.0).astype(np.float32)
    y = rng.standard_normal((W, G, 3)).astype(np.float32)

    def sm(fn):
        return jax.shard_map(fn, mesh=mesh, in_specs=(SPEC, P()), out_specs=SPEC)

    gather_p = sm(lambda l, k: dpx_jax.gather(l, plan, partial=True, counts=k))
    gather_r = sm(lambda l, k: dpx_jax.gather(l, plan, partial=False, counts=k))
    rs = sm(lambda g, k: dpx_jax.reduce_scatter(g, plan, counts=k))
    sc = sm(lambda g, k: dpx_jax.scatter(g, plan, counts=k))
    X, Y = jnp.asarray(x.reshape(W * L, 3)), jnp.asarray(y.reshape(W * G, 3))
    Wi = jnp.asarray(rng.integers(-4, 5, (W * G, 3)), jnp.float32)
    Ws = jnp.asarray(rng.integers(-4, 5, (W * L, 3)), jnp.float32)

    @jax.jit
    def everything(X, Y, Wi, Ws, c):
        """One program: both sides of the identity and the four gradients."""
        lhs = jnp.sum(gather_p(X, c) * Y)
        rhs = jnp.sum(X * rs(Y, c))
        grads = [jax.grad(lambda a, f=f: jnp.sum(f(a, c) * Wi))(X) for f in (gather_p, gather_r)]
        grads.append(jax.grad(lambda a: jnp.sum(sc(a, c) * Ws))(Wi))
        grads.append(jax.grad(lambda a: jnp.sum(rs(a, c) * Ws))(Wi))
        return lhs, rhs, grads

    lhs, rhs, (g_p, g_r, g_sc, g_rs) = everything(X, Y, Wi, Ws, c)
    assert abs(float(lhs) - float(rhs)) <= 1e-4 * max(1.0, float(np.abs(x).sum()
                                                                + np.abs(y).sum())), (lhs, rhs)
    Wi, Ws = np.asarray(Wi), np.asarray(Ws)
    off = offsets_of(plan, counts)
    total = Wi.reshape(W, G, 3).sum(0)
    want_g = np.zeros((W, L, 3), np.float32)
    want_adj = np.zeros((W, G, 3), np.float32)
    want_rs = np.zeros((W, G, 3), np.float32)
    for r in range(W):
        d = dp_of[r]
        n, o = counts[d], off[d]
        want_g[r, :n] = total[o:o + n]
        want_adj[r, o:o + n] = Ws.reshape(W, L, 3)[r, :n]
    for e in range(lay.dp_size):
        n, o = counts[e], off[e]
        s = sum(Ws.reshape(W, L, 3)[q, :n] for q in lay.replica_ranks(e))
        want_rs[:, o:o + n] = s
    # the replicated gather's attn-tp copies: the first takes the gradient
    first = np.array([lay.coords(r).attn_tp_rank == 0 for r in range(W)])[:, None, None]
    for got, keep in ((g_p, True), (g_r, first)):
        np.testing.assert_array_equal(np.asarray(got).reshape(W, L, 3), want_g * keep)
    np.testing.assert_array_equal(np.asarray(g_sc).reshape(W, G, 3), want_adj)
    np.testing.assert_array_equal(np.asarray(g_rs).reshape(W, G, 3), want_rs)


# ---------------------------------------------------------------- context parallel
CP_LAYOUTS = [(8, 2, 2), (8, 1, 4), (4, 2, 2)]


@pytest.mark.parametrize("layout", CP_LAYOUTS, ids=lambda l: f"w{l[0]}dp{l[1]}cp{l[2]}")
def test_context_parallel(layout):
    """Both CP cases in every mode: CP ranks holding the same rows and CP ranks holding
    shards (random splits, all on one CP rank, empty shards, idle replicas); capacity
    plans with device counts and device shard tables compile once."""
    lay = dpx.DpLayout(*layout)
    rng = random.Random(sum(layout))

    def split(n):
        cuts = sorted(rng.randint(0, n) for _ in range(lay.cp_size - 1))
        return tuple(b - a for a, b in zip([0, *cuts], [*cuts, n]))

    for i, counts in enumerate(_counts(lay.dp_size, sum(layout))[:2]):
        for mode in MODES:
            partial = i % 2 == 0
            run_case(dpx.plan_step(counts, lay, mode=mode), partial, seed=i)
            shards = [split(n) if i else (0,) * (lay.cp_size - 1) + (n,) for n in counts]
            run_case(dpx.plan_step(counts, lay, mode=mode, cp_shards=shards), not partial,
                     seed=i, dtype=("float32", "bfloat16", "int32")[i % 3])
    for mode in MODES:
        cap = 8 if mode == "max_len" else 8 * lay.dp_size
        per = min(8, cap // lay.dp_size)
        plan = dpx.plan_step([0] * lay.dp_size, lay, mode=mode, capacity=cap,
                             cp_shards=[(0,) * lay.cp_size] * lay.dp_size)
        f = None
        for k in range(2):
            run = [rng.randint(0, per) for _ in range(lay.dp_size)]
            f = run_case(plan, k == 0, counts=[split(n) for n in run], seed=k)
        assert f._cache_size() == 1, "new shard tables must not recompile"
        run_case(dpx.plan_step([0] * lay.dp_size, lay, mode=mode, capacity=cap), True,
                 counts=[rng.randint(0, per) for _ in range(lay.dp_size)])


@pytest.mark.parametrize("layout_args,mode,partial", [
    ((8, 4), "max_len", False), ((8, 4), "sum_len", False), ((8, 2, 2), "gatherv", False),
    ((8, 2, 2), "sum_len", True)],
    ids=["tp-copies", "tp-copies-summed", "tp-and-cp-copies", "cp-copies"])
def test_a_replicated_weight_before_a_gather_gets_the_dense_gradient(layout_args, mode,
                                                                      partial):
    """A training step's usual shape: tokens on every device (the copies of a replica
    equal), a weight replicated over the mesh (``P()``) before the gather, a loss divided
    by the copies: the weight's gradient is the dense model's (JAX sums the devices'
    cotangents into a replicated weight, so the copies must not each carry it whole)."""
    lay = dpx.DpLayout(*layout_args)
    W, dp, tp, H = lay.world_size, lay.dp_size, lay.attn_tp_size, 4
    copies = W // dp
    counts = [3, 0, 5, 2][:dp]
    plan = dpx.plan_step(counts, lay, mode=mode)
    L = plan.max_slot_rows
    rng = np.random.default_rng(5)
    xr = rng.standard_normal((dp, L, H)).astype(np.float32)
    wq = jnp.asarray(rng.standard_normal((tp, H, H)), jnp.float32)  # tp shards if partial
    w1 = jnp.asarray(rng.standard_normal((H, H)) * 0.3, jnp.float32)
    tg = rng.standard_normal((dp, L, H)).astype(np.float32)
    x = jnp.asarray(np.repeat(xr, copies, axis=0).reshape(-1, H))
    tgt = jnp.asarray(np.repeat(tg, copies, axis=0).reshape(-1, H))

    def body(x, wq, tgt):
        h = x @ (wq[jax.lax.axis_index("tp")] if partial else wq[0])
        y = dpx_jax.reduce_scatter(jnp.tanh(dpx_jax.gather(h, plan, partial=partial) @ w1),
                                   plan)
        real = dpx_jax.local_row_mask(plan)[:, None]
        return jax.lax.psum(jnp.sum(jnp.where(real, (y - tgt) ** 2, 0.0)),
                            dpx_jax.AXES) / copies

    step = jax.shard_map(body, mesh=mesh_for(lay), in_specs=(SPEC, P(), SPEC), out_specs=P())
    loss, grad = jax.jit(jax.value_and_grad(step, argnums=1))(x, wq, tgt)

    def dense(wq, xs):
        total = 0.0
        for d in range(dp):  # every device's rows of the gathered buffer, summed
            n = counts[d]
            y = W * jnp.tanh(xs[d, :n] @ (wq.sum(0) if partial else wq[0]) @ w1)
            total = total + jnp.sum((y - tg[d, :n]) ** 2)
        return total

    want_loss, (want, want_x) = jax.jit(jax.value_and_grad(dense, argnums=(0, 1)))(wq, xr)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-4)
    if not partial:  # the tokens typed replicated over their copies: their gradient too
        step_x = jax.shard_map(body, mesh=mesh_for(lay), in_specs=(P("dp"), P(), SPEC),
                               out_specs=P())
        got_x = jax.jit(jax.grad(step_x))(jnp.asarray(xr.reshape(-1, H)), wq, tgt)
        np.testing.assert_allclose(got_x.reshape(dp, L, H), want_x, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout_args", [(8, 4), (8, 2, 2)], ids=["tp", "cp-and-tp"])
def test_inputs_typed_replicated_over_their_copies(layout_args):
    """An input typed replicated over the axes of a replica's copies (``in_specs=P("dp")``,
    invariant over cp and tp, as the gradient test's tokens): a replicated gather and a
    reduce_scatter in every mode equal the reference (the summing collectives take the
    input cast to vary over their axes; a size-1 axis left invariant raised in psum)."""
    lay = dpx.DpLayout(*layout_args)
    mesh, W, dp = mesh_for(lay), lay.world_size, lay.dp_size
    copies = W // dp
    for mode in ("sum_len", "max_len", "gatherv"):
        plan = dpx.plan_step([3, 0, 5, 2][:dp], lay, mode=mode)
        L, G = plan.max_slot_rows, plan.global_rows
        xr = np.arange(dp * L * 2, dtype=np.float32).reshape(dp, L, 2)
        gr = np.arange(dp * G * 2, dtype=np.float32).reshape(dp, G, 2) - 7
        f = jax.jit(jax.shard_map(
            lambda x, g: (dpx_jax.gather(x, plan, partial=False),
                          dpx_jax.reduce_scatter(g, plan)),
            mesh=mesh, in_specs=P("dp"), out_specs=SPEC))
        got_g, got_rs = (unstack(o, W) for o in f(jnp.asarray(xr.reshape(-1, 2)),
                                                   jnp.asarray(gr.reshape(-1, 2))))
        want_g = np.zeros((G, 2), np.float32)
        total = gr.sum(0) * copies   # every device's buffer: its replica's, once a copy
        for d in range(dp):
            want_g[plan.offsets[d]:plan.offsets[d] + plan.num_tokens[d]] = \
                xr[d, :plan.num_tokens[d]]
        for r in range(W):
            d = lay.coords(r).attn_dp_rank
            n, o = plan.num_tokens[d], plan.offsets[d]
            np.testing.assert_array_equal(got_g[r], want_g, err_msg=f"{mode} gather {r}")
            np.testing.assert_array_equal(got_rs[r][:n], total[o:o + n], err_msg=f"{mode} {r}")
            assert not got_rs[r][n:].any(), (mode, r)


@pytest.mark.parametrize("dtype", [jnp.bool_, jnp.int8], ids=["bool", "int8"])
def test_ops_that_do_not_sum_take_bool_and_int8(dtype):
    """docs/semantics.md: dpx_jax takes any dtype, bool and int8 included, where nothing
    is summed -- the replicated gather (a SUM_LEN one all-reduces: summed as uint8, the
    result still ``dtype``), scatter and scatter_columns in one program -- bool in SUM_LEN
    and in GATHERV on a CP layout with shards, int8 in SUM_LEN -- each equal to the reference
    in ``dtype``; a partial gather and reduce_scatter of bool raise DpxTypeError."""
    from reference import global_inputs, local_inputs, ref_gather, ref_scatter_rank

    combos = ((dpx.DpLayout(4, 2), None, "sum_len"),
              (dpx.DpLayout(8, 2, 2), [(2, 1), (0, 2)], "gatherv"))
    for lay, shards, mode in combos if dtype == jnp.bool_ else combos[:1]:   # (int8: no cast)
        mesh, W = mesh_for(lay), lay.world_size
        plan = dpx.plan_step([3, 2], lay, mode=mode, cp_shards=shards)
        cast = (lambda v: v % 2) if dtype == jnp.bool_ else (lambda v: v)
        locs = [cast(v) for v in local_inputs(1, plan, (3,), partial=False, rows=3)]
        glob = [cast(v) for v in global_inputs(2, plan, (W,))]
        full = np.concatenate([g[:, r:r + 1] for r, g in enumerate(glob)], axis=1)
        x, g_in = shard(mesh, locs, dtype), shard(mesh, [glob[0]] * W, dtype)
        step = jax.shard_map(lambda v, g, c: (dpx_jax.gather(v, plan, partial=False),
                                              dpx_jax.scatter(g, plan),
                                              dpx_jax.scatter_columns(c, plan)),
                             mesh=mesh, in_specs=SPEC, out_specs=SPEC)
        outs = step(x, g_in, shard(mesh, [g[:, r:r + 1] for r, g in enumerate(glob)], dtype))
        assert all(o.dtype == dtype for o in outs), (lay, mode)
        got, sc, cols = (unstack(o, W) for o in outs)
        want = ref_gather(locs, plan, partial=False).astype(dtype)
        for r in range(W):   # (a device's slot_rows[d] rows, then zeros to the max)
            assert np.array_equal(got[r], want), (lay, mode)
            n = plan.slot_rows[lay.coords(r).attn_dp_rank]
            for res, src in ((sc[r], glob[0]), (cols[r], full)):
                assert np.array_equal(res[:n], ref_scatter_rank(src, plan, r).astype(dtype))
                assert not res[n:].any()
        if dtype == jnp.bool_:
            for fn, v in ((lambda v: dpx_jax.gather(v, plan, partial=True), x),
                          (lambda v: dpx_jax.reduce_scatter(v, plan), g_in)):
                with pytest.raises(dpx.DpxTypeError, match="a bool array has no sum"):
                    jax.shard_map(fn, mesh=mesh, in_specs=SPEC, out_specs=SPEC)(v)


def test_the_gathered_buffer_is_typed_per_device():
    """docs/semantics.md (gradients): the gathered buffer is typed varying over every
    DP-attention axis, so ``out_specs=P()`` refuses it under ``check_vma=True``; returned
    with ``out_specs=P(AXES)`` every device's copy is the same."""
    lay = dpx.DpLayout(4, 2)
    plan = dpx.plan_step([3, 2], lay, mode="max_len")
    mesh = mesh_for(lay)
    x = shard(mesh, [np.full((3, 2), r // 2, np.float32) for r in range(4)], jnp.float32)
    fn = lambda v: dpx_jax.gather(v, plan, partial=False)  # noqa: E731
    with pytest.raises(Exception, match="vma|varying|vary"):
        jax.shard_map(fn, mesh=mesh, in_specs=SPEC, out_specs=P())(x)
    got = unstack(jax.shard_map(fn, mesh=mesh, in_specs=SPEC, out_specs=SPEC)(x), 4)
    assert all(np.array_equal(got[r], got[0]) for r in range(4))
    assert np.array_equal(got[0][:, 0], [0, 0, 0, 0, 1, 1, 0, 0])   # slots of 4 rows


@pytest.mark.parametrize("sharded", [False, True], ids=["copies", "shards"])
def test_context_parallel_gradients(sharded):
    """dp 2 x cp 2 x tp 2: gradients of gather (both partial values), scatter and
    reduce_scatter equal the reference adjoints (the first of the CP copies, and of the
    attn-tp copies of a replicated gather, receives the gradient of the one value they
    hold, the others zeros), in one jitted program per mode."""
    lay = dpx.DpLayout(8, 2, 2)
    mesh = mesh_for(lay)
    W = lay.world_size
    for mode in MODES:
        shards = [(2, 3), (0, 4)] if sharded else None
        plan = dpx.plan_step([5, 4], lay, mode=mode, cp_shards=shards)
        L, G = plan.max_slot_rows, plan.global_rows
        rng = np.random.default_rng(3)
        X = jnp.asarray(rng.integers(-4, 5, (W * L, 3)), jnp.float32)
        Wi = jnp.asarray(rng.integers(-4, 5, (W * G, 3)), jnp.float32)
        Ws = jnp.asarray(rng.integers(-4, 5, (W * L, 3)), jnp.float32)

        def sm(fn):
            return jax.shard_map(fn, mesh=mesh, in_specs=SPEC, out_specs=SPEC)

        @jax.jit
        def grads(X, Wi, Ws):
            out = [jax.grad(lambda a, p=p: jnp.sum(sm(lambda l: dpx_jax.gather(
                l, plan, partial=p))(a) * Wi))(X) for p in (True, False)]
            out.append(jax.grad(lambda a: jnp.sum(sm(lambda g: dpx_jax.scatter(g, plan))(a)
                                                  * Ws))(Wi))
            out.append(jax.grad(lambda a: jnp.sum(sm(
                lambda g: dpx_jax.reduce_scatter(g, plan))(a) * Ws))(Wi))
            return out

        g_p, g_r, g_sc, g_rs = (np.asarray(a) for a in grads(X, Wi, Ws))
        wi, ws = np.asarray(Wi).reshape(W, G, 3), np.asarray(Ws).reshape(W, L, 3)
        total = wi.sum(0)
        want_g = np.zeros((W, L, 3), np.float32)
        want_sc = np.zeros((W, G, 3), np.float32)
        want_rs = np.zeros((G, 3), np.float32)
        for r in range(W):
            first, n = held(plan, r)
            want_g[r, :n] = total[first:first + n]
            want_sc[r, first:first + n] = ws[r, :n]
            want_rs[first:first + n] += ws[r, :n]
        for got, partial in ((g_p, True), (g_r, False)):
            # copies (CP unless sharded, attn-tp when replicated): the first takes it all
            first = np.array([(partial or lay.coords(r).attn_tp_rank == 0)
                              and (sharded or lay.coords(r).attn_cp_rank == 0)
                              for r in range(W)])
            np.testing.assert_array_equal(got.reshape(W, L, 3), want_g * first[:, None, None],
                                          err_msg=mode)
        np.testing.assert_array_equal(g_sc.reshape(W, G, 3), want_sc, err_msg=mode)
        np.testing.assert_array_equal(g_rs.reshape(W, G, 3), np.broadcast_to(want_rs, (W, G, 3)),
                                      err_msg=mode)


# ---------------------------------------------------------------- the LM-head scatter
def _check_columns(plan, *, counts=None, dtype="float32", seed=0):
    """Rank s holds columns s of random gathered rows (pad rows too): every device's
    output is the reference scatter of the full-width rows, its gradient every device's
    weights back at their rows, summed over the devices sharing them."""
    lay, C = plan.layout, 2
    W, G, L = lay.world_size, plan.global_rows, plan.max_slot_rows
    eff = None if counts is None else (tuple(tuple(x) for x in counts) if plan.sharded
                                       else tuple(counts))
    rng = np.random.default_rng(seed)
    full = rng.integers(-50, 50, (G, W * C)).astype(np.float64)
    weights = rng.integers(-4, 5, (W, L, W * C)).astype(np.float64)
    x = shard(mesh_for(lay), [full[:, s * C:(s + 1) * C] for s in range(W)], DTYPES[dtype])
    c = jnp.asarray(plan.num_tokens if eff is None else eff, jnp.int32)
    out, grad = columns_fn(plan, counts is not None)(
        x, c, jnp.asarray(weights.reshape(W * L, W * C), jnp.float32))
    out, grad = unstack(out, W), unstack(grad, W)
    want_grad = np.zeros_like(full)
    for r in range(W):
        rows = plan.slot_rows[lay.coords(r).attn_dp_rank]
        np.testing.assert_array_equal(out[r][:rows], ref_scatter_rank(full, plan, r, eff),
                                      err_msg=f"scatter_columns rank {r}")
        assert not out[r][rows:].any(), "rows past the slot"
        first, n = held(plan, r, eff)
        want_grad[first:first + n] += weights[r][:n]
    for s in range(W):
        np.testing.assert_array_equal(grad[s], want_grad[:, s * C:(s + 1) * C],
                                      err_msg=f"scatter_columns gradient rank {s}")


@pytest.mark.parametrize("layout", [(1, 1), (4, 4), (4, 2), (4, 1), (8, 2, 2), (4, 1, 2)],
                         ids=lambda l: "w{}dp{}".format(*l) +
                         (f"cp{l[2]}" if len(l) > 2 else ""))
def test_scatter_columns(layout):
    """The LM-head scatter in every mode: idle replicas, one replica holding everything,
    CP copies and CP shards, a capacity plan with device counts (compiled once), dtypes."""
    lay = dpx.DpLayout(*layout)
    rng = random.Random(sum(layout))
    for i, counts in enumerate(_counts(lay.dp_size, sum(layout))[1:]):
        for mode in MODES:
            dtype = ("float32", "bfloat16", "float16")[(i + len(mode)) % 3]
            _check_columns(dpx.plan_step(counts, lay, mode=mode), dtype=dtype, seed=i)
            if lay.cp_size > 1:
                shards = [(n,) + (0,) * (lay.cp_size - 1) if i else
                          (n // 2, n - n // 2) + (0,) * (lay.cp_size - 2) for n in counts]
                _check_columns(dpx.plan_step(counts, lay, mode=mode, cp_shards=shards),
                               seed=i)
    mode = MODES[sum(layout) % 3]
    cap = 8 if mode == "max_len" else 8 * lay.dp_size
    plan = dpx.plan_step([0] * lay.dp_size, lay, mode=mode, capacity=cap)
    for k in range(2):
        _check_columns(plan, counts=[rng.randint(0, min(8, cap // lay.dp_size))
                                     for _ in range(lay.dp_size)], seed=k)
    assert columns_fn(plan, True)._cache_size() == 1, "new counts must not recompile"


@pytest.mark.gpu
@pytest.mark.skipif(not jax_gpu_available(), reason="needs a JAX GPU backend")
@pytest.mark.parametrize("impl", ["triton", "xla"])
def test_scatter_columns_on_gpu(impl):
    """The LM-head scatter on the GPU's device (the ragged transport, the Triton pack
    through jax-triton or its XLA form), host and device counts, every mode, bf16."""
    lay = dpx.DpLayout(1, 1)
    mesh = mesh_for(lay)
    rng = np.random.default_rng(5)
    for mode in MODES:
        for cap in (None, 16):
            plan = dpx.plan_step([5], lay, mode=mode, capacity=cap)
            n = 3 if cap else 5
            full = jnp.asarray(rng.standard_normal((plan.global_rows, 96)), jnp.bfloat16)
            f = jax.jit(jax.shard_map(
                lambda v, c, plan=plan, cap=cap: dpx_jax.scatter_columns(
                    v, plan, counts=c if cap else None, impl=impl),
                mesh=mesh, in_specs=(SPEC, P()), out_specs=SPEC))
            got = np.asarray(f(full, jnp.asarray([n], jnp.int32)).astype(jnp.float32))
            want = np.zeros((plan.max_slot_rows, 96), np.float32)
            want[:n] = np.asarray(full[:n].astype(jnp.float32))
            np.testing.assert_array_equal(got, want, err_msg=f"{mode} capacity={cap}")


def test_a_capacity_plan_made_once_compiles_once():
    """The README's advice: a capacity plan made once serves every step's counts= with one
    compilation; plans made from each step's counts differ (a plan holds its host counts),
    so a jit given them as static values compiles for each."""
    lay = dpx.DpLayout(8, 4)
    mesh = mesh_for(lay)

    def step(x, c, plan):
        return jax.shard_map(lambda x, c: dpx_jax.gather(x, plan, partial=True, counts=c),
                             mesh=mesh, in_specs=(SPEC, P()), out_specs=SPEC)(x, c)

    steps = ([3, 0, 7, 5], [1, 2, 0, 4])
    # two functions: jit wrappers of one function share its cache
    once = jax.jit(lambda x, c, plan: step(x, c, plan), static_argnums=2)
    fresh = jax.jit(lambda x, c, plan: step(x, c, plan), static_argnums=2)
    plan = dpx.plan_step([0] * 4, lay, capacity=8)
    x = jnp.ones((8 * plan.max_slot_rows, 4))
    for counts in steps:
        c = jnp.asarray(counts, jnp.int32)
        np.testing.assert_array_equal(once(x, c, plan),
                                      fresh(x, c, dpx.plan_step(counts, lay, capacity=8)))
    assert once._cache_size() == 1 and fresh._cache_size() == len(steps)
