"""A communicator's life: whether it may run calls, whether they may take the prepared
path, and how its process groups go at the end.

Layer: transports. Imports dpx, the shims and passes layers and the modules before it in
its own row (docs/semantics.md, "Where things live").

:class:`Lifecycle` is the one switch every call form reads: ``fast`` is True while the
communicator is alive and does not validate, so the implicit fast path and every prepared
op (:mod:`dpx_torch.prepared`) run their bound steps only then; otherwise a call takes the
full path, which exchanges under ``validate=True`` and raises :meth:`Lifecycle.check`'s
error once destroyed.

Why the end matters at exit: a process group's C++ object joins its gloo worker threads
only when the last reference to it goes. A group kept alive past
``dist.destroy_process_group()`` -- by a communicator, a prepared op, or a reference cycle
through an exception's traceback -- is destroyed during interpreter finalization instead,
where a worker thread still releasing a tensor of a finished collective cannot take the
GIL and the process aborts ("terminate called without an active exception"). So the end
drops every reference to a group, a held prepared op's included, at ``destroy()`` or, for
a communicator never destroyed, at interpreter exit (:func:`exit_hook`).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch.distributed as dist

from dpx.errors import DpxPeerError, DpxValueError, check_bool

__all__ = ["destroyed", "end_groups", "exit_hook", "Lifecycle"]


class Lifecycle:
    """The state every call form reads (see the module docstring)."""

    __slots__ = ("alive", "validate", "fast", "failure")

    def __init__(self, *, validate: bool) -> None:
        self.alive = True
        self.validate = check_bool("validate", validate)
        #: alive and not validating: calls may run prepared steps
        self.fast = not self.validate
        #: ``(message, ranks)`` of the peer transport's failure (a peer that did not
        #: arrive), once one was found: every later call raises it
        self.failure: tuple[str, tuple[int, ...]] | None = None

    def set_validate(self, validate: bool) -> None:
        self.validate = check_bool("validate", validate)
        self.fast = self.alive and not self.validate and self.failure is None

    def fail(self, err: DpxPeerError) -> None:
        """A peer did not arrive: every later call raises ``err``'s message."""
        self.failure = (str(err), err.ranks)
        self.fast = False

    def end(self) -> None:
        self.alive = self.fast = False

    def check(self) -> None:
        """Raise when the communicator was destroyed, or failed (a new error each time:
        no traceback collects frames across calls)."""
        if not self.alive:
            raise destroyed()
        if self.failure is not None:
            raise DpxPeerError(self.failure[0], ranks=self.failure[1])


def destroyed() -> DpxValueError:
    """The error of any call of a destroyed communicator."""
    return DpxValueError("this DpComm was destroyed (DpComm.destroy()); build a new one to "
                         "run collectives")


def end_groups(owned: tuple, world: Any, *, drain: bool) -> None:
    """Destroy the process groups a communicator created. ``drain`` (``destroy()``, every
    rank calling it): each group is drained with a barrier first and the world after
    (``world=None``: not), so no rank tears a group down while a peer still uses it;
    without (interpreter exit), a group already destroyed with the world is passed
    over."""
    for pg in owned:
        if drain:
            dist.barrier(group=pg)
            dist.destroy_process_group(pg)
            continue
        try:
            dist.destroy_process_group(pg)
        except (ValueError, RuntimeError):  # already destroyed with the world
            pass
    if drain and owned and world is not None:
        dist.barrier(group=world)


def exit_hook(ref: "weakref.ref[Any]") -> Callable[[], None]:
    """What interpreter exit runs for a communicator that was not destroyed (a weak
    reference: the hook keeps nothing alive)."""
    def hook() -> None:
        comm = ref()
        if comm is not None:
            comm._at_exit()
    return hook
