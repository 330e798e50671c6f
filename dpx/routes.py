"""How each op moves its rows: a small closed set of routes, chosen by one function
(:func:`route_of`), each written by one emitter (:class:`dpx.emit.Emitter`).

:func:`choose_route` picks the route of ``(plan structure, op, transport, device counts,
known rank)`` for a schedule; the cost policy asks :func:`route_of` with host counts. Every row number
comes from :mod:`dpx.geometry` as a :mod:`dpx.expr` value over the counts leaf, so one
emission serves every count vector of the plan's structure. Where a shorter schedule is
possible for some counts (a rank whose rows fill its block sends them without a pass; a
slot with no pad tail needs no zeroing), the emitter asks :meth:`Emitter.known`: for host
counts the answer is recorded as a *guard* of the emitted variant (the variant serves
exactly the counts that give the same answers); for device counts or a symbolic rank the
answer is "not known", and the general steps are emitted.

Routes of a gather (and of its adjoints):

- ``SUM_SLOTS`` (SUM_LEN): each writer places its rows at their offset in a zero buffer;
  one world all-reduce. Its reduce_scatter all-reduces a copy and takes the slot.
- ``EQUAL_BLOCKS`` (MAX_LEN without shards; any plan whose chunks are full blocks at
  ``rank * B``): each rank's block, one equal world all-gather; reduce_scatter is the
  equal world reduce-scatter, then the replica's blocks are all-gathered back.
- ``BLOCKS_UNPACK`` (MAX_LEN with CP shards; GATHERV where no variable-size collective is
  available: device counts on torch, JAX on CPU): each rank's block, an equal all-gather
  into a scratch buffer, one pass moving every chunk to its rows. Its reduce_scatter packs
  the chunks into blocks first.
- ``RAGGED`` (GATHERV on a ragged transport: JAX on GPU): one ragged all-to-all each way.
- ``PER_ROOT`` (GATHERV on torch.distributed with host counts): every chunk broadcast in
  place from its owner (grouped per-root collectives); reduce_scatter: per-root reduces.
- ``LOCAL`` (scatter and its adjoint): no collective.

The fp8 wire wraps chunk production (a :class:`~dpx.steps.Quantize` pass writes the chunk
as wire rows) and adds a :class:`~dpx.steps.Dequantize` at the end; the route is the one
of the native gather. An in-place gather (the input is the caller's rows inside ``out``)
runs the same route with the collectives reading where the caller wrote.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable

from dpx import expr as X
from dpx.geometry import Geometry, Structure, geometry
from dpx.layout import DpLayout
from dpx.modes import Op, PaddingMode, Transport

__all__ = ["choose_route", "concrete_rank", "RankRef", "Route", "route_of",
           "symbolic_geometry", "symbolic_rank"]


class Route(enum.Enum):
    """How an op moves its rows (see the module docstring)."""

    SUM_SLOTS = "sum_slots"
    EQUAL_BLOCKS = "equal_blocks"
    BLOCKS_UNPACK = "blocks_unpack"
    RAGGED = "ragged"
    PER_ROOT = "per_root"
    LOCAL = "local"


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


def symbolic_geometry(structure: Structure) -> Geometry:
    """The geometry of a plan structure as expressions over the counts leaf: what one
    schedule template serves every count vector of the structure with."""
    return geometry(structure, X, X.counts_leaf(structure.counts_size))


def route_of(mode: PaddingMode, transport: Transport, *, equal: bool,
             host_sizes: bool) -> Route:
    """The route of a gather or reduce_scatter in ``mode`` (see the module docstring):
    ``equal`` when every chunk is a full block; ``host_sizes`` when the chunk sizes are
    host ints on a known rank (what per-root collectives need)."""
    if mode is PaddingMode.SUM_LEN:
        return Route.SUM_SLOTS
    if equal:
        return Route.EQUAL_BLOCKS
    if mode is PaddingMode.GATHERV:
        if transport is Transport.RAGGED:
            return Route.RAGGED
        if transport is Transport.PER_ROOT and host_sizes:
            return Route.PER_ROOT
    return Route.BLOCKS_UNPACK


def choose_route(geo: Geometry, op: Op, transport: Transport, *, device_counts: bool,
                 rank_known: bool, known: Callable[[Any], bool]) -> Route:
    """The route of ``op`` for a plan of geometry ``geo`` on ``transport``. ``known(cond)``
    answers whether a condition on the counts holds (and may record it as a guard)."""
    if op in (Op.SCATTER, Op.SCATTER_ADJOINT):
        return Route.LOCAL
    equal = geo.mode is not PaddingMode.SUM_LEN and known(geo.equal_chunks())
    return route_of(geo.mode, transport, equal=equal,
                    host_sizes=rank_known and not device_counts)
