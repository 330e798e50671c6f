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

With ``capacity=`` the shapes are static and independent of the counts::

    MAX_LEN : slot_rows[d] = ceil_align(capacity, m); offsets static as above;
              global_rows = dp * slot_rows[0] = sum(slot_rows)
    SUM_LEN / GATHERV : global_rows = ceil_align(capacity, m), and every replica's local
              buffer has slot_rows[d] = global_rows rows (a replica may hold every token),
              so here global_rows != sum(slot_rows); offsets are those of the plan's
              host counts (``num_tokens``): with device counts the slots lie where the
              step's counts put them, computed on the device.
"""

from __future__ import annotations

import hashlib
from itertools import accumulate
from dataclasses import dataclass, field
from typing import Callable, Sequence

from dpx.cost import CostModel
from dpx.counts import check_counts, check_shards
from dpx.errors import DpxCapacityError, DpxTypeError, DpxValueError
from dpx.explain import explain_plan
from dpx.expr import ceil_align
from dpx.layout import DpLayout
from dpx.modes import PaddingMode, Policy, Transport, Wire
from dpx.policy import ALL_MODES, compare_modes, cost_mode, sglang_mode

__all__ = ["DpPlan", "plan_step"]

#: The cost model of ``policy="cost"`` when none is given (immutable).
DEFAULT_COST_MODEL = CostModel()


def _layout_rows(mode: PaddingMode, aligned: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    n = len(aligned)
    if mode is PaddingMode.MAX_LEN:
        slot = max(aligned) if aligned else 0
        return (slot,) * n, (tuple(range(0, slot * n, slot)) if slot else (0,) * n)
    slots = tuple(aligned)
    return slots, tuple(accumulate(slots, initial=0))[:-1]


@dataclass(frozen=True)
class DpPlan:
    """A static description of one step's global buffer. Build it with :func:`plan_step`.

    Fields: ``layout``; ``mode``; ``num_tokens`` (real count per replica; with a capacity
    plan, the host counts used when no device counts are passed); ``slot_rows`` (rows of
    each replica's slot in the global buffer -- for a SUM_LEN / GATHERV capacity plan, the
    rows of each replica's local buffer, see the module docstring -- and of its scatter
    output); ``offsets`` (first global row of each slot for the host counts);
    ``global_rows``; ``capacity`` (``None`` or the static capacity); ``is_extend``;
    ``cp_shards`` (``None``: every CP rank of a replica holds all its rows; else per
    replica the rows each CP rank holds, back to back at the start of its slot,
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
    #: why the mode was chosen: a str, or a function making it on first read
    why: str | Callable[[], str] = field(default="", compare=False, repr=False)

    @property
    def reason(self) -> str:
        """Why the mode was chosen (the cost policy's prices are formatted when read)."""
        why = self.why
        if not isinstance(why, str):
            why = why()
            object.__setattr__(self, "why", why)
        return why

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
        """True when slot offsets follow the step's counts (device counts of a SUM_LEN /
        GATHERV capacity plan)."""
        return self.is_static and self.mode is not PaddingMode.MAX_LEN

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
        """Pickled: the fields, the reason as text (not the function that formats it);
        nothing derived (a hash is per process)."""
        state = {k: v for k, v in self.__dict__.items() if not k.startswith("_")}
        state["why"] = self.reason
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

    def describe(self) -> str:
        """The plan in one line (what a mismatch error shows)."""
        parts = [f"{self.mode.value}", f"counts={list(self.num_tokens)}"]
        if self.cp_shards is not None:
            parts.append(f"shards={[list(s) for s in self.cp_shards]}")
        if self.capacity is not None:
            parts.append(f"capacity={self.capacity}")
        parts.append(f"global_rows={self.global_rows}")
        if self.is_extend:
            parts.append("extend")
        return " ".join(parts)

    def with_counts(self, num_tokens: Sequence[int] | None = None, *,
                    cp_shards: Sequence[Sequence[int]] | None = None) -> "DpPlan":
        """For a capacity plan: the same static shapes, other host counts (a sharded plan
        takes ``cp_shards``; the counts are their sums)."""
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
                device_counts: bool = False, wire: Wire | str = Wire.NATIVE) -> str:
        """A human-readable account: layout, slots, a picture, every mode's estimate, and
        the priced schedules (partial and replicated gather on ``wire``, reduce_scatter)
        of ``ranks`` (``None``: all). Prices rows of ``hidden`` elements of ``itemsize``
        bytes."""
        model = cost_model or CostModel()
        transport = Transport.parse(transport)
        rb = hidden * itemsize
        modes = compare_modes(self.num_tokens, self.layout, row_bytes=rb, cost_model=model,
                              transport=transport, cp_shards=self.cp_shards)
        return explain_plan(self, modes, row_bytes=rb, hidden=hidden, itemsize=itemsize,
                            cost_model=model, transport=transport,
                            ranks=range(self.layout.world_size) if ranks is None else ranks,
                            device_counts=device_counts, wire=Wire.parse(wire))


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
    priced as the schedules it would run (:mod:`dpx.pricing`) under ``cost_model`` for rows
    of ``row_bytes`` bytes on ``transport``. ``capacity`` makes the shapes static (see the
    module docstring); a capacity plan with no forced mode uses MAX_LEN, the mode whose
    slots are static. ``cp_shards`` (``cp_size > 1``): per replica, the rows each CP rank
    holds (they lie back to back, in CP-rank order, at the start of the replica's slot);
    without it every CP rank of a replica holds all of its rows.
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
    if max_len_with_idle and policy is not Policy.SGLANG:
        raise DpxValueError(f"max_len_with_idle=True is an option of policy='sglang'; "
                            f"policy={policy.value!r} was given")
    m = layout.replica_size  # counts align to the ranks that share a replica's slot
    aligned = counts if m == 1 else tuple(-(-n // m) * m for n in counts)

    if capacity is not None:
        if isinstance(capacity, bool) or not isinstance(capacity, int):
            raise DpxTypeError(f"capacity={capacity!r} must be an int or None")
        if capacity < 0:
            raise DpxValueError(f"capacity={capacity} must be >= 0")
        chosen = forced or PaddingMode.MAX_LEN
        reason = (f"forced mode={chosen.value}" if forced else
                  "capacity plan: MAX_LEN (static slots) unless mode= is given")
        cap = ceil_align(capacity, m)
        if chosen is PaddingMode.MAX_LEN:
            for d, n in enumerate(counts):
                if n > capacity:
                    raise DpxCapacityError(
                        f"num_tokens[{d}]={n} exceeds capacity={capacity}: a MAX_LEN "
                        f"capacity is the per-replica slot size")
            slots = (cap,) * layout.dp_size
            offsets = tuple(d * cap for d in range(layout.dp_size))
            global_rows = cap * layout.dp_size
        else:
            if sum(aligned) > cap:
                raise DpxCapacityError(
                    f"sum of aligned num_tokens {aligned} = {sum(aligned)} exceeds "
                    f"capacity={capacity} (aligned to replica_size={m}: {cap}): a "
                    f"{chosen.name} capacity is the global buffer size")
            slots = (cap,) * layout.dp_size
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
        if type(row_bytes) is not int or row_bytes <= 0:
            raise DpxValueError(f"row_bytes={row_bytes!r} must be a positive int")
        cands = candidates if candidates is ALL_MODES else tuple(
            PaddingMode.parse(c) for c in candidates)
        if not cands:
            raise DpxValueError("candidates must name at least one PaddingMode")
        chosen, reason = cost_mode(counts, layout, aligned=aligned,
                                   cost_model=cost_model or DEFAULT_COST_MODEL,
                                   row_bytes=row_bytes,
                                   transport=transport if type(transport) is Transport
                                   else Transport.parse(transport),
                                   candidates=cands, cp_shards=shards)
    slots, offsets = _layout_rows(chosen, aligned)
    return DpPlan(layout, chosen, counts, slots, offsets, sum(slots), None, is_extend, shards,
                  reason)
