"""dpx: DP-attention gather/scatter planning shared by the PyTorch and JAX frontends.

This package is pure Python: it imports neither torch, jax nor triton. The Triton kernels
live in ``dpx.kernels``; the frontends are ``dpx_torch`` and ``dpx_jax``.
"""

from dpx.cost import CollectiveCost, CostModel
from dpx.errors import (DpxCapacityError, DpxError, DpxMismatchError, DpxTypeError,
                        DpxValueError)
from dpx.layout import DpLayout, RankCoords
from dpx.modes import PaddingMode, Policy
from dpx.plan import DpPlan, ModeEstimate, ceil_align, estimate_mode, plan_step, sglang_mode

__version__ = "0.1.0"

__all__ = [
    "CollectiveCost", "CostModel", "DpLayout", "DpPlan", "DpxCapacityError", "DpxError",
    "DpxMismatchError", "DpxTypeError", "DpxValueError", "ModeEstimate", "PaddingMode",
    "Policy", "RankCoords", "ceil_align", "estimate_mode", "plan_step", "sglang_mode",
]
