"""Exception types raised by dpx.

Every error dpx raises derives from :class:`DpxError`; the ones that describe a bad
value or a bad type also derive from :class:`ValueError` or :class:`TypeError`, so callers
that already catch the built-in kinds keep working.
"""

from __future__ import annotations

__all__ = ["check_bool", "check_int", "DpxCapacityError", "DpxError", "DpxMismatchCapacityError",
           "DpxMismatchError", "DpxMismatchInputError", "DpxMismatchTypeError",
           "DpxMismatchValueError", "DpxPeerError", "DpxTypeError", "DpxValueError", "error_kind",
           "mismatch_error"]


class DpxError(Exception):
    """Base class of every dpx error."""


class DpxValueError(DpxError, ValueError):
    """A value breaks a rule (a count, a size, a shape, a mode string)."""


class DpxTypeError(DpxError, TypeError):
    """A value has the wrong type (a float count, a tensor of the wrong dtype)."""


class DpxCapacityError(DpxValueError):
    """Real token counts exceed the static capacity of a plan."""


class DpxPeerError(DpxError, RuntimeError):
    """A peer of the peer transport did not arrive at a barrier within its timeout (its
    process died, or it stopped calling): ``ranks`` names them. The communicator refuses
    every later call with this error; ``destroy()`` still works."""

    def __init__(self, message: str, *, ranks: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.ranks = ranks


class DpxMismatchError(DpxError):
    """Ranks disagree on something they must share (a plan, an op, a dtype, counts)."""


class DpxMismatchValueError(DpxMismatchError, DpxValueError):
    """Ranks disagree, and the ranks that rejected their input raised value errors."""


class DpxMismatchTypeError(DpxMismatchError, DpxTypeError):
    """Ranks disagree, and the ranks that rejected their input raised type errors."""


class DpxMismatchInputError(DpxMismatchError, DpxTypeError, DpxValueError):
    """Ranks disagree, and the ranks that rejected their input raised type and value
    errors."""


class DpxMismatchCapacityError(DpxMismatchError, DpxCapacityError):
    """Ranks disagree, and every rank that rejected its input raised a capacity error."""


#: The kinds of input error :func:`mismatch_error` tells apart, most specific first.
_KINDS = (("capacity", DpxCapacityError), ("value", ValueError), ("type", TypeError))


def error_kind(err: BaseException | None) -> str | None:
    """The kind of a rejected input's error as one rank tells the others (``"capacity"``,
    ``"value"``, ``"type"``, ``"other"``), or None when there was none."""
    if err is None:
        return None
    return next((name for name, cls in _KINDS if isinstance(err, cls)), "other")


def mismatch_error(kinds: list[str | None]) -> type[DpxMismatchError]:
    """The class of the error every rank raises when ``validate=True`` finds a problem,
    given each rank's :func:`error_kind`: a :class:`DpxMismatchError` that is also a
    ``TypeError`` / ``ValueError`` as the rejected inputs' own errors were (a
    :class:`DpxCapacityError` when every rejection was one), so ``except ValueError``
    catches with validate what it catches without; the same class on every rank."""
    got = {k for k in kinds if k is not None}
    if got == {"capacity"}:
        return DpxMismatchCapacityError
    value, typ = bool(got & {"capacity", "value"}), "type" in got
    if value and typ:
        return DpxMismatchInputError
    return DpxMismatchValueError if value else DpxMismatchTypeError if typ else DpxMismatchError


def check_bool(name: str, value: object) -> bool:
    """``value`` when it is ``True`` or ``False``, else a :class:`DpxTypeError` naming
    ``name`` (a flag is never read from a truthy string or number)."""
    if value is not True and value is not False:
        raise DpxTypeError(f"{name}={value!r} must be a bool")
    return value


def check_int(name: str, value: object, *, minimum: int = 0) -> int:
    """``value`` as an int ``>= minimum`` (numpy integers through ``__index__``; no bools or
    floats), else a :class:`DpxTypeError` / :class:`DpxValueError` naming ``name``."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise DpxTypeError(f"{name}={value!r} must be an int (got {type(value).__name__})")
    if value.__index__() < minimum:
        raise DpxValueError(f"{name}={value} must be >= {minimum}")
    return value.__index__()
