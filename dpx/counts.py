"""Counts exchanged between ranks.

``exchange_counts(n_local)`` all-gathers every rank's own count (an int32 scalar) over the
world and keeps, for replica ``d`` (or, with ``shards=True``, for CP rank ``c`` of replica
``d``), the report of the rank with this rank's CP and attn-tp coordinates in that replica
(this rank's attn-tp coordinate in that CP rank): the same rank a JAX ``all_gather`` over
the ``dp`` axis (or ``dp`` and ``cp``) reads. The ranks that must agree are the replica's
ranks (the CP rank's attn-tp ranks for shards); :func:`disagreements` names the ones that
do not.
"""

from __future__ import annotations

from dpx.layout import DpLayout

__all__ = ["disagreements", "sources"]


def sources(layout: DpLayout, rank: int, *, shards: bool) -> tuple[int, ...]:
    """World ranks whose reports make rank ``rank``'s result, in result order (``[dp]``, or
    ``[dp, cp]`` row by row)."""
    me = layout.coords(rank)
    tp, cp = layout.attn_tp_size, layout.cp_size
    if shards:
        return tuple((d * cp + c) * tp + me.attn_tp_rank
                     for d in range(layout.dp_size) for c in range(cp))
    return tuple((d * cp + me.attn_cp_rank) * tp + me.attn_tp_rank
                 for d in range(layout.dp_size))


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
