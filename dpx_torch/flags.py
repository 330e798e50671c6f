"""The sticky overflow flag of a communicator: where the device check of a step's counts
(:class:`dpx.steps.CheckCounts`, the ``check_counts_kernel`` on CUDA) records counts
outside what a capacity plan holds.

Layer: passes. Imports dpx, the shims layer and the modules before it in its own row
(docs/semantics.md, "Where things live").

One int32 ``[1]`` tensor per device, made on first use (make it before a CUDA-graph
capture: a warm-up call does) and kept; a violation ORs a bit into it (1: a negative
count, 2: a replica over a MAX_LEN capacity, 4: the aligned counts over a SUM_LEN /
GATHERV capacity) and nothing clears it but :meth:`OverflowFlags.reset`. The check is
one launch of one program; the passes that follow stay inside their buffers whatever the
counts, so a bad count loses rows but never writes out of bounds -- and the flag says so.
"""

from __future__ import annotations

from typing import Any

import torch

from dpx.counts import CountRule
from dpx_torch.ops import OpPasses
from dpx_torch.passes import Passes, passes_for

__all__ = ["FLAG_BITS", "OverflowFlags", "OverflowMethods"]

#: What each bit of the flag means.
FLAG_BITS = {1: "a negative count", 2: "a replica's count over a MAX_LEN capacity",
             4: "the aligned counts over a SUM_LEN / GATHERV capacity"}


class OverflowFlags:
    """The flags of one communicator, one per device."""

    def __init__(self) -> None:
        self._flags: dict[torch.device, torch.Tensor] = {}

    def flag(self, device: torch.device) -> torch.Tensor:
        f = self._flags.get(device)
        if f is None:
            f = self._flags[device] = torch.zeros(1, dtype=torch.int32, device=device)
        return f

    def check(self, counts: torch.Tensor, rule: CountRule,
              passes: Passes | None = None) -> None:
        """Run ``rule`` on the device ``counts`` (flattened, int32), ORing into the flag
        (through ``passes``, default the device's)."""
        if torch.compiler.is_compiling():
            passes = OpPasses()
        (passes or passes_for(counts.device)).check(counts, self.flag(counts.device), rule)

    def value(self) -> int:
        """The OR of every device's flag (a host sync)."""
        v = 0
        for f in self._flags.values():
            v |= int(f.item())
        return v

    def reset(self) -> None:
        """Zero every flag (in place: capturable, and a captured graph keeps reading the
        same tensors)."""
        for f in self._flags.values():
            f.zero_()

    @staticmethod
    def describe(value: int) -> str:
        return ", ".join(text for bit, text in FLAG_BITS.items() if value & bit) or "none"


class OverflowMethods:
    """A communicator's methods on its runner's flags (``self.runner.flags``)."""

    runner: Any
    _life: Any

    def _flags(self) -> OverflowFlags:
        self._life.check()   # (a destroyed communicator's runner is gone)
        return self.runner.flags

    def overflowed(self) -> bool:
        """Whether any step's device counts broke its capacity plan since the last
        :meth:`reset_overflow` (a host sync: read it after a graph replay, not inside
        one). The flag is sticky; :meth:`overflow_reason` names what broke."""
        return self._flags().value() != 0

    def overflow_reason(self) -> str:
        """What the overflow flag records (``"none"`` when clear)."""
        flags = self._flags()
        return flags.describe(flags.value())

    def reset_overflow(self) -> None:
        """Clear the overflow flag (in place: capturable, and graphs keep reading it)."""
        self._flags().reset()

    def overflow_flag(self, device: torch.device | str) -> torch.Tensor:
        """The int32 ``[1]`` device flag itself (nonzero after an overflow): read it on the
        device, e.g. to branch or to copy it out with the step's results."""
        return self._flags().flag(torch.device(device))
