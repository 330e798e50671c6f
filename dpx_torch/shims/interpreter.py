"""Triton's interpreter for a launch on CPU tensors (what the kernel tests run), for kernels
that call other ``@triton.jit`` functions -- the ``dpx.kernels`` helpers and Triton's own
``tl.max`` / ``tl.min`` / ``tl.sum``.

Layer: shims. Imports dpx and the modules before it in its own row (docs/semantics.md,
"Where things live").

Private: ``triton.runtime.interpreter.InterpretedFunction`` (its launch and its
``rewrite()``) and ``JITFunction.__call__``, checked on Triton 3.6 and 3.9. Outside the
process-wide ``TRITON_INTERPRET=1`` switch a ``@triton.jit`` function called inside an
interpreted kernel raises ("Cannot call @triton.jit'd outside of the scope of a kernel");
for the duration of one interpreted launch (under this object's lock) such a call runs the
function's interpreted form instead -- what the switch does for a whole process, for this
launch only (Triton itself patches ``triton.language`` the same way while it interprets).

Public fallback: with ``TRITON_INTERPRET=1`` set before Triton is imported, every
``@triton.jit`` function already is an interpreted one and launches as it is; without it,
where the private names are missing, :meth:`Interpreter.kernel` raises a dpx error that
says so.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from dpx.errors import DpxValueError

__all__ = ["Interpreter"]


def _private() -> tuple[Any, Any] | None:
    try:
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction
    except ImportError:
        return None
    if not (hasattr(InterpretedFunction, "rewrite") and hasattr(JITFunction, "__call__")):
        return None
    return InterpretedFunction, JITFunction


#: Held while ``JITFunction.__call__`` is patched: the attribute is process-wide, so is the
#: lock (any number of :class:`Interpreter` objects share it).
_PATCH_LOCK = threading.RLock()


class Interpreter:
    """Interpreted launches (see the module docstring); the patch is made under one
    process-wide lock and restored after every launch."""

    def __init__(self) -> None:
        self._api = _private()
        #: jit function -> its interpreted (rewritten) Python function: a fixed set
        self._rewritten: dict[Any, Callable[..., Any]] = {}

    def kernel(self, kernel: Any) -> Any:
        """``kernel`` launchable on CPU tensors: ``kernel(...)[grid](*args, **consts)``."""
        if not hasattr(kernel, "fn") or type(kernel).__name__ == "InterpretedFunction":
            return kernel   # TRITON_INTERPRET=1: already interpreted
        if self._api is None:
            raise DpxValueError("this Triton has no interpreter dpx can use: set "
                                "TRITON_INTERPRET=1 before importing Triton to run dpx's "
                                "kernels on CPU tensors (CPU tensors run torch ops "
                                "otherwise)")
        return _Interpreted(self, self._api[0](kernel.fn))

    def run(self, interpreted: Any, grid: tuple, args: tuple, kwargs: dict) -> None:
        """One interpreted launch, nested ``@triton.jit`` calls interpreted."""
        jit_function = self._api[1]
        rewritten = self._rewritten

        def call(fn: Any, *a: Any, **k: Any) -> Any:
            f = rewritten.get(fn.fn)
            if f is None:
                f = rewritten[fn.fn] = self._api[0](fn.fn).rewrite()
            return f(*a, **k)

        with _PATCH_LOCK:
            saved = jit_function.__call__
            jit_function.__call__ = call
            try:
                interpreted[grid](*args, **kwargs)
            finally:
                jit_function.__call__ = saved


class _Interpreted:
    __slots__ = ("owner", "fn")

    def __init__(self, owner: Interpreter, fn: Any) -> None:
        self.owner, self.fn = owner, fn

    def __getitem__(self, grid: tuple) -> Callable[..., None]:
        return lambda *args, **kwargs: self.owner.run(self.fn, grid, args, kwargs)
