"""fp8 wire kernels (the format of :mod:`dpx.wire`): quantize rows while taking them into a
wire buffer, and dequantize wire rows.

A wire row is ``H`` float8_e4m3fn payload bytes then ``H / 128`` float32 scales; the
buffers are uint8 ``[rows, ROW_BYTES]``. Conversions are written with integer bit
operations and IEEE-rounded divisions (``div_rn``), so the compiled kernel and Triton's
interpreter give the same bits, equal to round-to-nearest-even conversions (what torch's
``.to(torch.float8_e4m3fn)`` and JAX's ``astype`` do). Like every dpx kernel they call no
other ``@triton.jit`` function, read ``start`` / ``count`` from device memory or plain
ints, and mask every access.

Grid for both: ``(cdiv(out_rows, BLOCK_R), H // 128)``: one program per block of rows and
one 128-element group.
"""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["start_val", "count_val"])
def quantize_rows_kernel(src_ptr, start_ptr, count_ptr, start_val, count_val, src_rows,
                         out_rows, out_ptr, H: tl.constexpr, ROW_BYTES: tl.constexpr,
                         START_PTR: tl.constexpr, COUNT_PTR: tl.constexpr,
                         BLOCK_R: tl.constexpr):
    """``out[j] = fp8_wire(src[start + j])`` for ``j < count``; rows ``count..out_rows`` of
    ``out`` are zero bytes. src ``[src_rows, H]`` (float32 / bfloat16 / float16) -> out
    uint8 ``[out_rows, ROW_BYTES]``."""
    if START_PTR:
        start = tl.load(start_ptr).to(tl.int64)
    else:
        start = start_val.to(tl.int64)
    if COUNT_PTR:
        count = tl.load(count_ptr).to(tl.int64)
    else:
        count = count_val.to(tl.int64)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)
    grp = tl.program_id(1).to(tl.int64)
    cols = grp * 128 + tl.arange(0, 128).to(tl.int64)
    src_row = start + rows
    real = (rows < count) & (src_row < src_rows) & (src_row >= 0) & (rows < out_rows)
    x = tl.load(src_ptr + src_row[:, None] * H + cols[None, :], mask=real[:, None],
                other=0).to(tl.float32)
    amax = tl.reduce(tl.abs(x), 1, tl.standard._elementwise_max)
    scale = tl.math.div_rn(tl.maximum(amax, 1e-10), 448.0)
    y = tl.math.div_rn(x, scale[:, None])
    y = tl.minimum(tl.maximum(y, -448.0), 448.0)
    # float32 -> e4m3fn, round to nearest even, by bits
    bits = y.to(tl.int32, bitcast=True)
    sign = (bits >> 31) & 1
    a = tl.abs(y)
    u = a.to(tl.int32, bitcast=True)
    normal = ((u + 0x7FFFF + ((u >> 20) & 1)) >> 20) - (120 << 3)
    sub = ((a * 512.0 + 8388608.0) - 8388608.0).to(tl.int32)  # exact: a * 512 < 8
    code = tl.where(a < 0.015625, sub, normal) | (sign << 7)
    code = tl.where(real[:, None], code, 0)
    ok = (rows < out_rows)[:, None]
    tl.store(out_ptr + rows[:, None] * ROW_BYTES + cols[None, :], code.to(tl.uint8), mask=ok)
    scale_ptr = (out_ptr + rows * ROW_BYTES + H + grp * 4).to(tl.pointer_type(tl.float32))
    tl.store(scale_ptr, tl.where(real, scale, 0.0), mask=rows < out_rows)


@triton.jit
def dequantize_rows_kernel(src_ptr, rows_n, out_ptr, H: tl.constexpr, ROW_BYTES: tl.constexpr,
                           OUT_KIND: tl.constexpr, BLOCK_R: tl.constexpr):
    """``out[:rows_n] = dequantize(src[:rows_n])``: uint8 ``[rows_n, ROW_BYTES]`` wire rows ->
    ``[rows_n, H]`` of ``OUT_KIND`` (0: float32, 1: bfloat16, 2: float16)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)
    grp = tl.program_id(1).to(tl.int64)
    cols = grp * 128 + tl.arange(0, 128).to(tl.int64)
    ok = rows < rows_n
    c = tl.load(src_ptr + rows[:, None] * ROW_BYTES + cols[None, :], mask=ok[:, None],
                other=0).to(tl.int32)
    scale_ptr = (src_ptr + rows * ROW_BYTES + H + grp * 4).to(tl.pointer_type(tl.float32))
    scale = tl.load(scale_ptr, mask=ok, other=0.0)
    # e4m3fn -> float32, by bits (exact)
    sign = (c >> 7) & 1
    e = (c >> 3) & 15
    m = c & 7
    normal = ((sign << 31) | ((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    sub = m.to(tl.float32) * 0.001953125
    sub = tl.where(sign == 1, -sub, sub)
    v = tl.where(e == 0, sub, normal) * scale[:, None]
    offs = rows[:, None] * H + cols[None, :]
    if OUT_KIND == 0:
        tl.store(out_ptr + offs, v, mask=ok[:, None])
    elif OUT_KIND == 1:
        # float32 -> bfloat16, round to nearest even, by bits
        u = v.to(tl.uint32, bitcast=True)
        r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        out16 = out_ptr.to(tl.pointer_type(tl.uint16))
        tl.store(out16 + offs, r.to(tl.uint16), mask=ok[:, None])
    else:
        tl.store(out_ptr + offs, v.to(tl.float16), mask=ok[:, None])
