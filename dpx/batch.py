"""Several tensors in one call: their schedules in lockstep, collectives batched.

:func:`lockstep` orders the tensors' steps into :class:`Stage` s, aligned on their last
collective: a stage's local passes, then its :class:`Batch` es (collectives of one kind on
one group, issued as one grouped launch). The grouping depends only on the collective
signatures, which are the same on every rank, so every rank builds the same stages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from dpx.schedule import Schedule
from dpx.steps import Step

__all__ = ["Batch", "lockstep", "Stage"]


@dataclass(frozen=True)
class Batch:
    """Collectives of one kind over one group, issued together: ``(tensor index, step)``."""

    kind: str
    items: tuple[tuple[int, Step], ...]


@dataclass(frozen=True)
class Stage:
    """Local passes ``(tensor index, step)`` in order, then the batches of collectives."""

    local: tuple[tuple[int, Step], ...]
    batches: tuple[Batch, ...]


def _segments(sched: Schedule) -> tuple[list[list[Step]], list[Step | None]]:
    """The schedule cut after each collective: local runs and the collective ending each
    (the last run has none)."""
    runs: list[list[Step]] = [[]]
    colls: list[Step | None] = []
    for step in sched.steps:
        if step.collective:
            colls.append(step)
            runs.append([])
        else:
            runs[-1].append(step)
    colls.append(None)
    return runs, colls


def lockstep(schedules: Sequence[Schedule]) -> tuple[Stage, ...]:
    """The stages that run ``schedules`` together (see the module docstring)."""
    cut = [_segments(s) for s in schedules]
    depth = max(len(runs) for runs, _ in cut)
    stages: list[Stage] = []
    for level in range(depth):
        local: list[tuple[int, Step]] = []
        batches: dict[tuple, list[tuple[int, Step]]] = {}  # by kind and group, in tensor order
        for i, (runs, cs) in enumerate(cut):
            k = level - (depth - len(runs))  # aligned on the last segment
            if k < 0:
                continue
            local += [(i, step) for step in runs[k]]
            if cs[k] is not None:
                batches.setdefault((cs[k].kind, cs[k].group), []).append((i, cs[k]))
        stages.append(Stage(tuple(local), tuple(Batch(k[0], tuple(v)) for k, v in batches.items())))
    return tuple(stages)
