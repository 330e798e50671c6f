"""Grouping several collectives into one launch (NCCL), and which groups are inside such a
block.

Layer: shims. Imports dpx and the modules before it in its own row (docs/semantics.md,
"Where things live").

Private: ``torch.distributed.distributed_c10d._coalescing_manager(group, device)`` (a
context manager) and ``distributed_c10d._world.pg_coalesce_state`` (the groups inside
one), checked on torch 2.11 (CUDA) and 2.13. Public fallback: the collectives issued one
by one (the same results; one launch each), when the manager is missing or its first use
fails; an empty table (no group is inside a block) when the state is missing.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import torch

__all__ = ["Coalescing", "coalescing_state"]


def coalescing_state() -> dict:
    """The groups inside a ``_coalescing_manager`` block (torch's own table, read live), or
    an empty dict where this torch keeps none."""
    from torch.distributed import distributed_c10d as c10d

    state = getattr(getattr(c10d, "_world", None), "pg_coalesce_state", None)
    return state if isinstance(state, dict) else {}


def _private_manager() -> Any:
    try:
        from torch.distributed.distributed_c10d import _coalescing_manager
    except ImportError:
        return None
    return _coalescing_manager


class Coalescing:
    """``with coalescing(pg, device):``: one grouped launch of the collectives issued
    inside (``device=None``: collected into one ``*_coalesced`` collective), or a plain
    sequence once the private manager is missing or failed to start (``fell_back``)."""

    def __init__(self, manager: Any = None) -> None:
        self._manager = manager if manager is not None else _private_manager()
        self.fell_back = self._manager is None

    def __call__(self, pg: Any, device: torch.device | None) -> "_Block":
        return _Block(self, pg, device)


class _Block:
    __slots__ = ("owner", "pg", "device", "cm")

    def __init__(self, owner: Coalescing, pg: Any, device: torch.device | None) -> None:
        self.owner, self.pg, self.device, self.cm = owner, pg, device, None

    def __enter__(self) -> None:
        owner = self.owner
        if owner.fell_back:
            return
        try:
            cm = owner._manager(self.pg, self.device)
            cm.__enter__()
        except (AttributeError, TypeError):
            owner.fell_back = True
            return
        self.cm = cm

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool | None:
        if self.cm is not None:
            return self.cm.__exit__(kind, exc, tb)
        return None
