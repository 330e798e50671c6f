"""The fp8 wire passes and the pad-row pass against stock torch ops and the NumPy reference,
in every implementation (torch ops and Triton's interpreter on CPU, the compiled kernels on
GPU): round-to-nearest-even conversions, ties, subnormal payloads, zero groups, pad rows,
device start/count, every float dtype, NaN and infinities."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import dpx
from conftest import device_params, passes_params
from dpx.kernels.blocks import store_rounded
from dpx.kernels.launch import OUT_KIND
from dpx.wire import CANONICAL_NAN, wire_row_bytes
from dpx_torch.passes import TritonPasses
from dpx_torch.shims.interpreter import Interpreter
from dpx_torch.wire import split_wire
from reference import as_dtype, bits_of, dequantize_fp8, quantize_fp8

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def _ref_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rows, h = x.shape
    g = x.float().view(rows, h // 128, 128)
    amax = g.abs().amax(-1).clamp(min=1e-10)
    # a tensor divisor: torch on CUDA divides by a Python scalar as a product with its
    # reciprocal, which is not IEEE division
    scale = amax / torch.full_like(amax, 448.0)
    q = (g / scale[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn).view(rows, h)
    return q, scale


def _hard_rows(dtype: torch.dtype, h: int) -> torch.Tensor:
    """Rows spanning many magnitudes, exact fp8 ties, values in e4m3's subnormal range,
    zero groups and negative zeros."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(24, h, generator=gen) * torch.logspace(-6, 4, 24)[:, None]
    grid = torch.arange(-448, 449, 8, dtype=torch.float32)
    x[0, :grid.numel()] = grid[:h]                     # amax 448: scale 1, ties of e4m3
    x[1] = torch.linspace(-448, 448, h)
    x[2, :128] = 0
    x[2, 128:] = -0.0
    x[3, 0] = 448.0
    x[3, 1:] = torch.linspace(-2**-6, 2**-6, h - 1)    # subnormal payloads
    return x.to(dtype)


