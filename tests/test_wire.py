"""The fp8 wire kernels and the pad-row kernel (Triton's interpreter on CPU, compiled on
GPU) against stock torch ops: round-to-nearest-even conversions, ties, subnormal payloads,
zero groups, pad rows, device start/count, every float dtype."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import dpx
from conftest import device_params
from dpx.wire import wire_row_bytes
from dpx_torch.wire import dequantize_into, quantize_into, split_wire

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def _ref_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rows, h = x.shape
    g = x.float().view(rows, h // 128, 128)
    scale = g.abs().amax(-1).clamp(min=1e-10) / 448.0
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


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_quantize_take_and_dequantize_match_stock_ops(device, dtype):
    h = 256
    x = _hard_rows(dtype, h).to(device)
    out = torch.full((20, wire_row_bytes(h)), 0x5A, dtype=torch.uint8, device=device)
    start, count = 2, 15
    quantize_into(x, start, count, out)
    payload, scales = split_wire(out)
    q, s = _ref_quantize(x[start:start + count])
    assert torch.equal(payload[:count].view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(scales[:count].view(torch.int32), s.view(torch.int32))
    assert (out[count:] == 0).all()                    # pad rows: all-zero bytes
    y = torch.full((20, h), 3, dtype=dtype, device=device)
    dequantize_into(out, y)
    want = (q.float().view(count, 2, 128) * s[..., None]).view(count, h).to(dtype)
    assert torch.equal(y[:count].view(BITS[dtype]), want.view(BITS[dtype]))
    assert torch.equal(y[count:].view(BITS[dtype]), torch.zeros_like(y[count:]).view(BITS[dtype]))


@pytest.mark.parametrize("device", device_params())
def test_quantize_reads_device_start_and_count(device):
    h = 128
    x = torch.randn(9, h, device=device)
    out_a = torch.empty(6, wire_row_bytes(h), dtype=torch.uint8, device=device)
    out_b = torch.empty_like(out_a)
    quantize_into(x, 3, 4, out_a)
    quantize_into(x, torch.tensor([3], dtype=torch.int32, device=device),
                  torch.tensor([4], dtype=torch.int32, device=device), out_b)
    assert torch.equal(out_a, out_b) and (out_a[4:] == 0).all() and out_a[:4].any()


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("mode", ["max_len", "sum_len", "gatherv"])
def test_mask_pad_rows_matches_the_real_rows(device, mode):
    from dpx_torch import mask_pad_rows, pad_row_mask

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
        for dtype in (torch.int32, torch.int64, torch.bfloat16):
            t = torch.arange(p.global_rows * 8, device=device).view(-1, 8).to(dtype)
            keep = t.clone()
            assert mask_pad_rows(t, p, counts=c_t, fill=-1) is t
            want = torch.where(torch.from_numpy(real)[:, None].to(device), keep,
                               torch.full_like(keep, -1))
            assert torch.equal(t, want)
        assert np.array_equal(pad_row_mask(p, counts=c_t, device=device).cpu().numpy(), ~real)
