"""How :func:`dpx.plan_step` picks a padding mode when none is forced.

``sglang``: sglang's rule on the aligned counts. ``cost``: the cheapest candidate under a
:class:`dpx.CostModel`: each mode priced as :func:`dpx.cost.estimate` prices its plan's
schedules (without CP ranks in closed form, :mod:`dpx.pricing`, proved equal), ties to the
earlier of MAX_LEN, SUM_LEN, GATHERV (:func:`dpx.pricing.cheapest_index`).
"""

from __future__ import annotations

from typing import Callable, Sequence

from dpx.cost import CostModel, ModeEstimate, estimate
from dpx.errors import check_int
from dpx.layout import DpLayout
from dpx.modes import PaddingMode, Transport
from dpx.plan import check_counts, check_shards, make_plan
from dpx.pricing import cheapest, cheapest_index
from dpx.schedule import ScheduleCache

ALL_MODES: tuple[PaddingMode, ...] = (PaddingMode.MAX_LEN, PaddingMode.SUM_LEN,
                                      PaddingMode.GATHERV)

__all__ = ["ALL_MODES", "compare_modes", "cost_mode", "fits_one_allreduce", "sglang_mode"]


def sglang_mode(aligned: Sequence[int], dp_size: int, is_extend: bool, *,
                max_len_with_idle: bool = False, allreduce_bytes: int | None = None,
                row_bytes: int = 0) -> tuple[PaddingMode, str]:
    """sglang's rule on the aligned counts: an extend batch with dp > 1 takes SUM_LEN, or
    MAX_LEN when ``max_len_with_idle`` and some replica is idle (sglang's branch for hybrid
    SSM models, which materialise idle replicas as padded rows). Any other batch takes
    SUM_LEN when ``allreduce_bytes`` is given, dp > 1, no replica is idle and the summed
    buffer (``sum * row_bytes``) fits one all-reduce of that many bytes; else MAX_LEN when
    ``2*sum >= dp*max`` (ties prefer MAX_LEN), else SUM_LEN."""
    if is_extend and dp_size > 1:
        if max_len_with_idle and min(aligned) == 0:
            return PaddingMode.MAX_LEN, ("sglang rule: extend batch with dp_size > 1 and an "
                                         "idle replica, max_len_with_idle -> MAX_LEN")
        return PaddingMode.SUM_LEN, "sglang rule: extend batch with dp_size > 1 -> SUM_LEN"
    total, largest = sum(aligned), max(aligned)
    if fits_one_allreduce(aligned, dp_size, allreduce_bytes, row_bytes):
        return PaddingMode.SUM_LEN, (
            f"sglang rule: decode batch, no idle replica, sum={total} rows x {row_bytes} B "
            f"<= {allreduce_bytes} B (one all-reduce) -> SUM_LEN")
    if 2 * total >= dp_size * largest:
        return PaddingMode.MAX_LEN, (
            f"sglang rule: 2*sum={2 * total} >= dp*max={dp_size * largest} -> MAX_LEN")
    return PaddingMode.SUM_LEN, (
        f"sglang rule: 2*sum={2 * total} < dp*max={dp_size * largest} -> SUM_LEN")


def fits_one_allreduce(counts: Sequence[int], dp_size: int, allreduce_bytes: int | None,
                       row_bytes: int) -> bool:
    """sglang's decode rule: SUM_LEN's one all-reduce of the summed buffer fits
    ``allreduce_bytes`` (None: the rule is off), dp > 1 and no replica is idle."""
    return (allreduce_bytes is not None and dp_size > 1 and min(counts) > 0
            and sum(counts) * row_bytes <= allreduce_bytes)


def _estimates(counts: tuple[int, ...], layout: DpLayout, modes: Sequence[PaddingMode], *,
               row_bytes: int, cost_model: CostModel, transport: Transport,
               cp_shards: tuple[tuple[int, ...], ...] | None,
               cache: ScheduleCache | None = None) -> list[ModeEstimate]:
    return [estimate(make_plan(counts, layout, m, is_extend=False, capacity=None,
                               cp_shards=cp_shards, why=""),
                     row_bytes=row_bytes, cost_model=cost_model, transport=transport,
                     cache=cache)
            for m in modes]


def cost_mode(counts: tuple[int, ...], layout: DpLayout, *, cost_model: CostModel,
              row_bytes: int, transport: Transport, candidates: Sequence[PaddingMode],
              cp_shards: tuple[tuple[int, ...], ...] | None,
              cache: ScheduleCache | None = None) -> tuple[PaddingMode, Callable[[], str]]:
    """The cheapest of ``candidates`` for these checked counts, and why (formatted when
    read). Modes whose collectives alone cost more than a cheaper mode's whole step are not
    priced further (their reason entry is a lower bound, ``>=``). With CP ranks every
    rank's schedules are built and priced, their templates kept in ``cache``."""
    if layout.cp_size == 1:
        best, priced = cheapest(counts, layout, candidates, row_bytes=row_bytes,
                                cost_model=cost_model, transport=transport)
    else:
        priced = [(e.seconds, True) for e in _estimates(
            counts, layout, candidates, row_bytes=row_bytes, cost_model=cost_model,
            transport=transport, cp_shards=cp_shards, cache=cache)]
        best = cheapest_index(candidates, [t for t, _ in priced])

    def reason() -> str:
        text = ", ".join(f"{m.value}{'=' if exact else '>='}{t * 1e6:.1f}us"
                         for m, (t, exact) in zip(candidates, priced))
        return (f"cost policy: cheapest schedule estimate for rows of {row_bytes} B "
                f"({text})")
    return candidates[best], reason


def compare_modes(num_tokens: Sequence[int], layout: DpLayout, *, row_bytes: int,
                  cost_model: CostModel, transport: Transport | str = Transport.PER_ROOT,
                  candidates: Sequence[PaddingMode | str] = ALL_MODES,
                  is_extend: bool = False,
                  cp_shards: Sequence[Sequence[int]] | None = None) -> tuple[ModeEstimate, ...]:
    """Every candidate mode's estimate for these counts: a partial gather then a
    reduce_scatter (slowest rank each), as :func:`dpx.cost.estimate` prices their
    schedules. ``is_extend`` does not change a price (it is accepted for symmetry with
    plan_step)."""
    counts = check_counts(num_tokens, layout)
    shards = check_shards(cp_shards, counts, layout)
    check_int("row_bytes", row_bytes, minimum=1)
    return tuple(_estimates(counts, layout, [PaddingMode.parse(c) for c in candidates],
                            row_bytes=row_bytes, cost_model=cost_model,
                            transport=Transport.parse(transport), cp_shards=shards))
