"""Which rows of a gathered buffer are real: replica ``d``'s are ``[o_d, o_d + n_d)``;
every other row of ``[0, global_rows)`` is a pad row (``mask_pad_rows`` in both frontends).
"""

from __future__ import annotations

from typing import Any

from dpx.geometry import INTS, geometry
from dpx.plan import DpPlan
from dpx.routes import symbolic_geometry

__all__ = ["real_ranges"]


def real_ranges(plan: DpPlan, *, device_counts: bool) -> tuple[Any, Any]:
    """``(firsts, lens)``, one entry per replica: the global rows ``[firsts[d], firsts[d] +
    lens[d])`` are replica d's real rows. Tuples of ints for the plan's host counts;
    :mod:`dpx.expr` vectors over the device counts (a ``[dp]`` vector, or a ``[dp, cp]``
    shard table row by row) when ``device_counts`` (capacity plans)."""
    if device_counts:
        g = symbolic_geometry(plan.structure)
    else:
        g = geometry(plan.structure, INTS, plan.leaf_counts)
    return g.offsets, g.n
