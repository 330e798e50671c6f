"""The fp4 wire formats (nvfp4, mxfp4: dpx/wire.py) in every implementation -- torch ops and
Triton's interpreter on CPU, the compiled kernels on GPU, JAX's XLA path -- bit for bit
against the NumPy reference (tests/reference.py, written from the definition): e2m1 ties at
every threshold, saturation, zero and negative-zero blocks, float32 and e4m3 subnormals,
NaN and infinities, pad rows, device start/count, every float dtype; and each format's
stated error bound."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from conftest import device_params, passes_params
from dpx.kernels.blocks import div_by_short
from dpx.modes import Wire
from dpx.wire import block, check_wire_scale, wire_row_bytes
from dpx_torch.passes import TorchPasses, TritonPasses
from dpx_torch.wire import split_wire
from reference import as_dtype, bits_of, dequantize_fp4, quantize_fp4

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
#: (wire, global scale): nvfp4 at an ordinary scale, at the ends of its range and at 1
FORMATS = [(Wire.MXFP4, None), (Wire.NVFP4, 1.0), (Wire.NVFP4, 0.37), (Wire.NVFP4, 2.0 ** 60),
           (Wire.NVFP4, 2.0 ** -60)]
_IDS = [f"{w.value}" + ("" if g is None else f"-g{g:g}") for w, g in FORMATS]
#: e2m1 magnitudes and the midpoints between them (the ties)
_GRID = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)
_TIES = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32)


def hard_rows(h: int, seed: int = 0) -> np.ndarray:
    """float32 rows: e2m1 grid points and ties at power-of-two block scales (block amax 6
    * 2**k, so every tie is exact), values just off each tie, saturation (amax / 2**E up
    to 8), magnitudes from float32 subnormals to near its maximum, zero and -0 blocks, and
    NaN / +-inf at the first, a middle and the last element of a block."""
    rng = np.random.default_rng(seed)
    rows = []
    for k in (-130, -126, -20, -3, 0, 5, 60, 120):
        r = rng.choice(np.concatenate([_GRID, _TIES, -_GRID, -_TIES]), h).astype(np.float64)
        r[::16] = 6.0                                   # every nvfp4 block's amax: 6 * 2**k
        rows.append(r * 2.0 ** k)
        off = np.nextafter(r.astype(np.float32), np.float32(np.inf)).astype(np.float64)
        off[::16] = 6.0
        rows.append(off * 2.0 ** k)
    for lo, hi in ((-149, -120), (-40, 40), (100, 127)):
        rows.append(rng.standard_normal(h) * 2.0 ** rng.integers(lo, hi, h))
    rows.append(np.linspace(7.5, 8.0, h) * rng.choice([-1, 1], h))   # mxfp4 saturation
    rows.append(np.zeros(h))
    rows.append(np.full(h, -0.0))
    for v in (np.nan, np.inf, -np.inf):
        for pos in (0, 7, 15, h - 1):
            r = rng.standard_normal(h)
            r[pos] = v
            rows.append(r)
    x = np.stack(rows)
    with np.errstate(over="ignore"):
        return x.astype(np.float32)


def _wire_bytes(x: np.ndarray, real: np.ndarray, wire: Wire, g) -> np.ndarray:
    p, s = quantize_fp4(x, real, wire.value, g)
    return np.concatenate([p, s], axis=1)


@pytest.mark.parametrize("fmt", FORMATS, ids=_IDS)
@pytest.mark.parametrize("impl", passes_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fp4_quantize_take_and_dequantize_match_the_reference(impl, dtype, fmt):
    """quantize rows ``start .. start + count`` into a longer wire buffer (pad rows zero
    bytes), then dequantize: every byte and every output bit is the reference's."""
    device, passes = impl
    wire, g = fmt
    g = None if g is None else check_wire_scale(wire, g)
    h = 128  # wire rows of a multiple of 4 bytes: the kernels store int32 words
    xf = hard_rows(h)
    x = torch.from_numpy(xf).to(dtype)
    xr = x.float().numpy()                      # the values the wire sees
    rows = x.shape[0]
    start, count, out_rows = 1, rows - 2, rows + 1
    out = torch.full((out_rows, wire_row_bytes(h, wire)), 0x5A, dtype=torch.uint8,
                     device=device)
    passes.quantize(x.to(device), start, count, out, wire, g)
    src = np.zeros((out_rows, h), np.float32)
    src[:count] = xr[start:start + count]
    real = np.arange(out_rows) < count
    want = _wire_bytes(src, real, wire, g)
    got = out.cpu().numpy()
    bad = np.nonzero((got != want).any(1))[0]
    assert bad.size == 0, (bad[:5], src[bad[:1]])
    y = torch.full((out_rows, h), 3, dtype=dtype, device=device)
    passes.dequantize(out, y, wire, g)
    p, s = split_wire(out.cpu(), wire)
    ref = bits_of(as_dtype(dequantize_fp4(p.numpy(), s.numpy(), wire.value, g),
                           str(dtype).replace("torch.", "")))
    got = y.cpu().view(BITS[dtype]).numpy().view(ref.dtype)
    bad = np.nonzero((got != ref).any(1))[0]
    assert bad.size == 0, bad[:5]
    assert not got[count:].any()                 # pad rows: exact (positive) zeros


