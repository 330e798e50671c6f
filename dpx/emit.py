"""Writes one rank's steps for one op: the emitter of every route (:mod:`dpx.routes`), the
LM-head scatter's included (docs/semantics.md, "The LM-head scatter").

Row numbers are :mod:`dpx.geometry` values over the counts leaf; shortcuts for some
counts are asked of :meth:`Emitter.known`, whose answers become the variant's guards.
"""

from __future__ import annotations

from typing import Any, Callable

from dpx import expr as X
from dpx import values as V
from dpx.counts import CountRule
from dpx.extents import first_copy
from dpx.fold import fold_copies
from dpx.modes import Group, Op, PaddingMode, Transport, Wire
from dpx.plan import count_rule
from dpx.routes import (Route, TemplateKey, choose_route, concrete_rank, route_transport,
                        symbolic_geometry, symbolic_rank)
from dpx.steps import (IN, OUT, AllGather, AllGatherCounts, AllGatherV, AllReduce, AllToAll,
                       AllToAllV, BroadcastV, CheckCounts, Dequantize, DequantizeSum, JoinColumns,
                       Move, Pack, Quantize, ReduceScatter, ReduceScatterV, ReduceV, Ref,
                       SplitColumns, Step, Unpack, Zero)
from dpx.wire import check_wire_mode, in_place_schedule

__all__ = ["EMITTERS", "Emitter"]


