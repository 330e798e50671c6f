"""The padding planner: per-replica token counts in, a static plan out.

A :class:`DpPlan` is a frozen, hashable dataclass of ints and enums. Every rank that plans
the same counts with the same arguments gets an equal plan (and an equal
:meth:`DpPlan.fingerprint`), so it can key caches, be compared across ranks, and be a
static argument of ``jax.jit``. What each rank then does with it is its schedule
(:mod:`dpx.schedule`).

Shape algebra for replica ``d`` (``n_d`` real tokens, ``a_d = ceil_align(n_d, m)`` with
``m = replica_size = cp_size * attn_tp_size``, the ranks that share a slot)::

    MAX_LEN : slot_rows[d] = max_d a_d            offsets[d] = d * slot_rows[0]
    SUM_LEN : slot_rows[d] = a_d                  offsets[d] = a_0 + ... + a_{d-1}
    GATHERV : as SUM_LEN (moved by a variable-length all-gather)
    global_rows = sum(slot_rows)

With ``capacity=`` the shapes are static and independent of the counts:

    MAX_LEN : slot_rows[d] = ceil_align(capacity, m); offsets static as above
    SUM_LEN / GATHERV : global_rows = ceil_align(capacity, m), and every replica's
        local buffer has slot_rows[d] = global_rows rows (a replica may hold every token);
        the offsets of the real counts are computed on the device at run time.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from dpx.cost import CostModel, ModeEstimate, estimate
from dpx.errors import DpxCapacityError, DpxTypeError, DpxValueError
from dpx.expr import ceil_align
from dpx.layout import DpLayout
from dpx.modes import PaddingMode, Policy, Transport

ALL_MODES: tuple[PaddingMode, ...] = (PaddingMode.MAX_LEN, PaddingMode.SUM_LEN,
                                      PaddingMode.GATHERV)


def check_counts(num_tokens: Iterable[object], layout: DpLayout) -> tuple[int, ...]:
    """Validate per-replica counts: ``dp_size`` non-negative Python ints."""
    if isinstance(num_tokens, (str, bytes)) or not hasattr(num_tokens, "__iter__"):
        raise DpxTypeError(f"num_tokens={num_tokens!r} must be a sequence of ints")
    counts = tuple(num_tokens)
    if len(counts) != layout.dp_size:
        raise DpxValueError(
            f"num_tokens has {len(counts)} entries {counts!r}; the layout has "
            f"dp_size={layout.dp_size} replicas and needs one count per replica")
    out = []
    for d, n in enumerate(counts):
        if isinstance(n, bool) or not isinstance(n, int):
            # numpy integers are accepted through __index__, floats are not.
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


def sglang_mode(aligned: Sequence[int], dp_size: int, is_extend: bool, *,
                max_len_with_idle: bool = False) -> tuple[PaddingMode, str]:
    """sglang's rule on the aligned counts: an extend batch with dp > 1 takes SUM_LEN, or
    MAX_LEN when ``max_len_with_idle`` and some replica is idle (sglang's branch for hybrid
    SSM models, which materialise idle replicas as padded rows); any other batch takes
    MAX_LEN when ``2*sum >= dp*max`` (ties prefer MAX_LEN), else SUM_LEN."""
    if is_extend and dp_size > 1:
        if max_len_with_idle and min(aligned) == 0:
            return PaddingMode.MAX_LEN, ("sglang rule: extend batch with dp_size > 1 and an "
                                         "idle replica, max_len_with_idle -> MAX_LEN")
        return PaddingMode.SUM_LEN, "sglang rule: extend batch with dp_size > 1 -> SUM_LEN"
    total, largest = sum(aligned), max(aligned)
    if 2 * total >= dp_size * largest:
        return PaddingMode.MAX_LEN, (
            f"sglang rule: 2*sum={2 * total} >= dp*max={dp_size * largest} -> MAX_LEN")
    return PaddingMode.SUM_LEN, (
        f"sglang rule: 2*sum={2 * total} < dp*max={dp_size * largest} -> SUM_LEN")


def _layout_rows(mode: PaddingMode, aligned: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if mode is PaddingMode.MAX_LEN:
        slot = max(aligned) if aligned else 0
        slots = tuple(slot for _ in aligned)
    else:
        slots = tuple(aligned)
    offsets, acc = [], 0
    for s in slots:
        offsets.append(acc)
        acc += s
    return slots, tuple(offsets)


@dataclass(frozen=True)
class DpPlan:
    """A static description of one step's global buffer. Build it with :func:`plan_step`.

    Fields: ``layout``; ``mode``; ``num_tokens`` (real count per replica; with a capacity
    plan, the default counts used when no device counts are passed); ``slot_rows`` (rows of
    each replica's slot in the global buffer, and of its scatter output); ``offsets``
    (first global row of each slot); ``capacity`` (``None`` or the static capacity);
    ``is_extend``; ``cp_shards`` (``None``: every CP rank of a replica holds all its rows;
    else per replica the rows each CP rank holds, back to back at the start of its slot,
    ``sum(cp_shards[d]) == num_tokens[d]``); ``reason`` (why the mode was chosen).
    """

    layout: DpLayout
    mode: PaddingMode
    num_tokens: tuple[int, ...]
    slot_rows: tuple[int, ...]
    offsets: tuple[int, ...]
    global_rows: int
    capacity: int | None = None
    is_extend: bool = False
    cp_shards: tuple[tuple[int, ...], ...] | None = None
    reason: str = field(default="", compare=False)

    @property
    def aligned_tokens(self) -> tuple[int, ...]:
        """Counts rounded up to a multiple of ``layout.replica_size`` (``cp_size *
        attn_tp_size``: ``attn_tp_size`` without context parallelism)."""
        m = self.layout.replica_size
        return tuple(ceil_align(n, m) for n in self.num_tokens)

    @property
    def sharded(self) -> bool:
        """True when each CP rank holds its own shard of its replica's rows."""
        return self.cp_shards is not None

    @property
    def max_slot_rows(self) -> int:
        """The largest local buffer any replica needs (the per-device rows under JAX)."""
        return max(self.slot_rows)

    @property
    def is_static(self) -> bool:
        """True for capacity plans: shapes do not depend on the counts."""
        return self.capacity is not None

    @property
    def dynamic_offsets(self) -> bool:
        """True when slot offsets must be derived from the counts at run time."""
        return self.is_static and self.mode is not PaddingMode.MAX_LEN

    def slot_of_rank(self, rank: int) -> int:
        return self.layout.coords(rank).attn_dp_rank

    def __hash__(self) -> int:
        # computed once per object (plans key every per-call cache); never pickled, since
        # str hashes differ between processes
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.layout, self.mode, self.num_tokens, self.slot_rows, self.offsets,
                      self.global_rows, self.capacity, self.is_extend, self.cp_shards))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_hash", None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def key(self) -> tuple:
        """The canonical content of the plan (what :meth:`fingerprint` hashes)."""
        lay = self.layout
        return (lay.world_size, lay.dp_size, lay.cp_size, self.mode.value, self.num_tokens,
                self.slot_rows, self.offsets, self.global_rows, self.capacity, self.is_extend,
                self.cp_shards)

    def fingerprint(self) -> str:
        """A 16-hex-digit digest of :meth:`key`, equal on every rank for equal plans."""
        return hashlib.sha256(repr(self.key()).encode()).hexdigest()[:16]

    def fingerprint64(self) -> int:
        """The fingerprint as a signed 64-bit int (to exchange in an int64 tensor)."""
        value = int(self.fingerprint(), 16)
        return value - (1 << 64) if value >= (1 << 63) else value

    def with_counts(self, num_tokens: Sequence[int] | None = None, *,
                    cp_shards: Sequence[Sequence[int]] | None = None) -> "DpPlan":
        """For a capacity plan: the same static shapes, other default counts (a sharded
        plan takes ``cp_shards``; the counts are their sums)."""
        if not self.is_static:
            raise DpxValueError("with_counts() needs a capacity plan (capacity=None here)")
        if self.sharded:
            if cp_shards is None:
                raise DpxValueError("with_counts() of a sharded plan needs cp_shards=")
            num_tokens = [sum(s) for s in cp_shards] if num_tokens is None else num_tokens
        return plan_step(num_tokens, self.layout, is_extend=self.is_extend, mode=self.mode,
                         capacity=self.capacity, cp_shards=cp_shards)

    def explain(self, *, hidden: int = 7168, itemsize: int = 2,
                cost_model: CostModel | None = None, ranks: Sequence[int] | None = (0,),
                transport: Transport | str = Transport.PER_ROOT,
                device_counts: bool = False) -> str:
        """A human-readable account: layout, slots, a picture, every mode's estimate, and
        the priced schedules (partial gather, reduce_scatter) of ``ranks`` (``None``: all)."""
        from dpx.explain import explain_plan

        model = cost_model or CostModel()
        transport = Transport.parse(transport)
        rb = hidden * itemsize
        modes = compare_modes(self.num_tokens, self.layout, row_bytes=rb, cost_model=model,
                              transport=transport, is_extend=self.is_extend,
                              cp_shards=self.cp_shards)
        return explain_plan(self, modes, row_bytes=rb, hidden=hidden, itemsize=itemsize,
                            cost_model=model, transport=transport,
                            ranks=range(self.layout.world_size) if ranks is None else ranks,
                            device_counts=device_counts)


