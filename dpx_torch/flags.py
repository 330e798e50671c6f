"""The sticky overflow flag of a communicator: where the device check of a step's counts
(:class:`dpx.steps.CheckCounts`, the ``check_counts_kernel``) records counts outside what
a capacity plan holds.

One int32 ``[1]`` tensor per device, made on first use (make it before a CUDA-graph
capture: a warm-up call does) and kept; a violation ORs a bit into it (1: a negative
count, 2: a replica over a MAX_LEN capacity, 4: the aligned counts over a SUM_LEN /
GATHERV capacity) and nothing clears it but :meth:`OverflowFlags.reset`. The check is
one launch of one program; the passes that follow stay inside their buffers whatever the
counts, so a bad count loses rows but never writes out of bounds -- and the flag says so.
"""

from __future__ import annotations

import torch

from dpx.kernels import counts as _kernels
from dpx.steps import CheckCounts
from dpx_torch.rows import kernel_for

__all__ = ["FLAG_BITS", "OverflowFlags"]

#: What each bit of the flag means.
FLAG_BITS = {1: "a negative count", 2: "a replica's count over a MAX_LEN capacity",
             4: "the aligned counts over a SUM_LEN / GATHERV capacity"}


def _launch(counts: torch.Tensor, flag: torch.Tensor, entries: int, group: int, align: int,
            max_each: int, max_sum: int, has_each: bool, has_sum: bool) -> None:
    block = max(1 << (entries - 1).bit_length(), 1)
    rblock = max(1 << (entries // group - 1).bit_length(), 1)
    kernel_for(_kernels.check_counts_kernel, counts.device)[(1,)](
        counts, flag, ENTRIES=entries, GROUP=group, ALIGN=align, MAX_EACH=max_each,
        MAX_SUM=max_sum, HAS_EACH=has_each, HAS_SUM=has_sum, BLOCK=block, RBLOCK=rblock,
        num_warps=1)


@torch.library.custom_op("dpx::check_counts_", mutates_args=("flag",))
def _check_counts_(counts: torch.Tensor, flag: torch.Tensor, entries: int, group: int,
                   align: int, max_each: int, max_sum: int, has_each: bool,
                   has_sum: bool) -> None:
    _launch(counts, flag, entries, group, align, max_each, max_sum, has_each, has_sum)


@_check_counts_.register_fake
def _(counts, flag, entries, group, align, max_each, max_sum, has_each, has_sum) -> None:
    return None


class OverflowFlags:
    """The flags of one communicator, one per device."""

    def __init__(self) -> None:
        self._flags: dict[torch.device, torch.Tensor] = {}

    def flag(self, device: torch.device) -> torch.Tensor:
        f = self._flags.get(device)
        if f is None:
            f = self._flags[device] = torch.zeros(1, dtype=torch.int32, device=device)
        return f

    def check(self, counts: torch.Tensor, rule: CheckCounts) -> None:
        """Run ``rule`` on the device ``counts`` (flattened, int32), ORing into the flag."""
        args = (rule.entries, rule.group, rule.align, rule.max_each or 0, rule.max_sum or 0,
                rule.max_each is not None, rule.max_sum is not None)
        flag = self.flag(counts.device)
        if torch.compiler.is_compiling():
            _check_counts_(counts, flag, *args)
        else:
            _launch(counts, flag, *args)

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
