"""Counts: the rule a capacity plan's counts obey, host or device (:class:`CountRule`),
whose report each entry of an exchange keeps (:func:`sources`: the rank with this rank's
CP and attn-tp coordinates in each replica, as a JAX all-gather over ``dp`` reads), and
which groups disagree (:func:`disagreements`).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

from dpx.ints import INTS
from dpx.layout import DpLayout

__all__ = ["CountRule", "disagreements", "own_entry", "sources"]


class CountRule(NamedTuple):
    """What a capacity plan's counts obey: each of ``entries`` counts ``>= 0``; each
    per-replica count (a sum of ``group`` entries) ``<= max_each`` (MAX_LEN), and the sum
    of their ``align``-aligned values ``<= max_sum`` (SUM_LEN / GATHERV); ``None``: no
    bound. The device forms (:class:`dpx.steps.CheckCounts`) are tested against
    :meth:`broken`."""

    entries: int
    group: int
    align: int
    max_each: int | None
    max_sum: int | None

    def per_replica(self, counts: Sequence[int]) -> list[int]:
        return list(INTS.group_sum(tuple(counts), self.group))

    def aligned_sum(self, counts: Sequence[int]) -> int:
        return sum(INTS.ceil_align(tuple(max(x, 0) for x in self.per_replica(counts)), self.align))

    def broken(self, counts: Sequence[int]) -> list[tuple[int, str]]:
        """``(bit, message)`` per broken bound (empty when every row fits): bit 1 a
        negative entry, 2 a replica past ``max_each``, 4 the sum past ``max_sum``."""
        per = self.per_replica(counts)
        if (min(counts, default=0) >= 0
                and (self.max_each is None or max(per, default=0) <= self.max_each)
                and (self.max_sum is None or self.aligned_sum(counts) <= self.max_sum)):
            return []  # every row fits: the common case, in a few builtin passes
        g = self.group
        out = [(1, f"replica {i // g}" + (f" CP rank {i % g}" if g > 1 else "")
                + f" has count {x} < 0") for i, x in enumerate(counts) if x < 0]
        if self.max_each is not None:
            out += [(2, f"replica {d} has count {x} > capacity {self.max_each} (a MAX_LEN "
                        f"capacity is each replica's slot)")
                    for d, x in enumerate(per) if x > self.max_each]
        if self.max_sum is not None and self.aligned_sum(counts) > self.max_sum:
            out.append((4, f"counts {per} aligned to {self.align} sum "
                           f"to {self.aligned_sum(counts)} > capacity {self.max_sum} (the "
                           f"global buffer's rows: a SUM_LEN / GATHERV capacity holds every "
                           f"replica's rows)"))
        return out

    def problems(self, counts: Sequence[int]) -> list[str]:
        return [text for _, text in self.broken(counts)]

    def flags(self, counts: Sequence[int]) -> int:
        """The OR of the bits of :meth:`broken` (a device check's flag)."""
        return sum({bit for bit, _ in self.broken(counts)})


def sources(layout: DpLayout, rank: int, *, shards: bool) -> tuple[int, ...]:
    """World ranks whose reports make rank ``rank``'s result, in result order (``[dp]``, or
    ``[dp, cp]`` row by row)."""
    me = layout.coords(rank)
    cps = range(layout.cp_size) if shards else (me.attn_cp_rank,)
    return tuple(layout.rank_of(d, c, me.attn_tp_rank) for d in range(layout.dp_size) for c in cps)


def own_entry(dp: Any, cp: Any, cp_size: int, *, shards: bool) -> Any:
    """The entry of a rank's own count in a counts vector (``[dp]``, or ``[dp, cp]`` row by
    row with ``shards``), from its DP and CP coordinates (ints, or a frontend's arrays)."""
    return dp * cp_size + cp if shards else dp


def disagreements(layout: DpLayout, reports: tuple[int, ...], *, shards: bool) -> list[str]:
    """For every world rank's report (rank order), the groups whose ranks must report the
    same count and do not, described for an error message."""
    out = []
    size = layout.attn_tp_size if shards else layout.replica_size
    for first in range(0, layout.world_size, size):
        group = reports[first:first + size]
        if len(set(group)) > 1:
            c = layout.coords(first)
            what = (f"replica {c.attn_dp_rank} CP rank {c.attn_cp_rank}" if shards
                    else f"replica {c.attn_dp_rank}")
            out.append(f"{what} (ranks {first}..{first + size - 1}) reported {list(group)}")
    return out
