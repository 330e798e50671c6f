"""The one definition of where rows lie: counts -> aligned counts -> slots -> offsets -> chunks.

Replica ``d`` (``n_d`` real rows), CP rank ``c``, attn-tp rank ``t``; ``m = cp * tp`` ranks
share a slot, ``q = c*tp + t`` is the rank's place among them::

    a_d = ceil_align(n_d, m)     S_d = MAX_LEN: the slot S (a capacity's, or max a); else a_d
    o_d = MAX_LEN: d * S; else a_0 + ... + a_{d-1}     G = capacity's size, else sum_d S_d
    no shards: B = max_d S_d // m; chunk of q: first = o_d + min(q*B, S_d),
               len = clip(S_d - q*B, 0, B)
    shards s_dc (back to back from the slot's start, shard c at o_d + P_dc):
               B = ceil(max shard / tp); chunk of t: first = o_d + P_dc + min(t*B, s_dc),
               len = clip(s_dc - t*B, 0, B)

In rank order the chunks never overlap (docs/semantics.md draws them). The arithmetic is
written once against an *ops* namespace: :data:`dpx.ints.INTS` on host ints (plans, the cost
policy), :mod:`dpx.expr` as expressions over a counts leaf (schedule templates).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from dpx.ints import INTS
from dpx.layout import DpLayout
from dpx.modes import Group, PaddingMode

__all__ = ["capacity_of", "capacity_rows", "equal_slots", "Geometry", "geometry", "slots",
           "Structure"]


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
    def counts_size(self) -> int:
        """Entries of the counts vector: ``dp``, or ``dp * cp`` shards."""
        return self.dp_size * (self.cp_size if self.sharded else 1)


@dataclass(frozen=True, eq=False)
class Geometry:
    """Rows of one plan structure for one counts value: ints (with :data:`INTS`) or
    expressions over a counts leaf (with :mod:`dpx.expr`), as ``ops`` builds them."""

    ops: Any
    layout: DpLayout
    mode: PaddingMode
    counts: Any     # n [dp], or the shard table [dp * cp] row by row
    n: Any          # real rows per replica [dp]
    shards: Any     # s [dp * cp], or None: CP ranks hold the same rows
    aligned: Any    # a [dp]
    slots: Any      # S_d [dp]
    offsets: Any    # o_d [dp]
    global_rows: Any  # G
    block: Any      # B
    is_static: bool
    tp: int         # attn-tp ranks, CP ranks, ranks of a replica (cp * tp)
    cp: int
    m: int

    @property
    def sharded(self) -> bool:
        return self.shards is not None

    def count(self, d: Any) -> Any:
        return self.ops.index(self.n, d)

    def shard(self, d: Any, c: Any) -> Any:
        """Rows CP rank ``c`` of replica ``d`` holds (sharded plans)."""
        X = self.ops
        return X.index(self.shards, X.add(X.mul(d, self.cp), c))

    def held(self, d: Any, c: Any) -> Any:
        """Real rows of the rank's input: its shard, or all of its replica's rows."""
        return self.shard(d, c) if self.sharded else self.count(d)

    def rows_start(self, d: Any, c: Any) -> Any:
        """First global row of the rank's rows: its replica's slot's, or its shard's (the
        shards lie back to back from the slot's start)."""
        X = self.ops
        slot = X.index(self.offsets, d)
        if not self.sharded:
            return slot
        return X.add(slot, X.index(X.group_cumsum_excl(self.shards, self.cp),
                                   X.add(X.mul(d, self.cp), c)))

    def group_base(self, c: Any) -> Any:
        """Index of the first block of the rank's attn-tp group: ``c*tp`` when CP ranks
        hold the same rows (block ``q = c*tp + t`` is rank ``(c, t)``'s), 0 in a shard."""
        return 0 if self.sharded else self.ops.mul(c, self.tp)

    def sharing_group(self) -> tuple[Group, int]:
        """The group whose ranks share a rank's rows, each holding one chunk of them (its
        attn-tp group in a shard, else its replica), and its size."""
        return (Group.ATTN_TP, self.tp) if self.sharded else (Group.REPLICA, self.m)

    def block_index(self, c: Any, t: Any) -> Any:
        """The rank's block among the blocks of its rows (``q``, or ``t`` in a shard)."""
        return self.ops.add(self.group_base(c), t)

    def local_range(self, held: Any, start: Any, blocks: int) -> tuple[Any, Any]:
        """``(first, rows)`` of the real rows among local rows ``[start, start +
        blocks*B)`` of an input holding ``held`` real rows."""
        X = self.ops
        rows = X.mul(blocks, self.block)
        if type(start) is int and start == 0:
            # from the first row: the count needs no clipping when the plan bounds it
            # (a device count then costs no extra op, e.g. in a captured CUDA graph)
            bound = self.tp if self.sharded else self.m
            return 0, held if bound <= blocks else X.clip(held, 0, rows)
        return X.minimum(start, held), X.clip(X.sub(held, start), 0, rows)

    def own_block(self, d: Any, c: Any, t: Any) -> tuple[Any, Any]:
        """``(first local row, rows)`` of the rank's real rows in its own block."""
        start = self.ops.mul(self.block_index(c, t), self.block)
        return self.local_range(self.held(d, c), start, 1)

    def rows_table(self, *, slots: bool = False) -> tuple[Any, Any]:
        """``(firsts, lens)``: every rank's real rows (its replica's, or its CP shard's),
        vectors of ``world_size`` in rank order (``slots``: a replica's whole slot)."""
        X, lay = self.ops, self.layout
        coords = [lay.coords(r) for r in range(lay.world_size)]
        d_of = tuple(c.attn_dp_rank for c in coords)
        offsets = X.gather(self.offsets, d_of)
        if self.sharded:
            dc = tuple(c.attn_dp_rank * self.cp + c.attn_cp_rank for c in coords)
            return (X.add(offsets, X.gather(X.group_cumsum_excl(self.shards, self.cp), dc)),
                    X.gather(self.shards, dc))
        return offsets, X.gather(self.slots if slots else self.n, d_of)

    def chunk_table(self, *, real: bool = False) -> tuple[Any, Any]:
        """``(firsts, lens)``: every rank's chunk, vectors of ``world_size`` in rank order
        (``real``: only its real rows, the slot's pad rows left out)."""
        X, lay, B = self.ops, self.layout, self.block
        base, held = self.rows_table(slots=not real)
        q = tuple(c.attn_tp_rank if self.sharded else c.attn_cp_rank * self.tp + c.attn_tp_rank
                  for c in map(lay.coords, range(lay.world_size)))
        tB = X.mul(q, B)
        return X.add(base, X.minimum(tB, held)), X.clip(X.sub(held, tB), 0, B)

    def chunk(self, d: Any, c: Any, t: Any) -> tuple[Any, Any]:
        """``(first global row, rows)`` of one rank's chunk (an entry of
        :meth:`chunk_table`, without building the table)."""
        X = self.ops
        q_b = X.mul(self.block_index(c, t), self.block)
        held = self.shard(d, c) if self.sharded else X.index(self.slots, d)
        return (X.add(self.rows_start(d, c), X.minimum(q_b, held)),
                X.clip(X.sub(held, q_b), 0, self.block))

    def equal_chunks(self) -> Any:
        """1 when every rank's chunk is a full block at ``rank * B`` (plain collectives
        move them): every shard, or every aligned count, fills ``tp*B`` / ``m*B`` rows."""
        X = self.ops
        if self.mode is PaddingMode.MAX_LEN and not self.sharded:
            return 1
        if not self.sharded:
            return X.vall(X.eq(self.aligned, X.mul(self.m, self.block)))
        full = X.vall(X.eq(self.shards, X.mul(self.tp, self.block)))
        if self.mode is PaddingMode.MAX_LEN:  # shards must also fill the slots
            return X.land(full, X.vall(X.eq(self.n, self.slots)))
        return full


def slots(ops: Any, mode: PaddingMode, dp: int, m: int, n: Any,
          cap_rows: tuple[int, int, int] | None) -> tuple[Any, Any, Any, Any]:
    """``(aligned, slots, offsets, global rows)`` of per-replica counts ``n``
    (``cap_rows``: a capacity plan's static sizes, :func:`capacity_rows`), built with
    ``ops``."""
    X = ops
    a = X.ceil_align(n, m)
    if mode is not PaddingMode.MAX_LEN:
        return a, a, X.exclusive_cumsum(a), (cap_rows[1] if cap_rows is not None else X.vsum(a))
    slot = cap_rows[2] if cap_rows is not None else X.vmax(a)
    return a, X.repeat(slot, dp), X.mul(tuple(range(dp)), slot), (
        cap_rows[1] if cap_rows is not None else X.mul(dp, slot))


def capacity_rows(capacity: int, mode: PaddingMode, dp: int, m: int) -> tuple[int, int, int]:
    """A capacity plan's static sizes ``(capacity, global rows, slot rows)``: the capacity
    aligned to the replica's ``m`` ranks is each slot (MAX_LEN: the replica's; SUM_LEN /
    GATHERV: the whole buffer's)."""
    c = INTS.ceil_align(capacity, m)
    return capacity, c * dp if mode is PaddingMode.MAX_LEN else c, c


def capacity_of(mode: PaddingMode, slot_rows: int, global_rows: int) -> int:
    """The ``capacity=`` of a plan in ``mode`` for buffers of ``slot_rows`` rows per slot
    and ``global_rows`` in all: a MAX_LEN capacity is a slot's rows, a SUM_LEN / GATHERV
    capacity the whole buffer's (the other side of :func:`capacity_rows`)."""
    return slot_rows if mode is PaddingMode.MAX_LEN else global_rows


def equal_slots(global_rows: int, dp: int) -> tuple[int, tuple[int, ...]]:
    """``(slot rows, offsets)`` of ``dp`` equal slots filling ``global_rows`` rows, as a
    MAX_LEN buffer lays them out whatever the counts (what sglang's drop-in derives from a
    buffer length: a graph's slots, a forward's combine without recorded counts)."""
    slot = global_rows // dp
    return slot, INTS.mul(tuple(range(dp)), slot)


def geometry(structure: Structure, ops: Any = INTS, counts: Any = None) -> Geometry:
    """The :class:`Geometry` of a plan structure for ``counts`` (per replica, or the shard
    table row by row), built with ``ops``."""
    lay, mode, sharded, cap = (structure.layout, PaddingMode(structure.mode),
                               structure.sharded, structure.capacity_rows)
    X = ops
    m, dp, cp, tp = lay.replica_size, lay.dp_size, lay.cp_size, lay.attn_tp_size
    shards = counts if sharded else None
    n = X.group_sum(counts, cp) if sharded else counts
    a, slot_rows, offsets, global_rows = slots(X, mode, dp, m, n, cap)
    # the largest slot: a capacity plan's static one, MAX_LEN's one, else the largest count
    max_slot = cap[2] if cap is not None else X.index(slot_rows, 0) \
        if mode is PaddingMode.MAX_LEN else X.vmax(a)
    block = (X.ceil_div(max_slot if cap is not None else X.vmax(counts), tp) if sharded
             else X.floordiv(max_slot, m))
    return Geometry(ops, lay, mode, counts, n, shards, a, slot_rows, offsets, global_rows,
                    block, cap is not None, tp, cp, m)
