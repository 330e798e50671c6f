"""Input checks of :class:`dpx_torch.DpComm`: each names the value and the rule, and runs on
the host before any collective. Checks of shared things (plan, layout, mode) fail alike on
every rank; checks of a rank's own tensors fail on that rank (``validate=True`` makes every
rank raise together, see :mod:`dpx_torch.agreement`).

Layer: call paths. Imports dpx, the shims, passes, transports and runner layers and the
modules before it in its own row (docs/semantics.md, "Where things live").
"""

from __future__ import annotations

import torch

from dpx.errors import DpxTypeError, DpxValueError
from dpx.layout import DpLayout
from dpx.plan import DpPlan, check_plan
from dpx_torch.groups import DpGroups
from dpx_torch.tensors import check_out, overlaps

__all__ = ["check_device_counts", "InputChecks", "SUPPORTED_DTYPES"]

SUPPORTED_DTYPES = frozenset({torch.float32, torch.bfloat16, torch.float16, torch.int32,
                              torch.int64})
_DTYPE_NAMES = ", ".join(str(d) for d in (torch.float32, torch.bfloat16, torch.float16,
                                          torch.int32, torch.int64))


class InputChecks:
    """The checks of one communicator: its layout, its replica and the device types its
    process groups carry."""

    def __init__(self, layout: DpLayout, dp_rank: int, groups: DpGroups) -> None:
        self.layout = layout
        self.dp_rank = dp_rank
        self.groups = groups
        self.devices = groups.devices

    def plan(self, plan: object) -> None:
        if check_plan(plan).layout != self.layout:
            raise DpxValueError(f"plan was made for layout {plan.layout.describe()}, this "
                                f"DpComm has {self.layout.describe()}")

    @staticmethod
    def partial(partial: object) -> None:
        if not isinstance(partial, bool):
            raise DpxTypeError(f"partial={partial!r} must be a bool")

    def tensor(self, name: str, t: object, *, min_rows: int | None = None,
               rows: int | None = None) -> None:
        # the common case in a handful of cheap predicates; messages on the failure path
        if (isinstance(t, torch.Tensor) and t.dtype in SUPPORTED_DTYPES and t.dim() >= 1
                and t.is_contiguous() and t.device.type in self.devices
                and (min_rows is None or t.shape[0] >= min_rows)
                and (rows is None or t.shape[0] == rows)):
            return
        if not isinstance(t, torch.Tensor):
            raise DpxTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise DpxTypeError(f"{name} has dtype {t.dtype}; supported: {_DTYPE_NAMES}")
        if t.dim() < 1:
            raise DpxValueError(f"{name} must have a row dimension, got a scalar")
        if not t.is_contiguous():
            raise DpxValueError(f"{name} of shape {tuple(t.shape)} must be contiguous")
        if t.device.type not in self.devices:
            raise DpxValueError(f"{name} is on {t.device}; the process groups' backend "
                                f"{self.groups.describe()} cannot carry it")
        if min_rows is not None and t.shape[0] < min_rows:
            raise DpxValueError(f"{name} has {t.shape[0]} rows; replica {self.dp_rank} needs "
                                f"at least {min_rows}")
        raise DpxValueError(f"{name} has {t.shape[0]} rows; the plan needs exactly {rows}")

    def out(self, out: torch.Tensor | None, ref: torch.Tensor, rows: int, *,
            compiling: bool = False, rest: tuple[int, ...] | None = None,
            in_place: bool = False) -> None:
        """``out`` must be a contiguous ``[rows, *rest]`` tensor (``rest``: ``ref``'s
        trailing shape) of ``ref``'s dtype on ``ref``'s device (``ref`` passed
        :meth:`tensor`), not overlapping ``ref`` (not checkable while torch.compile traces:
        ``compiling``; ``in_place``: ``ref`` is this rank's slot of ``out``, an in-place
        gather's input)."""
        if out is None:
            return
        rest = tuple(ref.shape[1:]) if rest is None else rest
        if not (isinstance(out, torch.Tensor) and out.dtype is ref.dtype
                and out.device == ref.device and out.is_contiguous()
                and out.shape[0] == rows and out.dim() == len(rest) + 1
                and (out.shape[1] == rest[0] if out.dim() == 2 else out.shape[1:] == rest)):
            check_out(out, (rows, *rest), ref.dtype, ref.device)
            self.tensor("out", out)   # contiguity
        if not (compiling or in_place) and overlaps(out, ref):
            raise DpxValueError("out overlaps the input in memory; they must not alias")

    def counts(self, plan: DpPlan, counts: torch.Tensor | None, ref: torch.Tensor) -> None:
        check_device_counts(plan, counts, ref.device)

    def n_local(self, n_local: object) -> None:
        """A rank's own count for an exchange: an int32 tensor of shape ``(1,)``."""
        if not isinstance(n_local, torch.Tensor) or n_local.dtype != torch.int32 \
                or tuple(n_local.shape) != (1,):
            raise DpxTypeError(f"n_local must be an int32 tensor of shape (1,), got "
                               f"{getattr(n_local, 'dtype', type(n_local).__name__)} "
                               f"{tuple(getattr(n_local, 'shape', ()))}")
        self.tensor("n_local", n_local)


def check_device_counts(plan: DpPlan, counts: torch.Tensor | None,
                        device: torch.device) -> None:
    """Device counts of a step: a capacity plan's, a contiguous int32 ``[dp_size]`` tensor
    (``[dp_size, cp_size]`` shard counts for a sharded plan) on ``device``."""
    if counts is None:
        return
    if not plan.is_static:
        raise DpxValueError("counts= needs a capacity plan (plan_step(..., capacity=))")
    lay = plan.layout
    shape = (lay.dp_size, lay.cp_size) if plan.sharded else (lay.dp_size,)
    if (not isinstance(counts, torch.Tensor) or counts.dtype != torch.int32
            or tuple(counts.shape) != shape or not counts.is_contiguous()):
        what = "shard counts" if plan.sharded else "counts"
        raise DpxTypeError(f"counts must be a contiguous int32 tensor of shape {shape} "
                           f"({what} of this step)")
    if counts.device != device:
        raise DpxValueError(f"counts is on {counts.device}, the data on {device}")
