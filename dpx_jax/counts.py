"""Counts exchanged on the device inside ``shard_map`` (:mod:`dpx.counts`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from dpx.errors import DpxTypeError


def exchange_counts(n_local: jax.Array, *, shards: bool = False) -> jax.Array:
    """This device's real count (int32, shape ``(1,)`` or scalar) -> the per-replica counts
    int32 ``[dp]`` (``shards=True``: the ``[dp, cp]`` shard table): an all-gather over the
    ``dp`` axis (``dp`` and ``cp``), so entry d is the report of replica d's device with
    this device's CP and attn-tp coordinates, as in ``DpComm.exchange_counts``. Call it
    inside ``shard_map`` over a :func:`dpx_jax.make_mesh` mesh."""
    if not hasattr(n_local, "dtype") or not jnp.issubdtype(n_local.dtype, jnp.integer) \
            or n_local.size != 1:
        raise DpxTypeError(f"n_local must be one integer per device, got "
                           f"{getattr(n_local, 'shape', n_local)!r}")
    n = jnp.reshape(n_local, (1,)).astype(jnp.int32)
    if shards:
        got = lax.all_gather(n, ("dp", "cp"), axis=0, tiled=True)
        return got.reshape(lax.axis_size("dp"), lax.axis_size("cp"))
    return lax.all_gather(n, "dp", axis=0, tiled=True)
