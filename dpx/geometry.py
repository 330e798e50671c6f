"""The one definition of where rows lie: counts -> aligned counts -> slots -> offsets -> chunks.

For a plan, replica ``d`` (``n_d`` real rows) and attn-tp rank ``t`` (``tp = attn_tp_size``)::

    a_d      = ceil_align(n_d, tp)                       aligned count
    S_d      = slot rows placed in the global buffer:    MAX_LEN: the static slot; else a_d
    o_d      = first global row of slot d:               MAX_LEN: d * slot; else a_0+...+a_{d-1}
    end      = o_{dp-1} + S_{dp-1}                       rows the slots cover (the rest is 0)
    B        = plan.max_slot_rows // tp                  static rows of one chunk
    chunk of rank (d, t): first = o_d + min(t*B, S_d),  len = clip(S_d - t*B, 0, B)

so the ``tp`` chunks of a slot are its consecutive ``B``-row blocks (the leading attn-tp
ranks hold full blocks, the trailing ones fewer rows or none) and the chunks of all ranks,
in rank order, tile ``[0, end)``. A rank's chunk is what it contributes to the world
collective of a copy mode (MAX_LEN, GATHERV) and what it receives back in a
reduce_scatter. ``real_in_chunk`` = ``clip(n_d - t*B, 0, B)``: rows of the chunk that are
real tokens (the rest are alignment or slot padding, always zero); they start at local row
``real_start = min(t*B, n_d)``.

Every quantity is built with :mod:`dpx.expr`: plain ints for host counts and a known rank,
expressions when the counts are device data or the rank is symbolic (SPMD programs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpx import expr as X
from dpx.layout import DpLayout
from dpx.modes import PaddingMode


@dataclass(frozen=True)
class RankRef:
    """The coordinates of the rank a schedule is built for: ints, or scalar expressions
    (:func:`symbolic_rank`) when one program serves every rank."""

    rank: Any
    dp: Any
    tp: Any

    @property
    def is_symbolic(self) -> bool:
        return isinstance(self.rank, X.Expr)


def concrete_rank(layout: DpLayout, rank: int) -> RankRef:
    c = layout.coords(rank)
    return RankRef(rank, c.attn_dp_rank, c.attn_tp_rank)


def symbolic_rank() -> RankRef:
    return RankRef(X.coord(X.Coord.RANK), X.coord(X.Coord.DP), X.coord(X.Coord.TP))


@dataclass(frozen=True, eq=False)
class Geometry:
    """Rows of one plan for host counts (ints) or device counts (expressions)."""

    layout: DpLayout
    counts: Any     # n   [dp]
    aligned: Any    # a   [dp]
    slots: Any      # S   [dp]
    offsets: Any    # o   [dp]
    end: Any        # rows covered by the slots
    block: int      # B
    global_rows: int

    @property
    def tp(self) -> int:
        return self.layout.attn_tp_size

    def count(self, d: Any) -> Any:
        return X.index(self.counts, d)

    def offset(self, d: Any) -> Any:
        return X.index(self.offsets, d)

    def slot(self, d: Any) -> Any:
        return X.index(self.slots, d)

    def real_in_chunk(self, d: Any, t: Any) -> Any:
        return X.clip(X.sub(self.count(d), X.mul(t, self.block)), 0, self.block)

    def real_start(self, d: Any, t: Any) -> Any:
        """First local row of the chunk's real rows, ``min(t*B, n_d)``: inside the input
        even when the chunk holds none."""
        return X.minimum(X.mul(t, self.block), self.count(d))

    def chunk_table(self) -> tuple[Any, Any]:
        """``(firsts, lens)``: every rank's chunk, vectors of ``world_size`` in rank order."""
        lay = self.layout
        d_of = tuple(lay.coords(r).attn_dp_rank for r in range(lay.world_size))
        tB = tuple(lay.coords(r).attn_tp_rank * self.block for r in range(lay.world_size))
        slots = X.gather(self.slots, d_of)
        firsts = X.add(X.gather(self.offsets, d_of), X.minimum(tB, slots))
        lens = X.clip(X.sub(slots, tB), 0, self.block)
        return firsts, lens


def geometry(plan: Any, *, device_counts: bool) -> Geometry:
    """The :class:`Geometry` of ``plan``; ``device_counts`` makes the counts the device
    vector (capacity plans), else they are ``plan.num_tokens``."""
    lay = plan.layout
    tp = lay.attn_tp_size
    n = X.counts_leaf(lay.dp_size) if device_counts else plan.num_tokens
    a = X.ceil_align(n, tp)
    if plan.mode is PaddingMode.MAX_LEN:
        slots: Any = tuple(plan.slot_rows)
        offsets: Any = tuple(plan.offsets)
    else:
        slots, offsets = a, X.exclusive_cumsum(a)
    end = X.add(X.index(offsets, lay.dp_size - 1), X.index(slots, lay.dp_size - 1))
    return Geometry(lay, n, a, slots, offsets, end, plan.max_slot_rows // tp, plan.global_rows)
