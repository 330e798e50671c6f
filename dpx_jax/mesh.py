"""Meshes whose device order is the dpx rank order."""

from __future__ import annotations

from typing import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from dpx.errors import DpxTypeError, DpxValueError
from dpx.layout import DpLayout

#: Mesh axes, slowest first; together they are the world (rank order = device order).
AXES: tuple[str, str, str] = ("dp", "cp", "tp")


def make_mesh(layout: DpLayout, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ``Mesh`` of shape ``(dp_size, cp_size, attn_tp_size)`` over axes ``("dp","cp","tp")``.

    ``devices`` (default ``jax.devices()``) lists rank 0 first; exactly ``world_size`` of
    them are used (the first ones), so ``mesh.devices.flat[r]`` is rank ``r``.
    """
    if not isinstance(layout, DpLayout):
        raise DpxTypeError(f"layout={layout!r} must be a dpx.DpLayout")
    devs = list(jax.devices() if devices is None else devices)
    if len(devs) < layout.world_size:
        raise DpxValueError(f"layout.world_size={layout.world_size} needs that many devices; "
                            f"{len(devs)} given")
    grid = np.array(devs[:layout.world_size], dtype=object).reshape(
        layout.dp_size, layout.cp_size, layout.attn_tp_size)
    return Mesh(grid, AXES)
