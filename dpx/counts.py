"""Counts exchanged between ranks: whose report each entry keeps (:func:`sources`: the
rank with this rank's CP and attn-tp coordinates in each replica, as a JAX all-gather
over ``dp`` reads), and which groups disagree (:func:`disagreements`).
"""

from __future__ import annotations

from typing import Any

from dpx.layout import DpLayout

__all__ = ["disagreements", "own_entry", "sources"]


def sources(layout: DpLayout, rank: int, *, shards: bool) -> tuple[int, ...]:
    """World ranks whose reports make rank ``rank``'s result, in result order (``[dp]``, or
    ``[dp, cp]`` row by row)."""
    me = layout.coords(rank)
    if shards:
        return tuple(layout.rank_of(d, c, me.attn_tp_rank)
                     for d in range(layout.dp_size) for c in range(layout.cp_size))
    return tuple(layout.rank_of(d, me.attn_cp_rank, me.attn_tp_rank)
                 for d in range(layout.dp_size))


def own_entry(dp: Any, cp: Any, cp_size: int, *, shards: bool) -> Any:
    """The entry of a rank's own count in a counts vector (``[dp]``, or ``[dp, cp]`` row by
    row with ``shards``), from its DP and CP coordinates (ints, or a frontend's arrays)."""
    return dp * cp_size + cp if shards else dp


def disagreements(layout: DpLayout, reports: tuple[int, ...], *,
                  shards: bool) -> list[str]:
    """For every world rank's report (rank order), the groups whose ranks must report the
    same count and do not, described for an error message."""
    tp, per = layout.attn_tp_size, layout.replica_size
    out = []
    size = tp if shards else per
    for first in range(0, layout.world_size, size):
        group = reports[first:first + size]
        if len(set(group)) > 1:
            c = layout.coords(first)
            what = (f"replica {c.attn_dp_rank} CP rank {c.attn_cp_rank}" if shards
                    else f"replica {c.attn_dp_rank}")
            out.append(f"{what} (ranks {first}..{first + size - 1}) reported "
                       f"{list(group)}")
    return out
