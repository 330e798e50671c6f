"""Counts exchanged on the device inside ``shard_map`` (:mod:`dpx.counts`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from dpx.errors import DpxTypeError
from dpx_jax.mesh import DEFAULT_AXES, Axes

__all__ = ["check_n_local", "exchange_counts"]


def check_n_local(n_local: object) -> None:
    """A device's own count: one integer."""
    if not hasattr(n_local, "dtype") or not jnp.issubdtype(n_local.dtype, jnp.integer) \
            or n_local.size != 1:
        got = (f"shape {tuple(n_local.shape)} dtype {n_local.dtype}"
               if hasattr(n_local, "dtype") and hasattr(n_local, "shape") else repr(n_local))
        raise DpxTypeError(f"n_local must be one integer per device (an integer array of "
                           f"one element), got {got}")


def exchange_counts(n_local: jax.Array, *, shards: bool = False,
                    axes: Axes = DEFAULT_AXES) -> jax.Array:
    """This device's real count (int32, shape ``(1,)`` or scalar) -> the per-replica counts
    int32 ``[dp]`` (``shards=True``: the ``[dp, cp]`` shard table): an all-gather over the
    ``dp`` axis (``dp`` and ``cp``), so entry d is the report of replica d's device with
    this device's CP and attn-tp coordinates, as in ``DpComm.exchange_counts``. Call it
    inside ``shard_map``; ``axes`` names the mesh's dp / cp / tp axes."""
    check_n_local(n_local)
    n = jnp.reshape(n_local, (1,)).astype(jnp.int32)
    dp, cp = axes.of("dp"), axes.of("cp")
    names = dp + cp if shards else dp
    got = lax.all_gather(n, names, axis=0, tiled=True) if names else n
    if not shards:
        return got
    size = 1
    for a in cp:
        size *= lax.axis_size(a)
    return got.reshape(-1, size)
