"""The one definition of where rows lie: counts -> aligned counts -> slots -> offsets -> chunks.

For a plan, replica ``d`` (``n_d`` real rows), CP rank ``c`` and attn-tp rank ``t``
(``cp``, ``tp``; ``m = cp * tp`` ranks share a replica's slot, ``q = c*tp + t`` is the
rank's place among them)::

    a_d   = ceil_align(n_d, m)                          aligned count
    S_d   = slot rows placed in the global buffer:      MAX_LEN: the static slot; else a_d
    o_d   = first global row of slot d:                 MAX_LEN: d * slot; else a_0+...+a_{d-1}
    end   = o_{dp-1} + S_{dp-1}                         rows the slots cover (the rest is 0)

Every rank contributes one *chunk* of at most ``B`` rows (static) to the world collective
of a copy mode (MAX_LEN, GATHERV), and receives it back in a reduce_scatter:

- CP ranks hold the same rows (``plan.cp_shards is None``, always so with ``cp == 1``):
  ``B = plan.max_slot_rows // m``; the slot is cut in ``m`` consecutive ``B``-row blocks,
  rank ``q`` owns block ``q``: ``first = o_d + min(q*B, S_d)``, ``len = clip(S_d - q*B,
  0, B)`` (the leading ranks hold full blocks). Its real rows are local rows
  ``[min(q*B, n_d), +clip(n_d - q*B, 0, B))``.
- CP ranks hold shards (``s_{d,c}`` rows each, back to back from the slot's start:
  shard c begins at row ``o_d + P_{d,c}``, ``P`` the exclusive cumulative sum of the
  shards): ``B = ceil(max shard / tp)`` (capacity plans: ``ceil(max_slot_rows / tp)``);
  attn-tp rank t owns block t of its shard: ``first = o_d + P_{d,c} + min(t*B, s)``,
  ``len = clip(s - t*B, 0, B)``, from local rows ``[min(t*B, s), +len)``. The slot's rows
  past ``n_d`` belong to no chunk and are zero.

In rank order the chunks never overlap, and they tile ``[0, end)`` when CP ranks hold the
same rows. Every quantity is built with :mod:`dpx.expr`: plain ints for host counts and a
known rank, expressions when the counts are device data or the rank is symbolic.
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
    cp: Any
    tp: Any

    @property
    def is_symbolic(self) -> bool:
        return isinstance(self.rank, X.Expr)


def concrete_rank(layout: DpLayout, rank: int) -> RankRef:
    c = layout.coords(rank)
    return RankRef(rank, c.attn_dp_rank, c.attn_cp_rank, c.attn_tp_rank)


def symbolic_rank() -> RankRef:
    return RankRef(X.coord(X.Coord.RANK), X.coord(X.Coord.DP), X.coord(X.Coord.CP),
                   X.coord(X.Coord.TP))


@dataclass(frozen=True, eq=False)
class Geometry:
    """Rows of one plan for host counts (ints) or device counts (expressions)."""

    layout: DpLayout
    counts: Any     # n   [dp]
    shards: Any     # s   [dp * cp] (row by row), or None: CP ranks hold the same rows
    aligned: Any    # a   [dp]
    slots: Any      # S   [dp]
    offsets: Any    # o   [dp]
    end: Any        # rows covered by the slots
    block: int      # B
    global_rows: int

    @property
    def tp(self) -> int:
        return self.layout.attn_tp_size

    @property
    def cp(self) -> int:
        return self.layout.cp_size

    @property
    def sharded(self) -> bool:
        return self.shards is not None

    def count(self, d: Any) -> Any:
        return X.index(self.counts, d)

    def offset(self, d: Any) -> Any:
        return X.index(self.offsets, d)

    def shard(self, d: Any, c: Any) -> Any:
        """Rows CP rank ``c`` of replica ``d`` holds (sharded plans)."""
        return X.index(self.shards, X.add(X.mul(d, self.cp), c))

    def shard_start(self, d: Any, c: Any) -> Any:
        """First row of that shard inside its replica's slot."""
        return X.index(X.group_cumsum_excl(self.shards, self.cp), X.add(X.mul(d, self.cp), c))

    def held(self, d: Any, c: Any) -> Any:
        """Real rows of the rank's input: its shard, or all of its replica's rows."""
        return self.shard(d, c) if self.sharded else self.count(d)

    def held_start(self, d: Any, c: Any) -> Any:
        """Where the rank's rows start inside its replica's slot."""
        return self.shard_start(d, c) if self.sharded else 0

    def group_base(self, c: Any) -> Any:
        """Index of the first block of the rank's attn-tp group: ``c*tp`` when CP ranks
        hold the same rows (block ``q = c*tp + t`` is rank ``(c, t)``'s), 0 in a shard."""
        return 0 if self.sharded else X.mul(c, self.tp)

    @property
    def held_bound(self) -> int:
        """The most rows a rank's input can hold under the plan (its static capacity)."""
        return self.tp * self.block if self.sharded else self.block * self.layout.replica_size

    def _local(self, held: Any, start: Any, rows: int) -> tuple[Any, Any]:
        if isinstance(start, int) and start == 0:
            # from the first row: the count needs no clipping when the plan bounds it
            # (a device count then costs no extra op, e.g. in a captured CUDA graph)
            return 0, held if self.held_bound <= rows else X.clip(held, 0, rows)
        return X.minimum(start, held), X.clip(X.sub(held, start), 0, rows)

    def own_block(self, d: Any, c: Any, t: Any) -> tuple[Any, Any]:
        """``(first local row, rows)`` of the rank's chunk taken from its own input."""
        start = X.mul(X.add(self.group_base(c), t), self.block)
        return self._local(self.held(d, c), start, self.block)

    def group_span(self, d: Any, c: Any) -> tuple[Any, Any]:
        """``(first local row, rows)`` of the rows the rank's attn-tp group covers: what it
        reduce-scatters when it holds partial sums."""
        start = X.mul(self.group_base(c), self.block)
        return self._local(self.held(d, c), start, self.tp * self.block)

    def chunk_table(self) -> tuple[Any, Any]:
        """``(firsts, lens)``: every rank's chunk, vectors of ``world_size`` in rank order."""
        lay = self.layout
        coords = [lay.coords(r) for r in range(lay.world_size)]
        d_of = tuple(c.attn_dp_rank for c in coords)
        offsets = X.gather(self.offsets, d_of)
        if self.sharded:
            dc = tuple(c.attn_dp_rank * self.cp + c.attn_cp_rank for c in coords)
            tB = tuple(c.attn_tp_rank * self.block for c in coords)
            held = X.gather(self.shards, dc)
            base = X.add(offsets, X.gather(X.group_cumsum_excl(self.shards, self.cp), dc))
        else:
            tB = tuple((c.attn_cp_rank * self.tp + c.attn_tp_rank) * self.block for c in coords)
            held = X.gather(self.slots, d_of)
            base = offsets
        firsts = X.add(base, X.minimum(tB, held))
        lens = X.clip(X.sub(held, tB), 0, self.block)
        return firsts, lens


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def geometry(plan: Any, *, device_counts: bool) -> Geometry:
    """The :class:`Geometry` of ``plan``; ``device_counts`` makes the counts (or, for a
    sharded plan, the shards) the device vector (capacity plans), else they are the plan's
    host values."""
    lay = plan.layout
    m, dp, cp = lay.replica_size, lay.dp_size, lay.cp_size
    sharded = plan.cp_shards is not None
    if sharded:
        shards: Any = (X.counts_leaf(dp * cp) if device_counts
                       else tuple(s for row in plan.cp_shards for s in row))
        n = X.group_sum(shards, cp)
        bound = plan.max_slot_rows if plan.is_static else max(
            (s for row in plan.cp_shards for s in row), default=0)
        block = _ceil_div(bound, lay.attn_tp_size)
    else:
        shards = None
        n = X.counts_leaf(dp) if device_counts else plan.num_tokens
        block = plan.max_slot_rows // m
    a = X.ceil_align(n, m)
    if plan.mode is PaddingMode.MAX_LEN:
        slots: Any = tuple(plan.slot_rows)
        offsets: Any = tuple(plan.offsets)
    else:
        slots, offsets = a, X.exclusive_cumsum(a)
    end = X.add(X.index(offsets, dp - 1), X.index(slots, dp - 1))
    return Geometry(lay, n, shards, a, slots, offsets, end, block, plan.global_rows)
