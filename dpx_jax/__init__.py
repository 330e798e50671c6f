"""JAX frontend of dpx: DP-attention gather/scatter inside ``jax.shard_map``."""

from dpx_jax.counts import exchange_counts
from dpx_jax.mesh import AXES, Axes, make_mesh
from dpx_jax.ops import gather, gather_with_counts, reduce_scatter, scatter, scatter_columns
from dpx_jax.padrows import local_count, local_row_mask, mask_pad_rows, pad_row_mask
from dpx_jax.rows import Impl, pack_rows, place_rows, take_rows, unpack_rows
from dpx_jax.wire import split_wire

__all__ = [
    "AXES", "Axes", "Impl", "exchange_counts", "gather", "gather_with_counts", "local_count",
    "local_row_mask", "make_mesh", "mask_pad_rows", "pack_rows", "pad_row_mask", "place_rows",
    "reduce_scatter", "scatter", "scatter_columns", "split_wire", "take_rows", "unpack_rows",
]
