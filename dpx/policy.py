"""The padding planner: per-replica token counts in, a static plan out (:func:`plan_step`),
and how it picks a padding mode when none is forced.

``sglang``: sglang's rule on the aligned counts. ``cost``: the cheapest candidate under a
:class:`dpx.CostModel`: each mode priced as :func:`dpx.cost.estimate` prices its plan's
schedules (without CP ranks in closed form, :mod:`dpx.pricing`, proved equal), ties to the
earlier of MAX_LEN, SUM_LEN, GATHERV (:func:`dpx.pricing.cheapest_index`).
"""

from __future__ import annotations

from typing import Callable, Sequence

from dpx.cost import ALL_MODES, mode_estimates
from dpx.cost_model import CostModel
from dpx.errors import DpxTypeError, DpxValueError, check_bool, check_int
from dpx.ints import INTS
from dpx.layout import DpLayout
from dpx.modes import PaddingMode, Policy, Transport
from dpx.plan import DpPlan, check_counts, check_shards, make_plan
from dpx.pricing import cheapest, cheapest_index
from dpx.schedule import ScheduleCache

__all__ = ["cost_mode", "fits_one_allreduce", "plan_step", "sglang_mode", "sglang_step_mode"]

#: The cost model of ``policy="cost"`` when none is given (immutable).
DEFAULT_COST_MODEL = CostModel()


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


def sglang_step_mode(padding: str | None, layout: DpLayout, *, max_padding: bool,
                     use_gatherv: bool) -> PaddingMode:
    """The mode dpx runs a step of sglang's in: its padding mode ``padding`` by name
    (``"MAX_LEN"`` / ``"SUM_LEN"``; None: the forward's recorded one, MAX_LEN when
    ``max_padding``), SUM_LEN as GATHERV where sglang's variable all-gather runs
    (``use_gatherv``, attn-tp 1 and no CP)."""
    if padding is None:
        padding = "MAX_LEN" if max_padding else "SUM_LEN"
    mode = PaddingMode[padding]
    gatherv = use_gatherv and layout.attn_tp_size == 1 and layout.cp_size == 1
    return PaddingMode.GATHERV if mode is PaddingMode.SUM_LEN and gatherv else mode


def fits_one_allreduce(counts: Sequence[int], dp_size: int, allreduce_bytes: int | None,
                       row_bytes: int) -> bool:
    """sglang's decode rule: SUM_LEN's one all-reduce of the summed buffer fits
    ``allreduce_bytes`` (None: the rule is off), dp > 1 and no replica is idle."""
    return (allreduce_bytes is not None and dp_size > 1 and min(counts) > 0
            and sum(counts) * row_bytes <= allreduce_bytes)


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
        priced = [(e.seconds, True) for e in mode_estimates(
            counts, layout, candidates, row_bytes=row_bytes, cost_model=cost_model,
            transport=transport, cp_shards=cp_shards, cache=cache)]
        best = cheapest_index(candidates, [t for t, _ in priced])

    def reason() -> str:
        text = ", ".join(f"{m.value}{'=' if exact else '>='}{t * 1e6:.1f}us"
                         for m, (t, exact) in zip(candidates, priced))
        bound = ("" if all(exact for _, exact in priced) else
                 "; >=: a lower bound, its collectives alone over the cheapest mode's step")
        return (f"cost policy: cheapest schedule estimate for rows of {row_bytes} B "
                f"({text}{bound})")
    return candidates[best], reason


def plan_step(num_tokens: Sequence[int], layout: DpLayout, *, is_extend: bool = False,
              mode: PaddingMode | str | None = None, policy: Policy | str = Policy.SGLANG,
              max_len_with_idle: bool = False, capacity: int | None = None,
              cost_model: CostModel | None = None, row_bytes: int = 7168 * 2,
              candidates: Sequence[PaddingMode | str] = ALL_MODES,
              transport: Transport | str = Transport.PER_ROOT,
              cp_shards: Sequence[Sequence[int]] | None = None, cache: ScheduleCache | None = None,
              sum_len_allreduce_bytes: int | None = None) -> DpPlan:
    """Plan one step for per-replica real counts ``num_tokens`` (length ``dp_size``).

    ``mode`` forces a mode; otherwise ``policy`` picks one: ``"sglang"`` applies sglang's
    rule (``max_len_with_idle=True`` turns on its hybrid-model branch: an extend batch with
    an idle replica takes MAX_LEN; ``sum_len_allreduce_bytes=N`` turns on its decode rule:
    SUM_LEN when no replica is idle and the summed buffer of rows of ``row_bytes`` bytes
    fits one all-reduce of ``N`` bytes); ``"cost"`` takes the cheapest of ``candidates``, each
    priced as the schedules it would run (:mod:`dpx.pricing`) under ``cost_model`` for rows
    of ``row_bytes`` bytes on ``transport``. ``capacity`` makes the shapes static (see
    :mod:`dpx.plan`); a capacity plan with no forced mode uses MAX_LEN, the mode whose
    slots are static. ``cp_shards`` (``cp_size > 1``): per replica, the rows each CP rank
    holds (they lie back to back, in CP-rank order, at the start of the replica's slot);
    without it every CP rank of a replica holds all of its rows. ``cache``: where the cost
    policy keeps the schedule templates it prices with CP ranks (``cp_size > 1``, where it
    builds every rank's schedules; a server planning every step passes one, else each
    call builds them anew).
    """
    if not isinstance(layout, DpLayout):
        raise DpxTypeError(f"layout={layout!r} must be a dpx.DpLayout")
    counts = check_counts(num_tokens, layout)
    shards = check_shards(cp_shards, counts, layout)
    check_bool("is_extend", is_extend)
    check_bool("max_len_with_idle", max_len_with_idle)
    policy = policy if policy is Policy.SGLANG else Policy.parse(policy)
    forced = None if mode is None else PaddingMode.parse(mode)
    if policy is not Policy.SGLANG:
        for name, on in (("max_len_with_idle=True", max_len_with_idle),
                         ("sum_len_allreduce_bytes", sum_len_allreduce_bytes is not None)):
            if on:
                raise DpxValueError(f"{name} is an option of policy='sglang'; "
                                    f"policy={policy.value!r} was given")
    if sum_len_allreduce_bytes is not None:
        check_int("sum_len_allreduce_bytes", sum_len_allreduce_bytes)
        check_int("row_bytes", row_bytes, minimum=1)
    if forced is not None:
        chosen, why = forced, f"forced mode={forced.value}"
    elif capacity is not None:
        chosen, why = PaddingMode.MAX_LEN, ("capacity plan: MAX_LEN (static slots) unless "
                                            "mode= is given")
    elif policy is Policy.SGLANG:
        chosen, why = sglang_mode(INTS.ceil_align(counts, layout.replica_size), layout.dp_size,
                                  is_extend, max_len_with_idle=max_len_with_idle,
                                  allreduce_bytes=sum_len_allreduce_bytes, row_bytes=row_bytes)
    else:
        check_int("row_bytes", row_bytes, minimum=1)
        cands = candidates if candidates is ALL_MODES else tuple(
            PaddingMode.parse(c) for c in candidates)
        if not cands:
            raise DpxValueError("candidates must name at least one PaddingMode")
        chosen, why = cost_mode(counts, layout, cost_model=cost_model or DEFAULT_COST_MODEL,
                                row_bytes=row_bytes, transport=Transport.parse(transport),
                                candidates=cands, cp_shards=shards, cache=cache)
    return make_plan(counts, layout, chosen, is_extend=is_extend, capacity=capacity,
                     cp_shards=shards, why=why)
