"""The quantized combine's receive pass (:class:`dpx.steps.DequantizeSum`, docs/semantics.md
"The quantized combine"): the ``PARTS`` wire copies of each row -- one from every source
rank, block ``p`` of the all-to-all's receive buffer -- dequantized to float32, summed in
float32 in source order from +0.0, rounded once to the output dtype. One pass: every
source's bytes are read once, the output written once. The loop over the sources is
unrolled (``tl.static_range``: code that grows with the world size).

The float32 values are the dequantize kernels' (fp8: ``e4m3 * scale`` as
:func:`~dpx.kernels.blocks.fp8_block_values`; nvfp4 / mxfp4:
:func:`~dpx.kernels.fp4.fp4_values`). The additions are IEEE round-to-nearest-even
with subnormals: on a GPU (``COMPILED``) each is a PTX ``add.rn.f32``, which the compiler
never fuses with the fp8 product into a multiply-add (a plain ``add.f32`` it may), or
for nvfp4 one ``fma.rn.f32`` of a product that is exact (the same bits); in Triton's
interpreter a NumPy float32 addition. A NaN anywhere gives the output's canonical
quiet NaN; a zero result is +0.0, as the sum from +0.0 defines it: the first addition is
a real one on both (``add.rn.f32`` is never folded away, nor is an ``fma.rn.f32`` into
``+0.0`` without no-signed-zeros: ``+0.0 + -0.0`` is ``+0.0``, not ``-0.0``; NumPy
adds). The rounding to the output dtype is the dequantize kernels'
(:func:`~dpx.kernels.blocks.store_rounded`).

Grid: ``(cdiv(rows * H / GS, BLOCK_B),)``, ``GS`` the wire's block (fp8: its 128-element
group): one program covers ``BLOCK_B`` consecutive blocks of the row-major ``[rows, H /
GS]`` block grid as a ``[BLOCK_B, GS]`` tile.
"""

import triton
import triton.language as tl

from dpx.kernels.blocks import add_rn, block_index, fp8_block_values, store_rounded
from dpx.kernels.constants import GROUP, MX_BLOCK, NV_BLOCK
from dpx.kernels.fp4 import fp4_values

__all__ = ["add_wire_block", "dequantize_sum_kernel", "store_sum", "wire_block_values"]


@triton.jit
def wire_block_values(base, grp, ok, g, H: tl.constexpr, ROW_BYTES: tl.constexpr,
                      FP4: tl.constexpr, NV: tl.constexpr, BLOCK_B: tl.constexpr,
                      COMPILED: tl.constexpr):
    """The float32 values ``[BLOCK_B, GS]`` of block ``grp`` of the wire rows at ``base``
    (uint8 pointers ``[BLOCK_B]``, one per row; ``ok``: rows to read): fp8 (``e4m3 *
    scale``) unless ``FP4`` (nvfp4 with global scale ``g`` when ``NV``, else mxfp4); a NaN
    code or a NaN block gives NaN. What the dequantize kernels compute before their rounding
    to the output dtype."""
    if FP4:
        v = fp4_values(base, grp, ok, g, H, ROW_BYTES, NV, BLOCK_B, COMPILED, 0.0, False)
    else:
        v = fp8_block_values(base, grp, ok, H, COMPILED)
    return v


@triton.jit
def add_wire_block(acc, base, grp, ok, g, H: tl.constexpr, ROW_BYTES: tl.constexpr,
                   FP4: tl.constexpr, NV: tl.constexpr, BLOCK_B: tl.constexpr,
                   COMPILED: tl.constexpr):
    """``acc`` plus :func:`wire_block_values` (float32 ``[BLOCK_B, GS]``): each value
    rounded, then added by :func:`~dpx.kernels.blocks.add_rn` (nvfp4 on a GPU: one
    ``fma.rn.f32`` of its exact product, the same bits: :func:`~dpx.kernels.fp4.
    fp4_values`)."""
    if FP4:
        return fp4_values(base, grp, ok, g, H, ROW_BYTES, NV, BLOCK_B, COMPILED, acc, True)
    else:
        return add_rn(acc, wire_block_values(base, grp, ok, g, H, ROW_BYTES, FP4, NV, BLOCK_B,
                                             COMPILED), COMPILED)


@triton.jit
def store_sum(acc, out_ptr, offs, mask, OUT_KIND: tl.constexpr, COMPILED: tl.constexpr):
    """``acc`` (a float32 sum from +0.0 by :func:`~dpx.kernels.blocks.add_rn`, or nvfp4's
    ``fma.rn.f32``: a zero sum is +0.0, as ``-0.0 + +0.0`` is) stored at ``out_ptr +
    offs`` rounded to ``OUT_KIND`` (0: float32, 1: bfloat16, 2: float16): nearest even, a
    NaN as the output's canonical quiet NaN (:func:`~dpx.kernels.blocks.store_rounded`)."""
    store_rounded(acc, out_ptr, offs, mask, OUT_KIND, COMPILED)


@triton.jit(do_not_specialize=["rows_n", "g"])
def dequantize_sum_kernel(src_ptr, rows_n, g, out_ptr, H: tl.constexpr,
                          ROW_BYTES: tl.constexpr, FP4: tl.constexpr, NV: tl.constexpr,
                          PARTS: tl.constexpr, OUT_KIND: tl.constexpr, BLOCK_B: tl.constexpr,
                          COMPILED: tl.constexpr, WIDE: tl.constexpr):
    """``out[j] = round(sum_p dequantize(src[p * rows_n + j]))`` for ``j < rows_n``: uint8
    ``[PARTS * rows_n, ROW_BYTES]`` wire rows (fp8 unless ``FP4``; nvfp4 with global scale
    ``g`` when ``NV``, else mxfp4) -> ``[rows_n, H]`` of ``OUT_KIND`` (0: float32, 1:
    bfloat16, 2: float16), the float32 sum over ``p = 0 .. PARTS-1`` in that order.
    ``WIDE``: index math in int64, else int32."""
    GS: tl.constexpr = (NV_BLOCK if NV else MX_BLOCK) if FP4 else GROUP
    NB: tl.constexpr = H // GS
    f = block_index(0, BLOCK_B, WIDE)
    row = f // NB
    grp = f % NB
    ok = row < rows_n
    acc = tl.full([BLOCK_B, GS], 0.0, tl.float32)
    base = src_ptr + row * ROW_BYTES
    for p in tl.static_range(PARTS):
        acc = add_wire_block(acc, base, grp, ok, g, H, ROW_BYTES, FP4, NV, BLOCK_B, COMPILED)
        if WIDE:   # a source's bytes may pass 2**31
            base += rows_n.to(tl.int64) * ROW_BYTES
        else:
            base += rows_n * ROW_BYTES
    offs = (f * GS)[:, None] + tl.arange(0, GS)[None, :]
    store_sum(acc, out_ptr, offs, ok[:, None], OUT_KIND, COMPILED)