class Emitter:
    """Writes one rank's steps for the op of a template ``key`` (:meth:`emit`); ``example``
    (host counts and the call's sizes) answers :meth:`known`, and every answer becomes a
    guard."""

    def __init__(self, key: TemplateKey, example: V.HostOps) -> None:
        self.geo = geo = symbolic_geometry(key.structure)
        self.op = op = Op(key.op)
        self.rank = symbolic_rank() if key.rank is None else concrete_rank(geo.layout, key.rank)
        #: the counts ride the world collective (the route chosen on the transport
        #: :func:`dpx.routes.route_transport` gives), the count check after it
        self.ride, self.device_counts = key.ride, key.device_counts
        self.partial = key.partial or op is Op.GATHER_SUM
        self.transport = transport = route_transport(Transport(key.transport), ride=key.ride)
        self.wire, self.dequantize = Wire(key.wire), key.dequantize
        #: the in-place schedule: a native gather's only (dpx.wire.in_place_schedule)
        self.in_place = in_place_schedule(self.wire, key.in_place)
        #: whether the rows travel quantized (a wire other than the input's dtype)
        self.quantized = self.wire is not Wire.NATIVE
        #: the plan's count rule, checked on device counts
        self.rule: CountRule | None = count_rule(key.structure) if key.device_counts else None
        self.example = example
        self.in_rows: Any = X.param("in_rows") if key.in_rows_known else None
        self.out_rows: Any = X.param("out_rows")
        # gather_sum over CP copies: every rank of a replica adds its rows
        self.sum_replica = (op is Op.GATHER_SUM and geo.cp > 1 and not geo.sharded)
        self.steps: list[Step] = []
        self.scratch: dict[str, Any] = {}  # scratch buffers' rows, by name
        self.wire_bufs: set[str] = set()  # buffers holding wire rows
        self.wide_bufs: set[str] = set()  # buffers holding wide rows
        self.notes: list[str] = []
        self.guards: dict[tuple, tuple[Any, int]] = {}
        self.route = choose_route(geo, op, transport, device_counts=key.device_counts,
                                  rank_known=not self.rank.is_symbolic, known=self.known,
                                  quantized=self.quantized)

    # ------------------------------------------------------------ decisions
    def host_known(self, v: Any) -> bool:
        """Whether ``v`` is a host value for every call of this schedule."""
        deps = X.deps_of(v)
        return not (deps & X.COORD or (deps & X.COUNTS and self.device_counts))

    def known(self, cond: Any) -> bool:
        """Whether ``cond`` holds for this call and is host-known (kept as a guard); False
        when it cannot be known before the call. Every shortcut asks here."""
        if type(cond) is int:
            return bool(cond)
        if not self.host_known(cond):
            return False
        value = int(bool(V.evaluate(cond, self.example)))
        self.guards.setdefault(cond.key(), (cond, value))
        return bool(value)

    def eq(self, a: Any, b: Any) -> Any:
        return 0 if a is None or b is None else X.eq(a, b)

    # ------------------------------------------------------------ buffers and steps
    def buffer(self, name: str, rows: Any, *, wire: bool = False, wide: bool = False) -> Ref:
        old = self.scratch.setdefault(name, rows)
        if old is not rows and X.render(old) != X.render(rows):
            raise AssertionError(f"scratch {name} sized twice")
        if wire:
            self.wire_bufs.add(name)
        if wide:
            self.wide_bufs.add(name)
        return Ref(name)

    def move(self, src: Ref, dst: Ref, rows: Any, src_start: Any, dst_start: Any,
             count: Any) -> None:
        self.steps.append(Move(src, dst, rows, src_start, dst_start, count))

    # ------------------------------------------------------------ the op
    def emit(self) -> None:
        """The steps: the device count check, then the op's method for its route
        (:data:`EMITTERS`)."""
        if self.rule is not None and not self.ride:
            self.steps.append(CheckCounts(self.rule))
        if self.quantized:
            check_wire_mode(self.geo.mode, self.wire, self.op)
        EMITTERS[self.op, self.route](self)
        if self.ride:
            self.ride_counts()
        if self.geo.layout.world_size == 1:
            self.steps = [t for s in self.steps for t in self.alone(s)]
            if not self.in_place:
                self.steps = fold_copies(self.steps, self.scratch, self.known)

    def alone(self, s: Step) -> tuple[Step, ...]:
        """``s`` on a world of one rank, where every group is this rank: no collective
        (:meth:`~dpx.steps.Step.alone`); an in-place gather's rows are the output's
        already."""
        if self.in_place and type(s) is AllGather and s.src.buf == IN and s.dst.buf == OUT:
            return ()
        return s.alone()

    def ride_counts(self) -> None:
        """The counts ride the world all-gather (the steps before it read only this rank's
        own count: the route's chunk; the count check follows it)."""
        i, s = next((i, s) for i, s in enumerate(self.steps)
                    if type(s) is AllGather and s.group is Group.WORLD)
        self.steps[i] = AllGatherCounts(s.group, s.src, s.dst, s.rows)
        if self.rule is not None:
            self.steps.insert(i + 1, CheckCounts(self.rule))

    def scatter_local(self, src: Ref = Ref(IN)) -> None:
        """``out``: this rank's rows of the global buffer ``src``."""
        g, r = self.geo, self.rank
        self.move(src, Ref(OUT), self.out_rows, g.rows_start(r.dp, r.cp), 0, g.held(r.dp, r.cp))

    def scatter_adjoint_local(self) -> None:
        """``out``: zeros, with ``in`` placed at this rank's rows."""
        g, r = self.geo, self.rank
        self.move(Ref(IN), Ref(OUT), self.out_rows, 0, g.rows_start(r.dp, r.cp), g.held(r.dp, r.cp))

    # ------------------------------------------------------------ shared pieces
    def sums_partials(self) -> bool:
        """Whether the rank's rows are partial sums its group must add first."""
        return self.partial and (self.geo.tp > 1 or self.sum_replica)

    def partial_group(self) -> tuple[Group, int, Any, Any, Any]:
        """``(group, size, its first block's index, start, count)`` of the partial sums."""
        g, r = self.geo, self.rank
        if self.sum_replica:
            return Group.REPLICA, g.m, 0, 0, g.count(r.dp)
        # the real rows of the blocks of the rank's attn-tp group
        start, count = g.local_range(g.held(r.dp, r.cp), X.mul(g.group_base(r.cp), g.block), g.tp)
        return Group.ATTN_TP, g.tp, g.group_base(r.cp), start, count

    def produce_chunk(self, dst: Ref | None, dst_rows: Any) -> Ref:
        """This rank's chunk (``B`` rows, ``dst_rows`` kept) written into ``dst`` (None: a
        scratch chunk, or the input's own view when it is the chunk; quantized: wire rows)."""
        g, r = self.geo, self.rank
        B = g.block
        start, real = g.own_block(r.dp, r.cp, r.tp)
        src, src_start = Ref(IN), start
        if self.sums_partials():
            group, k, _, span_start, count = self.partial_group()
            span = X.mul(k, B)
            if (type(span_start) is int and span_start == 0
                    and self.known(X.land(self.eq(count, span), self.eq(self.in_rows, span)))):
                padded = Ref(IN)
            else:
                padded = self.buffer("padded", span)
                self.move(Ref(IN), padded, span, span_start, 0, count)
            if not self.quantized and dst is not None and self.known(self.eq(dst_rows, B)):
                self.steps.append(ReduceScatter(group, padded, dst, B))
                return dst
            chunk = self.buffer("chunk", B)
            self.steps.append(ReduceScatter(group, padded, chunk, B))
            if not self.quantized and dst is None:
                return chunk
            src, src_start = chunk, 0
            if not self.quantized:
                if not self.known(self.eq(dst_rows, 0)):
                    self.move(chunk, dst, dst_rows, 0, 0, dst_rows)
                return dst
        if self.quantized:
            dst = dst or self.buffer("wire_chunk", B, wire=True)
            self.steps.append(Quantize(src, dst, dst_rows, src_start, real))
            return dst
        if dst is None and self.host_known(start) and self.known(self.eq(real, B)):
            if type(start) is int and start == 0 and self.known(self.eq(self.in_rows, B)):
                return Ref(IN)
            return Ref(IN, start, B)
        if dst is not None and self.known(self.eq(dst_rows, 0)):
            return dst
        dst = dst or self.buffer("chunk", B)
        self.move(Ref(IN), dst, dst_rows, start, 0, real)
        return dst

    def gathered_out(self) -> Ref:
        """Where a gather's world collective writes: ``out`` (holding wire rows when a
        quantized gather keeps them), or the wire buffer it dequantizes from."""
        if self.quantized and self.dequantize:
            return self.buffer("wire_out", self.geo.global_rows, wire=True)
        if self.quantized:
            self.wire_bufs.add(OUT)
        return Ref(OUT)

    def finish_gather(self, dst: Ref) -> None:
        if self.quantized and self.dequantize:
            self.steps.append(Dequantize(dst, Ref(OUT), self.geo.global_rows))

    def finish_slot(self, mine: Ref, mine_rows: Any) -> None:
        """``out`` from this rank's reduced chunk ``mine``: the chunks of the ranks sharing
        its rows all-gathered, then its real rows."""
        g, r, R = self.geo, self.rank, self.out_rows
        B = g.block
        group, size = self.geo.sharing_group()
        held = g.held(r.dp, r.cp)
        if size > 1:
            if not self.known(self.eq(mine_rows, B)):  # a per-root chunk view: a full block
                chunk = self.buffer("chunk", B)
                self.move(mine, chunk, B, 0, 0, mine_rows)
                mine = chunk
            if self.known(self.eq(R, X.mul(size, B))):
                self.steps.append(AllGather(group, mine, Ref(OUT), B))
                if not self.known(self.eq(held, R)):
                    self.steps.append(Zero(Ref(OUT), R, 0, held))
                return
            slot = self.buffer("slot", X.mul(size, B))
            self.steps.append(AllGather(group, mine, slot, B))
            mine = slot
        self.move(mine, Ref(OUT), R, 0, 0, held)

    # ------------------------------------------------------------ gather routes
    def gather_sum_slots(self) -> None:
        g, r = self.geo, self.rank
        G = g.global_rows
        # one rank of each group of identical copies writes; partial sums all write
        writes = first_copy(g.layout, self.op, partial=self.partial, sharded=g.sharded, rank=r)
        start, count = g.rows_start(r.dp, r.cp), X.mul(g.held(r.dp, r.cp), writes)
        if self.in_place:  # the caller's rows are there already: zero the rest
            self.steps.append(Zero(Ref(OUT), G, start, count))
        else:
            self.move(Ref(IN), Ref(OUT), G, 0, start, count)
        self.steps.append(AllReduce(Group.WORLD, Ref(OUT), G))

    def gather_equal_blocks(self) -> None:
        g, r = self.geo, self.rank
        B = g.block
        if not self.in_place:
            dst = self.gathered_out()
            self.steps.append(AllGather(Group.WORLD, self.produce_chunk(None, B), dst, B))
            self.finish_gather(dst)
            return
        # in place: the caller's rows are the rank's slot; the collectives read them there
        own = Ref(IN, X.mul(g.block_index(r.cp, r.tp), B), B)
        if self.sums_partials():
            group, k, base, _, count = self.partial_group()
            span = Ref(IN, X.mul(base, B), X.mul(k, B))
            if not self.known(self.eq(count, X.mul(k, B))):  # pad rows add zeros
                self.steps.append(Zero(span, X.mul(k, B), 0, count))
            self.steps.append(ReduceScatter(group, span, own, B))
        else:
            _, real = g.own_block(r.dp, r.cp, r.tp)
            if not self.known(self.eq(real, B)):
                self.steps.append(Zero(own, B, 0, real))
        self.steps.append(AllGather(Group.WORLD, own, Ref(OUT), B))

    def gather_blocks_unpack(self) -> None:
        g = self.geo
        B, W = g.block, g.layout.world_size
        if g.mode is PaddingMode.GATHERV:
            self.notes.append("GATHERV moves every rank's block in an equal all-gather, then "
                              "one pass moves the chunks to their rows (no variable-size "
                              "collective for these counts on this transport)")
        chunk = self.produce_chunk(None, B)
        gathered = self.buffer("wire_gathered" if self.quantized else "gathered", X.mul(W, B),
                               wire=self.quantized)
        self.steps.append(AllGather(Group.WORLD, chunk, gathered, B))
        dst = self.gathered_out()
        self.steps.append(Unpack(gathered, dst, g.global_rows, *g.chunk_table(), B))
        self.finish_gather(dst)

    def gather_ragged(self, real: bool = False) -> None:
        """A variable all-gather of every rank's chunk (``real``: its real rows only). The
        peer route, in every mode, is this with ``real``: every rank's chunk, its real rows
        only, put into every rank's workspace and taken into the output with zeros
        elsewhere (the real-row chunk table; sizes may be device data)."""
        g = self.geo
        chunk, dst = self.produce_chunk(None, g.block), self.gathered_out()
        self.steps.append(AllGatherV(Group.WORLD, g.global_rows, *g.chunk_table(real=real),
                                     g.block, chunk, dst))
        self.finish_gather(dst)

    def gather_per_root(self) -> None:
        g, r = self.geo, self.rank
        G, B = g.global_rows, g.block
        first, length = g.chunk(r.dp, r.cp, r.tp)
        dst = self.gathered_out()
        # the chunks tile [0, end), then a capacity plan's tail of zeros; shards leave gaps
        # (each slot's pad past its shards) unless every shard table fills its slot
        end = X.vsum(g.aligned)
        gaps = g.sharded and not self.known(X.land(X.vall(X.eq(g.n, g.aligned)), self.eq(end, G)))
        tail = not g.sharded and not self.known(self.eq(end, G))
        mine = Ref(dst.buf, first, length)
        zeros = Ref(OUT) if self.in_place else dst  # where the gaps and the tail are zeroed
        if self.in_place and not self.sums_partials():
            _, real = g.own_block(r.dp, r.cp, r.tp)  # the chunk's real rows: zero the rest
            if gaps:
                self.steps.append(Zero(zeros, G, first, real))
            elif not self.known(self.eq(real, length)):
                self.steps.append(Zero(mine, length, 0, real))
        else:  # the input, maybe a view of out, is read (in place: into a scratch) first
            self.produce_chunk(mine, length)
            if gaps:
                self.steps.append(Zero(zeros, G, first, length))
        if tail:
            self.steps.append(Zero(zeros, G, 0, end))
        self.steps.append(BroadcastV(Group.WORLD, G, *g.chunk_table(), B, dst))
        self.finish_gather(dst)

    # ------------------------------------------------------------ reduce_scatter routes
    def staged(self) -> Ref:
        """A copy of the input, for a collective that works in place."""
        G = self.geo.global_rows
        self.move(Ref(IN), self.buffer("staged", G), G, 0, 0, G)
        return Ref("staged")

    def rs_sum_slots(self) -> None:
        staged = self.staged()
        self.steps.append(AllReduce(Group.WORLD, staged, self.geo.global_rows))
        self.scatter_local(staged)

    def rs_equal_blocks(self, src: Ref = Ref(IN)) -> None:
        """A world reduce-scatter of the equal blocks of ``src`` (the input, or its chunks
        packed into blocks), then the slot -- or, from the input, straight into ``out``
        where ``out`` is the one block of a rank that shares its rows with no other."""
        g, r, R = self.geo, self.rank, self.out_rows
        B = g.block
        if src.buf == IN and g.m == 1 and self.known(self.eq(R, B)):
            held = g.held(r.dp, r.cp)
            self.steps.append(ReduceScatter(Group.WORLD, Ref(IN), Ref(OUT), B))
            if not self.known(self.eq(held, R)):
                self.steps.append(Zero(Ref(OUT), R, 0, held))
            return
        chunk = self.buffer("chunk", B)
        self.steps.append(ReduceScatter(Group.WORLD, src, chunk, B))
        self.finish_slot(chunk, B)

    def rs_blocks_unpack(self) -> None:
        g = self.geo
        span = X.mul(g.layout.world_size, g.block)
        packed = self.buffer("packed", span)
        self.steps.append(Pack(Ref(IN), packed, span, *g.chunk_table(), g.block))
        self.rs_equal_blocks(packed)

    def rs_ragged(self, real: bool = False) -> None:
        """A variable reduce-scatter of every rank's chunk (``real``: its real rows only;
        a quantized wire's input quantized once first), then the slot
        (:meth:`finish_slot`) -- or straight into ``out`` where the chunk is the slot: no
        other rank holds its rows, ``out`` is one block, and the chunk holds only rows the
        slot keeps (real rows, or a GATHERV slot), the collective zeroing past them. The
        peer route is this with ``real``: each rank's chunk, its real rows only, pulled
        from every rank and summed in float32 in rank order (the input rows -- on a
        quantized wire, the input quantized once -- staged where peers read them)."""
        g, R = self.geo, self.out_rows
        G, B = g.global_rows, g.block
        src = Ref(IN)
        if self.quantized:
            src = self.buffer("wire_send", G, wire=True)
            self.steps.append(Quantize(Ref(IN), src, G, 0, G))
        direct = ((real or g.mode is PaddingMode.GATHERV) and g.sharing_group()[1] == 1
                  and self.known(self.eq(R, B)))
        chunk = Ref(OUT) if direct else self.buffer("chunk", B)
        self.steps.append(ReduceScatterV(Group.WORLD, G, *g.chunk_table(real=real), B, src, chunk))
        if not direct:
            self.finish_slot(chunk, B)

    def rs_all_to_all(self) -> None:
        """The quantized combine where its chunks cannot travel as they lie (every case
        :meth:`rs_all_to_all_v` does not take: MAX_LEN, CP shards, and collectives without
        host sizes, :func:`dpx.routes.host_sizes`): every destination rank's chunk quantized
        into a ``B``-row block of wire rows -- in one pass when the input's chunks already
        are its blocks in rank order, else packed first -- one world all-to-all of the wire
        rows, then one pass dequantizing the ``W`` copies of each row of this rank's chunk
        and summing them in float32 in rank order, then the slot (:meth:`finish_slot`)."""
        g = self.geo
        B, W = g.block, g.layout.world_size
        span = X.mul(W, B)
        if g.mode is not PaddingMode.SUM_LEN and self.known(g.equal_chunks()):
            src = Ref(IN)
        else:
            self.notes.append("the chunks are packed into equal blocks before the quantize "
                              "(one all-to-all of equal blocks on every transport)")
            src = self.buffer("packed", span)
            self.steps.append(Pack(Ref(IN), src, span, *g.chunk_table(), B))
        send = self.buffer("wire_send", span, wire=True)
        self.steps.append(Quantize(src, send, span, 0, span))
        recv = self.buffer("wire_recv", span, wire=True)
        self.steps.append(AllToAll(Group.WORLD, send, recv, B))
        chunk = self.buffer("chunk", B)
        self.steps.append(DequantizeSum(recv, chunk, B, W))
        self.finish_slot(chunk, B)

    def rs_all_to_all_v(self) -> None:
        """The quantized combine of a SUM_LEN or GATHERV plan (no CP shards) on host sizes:
        the chunks tile the input from row 0 in rank order, so one quantize pass over them
        makes the send buffer; a variable all-to-all sends each rank its chunk's rows alone
        (no block padding); this rank receives its chunk from every rank, one pass sums
        them."""
        g, r = self.geo, self.rank
        W = g.layout.world_size
        _, lens = g.chunk_table()
        end, mine = X.vsum(lens), g.chunk(r.dp, r.cp, r.tp)[1]
        self.notes.append("host sizes: a variable all-to-all of each chunk's rows")
        send = self.buffer("wire_send", end, wire=True)
        self.steps.append(Quantize(Ref(IN), send, end, 0, end))
        recv = self.buffer("wire_recv", X.mul(W, mine), wire=True)
        self.steps.append(AllToAllV(Group.WORLD, send, recv, lens, mine))
        summed = self.buffer("summed", mine)
        self.steps.append(DequantizeSum(recv, summed, mine, W))
        self.finish_slot(summed, mine)

    def rs_per_root(self) -> None:
        g, r = self.geo, self.rank
        staged = self.staged()
        self.steps.append(ReduceV(Group.WORLD, g.global_rows, *g.chunk_table(), g.block, staged))
        first, length = g.chunk(r.dp, r.cp, r.tp)
        self.finish_slot(Ref("staged", first, length), length)

    # ------------------------------------------------------------ the LM-head scatter
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
            send = self.buffer("send", X.mul(W, span))
            self.steps.append(Pack(Ref(IN), send, X.mul(W, span), *g.rows_table(), span))
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
        self.steps.append(Unpack(recv, Ref(OUT), g.global_rows, *g.chunk_table(real=True), B))


