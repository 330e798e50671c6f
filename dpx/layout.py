"""Rank layout of DP attention: ranks are ``(dp, cp, tp)``, tp fastest::

    rank = (attn_dp_rank * cp_size + attn_cp_rank) * attn_tp_size + attn_tp_rank
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from dpx.errors import DpxValueError, check_int

__all__ = ["DpLayout", "RankCoords"]


class RankCoords(NamedTuple):
    """Coordinates of one rank in a :class:`DpLayout` (a value: an immutable tuple)."""

    attn_dp_rank: int
    attn_cp_rank: int
    attn_tp_rank: int


@dataclass(frozen=True)
class DpLayout:
    """How ``world_size`` ranks split into DP replicas, CP ranks and attn-TP ranks.

    ``attn_tp_size = world_size // (dp_size * cp_size)``; the division must be exact.
    """

    world_size: int
    dp_size: int
    cp_size: int = 1

    def __post_init__(self) -> None:
        for name in ("world_size", "dp_size", "cp_size"):  # stored as plain ints
            object.__setattr__(self, name, check_int(name, getattr(self, name), minimum=1))
        if self.world_size % (self.dp_size * self.cp_size) != 0:
            raise DpxValueError(f"world_size={self.world_size} must be divisible by dp_size*"
                                f"cp_size={self.dp_size}*{self.cp_size}="
                                f"{self.dp_size * self.cp_size}")

    @property
    def attn_tp_size(self) -> int:
        """Ranks in one attention tensor-parallel group."""
        return self.world_size // (self.dp_size * self.cp_size)

    @property
    def replica_size(self) -> int:
        """Ranks serving one DP replica (``cp_size * attn_tp_size``)."""
        return self.world_size // self.dp_size

    def coords(self, rank: int) -> RankCoords:
        """``(attn_dp_rank, attn_cp_rank, attn_tp_rank)`` of ``rank``."""
        if type(rank) is not int or not 0 <= rank < self.world_size:
            check_int("rank", rank, minimum=0)
            if rank >= self.world_size:
                raise DpxValueError(f"rank={rank} must be < world_size={self.world_size}")
        tp, m = self.attn_tp_size, self.replica_size
        return RankCoords(rank // m, (rank // tp) % self.cp_size, rank % tp)

    def rank_of(self, dp: int, cp: int = 0, tp: int = 0) -> int:
        """The rank at coordinates ``(dp, cp, tp)``."""
        for name, value, size in (("dp", dp, self.dp_size), ("cp", cp, self.cp_size),
                                  ("tp", tp, self.attn_tp_size)):
            check_int(name, value, minimum=0)
            if value >= size:
                raise DpxValueError(f"{name}={value} must be < {name}_size={size}")
        return (dp * self.cp_size + cp) * self.attn_tp_size + tp

    def attn_tp_groups(self) -> tuple[tuple[int, ...], ...]:
        """Every attn-TP group (consecutive ranks sharing dp and cp), in rank order."""
        tp = self.attn_tp_size
        return tuple(tuple(range(g * tp, (g + 1) * tp)) for g in range(self.world_size // tp))

    def attn_cp_groups(self) -> tuple[tuple[int, ...], ...]:
        """Every attn-CP group (ranks sharing dp and tp), in order of (dp, tp)."""
        return tuple(
            tuple(self.rank_of(d, c, t) for c in range(self.cp_size))
            for d in range(self.dp_size)
            for t in range(self.attn_tp_size)
        )

    def replica_ranks(self, dp: int) -> tuple[int, ...]:
        """All ranks of DP replica ``dp`` (its cp and tp ranks), in rank order."""
        first = self.rank_of(dp, 0, 0)
        return tuple(range(first, first + self.replica_size))

    def describe(self) -> str:
        return (f"world={self.world_size} dp={self.dp_size} cp={self.cp_size} "
                f"attn_tp={self.attn_tp_size}")
