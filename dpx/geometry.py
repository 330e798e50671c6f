"""The one definition of where rows lie: counts -> aligned counts -> slots -> offsets -> chunks.

For a plan, replica ``d`` (``n_d`` real rows), CP rank ``c`` and attn-tp rank ``t``
(``cp``, ``tp``; ``m = cp * tp`` ranks share a replica's slot, ``q = c*tp + t`` is the
rank's place among them)::

    a_d   = ceil_align(n_d, m)                          aligned count
    S_d   = rows of slot d in the global buffer:        MAX_LEN: the slot S; else a_d
    S     = MAX_LEN slot: ceil_align(capacity, m), or max_d a_d without a capacity
    o_d   = first global row of slot d:                 MAX_LEN: d * S; else a_0+...+a_{d-1}
    G     = global rows: a capacity plan's static size; else sum_d S_d

Every rank contributes one *chunk* of at most ``B`` rows (static for a call) to the world
collective of a copy mode (MAX_LEN, GATHERV), and receives it back in a reduce_scatter:

- CP ranks hold the same rows (``plan.cp_shards is None``, always so with ``cp == 1``):
  ``B = max_d S_d // m`` (a capacity plan: its slot capacity over ``m``); the slot is cut
  in ``m`` consecutive ``B``-row blocks, rank ``q`` owns block ``q``: ``first = o_d +
  min(q*B, S_d)``, ``len = clip(S_d - q*B, 0, B)`` (the leading ranks hold full blocks).
  Its real rows are local rows ``[min(q*B, n_d), +clip(n_d - q*B, 0, B))``.
- CP ranks hold shards (``s_{d,c}`` rows each, back to back from the slot's start:
  shard c begins at row ``o_d + P_{d,c}``, ``P`` the exclusive cumulative sum of the
  shards): ``B = ceil(max shard / tp)`` (capacity plans: ``ceil(capacity / tp)``, the
  capacity aligned to ``m``); attn-tp rank t owns block t of its shard: ``first = o_d +
  P_{d,c} + min(t*B, s)``, ``len = clip(s - t*B, 0, B)``, from local rows ``[min(t*B,
  s), +len)``. The slot's rows past ``n_d`` belong to no chunk and are zero.

In rank order the chunks never overlap, and they tile ``[0, G)`` when CP ranks hold the
same rows. Every quantity is built with :mod:`dpx.expr` over the counts leaf, so a
:class:`Geometry` depends only on a plan's *structure* (:func:`structure_of`): the same
geometry serves every count vector of that structure, whether the counts are host ints
(folded per call) or a device vector (capacity plans' ``counts=``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from dpx import expr as X
from dpx.layout import DpLayout
from dpx.modes import PaddingMode

__all__ = ["clamp", "Geometry", "geometry", "host_counts", "Structure", "structure_of"]

if TYPE_CHECKING:  # the plan module sits above this one
    from dpx.plan import DpPlan


class Structure(NamedTuple):
    """What a plan's schedules depend on besides its counts: the layout's sizes, the mode,
    whether CP ranks hold shards, and a capacity plan's static sizes (``None`` when the
    sizes follow the counts). Plain ints and strings, so it hashes fast (it keys every
    template lookup)."""

    world_size: int
    dp_size: int
    cp_size: int
    mode: str  # a PaddingMode's value
    sharded: bool
    #: ``(capacity, global_rows, max_slot_rows)`` of a capacity plan, else None
    capacity_rows: tuple[int, int, int] | None

    @property
    def layout(self) -> DpLayout:
        return DpLayout(self.world_size, self.dp_size, self.cp_size)

    @property
    def padding_mode(self) -> PaddingMode:
        return PaddingMode(self.mode)


def structure_of(plan: "DpPlan") -> Structure:
    """``plan``'s structure (computed once per plan object)."""
    s = plan.__dict__.get("_structure")
    if s is None:
        cap = ((plan.capacity, plan.global_rows, plan.max_slot_rows)
               if plan.capacity is not None else None)
        lay = plan.layout
        s = Structure(lay.world_size, lay.dp_size, lay.cp_size, plan.mode.value,
                      plan.cp_shards is not None, cap)
        object.__setattr__(plan, "_structure", s)
    return s