_E, _R = Emitter, Route
_GATHERS = {_R.SUM_SLOTS: _E.gather_sum_slots, _R.EQUAL_BLOCKS: _E.gather_equal_blocks,
            _R.BLOCKS_UNPACK: _E.gather_blocks_unpack, _R.RAGGED: _E.gather_ragged,
            _R.PEER: lambda e: e.gather_ragged(real=True), _R.PER_ROOT: _E.gather_per_root}
_COMBINES = {_R.SUM_SLOTS: _E.rs_sum_slots, _R.EQUAL_BLOCKS: _E.rs_equal_blocks,
             _R.BLOCKS_UNPACK: _E.rs_blocks_unpack, _R.RAGGED: _E.rs_ragged,
             _R.PEER: lambda e: e.rs_ragged(real=True), _R.PER_ROOT: _E.rs_per_root,
             _R.ALL_TO_ALL: _E.rs_all_to_all, _R.ALL_TO_ALL_V: _E.rs_all_to_all_v}
#: each op's emitter by route: every (op, route) :func:`dpx.routes.choose_route` returns
#: (gather_sum is emitted as gather, its partial flag set)
EMITTERS: dict[tuple[Op, Route], Callable[[Emitter], None]] = {
    **{(op, r): m for op in (Op.GATHER, Op.GATHER_SUM) for r, m in _GATHERS.items()},
    **{(Op.REDUCE_SCATTER, r): m for r, m in _COMBINES.items()},
    (Op.SCATTER, _R.LOCAL): _E.scatter_local,
    (Op.SCATTER_ADJOINT, _R.LOCAL): _E.scatter_adjoint_local,
    (Op.SCATTER_COLUMNS, _R.ALL_TO_ALL): _E.scatter_columns_all_to_all,
    (Op.SCATTER_COLUMNS, _R.ALL_TO_ALL_V): _E.scatter_columns_all_to_all_v,
    (Op.SCATTER_COLUMNS_ADJOINT, _R.ALL_TO_ALL): _E.scatter_columns_adjoint_all_to_all}
