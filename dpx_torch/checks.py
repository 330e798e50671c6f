"""Input checks of :class:`dpx_torch.DpComm`: each names the value and the rule, and runs on
the host before any collective. Checks of shared things (plan, layout, mode) fail alike on
every rank; checks of a rank's own tensors fail on that rank (``validate=True`` makes every
rank raise together, see :mod:`dpx_torch.agreement`)."""

from __future__ import annotations

import torch

from dpx.errors import DpxTypeError, DpxValueError
from dpx.layout import DpLayout
from dpx.plan import DpPlan
from dpx_torch.rows import overlaps

SUPPORTED_DTYPES = frozenset({torch.float32, torch.bfloat16, torch.float16, torch.int32,
                              torch.int64})
_DTYPE_NAMES = ", ".join(str(d) for d in (torch.float32, torch.bfloat16, torch.float16,
                                          torch.int32, torch.int64))


class InputChecks:
    """The checks of one communicator: its layout, its replica and its backend's device."""

    def __init__(self, layout: DpLayout, dp_rank: int, backend: str) -> None:
        self.layout = layout
        self.dp_rank = dp_rank
        self.backend = backend
        self.device_type = "cpu" if backend == "gloo" else "cuda"

    def plan(self, plan: object) -> None:
        if not isinstance(plan, DpPlan):
            raise DpxTypeError(f"plan must be a dpx.DpPlan, got {type(plan).__name__}")
        if plan.layout != self.layout:
            raise DpxValueError(f"plan was made for layout {plan.layout.describe()}, this "
                                f"DpComm has {self.layout.describe()}")

    @staticmethod
    def partial(partial: object) -> None:
        if partial.__class__ is not bool:
            raise DpxTypeError(f"partial={partial!r} must be a bool")

    def tensor(self, name: str, t: object, *, min_rows: int | None = None,
               rows: int | None = None) -> None:
        if not isinstance(t, torch.Tensor):
            raise DpxTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise DpxTypeError(f"{name} has dtype {t.dtype}; supported: {_DTYPE_NAMES}")
        if t.dim() < 1:
            raise DpxValueError(f"{name} must have a row dimension, got a scalar")
        if not t.is_contiguous():
            raise DpxValueError(f"{name} of shape {tuple(t.shape)} must be contiguous")
        if t.device.type != self.device_type:
            raise DpxValueError(f"{name} is on {t.device}; backend {self.backend} needs "
                                f"{self.device_type} tensors")
        if min_rows is not None and t.shape[0] < min_rows:
            raise DpxValueError(f"{name} has {t.shape[0]} rows; replica {self.dp_rank} needs "
                                f"at least {min_rows}")
        if rows is not None and t.shape[0] != rows:
            raise DpxValueError(f"{name} has {t.shape[0]} rows; the plan needs exactly {rows}")

    def out(self, out: torch.Tensor | None, ref: torch.Tensor, rows: int) -> None:
        if out is None:
            return
        self.tensor("out", out)
        if (out.shape[0] != rows or out.shape[1:] != ref.shape[1:] or out.dtype != ref.dtype
                or out.device != ref.device):
            raise DpxValueError(f"out has shape {tuple(out.shape)} {out.dtype} on "
                                f"{out.device}; it must be {(rows, *ref.shape[1:])} "
                                f"{ref.dtype} on {ref.device}")
        if out.numel() and ref.numel() and overlaps(out, ref):
            raise DpxValueError("out overlaps the input in memory; they must not alias")

    def counts(self, plan: DpPlan, counts: torch.Tensor | None, ref: torch.Tensor) -> None:
        if counts is None:
            return
        if not plan.is_static:
            raise DpxValueError("counts= needs a capacity plan (plan_step(..., capacity=))")
        if (not isinstance(counts, torch.Tensor) or counts.dtype != torch.int32
                or counts.shape != (self.layout.dp_size,)):
            raise DpxTypeError(f"counts must be an int32 tensor of shape "
                               f"({self.layout.dp_size},)")
        if counts.device != ref.device:
            raise DpxValueError(f"counts is on {counts.device}, the data on {ref.device}")
