"""The plan of one step: a frozen value, the rules of its counts, its rows.

A :class:`DpPlan` is a frozen, hashable dataclass of ints and enums: ranks that plan the
same counts alike get equal plans (and fingerprints), so a plan keys caches, is compared
across ranks and is a static argument of ``jax.jit``. Its rows are the geometry's
(:func:`dpx.geometry.slots`; docs/semantics.md, "Counts, alignment and modes").
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from dpx.counts import CountRule
from dpx.errors import DpxCapacityError, DpxTypeError, DpxValueError, check_int
from dpx.geometry import Structure, capacity_rows, slots
from dpx.ints import INTS
from dpx.layout import DpLayout
from dpx.modes import PaddingMode

__all__ = ["check_counts", "check_plan", "check_shards", "count_rule", "DpPlan", "make_plan"]


def check_counts(num_tokens: Iterable[object], layout: DpLayout) -> tuple[int, ...]:
    """Checked per-replica counts: ``dp_size`` ints >= 0 (``__index__``; no bools)."""
    if isinstance(num_tokens, (str, bytes)) or not hasattr(num_tokens, "__iter__"):
        raise DpxTypeError(f"num_tokens={num_tokens!r} must be a sequence of ints")
    counts = tuple(num_tokens)
    if len(counts) != layout.dp_size:
        raise DpxValueError(
            f"num_tokens has {len(counts)} entries {counts!r}; the layout has "
            f"dp_size={layout.dp_size} replicas and needs one count per replica")
    if set(map(type, counts)) <= {int} and (not counts or min(counts) >= 0):
        return counts  # the common case: plain non-negative ints
    return tuple(check_int(f"num_tokens[{d}]", n) for d, n in enumerate(counts))


def check_shards(cp_shards: object, counts: tuple[int, ...],
                 layout: DpLayout) -> tuple[tuple[int, ...], ...] | None:
    """A checked CP shard table: per replica ``cp_size`` ints >= 0 summing to its count
    (``None`` when ``cp_size == 1``: one CP rank holds all its replica's rows)."""
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
        row = tuple(check_int(f"cp_shards[{d}][{c}]", s) for c, s in enumerate(shards))
        if sum(row) != counts[d]:
            raise DpxValueError(f"cp_shards[{d}]={row} sums to {sum(row)}; it must "
                                f"sum to num_tokens[{d}]={counts[d]}")
        out.append(row)
    return tuple(out) if layout.cp_size > 1 else None


def count_rule(structure: Structure) -> CountRule:
    """The :class:`CountRule` of a capacity plan's structure."""
    capacity, global_rows, _ = structure.capacity_rows  # type: ignore[misc]
    each = structure.mode == PaddingMode.MAX_LEN.value  # a slot each, else the whole buffer
    return CountRule(structure.counts_size, structure.cp_size if structure.sharded else 1,
                     structure.layout.replica_size, capacity if each else None,
                     None if each else global_rows)


@dataclass(frozen=True)
class DpPlan:
    """One step's global buffer (build it with :func:`dpx.plan_step`): ``num_tokens`` real
    rows per replica (a capacity plan's host counts); ``slot_rows`` each replica's slot
    (its local buffer and scatter output; a SUM_LEN / GATHERV capacity plan's is the whole
    capacity); ``offsets`` each slot's first global row (for the host counts);
    ``cp_shards``: ``None`` (every CP rank holds all its replica's rows) or per replica each
    CP rank's rows, back to back from the slot's start."""

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
        """Why the mode was chosen (the cost policy's text is made when read)."""
        if isinstance(self.why, str):
            return self.why
        text = self.__dict__.get("_reason")
        if text is None:
            text = self.__dict__["_reason"] = self.why()
        return text

    @property
    def aligned_tokens(self) -> tuple[int, ...]:
        """Counts rounded up to a multiple of ``layout.replica_size``."""
        return INTS.ceil_align(self.num_tokens, self.layout.replica_size)

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

    @property
    def structure(self) -> Structure:
        """What the plan's schedules depend on besides its counts (made once per object;
        a plain cache: a first read on every new plan, on the call path)."""
        s = self.__dict__.get("_structure")
        if s is None:
            cap = ((self.capacity, self.global_rows, self.max_slot_rows)
                   if self.capacity is not None else None)
            lay = self.layout
            s = self.__dict__["_structure"] = Structure(
                lay.world_size, lay.dp_size, lay.cp_size, self.mode.value,
                self.cp_shards is not None, cap)
        return s

    @property
    def leaf_counts(self) -> tuple[int, ...]:
        """The counts as a schedule reads them (a shard table row by row)."""
        if self.cp_shards is None:
            return self.num_tokens
        c = self.__dict__.get("_leaf_counts")
        if c is None:
            c = self.__dict__["_leaf_counts"] = tuple(x for row in self.cp_shards for x in row)
        return c

    @property
    def count_rule(self) -> CountRule:
        """The rule a capacity plan's host and device counts obey."""
        if self.capacity is None:
            raise DpxValueError("device counts need a capacity plan (plan_step(..., capacity=))")
        return count_rule(self.structure)

    def __hash__(self) -> int:
        # once per object (plans key every per-call cache); never pickled, since str
        # hashes differ between processes
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = hash(self.key())
        return h

    def __getstate__(self) -> dict:
        """The fields, the reason as text; nothing derived (a hash is per process)."""
        return {k: self.__dict__[k] for k in self.__dataclass_fields__} | {"why": self.reason}

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
        return " ".join([
            self.mode.value, f"counts={list(self.num_tokens)}",
            *([f"shards={[list(s) for s in self.cp_shards]}"] if self.sharded else []),
            *([f"capacity={self.capacity}"] if self.capacity is not None else []),
            f"global_rows={self.global_rows}", *(["extend"] if self.is_extend else [])])

    def with_counts(self, num_tokens: Sequence[int] | None = None, *,
                    cp_shards: Sequence[Sequence[int]] | None = None) -> "DpPlan":
        """A capacity plan's static shapes with other host counts (or ``cp_shards``)."""
        if not self.is_static:
            raise DpxValueError("with_counts() needs a capacity plan (capacity=None here)")
        if self.sharded:
            if cp_shards is None:
                raise DpxValueError("with_counts() of a sharded plan needs cp_shards=")
            num_tokens = [sum(s) for s in cp_shards] if num_tokens is None else num_tokens
        counts = check_counts(num_tokens, self.layout)
        return make_plan(counts, self.layout, self.mode, is_extend=self.is_extend,
                         capacity=self.capacity,
                         cp_shards=check_shards(cp_shards, counts, self.layout), why=self.why)


def make_plan(counts: tuple[int, ...], layout: DpLayout, mode: PaddingMode, *, is_extend: bool,
              capacity: int | None, cp_shards: tuple[tuple[int, ...], ...] | None,
              why: str | Callable[[], str]) -> DpPlan:
    """The plan of checked ``counts`` in ``mode`` (a capacity plan's obey its
    :class:`CountRule`, else :class:`~dpx.DpxCapacityError`)."""
    m, dp = layout.replica_size, layout.dp_size
    cap_rows = None if capacity is None else capacity_rows(check_int("capacity", capacity),
                                                           mode, dp, m)
    aligned, slot_rows, offsets, global_rows = slots(INTS, mode, dp, m, counts, cap_rows)
    if cap_rows is None:  # slots and offsets follow the per-replica counts
        return DpPlan(layout, mode, counts, slot_rows, offsets, global_rows, None,
                      is_extend, cp_shards, why)
    capacity, _, slot = cap_rows  # every replica's buffer: a slot of the capacity
    plan = DpPlan(layout, mode, counts, (slot,) * dp, offsets, global_rows, capacity,
                  is_extend, cp_shards, why)
    rule = plan.count_rule
    if rule.problems(plan.leaf_counts):
        if rule.max_each is not None:
            d = next(d for d, n in enumerate(counts) if n > capacity)
            raise DpxCapacityError(
                f"num_tokens[{d}]={counts[d]} exceeds capacity={capacity}: a MAX_LEN "
                f"capacity is the per-replica slot size")
        raise DpxCapacityError(
            f"sum of aligned num_tokens {aligned} = {sum(aligned)} exceeds capacity="
            f"{capacity} (aligned to replica_size={m}: {cap_rows[2]}): a {mode.name} "
            f"capacity is the global buffer size")
    return plan


def check_plan(plan: object) -> DpPlan:
    """``plan`` itself, if it is a :class:`DpPlan` (every function taking one checks it
    here first)."""
    if not isinstance(plan, DpPlan):
        raise DpxTypeError(f"plan must be a dpx.DpPlan, got {type(plan).__name__}")
    return plan