def host_counts(plan: "DpPlan") -> tuple[int, ...]:
    """The plan's counts as the counts leaf reads them: per replica, or the shard table
    row by row for a sharded plan."""
    c = plan.__dict__.get("_leaf_counts")
    if c is None:
        c = (tuple(x for row in plan.cp_shards for x in row) if plan.cp_shards is not None
             else plan.num_tokens)
        object.__setattr__(plan, "_leaf_counts", c)
    return c


def clamp(x: Any, lo: int, hi: Any) -> Any:
    """``min(max(x, lo), hi)``; ``hi`` may be an expression."""
    if type(hi) is int:
        return X.clip(x, lo, hi)
    return X.minimum(X.maximum(x, lo), hi)


@dataclass(frozen=True, eq=False)
class Geometry:
    """Rows of one plan structure, as expressions over the counts leaf (ints where they
    do not depend on the counts)."""

    layout: DpLayout
    mode: PaddingMode
    counts: X.Expr  # the leaf: n [dp], or the shard table [dp * cp]
    n: Any          # real rows per replica [dp]
    shards: Any     # s [dp * cp] row by row, or None: CP ranks hold the same rows
    aligned: Any    # a [dp]
    slots: Any      # S_d [dp]
    offsets: Any    # o_d [dp]
    global_rows: Any  # G
    block: Any      # B
    is_static: bool

    @property
    def tp(self) -> int:
        return self.layout.attn_tp_size

    @property
    def cp(self) -> int:
        return self.layout.cp_size

    @property
    def m(self) -> int:
        return self.layout.replica_size

    @property
    def sharded(self) -> bool:
        return self.shards is not None

    def count(self, d: Any) -> Any:
        return X.index(self.n, d)

    def offset(self, d: Any) -> Any:
        return X.index(self.offsets, d)

    def slot(self, d: Any) -> Any:
        return X.index(self.slots, d)

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

    def rows_start(self, d: Any, c: Any) -> Any:
        """First global row of the rank's rows (its shard's, or its replica's slot)."""
        return X.add(self.offset(d), self.held_start(d, c))

    def group_base(self, c: Any) -> Any:
        """Index of the first block of the rank's attn-tp group: ``c*tp`` when CP ranks
        hold the same rows (block ``q = c*tp + t`` is rank ``(c, t)``'s), 0 in a shard."""
        return 0 if self.sharded else X.mul(c, self.tp)

    def block_index(self, c: Any, t: Any) -> Any:
        """The rank's block among the blocks of its rows (``q``, or ``t`` in a shard)."""
        return X.add(self.group_base(c), t)

    @property
    def bound_blocks(self) -> int:
        """The most blocks a rank's input can hold under the plan: its replica's ``m``
        blocks, or its attn-tp group's ``tp`` blocks of a shard."""
        return self.tp if self.sharded else self.m

    def local_range(self, held: Any, start: Any, blocks: int) -> tuple[Any, Any]:
        """``(first, rows)`` of the real rows among local rows ``[start, start +
        blocks*B)`` of an input holding ``held`` real rows."""
        rows = X.mul(blocks, self.block)
        if type(start) is int and start == 0:
            # from the first row: the count needs no clipping when the plan bounds it
            # (a device count then costs no extra op, e.g. in a captured CUDA graph)
            return 0, held if self.bound_blocks <= blocks else clamp(held, 0, rows)
        return X.minimum(start, held), clamp(X.sub(held, start), 0, rows)

    def own_block(self, d: Any, c: Any, t: Any) -> tuple[Any, Any]:
        """``(first local row, rows)`` of the rank's real rows in its own block."""
        start = X.mul(self.block_index(c, t), self.block)
        return self.local_range(self.held(d, c), start, 1)

    def group_span(self, d: Any, c: Any) -> tuple[Any, Any]:
        """``(first local row, rows)`` of the real rows the rank's attn-tp group covers:
        what it reduce-scatters when it holds partial sums."""
        start = X.mul(self.group_base(c), self.block)
        return self.local_range(self.held(d, c), start, self.tp)

    def chunk_table(self) -> tuple[Any, Any]:
        """``(firsts, lens)``: every rank's chunk, vectors of ``world_size`` in rank order."""
        lay, B = self.layout, self.block
        coords = [lay.coords(r) for r in range(lay.world_size)]
        d_of = tuple(c.attn_dp_rank for c in coords)
        offsets = X.gather(self.offsets, d_of)
        if self.sharded:
            dc = tuple(c.attn_dp_rank * self.cp + c.attn_cp_rank for c in coords)
            tB = X.mul(tuple(c.attn_tp_rank for c in coords), B)
            held = X.gather(self.shards, dc)
            base = X.add(offsets, X.gather(X.group_cumsum_excl(self.shards, self.cp), dc))
        else:
            tB = X.mul(tuple(c.attn_cp_rank * self.tp + c.attn_tp_rank for c in coords), B)
            held = X.gather(self.slots, d_of)
            base = offsets
        firsts = X.add(base, X.minimum(tB, held))
        lens = clamp(X.sub(held, tB), 0, B)
        return firsts, lens

    def chunk(self, rank: Any, d: Any, c: Any, t: Any) -> tuple[Any, Any]:
        """``(first global row, rows)`` of one rank's chunk (an entry of
        :meth:`chunk_table`, without building the table)."""
        q_b = X.mul(self.block_index(c, t), self.block)
        held = self.shard(d, c) if self.sharded else self.slot(d)
        return (X.add(self.rows_start(d, c), X.minimum(q_b, held)),
                clamp(X.sub(held, q_b), 0, self.block))

    def equal_chunks(self) -> Any:
        """1 when every rank's chunk is a full block at ``rank * B`` (plain collectives
        move them): every shard, or every aligned count, fills ``tp*B`` / ``m*B`` rows."""
        if self.mode is PaddingMode.MAX_LEN and not self.sharded:
            return 1
        if self.sharded:
            full = X.eq(self.shards, X.mul(self.tp, self.block))
            if self.mode is PaddingMode.MAX_LEN:  # shards must also fill the slots
                full = X.land(X.vall(full), X.vall(X.eq(self.n, self.slots)))
                return full
        else:
            full = X.eq(self.aligned, X.mul(self.m, self.block))
        return X.vall(full)


