"""Counts: checked on the host, checked on the device, and exchanged between ranks.

:func:`check_counts` / :func:`check_shards` check the host counts a plan is made from.
:func:`capacity_problems` applies a capacity plan's rule to the counts of one step (host
values read back from the device, ``validate=True``): the same rule
:func:`dpx.plan_step` applies to host counts, and the one the frontends check on the
device (:class:`dpx.steps.CheckCounts`).

``exchange_counts(n_local)`` all-gathers every rank's own count (an int32 scalar) over the
world and keeps, for replica ``d`` (or, with ``shards=True``, for CP rank ``c`` of replica
``d``), the report of the rank with this rank's CP and attn-tp coordinates in that replica
(this rank's attn-tp coordinate in that CP rank): the same rank a JAX ``all_gather`` over
the ``dp`` axis (or ``dp`` and ``cp``) reads. The ranks that must agree are the replica's
ranks (the CP rank's attn-tp ranks for shards); :func:`disagreements` names the ones that
do not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Sequence

from dpx.errors import DpxTypeError, DpxValueError
from dpx.layout import DpLayout
from dpx.modes import PaddingMode

__all__ = ["capacity_problems", "check_counts", "check_shards", "disagreements", "sources"]

if TYPE_CHECKING:
    from dpx.plan import DpPlan


def check_counts(num_tokens: Iterable[object], layout: DpLayout) -> tuple[int, ...]:
    """Validate per-replica counts: ``dp_size`` non-negative ints (numpy integers are
    accepted through ``__index__``; floats and bools are not)."""
    if isinstance(num_tokens, (str, bytes)) or not hasattr(num_tokens, "__iter__"):
        raise DpxTypeError(f"num_tokens={num_tokens!r} must be a sequence of ints")
    counts = tuple(num_tokens)
    if len(counts) != layout.dp_size:
        raise DpxValueError(
            f"num_tokens has {len(counts)} entries {counts!r}; the layout has "
            f"dp_size={layout.dp_size} replicas and needs one count per replica")
    if set(map(type, counts)) <= {int} and (not counts or min(counts) >= 0):
        return counts  # the common case: plain non-negative ints
    out = []
    for d, n in enumerate(counts):
        if type(n) is not int:
            if hasattr(n, "__index__") and not isinstance(n, bool):
                n = n.__index__()
            else:
                raise DpxTypeError(
                    f"num_tokens[{d}]={n!r} must be an int (got {type(n).__name__})")
        if n < 0:
            raise DpxValueError(f"num_tokens[{d}]={n} must be >= 0")
        out.append(int(n))
    return tuple(out)


def check_shards(cp_shards: object, counts: tuple[int, ...],
                 layout: DpLayout) -> tuple[tuple[int, ...], ...] | None:
    """Validate a CP shard table: one tuple of ``cp_size`` ints >= 0 per replica, summing
    to the replica's count. With ``cp_size == 1`` a shard table says nothing new and is
    dropped (every replica's one CP rank holds all its rows)."""
    if cp_shards is None:
        return None
    if isinstance(cp_shards, (str, bytes)) or not hasattr(cp_shards, "__iter__"):
        raise DpxTypeError(f"cp_shards={cp_shards!r} must be a sequence of per-replica "
                           f"shard sequences")
    table = [tuple(s) if hasattr(s, "__iter__") and not isinstance(s, (str, bytes))
             else s for s in cp_shards]
    if len(table) != layout.dp_size:
        raise DpxValueError(f"cp_shards has {len(table)} entries; the layout has dp_size="
                            f"{layout.dp_size} replicas and needs one shard tuple per replica")
    out = []
    for d, shards in enumerate(table):
        if not isinstance(shards, tuple) or len(shards) != layout.cp_size:
            raise DpxValueError(f"cp_shards[{d}]={shards!r} must hold cp_size="
                                f"{layout.cp_size} counts, one per CP rank")
        row = []
        for c, s in enumerate(shards):
            if isinstance(s, bool) or not hasattr(s, "__index__"):
                raise DpxTypeError(f"cp_shards[{d}][{c}]={s!r} must be an int")
            if s.__index__() < 0:
                raise DpxValueError(f"cp_shards[{d}][{c}]={s} must be >= 0")
            row.append(s.__index__())
        if sum(row) != counts[d]:
            raise DpxValueError(f"cp_shards[{d}]={tuple(row)} sums to {sum(row)}; it must "
                                f"sum to num_tokens[{d}]={counts[d]}")
        out.append(tuple(row))
    return tuple(out) if layout.cp_size > 1 else None


def capacity_problems(plan: "DpPlan", counts: Sequence[int]) -> list[str]:
    """What is wrong with one step's counts under capacity plan ``plan``: ``counts`` are
    the device counts as read back (per replica, or the ``[dp, cp]`` shard table row by
    row for a sharded plan). Empty when every row fits; else one message per problem,
    naming the replica, its count and the capacity."""
    lay = plan.layout
    m, cap = lay.replica_size, plan.capacity
    out = []
    sharded = plan.cp_shards is not None
    per = lay.cp_size if sharded else 1
    for i, x in enumerate(counts):
        if x < 0:
            where = (f"replica {i // per} CP rank {i % per}" if sharded else f"replica {i}")
            out.append(f"{where} has count {x} < 0")
    n = [sum(counts[d * per:(d + 1) * per]) for d in range(lay.dp_size)]
    if plan.mode is PaddingMode.MAX_LEN:
        for d, x in enumerate(n):
            if x > cap:
                out.append(f"replica {d} has count {x} > capacity {cap} (a MAX_LEN capacity "
                           f"is each replica's slot)")
    else:
        aligned = [-(-max(x, 0) // m) * m for x in n]
        if sum(aligned) > plan.global_rows:
            out.append(f"counts {n} aligned to {m} sum to {sum(aligned)} > capacity {cap} "
                       f"(global buffer {plan.global_rows} rows: a {plan.mode.name} "
                       f"capacity holds every replica's rows)")
    return out


def sources(layout: DpLayout, rank: int, *, shards: bool) -> tuple[int, ...]:
    """World ranks whose reports make rank ``rank``'s result, in result order (``[dp]``, or
    ``[dp, cp]`` row by row)."""
    me = layout.coords(rank)
    tp, cp = layout.attn_tp_size, layout.cp_size
    if shards:
        return tuple((d * cp + c) * tp + me.attn_tp_rank
                     for d in range(layout.dp_size) for c in range(cp))
    return tuple((d * cp + me.attn_cp_rank) * tp + me.attn_tp_rank
                 for d in range(layout.dp_size))


def disagreements(layout: DpLayout, reports: tuple[int, ...], *,
                  shards: bool) -> list[str]:
    """For every world rank's report (rank order), the groups whose ranks must report the
    same count and do not, described for an error message."""
    tp, per = layout.attn_tp_size, layout.replica_size
    out = []
    size = tp if shards else per
    for first in range(0, layout.world_size, size):
        group = reports[first:first + size]
        if len(set(group)) > 1:
            c = layout.coords(first)
            what = (f"replica {c.attn_dp_rank} CP rank {c.attn_cp_rank}" if shards
                    else f"replica {c.attn_dp_rank}")
            out.append(f"{what} (ranks {first}..{first + size - 1}) reported "
                       f"{list(group)}")
    return out