@pytest.mark.parametrize("impl", passes_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_quantize_take_and_dequantize_match_stock_ops(impl, dtype):
    device, passes = impl
    h = 256
    x = _hard_rows(dtype, h).to(device)
    out = torch.full((20, wire_row_bytes(h)), 0x5A, dtype=torch.uint8, device=device)
    start, count = 2, 15
    passes.quantize(x, start, count, out)
    payload, scales = split_wire(out)
    q, s = _ref_quantize(x[start:start + count])
    assert torch.equal(payload[:count].view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(scales[:count].view(torch.int32), s.view(torch.int32))
    assert (out[count:] == 0).all()                    # pad rows: all-zero bytes
    y = torch.full((20, h), 3, dtype=dtype, device=device)
    passes.dequantize(out, y)
    want = (q.float().view(count, 2, 128) * s[..., None]).view(count, h).to(dtype)
    assert torch.equal(y[:count].view(BITS[dtype]), want.view(BITS[dtype]))
    assert torch.equal(y[count:].view(BITS[dtype]), torch.zeros_like(y[count:]).view(BITS[dtype]))


@pytest.mark.parametrize("device", device_params())
def test_every_quantize_launch_shape_gives_the_same_bytes(device):
    """Each launch shape the size rule can pick (and the default) writes the reference
    bytes, including rows past a program's block and the zeroed tail."""
    from dpx.kernels import wire as K
    from dpx.kernels.launch import QUANTIZE_BY_BYTES, QuantizeShape, quantize_grid
    from dpx_torch.shims.triton_launch import kernel_for

    h = 384
    x = _hard_rows(torch.bfloat16, h).to(device)
    want = torch.empty(21, wire_row_bytes(h), dtype=torch.uint8, device=device)
    TritonPasses().quantize(x, 1, 19, want)
    q, sc = _ref_quantize(x[1:20])
    assert torch.equal(split_wire(want)[0][:19].view(torch.uint8), q.view(torch.uint8))
    for shape in {QuantizeShape(), *(qs for _, qs in QUANTIZE_BY_BYTES)}:
        out = torch.full_like(want, 0x5A)
        kernel_for(K.quantize_rows_kernel, out.device)[quantize_grid(21, h, shape)](
            x, x, x, 1, 19, x.shape[0], 21, out, H=h, ROW_BYTES=out.shape[1],
            START_PTR=False, COUNT_PTR=False, BLOCK_R=shape.block_r, BLOCK_G=shape.block_g,
            COMPILED=out.device.type == "cuda", WIDE=False, num_warps=shape.warps)
        assert torch.equal(out, want), shape


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_compiled_quantize_matches_ieee_division_on_many_rows(dtype):
    """The compiled kernel divides by a reciprocal with two corrections: bitwise equal to
    IEEE division then the round-to-nearest-even conversion, over magnitudes spanning the
    dtype, signed zeros and exact e4m3fn ties at power-of-two scales."""
    gen = torch.Generator(device="cuda").manual_seed(7)
    rows, h = 6144, 1024
    lo, hi = {torch.float32: (-100, 100), torch.bfloat16: (-100, 100),
              torch.float16: (-14, 12)}[dtype]
    x = torch.randn(rows, h, device="cuda", generator=gen)
    x *= torch.exp2(torch.randint(lo, hi, (rows, h // 128, 1), device="cuda",
                                  generator=gen).float()).repeat_interleave(128, 1)[..., 0]
    # rows 0..1023: amax 448 * 2**k, so scale = 2**k and the other elements are e4m3fn
    # midpoints (ties) or grid points times 2**k
    k = torch.randint(lo // 2, hi // 2, (1024, 1), device="cuda", generator=gen).float()
    m = torch.randint(0, 2 ** 8, (1024, h), device="cuda", generator=gen).float()
    ties = (8 + (m % 8) + 0.5 * (m >= 128)) * torch.exp2(torch.floor(m / 16) % 8 - 9)
    x[:1024] = torch.where(m % 2 == 0, ties, -ties) * torch.exp2(k)
    x[:1024, ::128] = 448 * torch.exp2(k)
    x[1024:1100] = -0.0
    x[1100:1200, 5::7] = 0.0
    x = x.to(dtype)
    assert torch.isfinite(x).all()
    out = torch.empty(rows, wire_row_bytes(h), dtype=torch.uint8, device="cuda")
    TritonPasses().quantize(x, 0, rows, out)
    payload, scales = split_wire(out)
    q, s = _ref_quantize(x)
    assert torch.equal(scales.view(torch.int32), s.view(torch.int32))
    bad = (payload.view(torch.uint8) != q.view(torch.uint8)).nonzero()
    assert bad.numel() == 0, (bad[:5], x[bad[:5, 0], bad[:5, 1]])


@pytest.mark.parametrize("impl", passes_params())
def test_quantize_reads_device_start_and_count(impl):
    device, passes = impl
    h = 128
    x = torch.randn(9, h, device=device)
    out_a = torch.empty(6, wire_row_bytes(h), dtype=torch.uint8, device=device)
    out_b = torch.empty_like(out_a)
    passes.quantize(x, 3, 4, out_a)
    passes.quantize(x, torch.tensor([3], dtype=torch.int32, device=device),
                    torch.tensor([4], dtype=torch.int32, device=device), out_b)
    assert torch.equal(out_a, out_b) and (out_a[4:] == 0).all() and out_a[:4].any()


@pytest.mark.parametrize("impl", passes_params())
@pytest.mark.parametrize("mode", ["max_len", "sum_len", "gatherv"])
def test_mask_pad_rows_matches_the_real_rows(impl, mode):
    from dpx_torch import mask_pad_rows, pad_row_mask

    device, passes = impl
    ran, mask = [], passes.mask
    passes.mask = lambda *a: (ran.append(1), mask(*a))[1]
    lay = dpx.DpLayout(8, 4)
    plan = dpx.plan_step([3, 0, 7, 1], lay, mode=mode)
    cap = dpx.plan_step([0] * 4, lay, mode=mode, capacity=16)
    for p, counts in ((plan, None), (cap, [5, 0, 2, 3])):
        c_t = None if counts is None else torch.tensor(counts, dtype=torch.int32,
                                                       device=device)
        n = p.num_tokens if counts is None else counts
        offs = p.offsets if counts is None or mode == "max_len" else tuple(
            np.concatenate([[0], np.cumsum([-(-k // 2) * 2 for k in n])[:-1]]))
        real = np.zeros(p.global_rows, bool)
        for o, k in zip(offs, n):
            real[o:o + k] = True
        # (a float64 fill goes in exactly: a kernel's float scalar would be a float32)
        for dtype, fill in ((torch.int32, -1), (torch.int64, -1), (torch.bfloat16, -1),
                            (torch.float64, 0.1)):
            t = torch.arange(p.global_rows * 8, device=device).view(-1, 8).to(dtype)
            keep = t.clone()
            assert mask_pad_rows(t, p, counts=c_t, fill=fill, passes=passes) is t
            want = torch.where(torch.from_numpy(real)[:, None].to(device), keep,
                               torch.full_like(keep, fill))
            assert torch.equal(t, want), (dtype, fill)
        assert np.array_equal(pad_row_mask(p, counts=c_t, device=device).cpu().numpy(), ~real)
    # the passes given ran every mask (an empty TritonPasses was taken for "no passes")
    del passes.mask
    assert len(ran) == 8


# (dtype, fill, error or None): what every frontend's mask_pad_rows takes and refuses
FILLS = [("uint8", 255, None), ("uint8", -1, r"fill=-1 is not a value of uint8: an integer "
                                          r"in \[0, 255\]"),
         ("int8", -128, None), ("int8", 3.0, None), ("int8", 128, r"not a value of int8"),
         ("int8", 2.5, r"fill=2.5 is not a value of int8"), ("bool", 1, None),
         ("bool", 2, r"not a value of bool"), ("int32", True, r"fill=True must be an int or a "
                                                          r"float"),
         ("int16", -32768, None), ("float16", 65504, None), ("float16", float("-inf"), None),
         ("float16", 1e5, r"fill=100000.0 is not a value of float16: NaN, \+-inf or a number "
                          r"within \+-65504"),
         ("bfloat16", float("nan"), None), ("bfloat16", -float("nan"), None),
         ("bfloat16", 0.1, None), ("bfloat16", 1e39, r"not a value of bfloat16"),
         ("float32", -2 ** 100, None), ("float32", 10 ** 39, r"not a value of float32"),
         ("float8_e5m2", float("inf"), None), ("float8_e4m3fn", 448.0, None),
         ("float8_e4m3fn", -0.0, None), ("float8_e4m3fn", 2.0 ** -10, None),
         ("float8_e4m3fn", float("inf"), r"fill=inf is not a value of float8_e4m3fn: NaN, a "
                                         r"number within \+-448"),
         ("float32", "0", r"fill='0' must be an int or a float"),
         # one rounding from the Python float (through float32 first: another element)
         ("bfloat16", 1 + 2 ** -8 + 2 ** -30, None), ("float16", 1 + 2 ** -11 + 2 ** -30, None),
         ("float8_e4m3fn", 1 + 2 ** -4 + 2 ** -40, None), ("float16", 2.0 ** -25, None),
         ("float16", -(2.0 ** -25 + 2 ** -40), None), ("float32", 2.0 ** -150, None),
         # 64-bit dtypes (torch only: JAX holds them with jax_enable_x64 alone)
         ("uint64", 2 ** 64 - 1, None), ("int64", -2 ** 63, None), ("float64", 0.1, None),
         ("uint64", 2 ** 64, r"not a value of uint64")]


def test_mask_pad_rows_fills_only_values_of_the_dtype():
    """``mask_pad_rows``' fill must be a value of the tensor's dtype (:func:`dpx.extents.
    fill_bits`): torch and JAX refuse the same fills with the same message, before
    touching the tensor, and store the same bits for the fills they take -- the fill
    rounded once to nearest even (NumPy's and ml_dtypes' conversion from a float64 here;
    a NaN as the dtype's canonical quiet NaN), also where rounding through float32 first
    gives another element."""
    import ml_dtypes

    import dpx_torch
    from dpx.errors import DpxError

    jnp = pytest.importorskip("jax.numpy")
    import dpx_jax

    plan = dpx.plan_step([3, 0, 2, 1], dpx.DpLayout(4, 4), mode="max_len")
    real = ~np.asarray(dpx_torch.pad_row_mask(plan))
    for dtype, fill, err in FILLS:
        t = torch.zeros(plan.global_rows, 4, dtype=getattr(torch, dtype))
        j = None if "64" in dtype else jnp.zeros((plan.global_rows, 4), getattr(jnp, dtype))
        if err is not None:
            with pytest.raises(DpxError, match=err):
                dpx_torch.mask_pad_rows(t, plan, fill=fill)
            if j is not None:
                with pytest.raises(DpxError, match=err):
                    dpx_jax.mask_pad_rows(j, plan, fill=fill)
            assert not t.view(torch.uint8).any(), (dtype, fill)
            continue
        got_t = dpx_torch.mask_pad_rows(t, plan, fill=fill)
        ref = getattr(ml_dtypes, dtype, None) or np.dtype(dtype)
        one = fill if fill == fill else float("nan")   # (NaN: the canonical, positive)
        want = (np.array([one], ref) if "int" in dtype else
                np.array([one], np.float64).astype(ref)).view(np.uint8)
        b = got_t.view(torch.uint8).numpy().reshape(plan.global_rows, -1)
        assert (b[real] == 0).all() and (b[~real] == np.tile(want, 4)).all(), (dtype, fill)
        if j is not None:
            got_j = np.asarray(dpx_jax.mask_pad_rows(j, plan, fill=fill))
            assert np.array_equal(got_j.view(np.uint8).reshape(b.shape), b), (dtype, fill)


NONFINITE = (float("nan"), float("inf"), float("-inf"), -float("nan"))


def _nonfinite_rows(h: int) -> np.ndarray:
    """float32 rows with NaN and infinities at every position of a group (first, middle,
    last element), whole groups and rows of them, huge finite values beside them, and
    clean rows between (which must come back as if alone)."""
    rng = np.random.default_rng(11)
    rows = []
    for v in NONFINITE:
        for pos in (0, 64, 127, 128, h - 1):
            r = rng.standard_normal(h).astype(np.float32)
            r[pos] = v
            rows.append(r)
        rows.append(np.full(h, v, np.float32))
        r = (np.clip(rng.standard_normal(h), -4, 4) * 8e37).astype(np.float32)  # huge, finite
        r[5] = v
        rows.append(r)
        rows.append(rng.standard_normal(h).astype(np.float32))
    return np.stack(rows)


@pytest.mark.parametrize("impl", passes_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_nonfinite_values_follow_the_rule_bit_for_bit(impl, dtype):
    """NaN stays NaN, +-inf arrives as NaN, no finite value changes because of them (a
    group's scale comes from its finite values): every implementation equals the NumPy
    reference bit for bit, payload, scales and the dequantized rows."""
    device, passes = impl
    h = 256
    x = torch.from_numpy(_nonfinite_rows(h)).to(dtype)
    xf = x.float().numpy()
    rows = x.shape[0]
    out = torch.full((rows + 2, wire_row_bytes(h)), 0x5A, dtype=torch.uint8, device=device)
    passes.quantize(x.to(device), 0, rows, out)
    rp, rs = quantize_fp8(xf, np.ones(rows, bool))
    payload, scales = split_wire(out.cpu())
    assert np.array_equal(payload[:rows].view(torch.uint8).numpy(), rp)
    assert np.array_equal(scales[:rows].numpy().view(np.uint32), rs.view(np.uint32))
    y = torch.empty(rows + 2, h, dtype=dtype, device=device)
    passes.dequantize(out, y)
    want = bits_of(as_dtype(dequantize_fp8(rp, rs), str(dtype).replace("torch.", "")))
    got = y[:rows].cpu().view(BITS[dtype]).numpy().view(want.dtype)
    assert np.array_equal(got, want)
    # the rule itself: where the input is not finite the output is NaN; every finite
    # value equals its value quantized alone, without the non-finite elements
    yf = y[:rows].float().cpu().numpy()
    assert np.isnan(yf[~np.isfinite(xf)]).all()
    clean = np.where(np.isfinite(xf), xf, 0).astype(np.float32)
    alone = dequantize_fp8(*quantize_fp8(clean, np.ones(rows, bool)))
    fin = np.isfinite(xf)
    assert np.array_equal(bits_of(as_dtype(alone, str(dtype).replace("torch.", "")))[fin],
                          want[fin])


@triton.jit
def _store_bits(src_ptr, out_ptr, N: tl.constexpr, OUT_KIND: tl.constexpr,
                COMPILED: tl.constexpr):
    o = tl.arange(0, N)
    v = tl.load(src_ptr + o).to(tl.float32, bitcast=True)
    store_rounded(v, out_ptr, o, o < N, OUT_KIND, COMPILED)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_nan_is_stored_as_the_canonical_nan(device, dtype):
    """The dequantize and summing passes store a float32 through ``store_rounded``: each
    number and infinity rounded to nearest even, every NaN -- either sign, quiet or
    signalling, any payload -- as the output dtype's canonical quiet NaN (a GPU's
    conversion writes every NaN as 0x7FFF, the interpreter's keeps sign and payload),
    beside the values next to it: the largest numbers, the infinities, negatives, values
    that round to infinity."""
    name = str(dtype).replace("torch.", "")
    nans = [0x7FC00000, 0x7FFFFFFF, 0x7F800001, 0x7FA00000, 0x7FC00001, 0x7FBFFFFF,
            0xFFC00000, 0xFFFFFFFF, 0xFF800001, 0xFFA00000, 0xFFC00001]
    numbers = [0x7F800000, 0xFF800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x477FE000, 0x477FF000,
               0xC77FF000, 0x477FEFFF, 0x7F7F0000, 0x7F7F8000, 0xFF7F8000, 0x3F800000,
               0xBF800000, 0x00000001, 0x80000001, 0x00000000, 0x80000000, 0x33800001]
    bits = np.array(nans + numbers + [0] * (32 - len(nans) - len(numbers)), np.uint32)
    src = torch.from_numpy(bits.view(np.int32)).to(device)
    out = torch.empty(32, dtype=dtype, device=device)
    kernel = _store_bits if device == "cuda" else Interpreter().kernel(_store_bits)
    kernel[(1,)](src, out, N=32, OUT_KIND=OUT_KIND[name], COMPILED=device == "cuda")
    got = out.cpu().view(BITS[dtype]).numpy().view(
        {4: np.uint32, 2: np.uint16}[dtype.itemsize])
    v = bits.view(np.float32)
    want = bits_of(as_dtype(np.where(np.isnan(v), 0, v), name)).copy()
    want[np.isnan(v)] = CANONICAL_NAN[name]
    assert np.array_equal(got, want), [(hex(b), hex(g), hex(w)) for b, g, w in
                                       zip(bits, got, want) if g != w]