@pytest.mark.parametrize("wire", [Wire.NVFP4, Wire.MXFP4], ids=lambda w: w.value)
@pytest.mark.parametrize("impl", passes_params())
def test_fp4_reads_device_start_and_count(impl, wire):
    device, passes = impl
    h, g = 64, (0.5 if wire is Wire.NVFP4 else None)
    x = torch.randn(9, h, device=device)
    out_a = torch.empty(6, wire_row_bytes(h, wire), dtype=torch.uint8, device=device)
    out_b = torch.empty_like(out_a)
    passes.quantize(x, 3, 4, out_a, wire, g)
    passes.quantize(x, torch.tensor([3], dtype=torch.int32, device=device),
                    torch.tensor([4], dtype=torch.int32, device=device), out_b, wire, g)
    assert torch.equal(out_a, out_b) and (out_a[4:] == 0).all() and out_a[:4].any()


@pytest.mark.parametrize("device", device_params())
def test_every_fp4_block_count_gives_the_same_bytes(device):
    """Programs of 1 to 256 blocks (rows split across programs, a partial last program)
    write the same bytes, and dequantize to the same bits, as the launch the frontends
    use, and those are the reference's; rows of 96 elements make wire rows of an odd size,
    which the kernels read and write byte by byte."""
    from dpx.kernels import fp4 as K
    from dpx.kernels.launch import fp4_scale
    from dpx_torch.shims.triton_launch import kernel_for

    h, rows = 96, 13
    x = torch.from_numpy(hard_rows(h, seed=3)[:rows]).to(torch.bfloat16).to(device)
    for wire, g in ((Wire.NVFP4, 0.75), (Wire.MXFP4, None)):
        rb = wire_row_bytes(h, wire)
        want = torch.empty(rows + 2, rb, dtype=torch.uint8, device=device)
        TritonPasses().quantize(x, 0, rows, want, wire, g)
        xs = x.float().cpu().numpy()
        ref = _wire_bytes(xs, np.ones(rows, bool), wire, g)
        assert np.array_equal(want[:rows].cpu().numpy(), ref) and not want[rows:].any()
        nb = h // block(wire)
        for bb in (1, 4, 32, 256):
            out = torch.full_like(want, 0x5A)
            kernel_for(K.quantize_fp4_kernel, out.device)[(-(-(rows + 2) * nb // bb),)](
                x, x, x, 0, rows, rows, rows + 2, fp4_scale(g), out, H=h,
                ROW_BYTES=rb, NV=wire is Wire.NVFP4, START_PTR=False, COUNT_PTR=False,
                BLOCK_B=bb, COMPILED=out.device.type == "cuda", WIDE=False)
            assert torch.equal(out, want), (wire, bb)
            y_want = torch.empty(rows + 2, h, dtype=torch.float32, device=device)
            TritonPasses().dequantize(want, y_want, wire, g)
            p, sc = split_wire(want[:rows].cpu(), wire)
            assert np.array_equal(bits_of(y_want[:rows].cpu().numpy()),
                                  bits_of(dequantize_fp4(p.numpy(), sc.numpy(), wire.value, g)))
            y = torch.full_like(y_want, 7.0)
            kernel_for(K.dequantize_fp4_kernel, out.device)[(-(-(rows + 2) * nb // bb),)](
                want, rows + 2, fp4_scale(g), y, H=h, ROW_BYTES=rb,
                NV=wire is Wire.NVFP4, OUT_KIND=0, BLOCK_B=bb,
                COMPILED=out.device.type == "cuda", WIDE=False)
            assert torch.equal(y.view(torch.int32), y_want.view(torch.int32)), (wire, bb)


@pytest.mark.parametrize("fmt", FORMATS, ids=_IDS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_fp4_xla_path_matches_the_reference(dtype, fmt):
    """JAX's XLA implementation (what runs off the GPU), bit for bit."""
    import jax.numpy as jnp

    from dpx_jax.rows import Impl
    from dpx_jax.wire import dequantize, quantize_take

    wire, g = fmt
    g = None if g is None else check_wire_scale(wire, g)
    h = 64
    x = torch.from_numpy(hard_rows(h)).to(getattr(torch, dtype))
    xr = x.float().numpy()
    rows = x.shape[0]
    jdt = getattr(jnp, dtype)
    got = quantize_take(jnp.asarray(xr).astype(jdt), 2, rows - 3, rows, Impl.XLA, wire, g)
    src = np.zeros((rows, h), np.float32)
    src[:rows - 3] = xr[2:rows - 1]
    want = _wire_bytes(src, np.arange(rows) < rows - 3, wire, g)
    assert np.array_equal(np.asarray(got), want)
    y = dequantize(got, jdt, Impl.XLA, wire, g)
    p, s = want[:, :h // 2], want[:, h // 2:]
    ref = bits_of(as_dtype(dequantize_fp4(p, s, wire.value, g), dtype))
    assert np.array_equal(bits_of(np.asarray(y)), ref)


def error_bound(x: np.ndarray, wire: Wire, g, p: np.ndarray, s: np.ndarray) -> np.ndarray:
    """The bound docs/semantics.md states, per element of finite ``x``: ``|x' - x| <=
    max(|x|, u) / 4 + max(0, |x| - 6u)`` with ``u`` the block's unit (nvfp4 ``s / g``,
    mxfp4 ``2**E``), times ``1 + 2**-20`` for the float32 arithmetic."""
    import ml_dtypes

    gs = block(wire)
    if wire is Wire.NVFP4:
        u = s.view(ml_dtypes.float8_e4m3fn).astype(np.float64) / np.float32(g)
    else:
        u = np.exp2(s.astype(np.float64) - 127)
    u = np.repeat(u, gs, axis=1)
    a = np.abs(x.astype(np.float64))
    return (np.maximum(a, u) / 4 + np.maximum(0, a - 6 * u)) * (1 + 2.0 ** -20)


@pytest.mark.parametrize("fmt", FORMATS, ids=_IDS)
def test_fp4_error_bound(fmt):
    """Every finite element of the hard rows and of random rows over 80 binades is within
    the stated bound (and for mxfp4 the saturation term is never needed); the bound is
    tight: some element comes within 1% of it."""
    wire, g = fmt
    g = None if g is None else check_wire_scale(wire, g)
    rng = np.random.default_rng(5)
    h = 256
    x = np.concatenate([hard_rows(h), (rng.standard_normal((64, h))
                                       * 2.0 ** rng.integers(-40, 40, (64, 1)))]).astype(
        np.float32)
    x = x[np.isfinite(x).all(1)]
    p, s = quantize_fp4(x, np.ones(x.shape[0], bool), wire.value, g)
    y = dequantize_fp4(p, s, wire.value, g).astype(np.float64)
    fin = np.isfinite(y)
    err = np.abs(y - x)[fin]
    bound = error_bound(x, wire, g, p, s)[fin]
    assert (err <= bound).all(), np.max(err - bound)
    assert (err >= 0.99 * bound).any()
    if wire is Wire.MXFP4:  # |x| / 2**E < 8: within a quarter of max(|x|, 2**E)
        u = np.repeat(np.exp2(s.astype(np.float64) - 127), 32, axis=1)[fin]
        assert (err <= np.maximum(np.abs(x[fin]), u) / 4 * (1 + 2.0 ** -20)).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fmt", [(Wire.NVFP4, 0.37), (Wire.NVFP4, 1.0), (Wire.MXFP4, None)],
                         ids=["nvfp4-g0.37", "nvfp4-g1", "mxfp4"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_compiled_fp4_matches_the_torch_ops_on_many_rows(dtype, fmt):
    """The compiled kernels (nvfp4: a reciprocal and fused corrections) against the CPU
    torch ops (tested against the reference above), over many blocks spanning the dtype's
    range, e2m1 ties at power-of-two scales and signed zeros; both ways."""
    wire, g = fmt
    gen = torch.Generator(device="cuda").manual_seed(7)
    rows, h = 4096, 1024
    lo, hi = {torch.float16: (-14, 12)}.get(dtype, (-100, 100))
    x = torch.randn(rows, h, device="cuda", generator=gen)
    x *= torch.exp2(torch.randint(lo, hi, (rows, h // 16, 1), device="cuda",
                                  generator=gen).float()).repeat_interleave(16, 1)[..., 0]
    grid = torch.from_numpy(np.concatenate([_GRID, _TIES, -_GRID, -_TIES])).cuda()
    ties = grid[torch.randint(0, grid.numel(), (1024, h), device="cuda", generator=gen)]
    k = torch.randint(lo // 2, hi // 2, (1024, 1), device="cuda", generator=gen).float()
    ties[:, ::16] = 6.0
    x[:1024] = ties * torch.exp2(k)
    x[1024:1100] = -0.0
    x = x.to(dtype)
    out = torch.empty(rows, wire_row_bytes(h, wire), dtype=torch.uint8, device="cuda")
    TritonPasses().quantize(x, 0, rows, out, wire, g)
    want = torch.empty(rows, out.shape[1], dtype=torch.uint8)
    TorchPasses().quantize(x.cpu(), 0, rows, want, wire, g)
    bad = (out.cpu() != want).any(1).nonzero()
    assert bad.numel() == 0, bad[:5]
    y = torch.empty(rows, h, dtype=dtype, device="cuda")
    TritonPasses().dequantize(out, y, wire, g)
    yw = torch.empty(rows, h, dtype=dtype)
    TorchPasses().dequantize(want, yw, wire, g)
    assert torch.equal(y.cpu().view(BITS[dtype]), yw.view(BITS[dtype]))


@triton.jit
def _short_quotient_misses(d, r, miss_ptr, BLOCK: tl.constexpr, CORRECT: tl.constexpr):
    """Counts into ``miss_ptr`` the ``p`` in ``[1, 2)`` (every float32 significand) where
    :func:`~dpx.kernels.blocks.div_by_short` (``CORRECT``; else the bare product ``p *
    r``) differs from the GPU's IEEE quotient ``p / d``."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    p = (0x3F800000 + i).to(tl.float32, bitcast=True)
    q = div_by_short(p, d, r) if CORRECT else p * r
    bad = q != tl.math.div_rn(p, d)
    tl.atomic_add(miss_ptr, tl.sum(bad.to(tl.int32), 0))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_one_correction_divides_by_a_short_significand_exactly():
    """The nvfp4 quantize divides by 6 and by e4m3 scales with one fused correction
    (``div_by_short``). For every float32 significand of the dividend and each of the eight
    significands an e4m3 value has (1, 1.125, ..., 1.875), at powers of two from the
    smallest subnormal scale's to 448's, and at 6 and 448, the quotient is the correctly
    rounded one: a power of two on either operand only moves the quotient's exponent, so
    this covers every quotient the kernel forms whose remainder does not underflow (the
    others, from dividends below about 2**-100, are far below e2m1's smallest step: code
    0 however they round). The bare product with the reciprocal misses for most of these
    divisors: the check can fail."""
    miss = torch.zeros(1, dtype=torch.int32, device="cuda")
    block, n = 1024, 1 << 23

    def misses(d: float, correct: bool = True) -> int:
        miss.zero_()
        d32 = np.float32(d)   # (float32 values, passed as Python floats)
        _short_quotient_misses[(n // block,)](float(d32), float(np.float32(1) / d32), miss,
                                              BLOCK=block, CORRECT=correct)
        return int(miss.item())

    for e in (-9, -3, 0, 4, 8):
        for m in range(8, 16):
            assert misses(m / 8 * 2.0 ** e) == 0, (m, e)
    assert misses(6.0) == 0 and misses(448.0) == 0
    assert all(misses(m / 8, correct=False) > 0 for m in range(9, 16))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compiled_nvfp4_factors_at_many_global_scales():
    """The compiled nvfp4 dequantize and summing pass form each block's two factors
    ``RN(s / g)`` and ``RN(1.5 s / g)`` as float64 products with ``1 / g`` (``nv_factor``).
    Against the CPU torch ops (``div_rn`` by definition), bit for bit: every scale byte (the
    NaN code's included) times every e2m1 code, at 400 global scales spread over the
    whole range [2**-64, 2**64] (its ends, powers of two, significands from random bits)
    and at the hardest ones: the 34 significands ``b`` with ``b * m = a * 2**t +- 1`` for a
    25-bit odd ``m`` and ``a`` the odd part of a ``k s`` (their quotients come within
    ``2**-48`` of a float32 rounding boundary; a reciprocal one Newton step short misses
    there), into float32 and bfloat16, one source and two."""
    h = 16 * 128
    rb = wire_row_bytes(h, Wire.NVFP4)
    row = torch.zeros(rb, dtype=torch.uint8)
    # block b: scale byte b, its 16 elements every code 0..15 (two codes a byte)
    row[: h // 2] = torch.tensor([(2 * k) | ((2 * k + 1) << 4) for k in range(8)] * 128,
                                 dtype=torch.uint8)
    row[h // 2:] = torch.arange(128, dtype=torch.uint8)
    rng = np.random.default_rng(5)
    gs = [2.0 ** -64, 2.0 ** 64, 1.0, 0.37, 537.6]
    gs += [float(2.0 ** e) for e in rng.integers(-64, 64, 45)]
    gs += [float(np.float32(m * 2.0 ** e)) for m, e in
           zip(rng.uniform(1, 2, 350), rng.integers(-64, 63, 350))]
    hard = (8821011, 8899653, 9370179, 9450075, 9476361, 9987993, 10183681, 10218159,
            10542545, 10636535, 10764557, 10896543, 11242465, 11342695, 12077715, 12648641,
            12729795, 13675545, 13688077, 13786405, 13909315, 14427101, 14583465, 14701685,
            14759563, 14832755, 15498951, 15616965, 15732721, 15739451, 15793935, 16527927,
            16646655, 16777215)
    gs += [b * 2.0 ** e for b in hard for e in (-87, -23, 40)]
    other = row.clone()
    other[h // 2:] = (torch.arange(128) + 37) % 128      # a second source, scales shifted
    src = torch.stack([row, other])
    gpu = src.cuda()
    for g in gs:
        for dtype in (torch.float32, torch.bfloat16):
            want = torch.empty(1, h, dtype=dtype)
            got = torch.empty(1, h, dtype=dtype, device="cuda")
            TorchPasses().dequantize(src[:1], want, Wire.NVFP4, g)
            TritonPasses().dequantize(gpu[:1], got, Wire.NVFP4, g)
            assert torch.equal(got.cpu().view(BITS[dtype]), want.view(BITS[dtype])), g
            TorchPasses().dequantize_sum(src, want, 2, Wire.NVFP4, g)
            TritonPasses().dequantize_sum(gpu, got, 2, Wire.NVFP4, g)
            assert torch.equal(got.cpu().view(BITS[dtype]), want.view(BITS[dtype])), g
    assert want.isnan().any() and (want == 0).any() and want.isfinite().any()


def test_the_nvfp4_scale_the_format_implies():
    """``dpx.nvfp4_scale(amax)``: the block holding ``amax`` gets the largest e4m3 scale
    (448, byte 0x7E) and arrives exact to the error bound; a scale 8x larger saturates it,
    the reciprocal convention sends small blocks to zero."""
    import dpx
    from dpx.wire import FP8_MAX, nvfp4_scale

    x = torch.tensor([[0.0] * 15 + [4.0] + [1e-3] * 16], dtype=torch.float32)
    g = nvfp4_scale(4.0)
    assert g == FP8_MAX * 6 / 4.0 and dpx.nvfp4_scale is nvfp4_scale
    out = torch.zeros(1, wire_row_bytes(32, Wire.NVFP4), dtype=torch.uint8)
    TorchPasses().quantize(x, 0, 1, out, Wire.NVFP4, g)
    payload, scales = split_wire(out, Wire.NVFP4)
    assert scales[0, 0] == 0x7E              # e4m3 448: the largest scale, not saturated
    back = torch.empty_like(x)
    TorchPasses().dequantize(out, back, Wire.NVFP4, g)
    assert back[0, 15] == 4.0
    for wrong, check in ((8 * g, lambda y: y[0, 15] < 4.0),          # saturated
                         (4.0 / (FP8_MAX * 6), lambda y: not y[0, 16:].any())):   # zeros
        TorchPasses().quantize(x, 0, 1, out, Wire.NVFP4, wrong)
        TorchPasses().dequantize(out, back, Wire.NVFP4, wrong)
        assert check(back), (wrong, back)
    for bad in (0.0, -1.0, float("inf"), float("nan"), 1e-30):
        with pytest.raises(dpx.DpxValueError, match="nvfp4_scale"):
            nvfp4_scale(bad)
    for bad in (True, "4", None, [4.0]):
        with pytest.raises(dpx.DpxTypeError, match="amax must be a number"):
            nvfp4_scale(bad)
    assert nvfp4_scale(torch.tensor(4.0)) == nvfp4_scale(np.float32(4.0)) == g
