"""Which rows of a gathered buffer are real token rows: one definition for
``mask_pad_rows`` / ``pad_row_mask`` in both frontends.

Replica ``d``'s real rows are global rows ``[o_d, o_d + n_d)`` (``o_d`` its slot's first
row, :mod:`dpx.geometry`; with CP shards, ``n_d`` is the sum of its shards, which lie back
to back from the slot's start). Every other row of ``[0, plan.global_rows)`` -- slot
padding, alignment rows, idle replicas' slots, the tail past the last slot -- is a pad row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dpx import expr as X
from dpx.geometry import geometry, host_counts, structure_of

__all__ = ["real_ranges"]

if TYPE_CHECKING:
    from dpx.plan import DpPlan


def real_ranges(plan: "DpPlan", *, device_counts: bool) -> tuple[Any, Any]:
    """``(firsts, lens)``, one entry per replica: the global rows ``[firsts[d], firsts[d] +
    lens[d])`` are replica d's real rows. Tuples of ints for the plan's host counts;
    :mod:`dpx.expr` vectors over the device counts (a ``[dp]`` vector, or a ``[dp, cp]``
    shard table row by row) when ``device_counts`` (capacity plans)."""
    g = geometry(structure_of(plan))
    if device_counts:
        return g.offsets, g.n
    counts = host_counts(plan)
    return X.substitute(g.offsets, counts=counts), X.substitute(g.n, counts=counts)
