"""How each op moves its rows: a closed set of routes (docs/semantics.md, "Transports and
routes"), chosen by one function, :func:`route_of`, and written by :class:`dpx.emit.Emitter`.
Also what a schedule template is emitted for (:class:`TemplateKey`) and the rank it is
built for (:class:`RankRef`: a concrete rank, or symbolic for one program of every rank).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from dpx import expr as X
from dpx.geometry import Geometry, Structure, geometry
from dpx.layout import DpLayout
from dpx.modes import Op, PaddingMode, Transport

__all__ = ["choose_route", "concrete_rank", "host_sizes", "RankRef", "Route", "route_of",
           "route_transport", "symbolic_geometry", "symbolic_rank", "TemplateKey"]


class Route(enum.Enum):
    """How an op moves its rows (see the module docstring)."""

    SUM_SLOTS = "sum_slots"
    EQUAL_BLOCKS = "equal_blocks"
    BLOCKS_UNPACK = "blocks_unpack"
    RAGGED = "ragged"
    PER_ROOT = "per_root"
    PEER = "peer"
    LOCAL = "local"
    ALL_TO_ALL = "all_to_all"
    ALL_TO_ALL_V = "all_to_all_v"


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


class TemplateKey(NamedTuple):
    """What a template depends on besides the counts and the call's sizes (plain values)."""

    structure: Structure
    op: str  # an Op's value
    partial: bool
    rank: int | None
    device_counts: bool
    transport: str  # a Transport's value
    wire: str  # a Wire's value
    dequantize: bool
    in_place: bool
    in_rows_known: bool
    #: the counts ride the gather's world collective (:class:`~dpx.steps.AllGatherCounts`)
    ride: bool = False


def concrete_rank(layout: DpLayout, rank: int) -> RankRef:
    return RankRef(rank, *layout.coords(rank))   # its (dp, cp, tp) coordinates


def symbolic_rank() -> RankRef:
    return RankRef(*map(X.coord, (X.Coord.RANK, X.Coord.DP, X.Coord.CP, X.Coord.TP)))


def symbolic_geometry(structure: Structure) -> Geometry:
    """The geometry of a plan structure as expressions over the counts leaf: what one
    schedule template serves every count vector of the structure with."""
    return geometry(structure, X, X.counts_leaf(structure.counts_size))


def host_sizes(transport: Transport, *, rank_known: bool, device_counts: bool) -> bool:
    """Whether a schedule's collectives may take host sizes -- the per_root transport's
    per-root and variable collectives need them: on that transport, for a known rank,
    with host counts. The one statement of the rule (:func:`choose_route` asks it)."""
    return transport is Transport.PER_ROOT and rank_known and not device_counts


def route_transport(transport: Transport, *, ride: bool) -> Transport:
    """The transport a schedule's route is chosen on: the requested one, or the equal one
    when the counts ride the gather's world all-gather (every rank's count arrives with
    the rows, so no collective before it may read the counts: not the ragged one). The
    one statement of the rule (the schedule builder asks it)."""
    return Transport.EQUAL if ride else transport


def route_of(mode: PaddingMode, transport: Transport, *, equal: bool, host_sizes: bool) -> Route:
    """The route of a gather or reduce_scatter in ``mode`` (see the module docstring):
    ``equal`` when every chunk is a full block; ``host_sizes`` when the chunk sizes are
    host ints on a known rank (what per-root collectives need). On the peer transport
    every mode puts and pulls each chunk's real rows (sizes may be device data)."""
    if transport is Transport.PEER:
        return Route.PEER
    if mode is PaddingMode.SUM_LEN:
        return Route.SUM_SLOTS
    if equal:
        return Route.EQUAL_BLOCKS
    if mode is PaddingMode.GATHERV:
        if transport is Transport.RAGGED:
            return Route.RAGGED
        if host_sizes:
            return Route.PER_ROOT
    return Route.BLOCKS_UNPACK


def choose_route(geo: Geometry, op: Op, transport: Transport, *, device_counts: bool,
                 rank_known: bool, known: Callable[[Any], bool], quantized: bool = False) -> Route:
    """The route of ``op`` for a plan of geometry ``geo`` on ``transport``. ``known(cond)``
    answers whether a condition on the counts holds (and may record it as a guard).
    ``quantized``: the rows travel on a quantized wire (a reduce_scatter on one sums after
    an all-to-all in every mode, or pulls them on the peer transport)."""
    if op in (Op.SCATTER, Op.SCATTER_ADJOINT):
        return Route.LOCAL
    hosted = host_sizes(transport, rank_known=rank_known, device_counts=device_counts)
    # a SUM_LEN or GATHERV plan's chunks (and, where no two ranks share rows, its ranks'
    # rows) tile the input in rank order: on host sizes each travels alone
    tiled = hosted and geo.mode is not PaddingMode.MAX_LEN and not geo.sharded
    if op is Op.SCATTER_COLUMNS:
        return Route.ALL_TO_ALL_V if tiled and geo.sharing_group()[1] == 1 else Route.ALL_TO_ALL
    if op is Op.SCATTER_COLUMNS_ADJOINT:
        return Route.ALL_TO_ALL
    if quantized and op is Op.REDUCE_SCATTER and transport is not Transport.PEER:
        return Route.ALL_TO_ALL_V if tiled else Route.ALL_TO_ALL
    # (the peer transport's route serves every chunk size: no guard to ask for)
    equal = transport is not Transport.PEER and geo.mode is not PaddingMode.SUM_LEN \
        and known(geo.equal_chunks())
    return route_of(geo.mode, transport, equal=equal, host_sizes=hosted)