def compare_modes(num_tokens: Sequence[int], layout: DpLayout, *, row_bytes: int,
                  cost_model: CostModel, transport: Transport | str = Transport.PER_ROOT,
                  candidates: Sequence[PaddingMode | str] = ALL_MODES,
                  is_extend: bool = False,
                  cp_shards: Sequence[Sequence[int]] | None = None) -> tuple[ModeEstimate, ...]:
    """Every candidate mode's estimate for these counts: the priced schedules of a partial
    gather and a reduce_scatter (slowest rank each), as :mod:`dpx.cost` defines them."""
    transport = Transport.parse(transport)
    return tuple(estimate(plan_step(num_tokens, layout, mode=m, is_extend=is_extend,
                                    cp_shards=cp_shards),
                          row_bytes=row_bytes, cost_model=cost_model, transport=transport)
                 for m in (PaddingMode.parse(c) for c in candidates))


def plan_step(num_tokens: Sequence[int], layout: DpLayout, *, is_extend: bool = False,
              mode: PaddingMode | str | None = None, policy: Policy | str = Policy.SGLANG,
              max_len_with_idle: bool = False, capacity: int | None = None,
              cost_model: CostModel | None = None, row_bytes: int = 7168 * 2,
              candidates: Sequence[PaddingMode | str] = ALL_MODES,
              transport: Transport | str = Transport.PER_ROOT,
              cp_shards: Sequence[Sequence[int]] | None = None) -> DpPlan:
    """Plan one step for per-replica real counts ``num_tokens`` (length ``dp_size``).

    ``mode`` forces a mode; otherwise ``policy`` picks one: ``"sglang"`` applies sglang's
    rule (``max_len_with_idle=True`` turns on its hybrid-model branch: an extend batch with
    an idle replica takes MAX_LEN); ``"cost"`` takes the cheapest of ``candidates``, each
    priced from the schedules it would run (:func:`compare_modes`) under ``cost_model``
    for rows of ``row_bytes`` bytes on ``transport``. ``capacity`` makes the shapes static
    (see the module docstring); a capacity plan with no forced mode uses MAX_LEN, the mode
    whose slots are static. ``cp_shards`` (``cp_size > 1``): per replica, the rows each CP
    rank holds (they lie back to back, in CP-rank order, at the start of the replica's
    slot); without it every CP rank of a replica holds all of its rows.
    """
    if not isinstance(layout, DpLayout):
        raise DpxTypeError(f"layout={layout!r} must be a dpx.DpLayout")
    counts = check_counts(num_tokens, layout)
    shards = check_shards(cp_shards, counts, layout)
    if not isinstance(is_extend, bool):
        raise DpxTypeError(f"is_extend={is_extend!r} must be a bool")
    if not isinstance(max_len_with_idle, bool):
        raise DpxTypeError(f"max_len_with_idle={max_len_with_idle!r} must be a bool")
    policy = Policy.parse(policy)
    forced = None if mode is None else PaddingMode.parse(mode)
    cands = tuple(PaddingMode.parse(c) for c in candidates)
    if not cands:
        raise DpxValueError("candidates must name at least one PaddingMode")
    if max_len_with_idle and policy is not Policy.SGLANG:
        raise DpxValueError(f"max_len_with_idle=True is an option of policy='sglang'; "
                            f"policy={policy.value!r} was given")
    tp = layout.replica_size  # counts align to the ranks that share a replica's slot
    aligned = tuple(ceil_align(n, tp) for n in counts)

    if capacity is not None:
        if isinstance(capacity, bool) or not isinstance(capacity, int):
            raise DpxTypeError(f"capacity={capacity!r} must be an int or None")
        if capacity < 0:
            raise DpxValueError(f"capacity={capacity} must be >= 0")
        chosen = forced or PaddingMode.MAX_LEN
        reason = (f"forced mode={chosen.value}" if forced else
                  "capacity plan: MAX_LEN (static slots) unless mode= is given")
        cap = ceil_align(capacity, tp)
        if chosen is PaddingMode.MAX_LEN:
            for d, n in enumerate(counts):
                if n > capacity:
                    raise DpxCapacityError(
                        f"num_tokens[{d}]={n} exceeds capacity={capacity}: a MAX_LEN "
                        f"capacity is the per-replica slot size")
            slots = tuple(cap for _ in counts)
            offsets = tuple(d * cap for d in range(layout.dp_size))
            global_rows = cap * layout.dp_size
        else:
            if sum(aligned) > cap:
                raise DpxCapacityError(
                    f"sum of aligned num_tokens {aligned} = {sum(aligned)} exceeds "
                    f"capacity={capacity} (aligned to replica_size={tp}: {cap}): a "
                    f"{chosen.name} capacity is the global buffer size")
            slots = tuple(cap for _ in counts)
            _, offsets = _layout_rows(chosen, aligned)
            global_rows = cap
        return DpPlan(layout, chosen, counts, slots, offsets, global_rows, capacity,
                      is_extend, shards, reason)

    if forced is not None:
        chosen, reason = forced, f"forced mode={forced.value}"
    elif policy is Policy.SGLANG:
        chosen, reason = sglang_mode(aligned, layout.dp_size, is_extend,
                                     max_len_with_idle=max_len_with_idle)
    else:
        model = cost_model or CostModel()
        if isinstance(row_bytes, bool) or not isinstance(row_bytes, int) or row_bytes <= 0:
            raise DpxValueError(f"row_bytes={row_bytes!r} must be a positive int")
        estimates = compare_modes(counts, layout, row_bytes=row_bytes, cost_model=model,
                                  transport=transport, candidates=cands, is_extend=is_extend,
                                  cp_shards=shards)
        best = min(estimates, key=lambda e: (e.seconds, ALL_MODES.index(e.mode)))
        chosen = best.mode
        others = ", ".join(f"{e.mode.value}={e.seconds * 1e6:.1f}us" for e in estimates)
        reason = f"cost policy: cheapest schedule estimate ({others})"
    slots, offsets = _layout_rows(chosen, aligned)
    return DpPlan(layout, chosen, counts, slots, offsets, sum(slots), None, is_extend, shards,
                  reason)
