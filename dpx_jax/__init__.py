"""JAX frontend of dpx: DP-attention gather/scatter inside ``jax.shard_map``."""

from dpx_jax.mesh import AXES, make_mesh
from dpx_jax.ops import gather, reduce_scatter, scatter
from dpx_jax.rows import Impl, pack_rows, place_rows, take_rows, unpack_rows

__all__ = ["AXES", "Impl", "gather", "make_mesh", "pack_rows", "place_rows", "reduce_scatter",
           "scatter", "take_rows", "unpack_rows"]
