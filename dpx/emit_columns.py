"""The LM-head scatter's emitters (docs/semantics.md, "The LM-head scatter"): the methods
:class:`dpx.emit.Emitter` takes for :data:`dpx.Op.SCATTER_COLUMNS` and its adjoint, one per
route (:data:`dpx.emit.EMITTERS` names them). They write with the emitter's own state
(``geo``, ``rank``, ``steps``, ``buffer`` ...), which :class:`dpx.emit.Emitter` defines.
"""

from __future__ import annotations

from typing import Any, Callable

from dpx import expr as X
from dpx.geometry import Geometry
from dpx.modes import Group, PaddingMode
from dpx.routes import RankRef
from dpx.steps import (IN, OUT, AllToAll, AllToAllV, JoinColumns, Pack, ReduceScatter, Ref,
                       SplitColumns, Step, Unpack)

__all__ = ["ColumnsEmitter"]


class ColumnsEmitter:
    """The LM-head scatter's routes, as :class:`dpx.emit.Emitter`'s methods (the state and
    the helpers they use, which the emitter defines, declared here)."""

    geo: Geometry
    rank: RankRef
    steps: list[Step]
    notes: list[str]
    wide_bufs: set[str]
    in_rows: Any
    out_rows: Any
    buffer: Callable[..., Ref]
    move: Callable[..., None]
    known: Callable[[Any], bool]
    host_known: Callable[[Any], bool]
    eq: Callable[[Any, Any], Any]

    def scatter_columns_all_to_all(self) -> None:
        """Every rank's real rows packed per destination (``k * B`` rows a block: ``k``
        ranks share them), one world all-to-all, the column parts joined side by side
        (docs/semantics.md, "The LM-head scatter")."""
        g, R, r = self.geo, self.out_rows, self.rank
        W = g.layout.world_size
        k = self.geo.sharing_group()[1]
        span = X.mul(k, g.block)
        count = X.minimum(R, span)
        recv = self.buffer("recv", X.mul(W, span))
        if k == 1 and g.mode is PaddingMode.MAX_LEN and not g.sharded \
                and self.host_known(g.held(r.dp, r.cp)):
            # the input already is every rank's slot at rank * S: the join takes this
            # rank's real rows of each block and zeroes the rest
            send, count = Ref(IN), X.minimum(R, g.held(r.dp, r.cp))
        else:
            firsts, lens = g.rows_table()
            send = self.buffer("send", X.mul(W, span))
            self.steps.append(Pack(Ref(IN), send, X.mul(W, span), firsts, lens, span))
        self.steps.append(AllToAll(Group.WORLD, send, recv, span))
        self.wide_bufs.add(OUT)
        self.steps.append(JoinColumns(recv, Ref(OUT), R, count, span, W))

    def scatter_columns_all_to_all_v(self) -> None:
        """The LM-head scatter where every rank's rows are its own and tile the input from
        row 0 in rank order (SUM_LEN or GATHERV, no two ranks sharing rows, host sizes):
        the input is the send buffer, a variable all-to-all sends each rank its real rows
        alone (no packing, no block padding), the column parts joined side by side."""
        g, R, r = self.geo, self.out_rows, self.rank
        W = g.layout.world_size
        _, lens = g.rows_table()
        mine = g.held(r.dp, r.cp)
        self.notes.append("host sizes: a variable all-to-all of each rank's rows")
        recv = self.buffer("recv", X.mul(W, mine))
        self.steps.append(AllToAllV(Group.WORLD, Ref(IN, 0, X.vsum(lens)), recv, lens, mine))
        self.wide_bufs.add(OUT)
        self.steps.append(JoinColumns(recv, Ref(OUT), R, X.minimum(R, mine), mine, W))

    def scatter_columns_adjoint_all_to_all(self) -> None:
        """The transpose of :meth:`scatter_columns_all_to_all`: the sharing ranks' rows
        summed and reduce-scattered, the column parts split into blocks, one world
        all-to-all, every chunk's real rows moved to its rows of ``out``."""
        g, R = self.geo, self.in_rows
        B, W = g.block, g.layout.world_size
        self.wide_bufs.add(IN)
        group, size = self.geo.sharing_group()
        send = self.buffer("send", X.mul(W, B))
        if size == 1:
            self.steps.append(SplitColumns(Ref(IN), send, X.minimum(R, B), B, W))
        else:
            span = X.mul(size, B)
            if self.known(self.eq(R, span)):
                padded = Ref(IN)
            else:
                padded = self.buffer("slot", span, wide=True)
                self.move(Ref(IN), padded, span, 0, 0, X.minimum(R, span))
            chunk = self.buffer("chunk", B, wide=True)
            self.steps.append(ReduceScatter(group, padded, chunk, B))
            self.steps.append(SplitColumns(chunk, send, B, B, W))
        recv = self.buffer("recv", X.mul(W, B))
        self.steps.append(AllToAll(Group.WORLD, send, recv, B))
        firsts, lens = g.chunk_table(real=True)
        self.steps.append(Unpack(recv, Ref(OUT), g.global_rows, firsts, lens, B))
