"""dpx_jax on the caller's own mesh: renamed axes, a dimension spread over two axes, no cp
axis, and an extra outer axis the ops are replicated over (8 simulated CPU devices); every
op (gather, scatter, reduce_scatter, gradients, exchange_counts) equals the reference."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import dpx  # noqa: E402
import dpx_jax  # noqa: E402
from reference import (global_inputs, local_inputs, ref_gather,  # noqa: E402
                       ref_reduce_scatter_rank, ref_scatter_rank)

CASES = [
    # (mesh axes and sizes, layout, Axes) -- the outer axes are the mesh's leading ones
    ((("pp", 2), ("data", 2), ("tensor", 2)), (4, 2), dict(dp="data", cp=None, tp="tensor")),
    ((("data", 2), ("ctx", 2), ("tensor", 2)), (8, 2, 2), dict(dp="data", cp="ctx",
                                                               tp="tensor")),
    ((("a", 2), ("b", 2), ("t", 2)), (8, 4), dict(dp=("a", "b"), cp=None, tp="t")),
    ((("fsdp", 2), ("expert", 4)), (4, 4), dict(dp="expert", cp=None, tp=None)),
]


@pytest.mark.parametrize("mesh_axes,layout,axes", CASES, ids=["pp-outer", "cp", "dp-split",
                                                              "no-tp"])
@pytest.mark.parametrize("mode", ["max_len", "gatherv", "sum_len"])
def test_named_axes_match_the_reference(mesh_axes, layout, axes, mode):
    lay = dpx.DpLayout(*layout)
    ax = dpx_jax.Axes(**axes)
    names = tuple(n for n, _ in mesh_axes)
    mesh = Mesh(np.array(jax.devices()[:8]).reshape([s for _, s in mesh_axes]), names)
    outer = [n for n in names if n not in ax.world]
    reps = int(np.prod([dict(mesh_axes)[n] for n in outer])) if outer else 1
    counts = [3 if i % 2 == 0 else 0 for i in range(lay.dp_size)]
    counts[-1] = 5
    plan = dpx.plan_step(counts, lay, mode=mode)
    spec = P(names)
    H = 128
    locs = local_inputs(1, plan, (H,), partial=True, rows=plan.max_slot_rows)
    globs = global_inputs(2, plan, (H,))
    mine = [np.array([counts[lay.coords(r).attn_dp_rank]]) for r in range(lay.world_size)]

    def body(x, g, n):
        y = dpx_jax.gather(x, plan, partial=True, axes=ax)
        loss = lambda v: jnp.sum(dpx_jax.gather(v, plan, partial=True, axes=ax) ** 2)
        ones = lambda v: jnp.sum(dpx_jax.gather(v, plan, partial=False, axes=ax))
        return (y, dpx_jax.scatter(y, plan, axes=ax),
                dpx_jax.reduce_scatter(g, plan, axes=ax),
                jnp.stack([jax.grad(loss)(x), jax.grad(ones)(x)]),
                dpx_jax.exchange_counts(n, axes=ax)[None],
                dpx_jax.gather(x, plan, partial=True, axes=ax, wire="fp8")
                if mode != "sum_len" else y)

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(spec, spec, spec),
                              out_specs=spec))
    put = lambda a, dt: jax.device_put(jnp.asarray(np.concatenate(a * reps), dt),
                                       NamedSharding(mesh, spec))
    y, sc, rs, gr, ex, fp8 = (np.asarray(v) for v in f(put(locs, jnp.float32),
                                                       put(globs, jnp.float32),
                                                       put(mine, jnp.int32)))
    W = lay.world_size
    want = ref_gather(locs, plan, partial=True)
    for k in range(reps * W):
        r = k % W
        rows = plan.slot_rows[lay.coords(r).attn_dp_rank]
        blk = lambda a: a.reshape(reps * W, -1, *a.shape[1:])[k]
        np.testing.assert_array_equal(blk(y), want)
        np.testing.assert_array_equal(blk(sc)[:rows], ref_scatter_rank(want, plan, r))
        np.testing.assert_array_equal(blk(rs)[:rows],
                                      ref_reduce_scatter_rank(globs, plan, r))
        # d/dx sum(gather(x)^2) = reduce_scatter(2 * gather(x)) on the rank's rows; of
        # CP copies, on the first (CP rank 0 along the named axis) alone
        held = counts[lay.coords(r).attn_dp_rank]
        first = lay.coords(r).attn_cp_rank == 0
        g2 = gr.reshape(reps * W, 2, -1, H)[k]
        np.testing.assert_allclose(g2[0][:held], first * ref_reduce_scatter_rank(
            [2 * want] * W, plan, r)[:held], rtol=1e-6)
        # sum(gather(x, partial=False)): the attn-tp and CP copies' first (along the named
        # axes) gets every device's ones on its real rows, the others zeros
        first = first and lay.coords(r).attn_tp_rank == 0
        np.testing.assert_array_equal(g2[1][:held], np.full((held, H), W * first))
        assert not np.any(g2[1][held:])
        np.testing.assert_array_equal(blk(ex)[0], counts)
        err = np.abs(blk(fp8) - want)
        assert (err <= np.abs(want) / 16 + 1e-6).all()


def test_axes_errors():
    lay = dpx.DpLayout(4, 2)
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("data", "tensor"))
    plan = dpx.plan_step([3, 1], lay)
    x = jnp.zeros((4 * plan.max_slot_rows, 4))

    def run(ax):
        return jax.shard_map(lambda v: dpx_jax.gather(v, plan, partial=True, axes=ax),
                             mesh=mesh, in_specs=P(("data", "tensor")),
                             out_specs=P(("data", "tensor")))(x)

    with pytest.raises(dpx.DpxValueError, match=r"Axes.tp=None spans 1 devices; layout .* "
                                                 r"needs 2"):
        run(dpx_jax.Axes(dp="data", cp=None, tp=None))
    with pytest.raises(dpx.DpxValueError, match=r"Axes.dp='dp' names an axis"):
        run(dpx_jax.Axes())
    with pytest.raises(dpx.DpxValueError, match="named twice"):
        dpx_jax.Axes(dp="data", cp=None, tp="data")