def geometry(structure: Structure) -> Geometry:
    """The :class:`Geometry` of a plan structure (:func:`structure_of`)."""
    lay, mode, sharded, cap = (structure.layout, structure.padding_mode, structure.sharded,
                               structure.capacity_rows)
    m, dp, cp, tp = lay.replica_size, lay.dp_size, lay.cp_size, lay.attn_tp_size
    leaf = X.counts_leaf(dp * cp if sharded else dp)
    shards = leaf if sharded else None
    n = X.group_sum(leaf, cp) if sharded else leaf
    a = X.ceil_align(n, m)
    if cap is not None:
        _, global_rows, max_slot = cap
    if mode is PaddingMode.MAX_LEN:
        slot = max_slot if cap is not None else X.vmax(a)
        max_slot = slot
        slots = X.repeat(slot, dp)
        offsets = X.mul(tuple(range(dp)), slot)
        if cap is None:
            global_rows = X.mul(dp, slot)
    else:
        slots, offsets = a, X.exclusive_cumsum(a)
        if cap is None:
            max_slot = X.vmax(a)
            global_rows = X.vsum(a)
    if sharded:
        bound = max_slot if cap is not None else X.vmax(leaf)
        block = X.ceil_div(bound, tp)
    else:
        block = X.floordiv(max_slot, m)
    return Geometry(lay, mode, leaf, n, shards, a, slots, offsets, global_rows, block,
                    cap is not None)
