"""Pad rows for JAX (:func:`dpx.extents.real_ranges`). Of a gathered buffer:
``mask_pad_rows`` returns it with every row that is not a real token row set to
``fill``; ``pad_row_mask`` the boolean mask (inside or outside ``shard_map``). Of a
device's own rows (its ``local`` input of a gather, its scatter / reduce_scatter output):
``local_count`` is how many are real (its replica's count, or its CP shard) and
``local_row_mask`` marks them (inside ``shard_map``). ``counts`` (int32 ``[dp_size]``, or a ``[dp_size, cp_size]`` shard table;
capacity plans only) are data, so new counts never recompile."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dpx import values as V
from dpx.errors import DpxTypeError, DpxValueError
from dpx.extents import fill_bits, real_ranges
from dpx.plan import DpPlan, check_plan
from dpx.routes import symbolic_geometry, symbolic_rank
from dpx_jax.interpreter import JaxValues
from dpx_jax.mesh import DEFAULT_AXES, Axes
from dpx_jax.ops import _axes, _counts
from dpx_jax.rows import is_array

__all__ = ["local_count", "local_row_mask", "mask_pad_rows", "pad_row_mask"]


def pad_row_mask(plan: DpPlan, *, counts: jax.Array | None = None) -> jax.Array:
    """Boolean ``[plan.global_rows]``: True at the rows :func:`mask_pad_rows` fills."""
    check_plan(plan)
    c = _counts(plan, counts)
    ops, memo = JaxValues(c), {}
    firsts, lens = (jnp.asarray(V.evaluate(v, ops, memo), jnp.int32)
                    for v in real_ranges(plan, device_counts=c is not None))
    rows = jnp.arange(plan.global_rows, dtype=jnp.int32)[:, None]
    return ~jnp.any((rows >= firsts) & (rows < firsts + lens), axis=1)


def mask_pad_rows(t: jax.Array, plan: DpPlan, *, counts: jax.Array | None = None,
                  fill: int | float = -1) -> jax.Array:
    """``t [plan.global_rows, ...]`` with every pad row (slot padding, alignment rows, idle
    replicas; every mode) set to ``fill``, a value of ``t``'s dtype stored as the element
    :func:`dpx.extents.fill_bits` gives (the same bits as dpx_torch's)."""
    check_plan(plan)
    if not is_array(t):
        raise DpxTypeError(f"t must be an array, got {type(t).__name__}")
    if len(t.shape) < 1 or t.shape[0] != plan.global_rows:
        raise DpxValueError(f"t must be an array of plan.global_rows={plan.global_rows} "
                            f"rows, got shape {t.shape}")
    bits, size = fill_bits(fill, t.dtype.name)
    pad = pad_row_mask(plan, counts=counts).reshape((-1,) + (1,) * (t.ndim - 1))
    if t.dtype == jnp.bool_:
        return jnp.where(pad, bool(bits), t)
    # the fill's bits through the integer view: the same element as every frontend stores
    it = {1: jnp.int8, 2: jnp.int16, 4: jnp.int32, 8: jnp.int64}[size]
    ti = jax.lax.bitcast_convert_type(t, it)
    return jax.lax.bitcast_convert_type(jnp.where(pad, jnp.asarray(bits, it), ti), t.dtype)


def local_count(plan: DpPlan, *, counts: jax.Array | None = None,
                axes: Axes = DEFAULT_AXES) -> jax.Array:
    """Inside ``shard_map``: this device's real rows, an int32 scalar -- its replica's
    count, or its CP rank's shard with a sharded plan (the rows of ``local`` a gather reads,
    and the real rows at the start of its scatter / reduce_scatter output)."""
    check_plan(plan)
    axes = _axes(axes)
    axes.check(plan.layout)   # (the mesh being traced must be the plan's layout)
    c = _counts(plan, counts)
    if c is None:   # the plan's own counts, as constants
        c = jnp.asarray(plan.leaf_counts, jnp.int32)
    r = symbolic_rank()
    held = symbolic_geometry(plan.structure).held(r.dp, r.cp)
    return jnp.asarray(V.evaluate(held, JaxValues(c, axes), {}), jnp.int32).reshape(())


def local_row_mask(plan: DpPlan, *, counts: jax.Array | None = None,
                   axes: Axes = DEFAULT_AXES) -> jax.Array:
    """Inside ``shard_map``: boolean ``[plan.max_slot_rows]``, True at this device's real
    rows (:func:`local_count` of them, first) -- e.g. to mask a per-token loss over the
    rows a scatter / reduce_scatter returns."""
    return jnp.arange(plan.max_slot_rows, dtype=jnp.int32) < local_count(plan, counts=counts,
                                                                         axes=axes)
