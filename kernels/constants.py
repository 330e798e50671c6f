"""The wire formats' constants as Triton constexprs, taken from :mod:`dpx.wire` (their one
definition), for the kernels of :mod:`.wire` and :mod:`.fp4`; and the peer workspace's flag
of a rank that left, from :mod:`dpx.workspace`, for :mod:`.peer`."""

import struct

import triton.language as tl

from dpx import wire as W
from dpx.modes import Wire
from dpx.workspace import LEFT as _LEFT

__all__ = ["E2M1_MAX", "E2M1_RECIP", "FP8_EPS", "FP8_MAX", "GROUP", "LEFT", "MX_BLOCK",
           "MX_NAN_SCALE", "NAN_BF16", "NAN_CODE", "NAN_F16", "NAN_F32", "NV_BLOCK",
           "NV_NAN_SCALE"]

#: fp8: elements per scale, the largest e4m3 magnitude, the amax floor, the NaN code
GROUP = tl.constexpr(W.GROUP)
FP8_MAX = tl.constexpr(W.FP8_MAX)
FP8_EPS = tl.constexpr(W.EPS)
NAN_CODE = tl.constexpr(W.NAN_CODE)
#: fp4: elements per scale and the scale byte of a block holding a NaN, per format
NV_BLOCK = tl.constexpr(W.block(Wire.NVFP4))
MX_BLOCK = tl.constexpr(W.block(Wire.MXFP4))
NV_NAN_SCALE = tl.constexpr(W.FP4_NAN_SCALE[Wire.NVFP4])
MX_NAN_SCALE = tl.constexpr(W.FP4_NAN_SCALE[Wire.MXFP4])
#: the largest e2m1 magnitude, and its reciprocal rounded to float32
E2M1_MAX = tl.constexpr(W.E2M1_MAX)
E2M1_RECIP = tl.constexpr(struct.unpack("f", struct.pack("f", 1.0 / W.E2M1_MAX))[0])
#: the canonical quiet NaN of each output dtype, as its bits
NAN_F32 = tl.constexpr(W.CANONICAL_NAN["float32"])
NAN_BF16 = tl.constexpr(W.CANONICAL_NAN["bfloat16"])
NAN_F16 = tl.constexpr(W.CANONICAL_NAN["float16"])
#: a peer flag at or above this: its rank left (dpx.workspace)
LEFT = tl.constexpr(_LEFT)
