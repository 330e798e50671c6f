"""The padding planner: per-replica token counts in, a static plan out (:func:`plan_step`)."""

from __future__ import annotations

from typing import Sequence

from dpx.cost import CostModel
from dpx.errors import DpxTypeError, DpxValueError, check_int
from dpx.ints import INTS
from dpx.layout import DpLayout
from dpx.modes import PaddingMode, Policy, Transport
from dpx.plan import DpPlan, check_counts, check_shards, make_plan
from dpx.policy import ALL_MODES, cost_mode, sglang_mode
from dpx.schedule import ScheduleCache

__all__ = ["plan_step"]

#: The cost model of ``policy="cost"`` when none is given (immutable).
DEFAULT_COST_MODEL = CostModel()


def plan_step(num_tokens: Sequence[int], layout: DpLayout, *, is_extend: bool = False,
              mode: PaddingMode | str | None = None, policy: Policy | str = Policy.SGLANG,
              max_len_with_idle: bool = False, capacity: int | None = None,
              cost_model: CostModel | None = None, row_bytes: int = 7168 * 2,
              candidates: Sequence[PaddingMode | str] = ALL_MODES,
              transport: Transport | str = Transport.PER_ROOT,
              cp_shards: Sequence[Sequence[int]] | None = None,
              cache: ScheduleCache | None = None,
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
    shards = check_shards(cp_shards, counts, layout) if cp_shards is not None else None
    if is_extend is not True and is_extend is not False:
        raise DpxTypeError(f"is_extend={is_extend!r} must be a bool")
    if max_len_with_idle is not True and max_len_with_idle is not False:
        raise DpxTypeError(f"max_len_with_idle={max_len_with_idle!r} must be a bool")
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
    if capacity is not None:
        chosen = forced or PaddingMode.MAX_LEN
        why = (f"forced mode={chosen.value}" if forced else
               "capacity plan: MAX_LEN (static slots) unless mode= is given")
        return make_plan(counts, layout, chosen, is_extend=is_extend, capacity=capacity,
                         cp_shards=shards, why=why)
    if forced is not None:
        chosen, why = forced, f"forced mode={forced.value}"
    elif policy is Policy.SGLANG:
        chosen, why = sglang_mode(INTS.ceil_align(counts, layout.replica_size),
                                  layout.dp_size, is_extend,
                                  max_len_with_idle=max_len_with_idle,
                                  allreduce_bytes=sum_len_allreduce_bytes,
                                  row_bytes=row_bytes)
    else:
        if type(row_bytes) is not int or row_bytes <= 0:
            check_int("row_bytes", row_bytes, minimum=1)
        cands = candidates if candidates is ALL_MODES else tuple(
            PaddingMode.parse(c) for c in candidates)
        if not cands:
            raise DpxValueError("candidates must name at least one PaddingMode")
        chosen, why = cost_mode(counts, layout, cost_model=cost_model or DEFAULT_COST_MODEL,
                                row_bytes=row_bytes,
                                transport=transport if type(transport) is Transport
                                else Transport.parse(transport),
                                candidates=cands, cp_shards=shards, cache=cache)
    return make_plan(counts, layout, chosen, is_extend=is_extend, capacity=None,
                     cp_shards=shards, why=why)
