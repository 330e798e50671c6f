"""Which rows of a gathered buffer are real token rows: one definition for
``mask_pad_rows`` / ``pad_row_mask`` in both frontends.

Replica ``d``'s real rows are global rows ``[o_d, o_d + n_d)`` (``o_d`` its slot's first
row, :mod:`dpx.geometry`; with CP shards, ``n_d`` is the sum of its shards, which lie back
to back from the slot's start). Every other row of ``[0, plan.global_rows)`` -- slot
padding, alignment rows, idle replicas' slots, the tail past the last slot -- is a pad row.
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
