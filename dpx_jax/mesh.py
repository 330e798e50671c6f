"""Meshes whose device order is the dpx rank order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Tuple, Union

import jax
import numpy as np
from jax.sharding import Mesh

from dpx.errors import DpxTypeError, DpxValueError
from dpx.layout import DpLayout

__all__ = ["AXES", "Axes", "DEFAULT_AXES", "make_mesh", "Names"]

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


Names = Union[str, Tuple[str, ...], None]


def _names(value: Names, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
        return value
    raise DpxTypeError(f"Axes.{what}={value!r} must be a mesh axis name, a tuple of names or "
                       f"None")


@dataclass(frozen=True)
class Axes:
    """Which axes of the caller's mesh are the DP-attention dimensions: each a name, a
    tuple of names (flattened slowest first), or None for a dimension of size 1. The
    world is ``dp + cp + tp`` in that order (device order = rank order along them); axes
    of the mesh named in none of them (e.g. an outer ``"pp"`` or ``"fsdp"`` axis) are
    outside the DP-attention group: each op runs independently along them. Default:
    :func:`make_mesh`'s ``("dp", "cp", "tp")``."""

    dp: Names = "dp"
    cp: Names = "cp"
    tp: Names = "tp"

    def __post_init__(self) -> None:
        seen: list[str] = []
        for what in ("dp", "cp", "tp"):
            for n in _names(getattr(self, what), what):
                if n in seen:
                    raise DpxValueError(f"mesh axis {n!r} is named twice in {self}")
                seen.append(n)

    def of(self, dim: str) -> tuple[str, ...]:
        return _names(getattr(self, dim), dim)

    @property
    def world(self) -> tuple[str, ...]:
        return self.of("dp") + self.of("cp") + self.of("tp")

    def check(self, layout: DpLayout) -> None:
        """Inside ``shard_map``: the named axes have the layout's sizes (a dpx error naming
        the axis and the sizes otherwise)."""
        import jax.lax as lax

        for dim, want in (("dp", layout.dp_size), ("cp", layout.cp_size),
                          ("tp", layout.attn_tp_size)):
            names = self.of(dim)
            try:
                got = 1
                for n in names:
                    got *= lax.axis_size(n)
            except (NameError, KeyError, ValueError) as exc:
                raise DpxValueError(f"Axes.{dim}={getattr(self, dim)!r} names an axis the "
                                    f"mesh being traced does not have ({exc})") from None
            if got != want:
                raise DpxValueError(f"Axes.{dim}={getattr(self, dim)!r} spans {got} devices; "
                                    f"layout {layout.describe()} needs {want}")


DEFAULT_AXES = Axes()
