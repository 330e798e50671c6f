"""The peer transport's workspace: where each rank's shared memory holds its flags, its
epoch, and the two buffer phases peers put rows into and pull rows from (docs/semantics.md,
"The peer transport"). One definition of the byte offsets, read by the kernels
(:mod:`dpx.kernels.peer`), the torch frontend's two implementations (CUDA memory, host
shared memory) and ``explain``.

Per rank, one allocation of :attr:`PeerLayout.total_bytes`::

    [0, 8W)              flags: int64, flag[p] = the epoch of peer p's latest arrival, or
                         ``LEFT + e``: peer p left (``destroy()``) after e barriers
    [8W, 8W + 8)         epoch: int64, this rank's barriers so far
    ... to CTRL          (256-byte aligned)
    phase q (q = 0, 1) at CTRL + q * STRIDE:
        [0, HDR)         header: int32 [W], report[p] = the count peer p sent with its rows
        [HDR, STRIDE)    rows: ``phase_bytes`` bytes (a call's rows, in the layout its step
                         names)

A step writes into phase ``(epoch + 1) & 1`` before its barrier (which adds 1 to the epoch)
and reads phase ``epoch & 1`` after it: consecutive steps use the two phases in turn, so a
fast rank's next step never writes the phase a slow peer may still be reading (it would
first have to pass a barrier that peer has not reached). A rank that leaves writes
``LEFT + e`` into its flags: a peer's barrier of epoch ``E > e`` names it at once (it will
never arrive), one of ``E <= e`` counts it arrived (it passed that barrier before it left).
"""

from __future__ import annotations

from dataclasses import dataclass

from dpx.errors import check_int
from dpx.ints import INTS

__all__ = ["ALIGN", "LEFT", "PeerLayout", "peer_phase_bytes"]

#: Alignment of the control block, the header and every phase, in bytes.
ALIGN = 256
#: A flag at or above this value says its rank left after ``flag - LEFT`` barriers.
LEFT = 1 << 62


@dataclass(frozen=True)
class PeerLayout:
    """The byte offsets of one rank's workspace for ``world_size`` ranks and phases of
    ``phase_bytes`` bytes of rows (see the module docstring)."""

    world_size: int
    phase_bytes: int

    def __post_init__(self) -> None:
        check_int("PeerLayout(world_size)", self.world_size, minimum=1)
        check_int("PeerLayout(phase_bytes)", self.phase_bytes, minimum=0)

    @property
    def flags(self) -> int:
        return 0

    @property
    def epoch(self) -> int:
        return 8 * self.world_size

    @property
    def ctrl(self) -> int:
        """First byte of phase 0."""
        return INTS.ceil_align(8 * self.world_size + 8, ALIGN)

    @property
    def header(self) -> int:
        """Bytes of a phase's header (the reports)."""
        return INTS.ceil_align(4 * self.world_size, ALIGN)

    @property
    def stride(self) -> int:
        """Bytes from one phase to the next."""
        return self.header + INTS.ceil_align(self.phase_bytes, ALIGN)

    @property
    def data(self) -> int:
        """First byte of phase 0's rows (phase q's: ``data + q * stride``)."""
        return self.ctrl + self.header

    @property
    def total_bytes(self) -> int:
        return self.ctrl + 2 * self.stride


def peer_phase_bytes(rows: int, row_bytes: int) -> int:
    """Bytes of one phase holding ``rows`` rows of ``row_bytes`` bytes: a call moving a
    ``[rows, H]`` buffer (the gather's ``global_rows``, the combine's input rows) needs
    this much (``explain`` states it per op)."""
    return check_int("rows", rows, minimum=0) * check_int("row_bytes", row_bytes, minimum=0)
