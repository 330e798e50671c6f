"""Exception types raised by dpx.

Every error dpx raises derives from :class:`DpxError`; the ones that describe a bad
value or a bad type also derive from :class:`ValueError` or :class:`TypeError`, so callers
that already catch the built-in kinds keep working.
"""

from __future__ import annotations

__all__ = [
    "check_int", "DpxCapacityError", "DpxError", "DpxMismatchError", "DpxTypeError",
    "DpxValueError"
]


class DpxError(Exception):
    """Base class of every dpx error."""


class DpxValueError(DpxError, ValueError):
    """A value breaks a rule (a count, a size, a shape, a mode string)."""


class DpxTypeError(DpxError, TypeError):
    """A value has the wrong type (a float count, a tensor of the wrong dtype)."""


class DpxCapacityError(DpxValueError):
    """Real token counts exceed the static capacity of a plan."""


class DpxMismatchError(DpxError):
    """Ranks disagree on something they must share (a plan, an op, a dtype, counts)."""


def check_int(name: str, value: object, *, minimum: int = 0) -> int:
    """``value`` as an int ``>= minimum`` (numpy integers through ``__index__``; no bools or
    floats), else a :class:`DpxTypeError` / :class:`DpxValueError` naming ``name``."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise DpxTypeError(f"{name}={value!r} must be an int (got {type(value).__name__})")
    if value.__index__() < minimum:
        raise DpxValueError(f"{name}={value} must be >= {minimum}")
    return value.__index__()
