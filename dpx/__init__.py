"""dpx: DP-attention gather/scatter planning shared by the PyTorch and JAX frontends.

This package is pure Python: it imports neither torch, jax nor triton. The Triton kernels
live in ``dpx.kernels``; the frontends are ``dpx_torch`` and ``dpx_jax``. A plan
(:func:`plan_step`) says how the global buffer is laid out; a schedule
(:func:`build_schedule`) says what every rank does with it, step by step.
"""

from dpx.cost import ModeEstimate, OpEstimate, compare_modes, estimate
from dpx.cost_model import CostModel, StepCost
from dpx.counts import CountRule
from dpx.errors import (DpxCapacityError, DpxError, DpxMismatchCapacityError,
                        DpxMismatchError, DpxMismatchInputError, DpxMismatchTypeError,
                        DpxMismatchValueError, DpxPeerError, DpxTypeError, DpxValueError)
from dpx.explain import explain
from dpx.extents import OpRows, local_rows, op_rows
from dpx.ints import INTS
from dpx.layout import DpLayout, RankCoords
from dpx.modes import Group, Op, PaddingMode, Policy, Transport, Wire
from dpx.plan import DpPlan
from dpx.policy import plan_step, sglang_mode
from dpx.routes import Route
from dpx.schedule import Schedule, ScheduleCache, build_schedule
from dpx.transport import RankFacts, TransportChoice, choose_transport
from dpx.wire import nvfp4_scale
from dpx.workspace import PeerLayout, peer_phase_bytes

#: The smallest multiple of ``multiple`` that is >= ``value`` (ints, or tuples of ints).
ceil_align = INTS.ceil_align

__version__ = "0.3.0"

__all__ = ["CostModel", "CountRule", "DpLayout", "DpPlan", "DpxCapacityError", "DpxError",
           "DpxMismatchCapacityError", "DpxMismatchError", "DpxMismatchInputError",
           "DpxMismatchTypeError", "DpxMismatchValueError", "DpxPeerError", "DpxTypeError",
           "DpxValueError", "Group", "ModeEstimate", "Op", "OpEstimate", "OpRows", "PaddingMode",
           "PeerLayout", "Policy", "RankCoords", "RankFacts", "Route", "Schedule", "ScheduleCache",
           "StepCost", "Transport", "TransportChoice", "Wire", "build_schedule", "ceil_align",
           "choose_transport", "compare_modes", "estimate", "explain", "local_rows", "nvfp4_scale",
           "op_rows", "peer_phase_bytes", "plan_step", "sglang_mode"]
