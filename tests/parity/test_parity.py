"""Cross-frontend parity: the same NumPy inputs through dpx_torch (gloo processes) and
dpx_jax (shard_map on simulated CPU devices) give the same outputs and gradients.

Bitwise for gather and scatter (no arithmetic beyond the attn-tp sum, where two addends
commute) and for reduce_scatter on small integers (exact sums in any order). On random
floats a sum of more than two addends follows each collective's own order, so those
results (reduce_scatter; a partial gather with attn_tp > 2) are compared within
``4 * addends * eps(float32) * max|x|``, a bound on reordering error for that many terms.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import dpx  # noqa: E402
import dpx_jax  # noqa: E402
from jax_harness import SPEC, columns_fn, mesh_for, shard, step_fn, unstack  # noqa: E402
from reference import global_inputs, local_inputs  # noqa: E402

pytestmark = pytest.mark.multiproc

DT = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "int32": jnp.int32}
REST = (5,)


def _cases(dp: int, cp: int = 1):
    counts = [[0] + [4] * (dp - 1), [9] + [0] * (dp - 1), [(2 * i + 1) % 7 for i in range(dp)]]
    out = []
    if cp > 1:  # CP ranks holding shards: uneven, empty, all on the last CP rank
        for i, (c, mode) in enumerate(itertools.product(counts, ["max_len", "sum_len",
                                                                 "gatherv"])):
            shards = [((n + 1) // 2,) + (n // 2,) if i % 2 else (0,) * (cp - 1) + (n,)
                      for n in c] if cp == 2 else [(0,) * (cp - 1) + (n,) for n in c]
            out.append(dict(counts=c, mode=mode, partial=i % 2 == 0, seed=60 + i,
                            shards=shards, grads=i % 3 == 0))
        out.append(dict(counts=[1] * dp, mode="gatherv", capacity=16, shards=[(1,) + (0,) * (cp - 1)] * dp,
                        run_counts=[[2] + [1] * (cp - 1)] * dp, partial=True, seed=70))
    for i, (c, mode, partial) in enumerate(itertools.product(
            counts, ["max_len", "sum_len", "gatherv"], (True, False))):
        out.append(dict(counts=c, mode=mode, partial=partial, seed=i, grads=i % 3 == 0,
                        dtype=("float32", "bfloat16", "int32")[i % 3]))
    out.append(dict(counts=[1] * dp, mode="max_len", capacity=8, run_counts=[8] + [0] * (dp - 1),
                    partial=True, seed=99))
    out.append(dict(counts=[1] * dp, mode="sum_len", capacity=16,
                    run_counts=[5] + [2] * (dp - 1), partial=False, seed=98))
    out.append(dict(counts=[2 + d for d in range(dp)], mode="sum_len", partial=True, seed=97,
                    floats=True))
    out.append(dict(counts=[2 + d for d in range(dp)], mode="max_len", partial=False, seed=96,
                    floats=True))
    return out


def _jax_outputs(layout, case):
    plan = dpx.plan_step(case["counts"], layout, mode=case["mode"], capacity=case.get("capacity"),
                         cp_shards=case.get("shards"))
    run = case.get("run_counts")
    eff = None if run is None else (tuple(map(tuple, run)) if plan.sharded else tuple(run))
    floats = case.get("floats", False)
    locs = local_inputs(case["seed"], plan, REST, partial=case["partial"],
                        rows=plan.max_slot_rows, floats=floats, eff=eff)
    globs = global_inputs(case["seed"], plan, REST, floats=floats)
    mesh = mesh_for(layout)
    dt = DT[case["dtype"]] if "dtype" in case else jnp.float32
    f = step_fn(plan, case["partial"], "auto", run is not None)
    c = jnp.asarray(plan.num_tokens if eff is None else eff, jnp.int32)
    g, sc, rs = f(shard(mesh, locs, dt), shard(mesh, globs, dt), c)
    out = dict(gather=unstack(g, layout.world_size), scatter=unstack(sc, layout.world_size),
               reduce_scatter=unstack(rs, layout.world_size))
    if case.get("grads") and dt != jnp.int32 and run is None:
        W = layout.world_size
        rng = np.random.default_rng(case["seed"] + 1)
        wg = jnp.asarray(np.concatenate([rng.integers(-4, 5, (plan.global_rows, *REST))
                                         for _ in range(W)]), dt)
        ws = jnp.asarray(np.concatenate([rng.integers(-4, 5, (plan.max_slot_rows, *REST))
                                         for _ in range(W)]), dt)

        def loss_g(x):
            y = jax.shard_map(lambda l: dpx_jax.gather(l, plan, partial=case["partial"]),
                              mesh=mesh, in_specs=SPEC, out_specs=SPEC)(x)
            return jnp.sum(y * wg)

        def loss_rs(x):
            y = jax.shard_map(lambda l: dpx_jax.reduce_scatter(l, plan), mesh=mesh,
                              in_specs=SPEC, out_specs=SPEC)(x)
            return jnp.sum(y * ws)

        out["grad_gather"] = unstack(jax.jit(jax.grad(loss_g))(shard(mesh, locs, dt)), W)
        out["grad_rs"] = unstack(jax.jit(jax.grad(loss_rs))(shard(mesh, globs, dt)), W)
        # the LM-head scatter of the same buffers, and its gradient for columns weights
        wc = np.random.default_rng(case["seed"] + 2).integers(
            -4, 5, (W * plan.max_slot_rows, W * REST[0]))
        cols, grad = columns_fn(plan, False)(shard(mesh, globs, dt), c,
                                             jnp.asarray(wc, jnp.float32))
        out["columns"], out["grad_columns"] = unstack(cols, W), unstack(grad, W)
    return plan, out


@pytest.mark.parametrize("layout_args", [(4, 4), (4, 2), (4, 1), (2, 2), (4, 1, 2)],
                         ids=lambda l: f"w{l[0]}dp{l[1]}" + (f"cp{l[2]}" if len(l) > 2 else ""))
def test_torch_and_jax_agree(gloo_worlds, layout_args):
    """Both torch transports against one JAX run: per_root and peer (the peer transport's
    world steps on the host's shared memory; its reduce_scatter sums in rank order, which
    the bound below covers as it covers the backends' orders)."""
    layout = dpx.DpLayout(*layout_args)
    cases = _cases(layout.dp_size, layout.cp_size)
    world = gloo_worlds(layout.world_size)
    torch_outs = {tr: world.run("torch_jobs:outputs", layout_args, cases, rest=REST,
                                transport=tr) for tr in ("per_root", "peer")}
    for i, case in enumerate(cases):
        plan, jx = _jax_outputs(layout, case)
        for (tr, torch_out), r in itertools.product(torch_outs.items(),
                                                    range(layout.world_size)):
            t = torch_out[r][i]
            rows = plan.slot_rows[layout.coords(r).attn_dp_rank]
            where = f"case {case} rank {r} transport {tr}"
            if case.get("floats") and case["partial"] and layout.attn_tp_size > 2:
                # more than two partial addends: each side sums in its collective's order
                bound = 4 * layout.attn_tp_size * np.finfo(np.float32).eps * \
                    max(1.0, float(np.abs(jx["gather"][r]).max(initial=0)))
                np.testing.assert_allclose(t["gather"], jx["gather"][r], rtol=0, atol=bound,
                                           err_msg="gather " + where)
                np.testing.assert_allclose(t["scatter"], jx["scatter"][r][:rows], rtol=0,
                                           atol=bound, err_msg="scatter " + where)
            else:
                np.testing.assert_array_equal(t["gather"], jx["gather"][r],
                                              err_msg="gather " + where)
                np.testing.assert_array_equal(t["scatter"], jx["scatter"][r][:rows],
                                              err_msg="scatter " + where)
            if case.get("floats"):
                bound = 4 * layout.world_size * np.finfo(np.float32).eps * \
                    max(1.0, float(np.abs(jx["reduce_scatter"][r]).max(initial=0)))
                np.testing.assert_allclose(t["reduce_scatter"], jx["reduce_scatter"][r][:rows],
                                           rtol=0, atol=bound, err_msg="rs " + where)
            else:
                np.testing.assert_array_equal(t["reduce_scatter"], jx["reduce_scatter"][r][:rows],
                                              err_msg="reduce_scatter " + where)
            if "columns" in jx:
                np.testing.assert_array_equal(t["columns"], jx["columns"][r][:rows],
                                              err_msg="scatter_columns " + where)
                np.testing.assert_array_equal(t["grad_columns"], jx["grad_columns"][r],
                                              err_msg="scatter_columns grad " + where)
            if "grad_gather" in jx:
                # copies of one value (attn-tp copies of a replicated gather, CP copies
                # unless sharded): torch gives each copy the value's gradient, JAX the
                # first copy (JAX sums the copies' cotangents where they meet)
                c = layout.coords(r)
                cp = c.attn_cp_rank if plan.sharded else 0
                tp = c.attn_tp_rank if case["partial"] else 0
                r0 = (c.attn_dp_rank * layout.cp_size + cp) * layout.attn_tp_size + tp
                np.testing.assert_array_equal(t["grad_gather"], jx["grad_gather"][r0],
                                              err_msg="grad gather " + where)
                if r != r0:
                    assert not np.any(jx["grad_gather"][r]), "grad gather " + where
                np.testing.assert_array_equal(t["grad_rs"], jx["grad_rs"][r],
                                              err_msg="grad rs " + where)
