"""The demo's JAX runner: shard_map over simulated CPU devices (see ``dpx.demo``)."""

from __future__ import annotations

import time

import numpy as np

from dpx.demo import DemoProblem


def run(problem: DemoProblem) -> list[dict]:
    """Per step: ``out`` (per rank), ``gathered`` (per rank), ``gather_ok``, ``ms``."""
    import jax

    try:  # simulated CPU devices; possible only before JAX's backends start
        jax.config.update("jax_num_cpu_devices", max(problem.world, 1))
    except RuntimeError:
        pass
    if jax.device_count() < problem.world:
        raise SystemExit(f"the JAX demo needs {problem.world} devices; JAX has "
                         f"{jax.device_count()}")
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from dpx_jax import AXES, gather, make_mesh, reduce_scatter

    lay = problem.layout
    mesh = make_mesh(lay)
    spec = NamedSharding(mesh, P(AXES))
    w1 = np.concatenate([problem.shard(r)[0] for r in range(lay.world_size)], axis=1)
    w2 = np.concatenate([problem.shard(r)[1] for r in range(lay.world_size)], axis=0)
    k = problem.ffn // lay.world_size
    w1s = jax.device_put(jnp.asarray(w1.T.reshape(lay.world_size * k, -1)), spec)  # per rank W1^T
    w2s = jax.device_put(jnp.asarray(w2), spec)
    steps = []
    for step in range(problem.steps):
        plan = problem.plan(step)
        rows = plan.max_slot_rows
        locs = []
        for r in range(lay.world_size):
            n = plan.num_tokens[lay.coords(r).attn_dp_rank]
            x = np.zeros((rows, problem.hidden), np.float32)
            x[:n] = problem.partial_states(step, r, n)
            locs.append(x)
        local = jax.device_put(jnp.asarray(np.concatenate(locs)), spec)

        def body(x, w1t, w2_):
            g = gather(x, plan, partial=True)
            h = jnp.maximum(g @ w1t.T, 0) @ w2_
            return g, reduce_scatter(h, plan)

        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(AXES),) * 3,
                                  out_specs=(P(AXES), P(AXES))))
        jax.block_until_ready(f(local, w1s, w2s))  # compile outside the timing
        t0 = time.perf_counter()
        g, out = jax.block_until_ready(f(local, w1s, w2s))
        ms = (time.perf_counter() - t0) * 1e3
        g = np.asarray(g).reshape(lay.world_size, plan.global_rows, -1)
        out = np.asarray(out).reshape(lay.world_size, rows, -1)
        outs = [out[r][:plan.slot_rows[lay.coords(r).attn_dp_rank]] for r in range(lay.world_size)]
        steps.append(dict(out=outs, gathered=list(g), ms=ms,
                          gather_ok=all(np.array_equal(x, g[0]) for x in g)))
        print(f"  [jax] step {step} done", flush=True)
    return steps
