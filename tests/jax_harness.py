"""Helpers to run dpx_jax ops under shard_map on the simulated devices, with inputs from
reference.py stacked per device (device r's block is rank r's array)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import dpx
import dpx_jax

SPEC = P(dpx_jax.AXES)


def shard(mesh, per_rank: list[np.ndarray], dtype) -> jax.Array:
    x = jnp.asarray(np.concatenate(per_rank), dtype)
    return jax.device_put(x, NamedSharding(mesh, SPEC))


def unstack(x: jax.Array, world: int) -> np.ndarray:
    a = np.asarray(x.astype(jnp.float32) if x.dtype == jnp.bfloat16 else x)
    return a.reshape(world, -1, *a.shape[1:])


@functools.cache
def mesh_for(layout: dpx.DpLayout):
    return dpx_jax.make_mesh(layout)


@functools.cache
def step_fn(plan: dpx.DpPlan, partial: bool, impl: str = "auto", with_counts: bool = False):
    """One jitted shard_map running gather -> scatter and reduce_scatter, cached per plan."""
    mesh = mesh_for(plan.layout)

    def body(local, glob, counts):
        c = counts if with_counts else None
        g = dpx_jax.gather(local, plan, partial=partial, counts=c, impl=impl)
        return (g, dpx_jax.scatter(g, plan, counts=c, impl=impl),
                dpx_jax.reduce_scatter(glob, plan, counts=c, impl=impl))

    f = jax.shard_map(body, mesh=mesh, in_specs=(SPEC, SPEC, P()),
                      out_specs=(SPEC, SPEC, SPEC))
    return jax.jit(f)


@functools.cache
def columns_fn(plan: dpx.DpPlan, with_counts: bool):
    """One jitted program per plan: ``scatter_columns`` and the gradient of its output's
    inner product with ``w`` (float32)."""
    sm = jax.shard_map(lambda x, c: dpx_jax.scatter_columns(x, plan, counts=c if with_counts
                                                            else None),
                       mesh=mesh_for(plan.layout), in_specs=(SPEC, P()), out_specs=SPEC)

    @jax.jit
    def f(x, c, w):
        out = sm(x, c)
        return out, jax.grad(lambda a: jnp.sum(sm(a, c).astype(jnp.float32) * w))(x)
    return f
