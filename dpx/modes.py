"""Enums naming the padding modes and the planner's policies."""

from __future__ import annotations

import enum

from dpx.errors import DpxTypeError, DpxValueError


class _ParsableEnum(enum.Enum):
    @classmethod
    def parse(cls, value: "str | _ParsableEnum") -> "_ParsableEnum":
        """Accept a member or its (case-insensitive) name or value; reject anything else."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, str):
            raise DpxTypeError(
                f"{cls.__name__} must be a {cls.__name__} or a str, got {value!r}")
        key = value.strip().lower()
        for member in cls:
            if key in (member.value, member.name.lower()):
                return member
        choices = ", ".join(repr(m.value) for m in cls)
        raise DpxValueError(f"unknown {cls.__name__} {value!r}: expected one of {choices}")


class PaddingMode(_ParsableEnum):
    """How the per-replica slots are laid out in the global buffer, and moved.

    ``MAX_LEN``: every slot padded to the largest aligned count; world all-gather.
    ``SUM_LEN``: slots packed at their cumulative offsets in a zero buffer; world all-reduce.
    ``GATHERV``: packed slots, variable-length all-gather moving exactly the real rows.
    """

    MAX_LEN = "max_len"
    SUM_LEN = "sum_len"
    GATHERV = "gatherv"


class Policy(_ParsableEnum):
    """How :func:`dpx.plan_step` picks a mode when none is forced.

    ``SGLANG``: sglang's rule. ``COST``: the cheapest mode under a :class:`dpx.CostModel`.
    """

    SGLANG = "sglang"
    COST = "cost"
