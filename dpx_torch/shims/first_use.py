"""The rule every private dependency follows: use the private callable while it works, and
the public one for good once its first call fails.

Layer: shims. Imports dpx and the modules before it in its own row (docs/semantics.md,
"Where things live").

A private API that is present but changed (another signature, another return) fails on
its first call, and only there can it be told apart from one that works; after a first
call that worked, failures are the call's own (a collective's error, a bad argument) and
propagate unchanged.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["FirstUse"]


class FirstUse:
    """``fn``: the callable to use -- ``private`` until its first call raises one of
    ``errors`` (then ``public`` for good, and that call is retried through it), ``public``
    when ``private`` is None. ``fell_back`` says which. Call through ``fn``: after the
    first call it is the chosen callable itself (no wrapper on the hot path)."""

    __slots__ = ("fn", "private", "public", "errors", "fell_back")

    def __init__(self, private: Callable[..., Any] | None, public: Callable[..., Any], *,
                 errors: tuple[type[BaseException], ...] = (AttributeError, TypeError)
                 ) -> None:
        self.private, self.public, self.errors = private, public, errors
        self.fell_back = private is None
        self.fn: Callable[..., Any] = public if private is None else self._first

    def _first(self, *args: Any, **kwargs: Any) -> Any:
        try:
            out = self.private(*args, **kwargs)  # type: ignore[misc]
        except self.errors:
            self.fn, self.fell_back = self.public, True
            return self.public(*args, **kwargs)
        self.fn = self.private  # type: ignore[assignment]
        return out
