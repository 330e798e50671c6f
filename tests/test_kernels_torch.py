"""The row passes through the torch launchers, against plain torch indexing, in every
implementation: on CPU the torch-op passes (what DpComm runs there) and the Triton kernels
in Triton's interpreter; the ``cuda`` cases (marked ``gpu``) run the compiled kernels.
"""

from __future__ import annotations

import pytest
import torch

from conftest import device_params, passes_params
from dpx import DpxTypeError, DpxValueError
from dpx_torch import place_rows, take_rows, zero_rows_

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64]
POISON = {torch.float32: float("nan"), torch.bfloat16: float("nan"),
          torch.float16: float("nan"), torch.int32: -7, torch.int64: -7}


def _rand(shape, dtype, gen, device):
    x = torch.randint(-1000, 1000, shape, generator=gen)
    x = x.to(dtype) if not dtype.is_floating_point else (x.to(torch.float32) / 7).to(dtype)
    return x.to(device)


def _ref_place(src, start, count, rows):
    out = torch.zeros((rows, *src.shape[1:]), dtype=src.dtype, device=src.device)
    out[start:start + count] = src[:count]
    return out


def _ref_take(src, start, count, rows):
    out = torch.zeros((rows, *src.shape[1:]), dtype=src.dtype, device=src.device)
    out[:count] = src[start:start + count]
    return out


def _poisoned(rows, rest, dtype, device, margin=3):
    """An ``out`` view with poisoned guard rows on both sides, to catch stray writes."""
    big = torch.full((rows + 2 * margin, *rest), POISON[dtype], dtype=dtype, device=device)
    return big, big[margin:margin + rows]


def _check_guards(big, margin=3):
    for guard in (big[:margin], big[big.shape[0] - margin:]):
        g = guard.float()
        assert (torch.isnan(g) | (g == -7)).all(), "a kernel wrote outside its output"


CASES = [  # (src_rows, rest, start, count, rows)
    (5, (7,), 2, 4, 9), (5, (1,), 0, 5, 5), (3, (3, 5), 4, 3, 7), (0, (11,), 0, 0, 4),
    (4, (13,), 0, 0, 4), (6, (1029,), 3, 6, 9), (2, (4,), 8, 2, 10), (9, (2, 2, 3), 1, 8, 9),
    (40, (130,), 17, 33, 50), (1, (8,), 0, 1, 1), (4, (6,), 3, 1, 4), (4, (6,), 0, 0, 0),
]


@pytest.mark.parametrize("impl", passes_params())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_place_and_take_match_indexing(impl, dtype, case):
    device, P = impl
    src_rows, rest, start, count, rows = case
    gen = torch.Generator().manual_seed(hash((src_rows, rest, start, count, rows)) % 2**31)
    src = _rand((src_rows, *rest), dtype, gen, device)
    for as_tensor in (False, True):
        s = torch.tensor([start], dtype=torch.int32, device=device) if as_tensor else start
        c = torch.tensor([count], dtype=torch.int32, device=device) if as_tensor else count
        big, out = _poisoned(rows, rest, dtype, device)
        place_rows(src, s, c, rows, out=out, passes=P)
        _check_guards(big)
        assert torch.equal(out, _ref_place(src, start, count, rows))
        assert torch.equal(place_rows(src, s, c, rows, passes=P),
                           _ref_place(src, start, count, rows))
        # take reads back what place wrote
        placed = _ref_place(src, start, count, rows)
        big, out = _poisoned(src_rows, rest, dtype, device)
        take_rows(placed, s, c, src_rows, out=out, passes=P)
        _check_guards(big)
        assert torch.equal(out, _ref_take(placed, start, count, src_rows))


@pytest.mark.parametrize("impl", passes_params())
def test_mixed_int_and_tensor_index(impl):
    device, P = impl
    src = torch.arange(24, dtype=torch.float32, device=device).reshape(6, 4)
    c = torch.tensor([3], dtype=torch.int32, device=device)
    assert torch.equal(place_rows(src, 2, c, 8, passes=P), _ref_place(src, 2, 3, 8))
    s = torch.tensor([1], dtype=torch.int32, device=device)
    assert torch.equal(take_rows(src, s, 4, 5, passes=P), _ref_take(src, 1, 4, 5))


@pytest.mark.parametrize("impl", passes_params())
def test_device_counts_out_of_range_stay_in_bounds(impl):
    """A wrong device-side count is clipped to the buffers: no stray write, no stray
    read."""
    device, P = impl
    src = torch.arange(20, dtype=torch.float32, device=device).reshape(5, 4) + 1
    big, out = _poisoned(6, (4,), torch.float32, device)
    s = torch.tensor([4], dtype=torch.int32, device=device)
    c = torch.tensor([1000], dtype=torch.int32, device=device)
    place_rows(src, s, c, 6, out=out, passes=P)
    _check_guards(big)
    assert torch.equal(out[:4], torch.zeros(4, 4, device=device))
    assert torch.equal(out[4:], src[:2])
    big, out = _poisoned(7, (4,), torch.float32, device)
    take_rows(src, torch.tensor([3], dtype=torch.int32, device=device), c, 7, out=out,
              passes=P)
    _check_guards(big)
    assert torch.equal(out[:2], src[3:]) and (out[2:] == 0).all()


@pytest.mark.parametrize("impl", passes_params())
@pytest.mark.parametrize("dtype", DTYPES)
def test_zero_rows_keeps_only_the_window(impl, dtype):
    device, P = impl
    gen = torch.Generator().manual_seed(3)
    for keep_start, keep_count in ((1, 3), (0, 4), (6, 9), (0, 0), (9, 0), (2, 0)):
        x = _rand((9, 5), dtype, gen, device)
        ref = torch.zeros_like(x)
        ref[keep_start:keep_start + keep_count] = x[keep_start:keep_start + keep_count]
        for as_tensor in (False, True):
            y = x.clone()
            c = (torch.tensor([keep_count], dtype=torch.int32, device=device) if as_tensor
                 else keep_count)
            zero_rows_(y, keep_start, c, passes=P)
            assert torch.equal(y, ref), (keep_start, keep_count, as_tensor)


def test_tile_for_is_a_pure_function_of_shapes():
    from dataclasses import replace

    from dpx.kernels.launch import (DEFAULT_TILE, STREAM_BYTES, TILES_BY_BYTES, peer_move_tile,
                                    tile_for)

    width = 7168
    small = tile_for(8, width, 2, src_rows=1)
    assert small == DEFAULT_TILE and not small.stream
    rows = -(-STREAM_BYTES // (width * 2))
    assert tile_for(rows, width, 2, src_rows=rows // 2).stream      # mostly zeros: streamed
    assert not tile_for(rows, width, 2, src_rows=rows).stream       # a full copy: not
    assert not tile_for(rows, width, 2).stream                      # reads unknown: not
    assert tile_for(rows, width, 2, src_rows=0).stream              # zeros only
    assert tile_for(rows, width, 2) == TILES_BY_BYTES[-1][1]
    assert tile_for(rows, width, 2, src_rows=5) == tile_for(rows, width, 2, src_rows=5)
    # byte rows: the tile of 2-byte rows of the same bytes with twice the elements and the
    # column block (the same bytes a thread), streamed where that one is
    for r, src in ((8, 1), (rows, rows // 2), (rows, None), (2 * rows, 0), (4 * rows, 0)):
        t2, t1 = tile_for(r, width // 2, 2, src_rows=src), tile_for(r, width, 1, src_rows=src)
        assert t1 == replace(t2, elems=2 * t2.elems, max_block_c=2 * t2.max_block_c), (r, src)
    assert tile_for(4 * rows, width, 1, src_rows=0).stream
    # the peer moves: 128 bytes a thread of 16 warps, 64 on byte rows
    for itemsize in (1, 2, 4, 8):
        t = peer_move_tile(itemsize)
        assert t.elems * max(itemsize, 2) == 128 * 32 * t.warps and t.warps == 16
    from dpx.kernels.launch import QUANTIZE_BY_BYTES, quantize_grid, quantize_shape

    assert quantize_shape(256, 7168, 2) == QUANTIZE_BY_BYTES[0][1]       # 5.3 MiB
    assert quantize_shape(4096, 7168, 2) == QUANTIZE_BY_BYTES[1][1]      # 85 MiB
    assert quantize_shape(65536, 7168, 2) == QUANTIZE_BY_BYTES[2][1]     # 1.3 GiB
    q = quantize_shape(33, 384, 4)
    assert quantize_grid(33, 384, q) == (-(-33 // q.block_r), -(-3 // q.block_g))


@pytest.mark.parametrize("device", device_params())
def test_every_launch_tile_moves_and_zeroes_the_same_rows(device):
    """Each tile (shape and store kind) a launch can pick gives the reference result."""
    from dpx.kernels import Tile
    from dpx_torch.passes import TritonPasses

    P = TritonPasses()
    gen = torch.Generator().manual_seed(5)
    src = _rand((6, 3, 40), torch.bfloat16, gen, device)
    for tile in (Tile(), Tile(256, 4, 32), Tile(8192, 16, 2048, stream=True),
                 Tile(64, 4, 16, stream=True)):
        for start, count, rows in ((0, 6, 6), (3, 4, 11), (2, 0, 5)):
            got = place_rows(src, start, count, rows, tile=tile, passes=P)
            assert torch.equal(got, _ref_place(src, start, count, rows)), (tile, start)
            y = _rand((9, 3, 40), torch.bfloat16, gen, device)
            ref = torch.zeros_like(y)
            ref[start:start + count] = y[start:start + count]
            zero_rows_(y, start, count, tile=tile, passes=P)
            assert torch.equal(y, ref), (tile, start, count)


@pytest.mark.parametrize("device", device_params())
def test_gradients_are_adjoint(device):
    src = torch.randn(5, 3, device=device, dtype=torch.float64).float().requires_grad_()
    weight = torch.randn(8, 3, device=device)
    (place_rows(src, 2, 4, 8) * weight).sum().backward()
    expect = torch.zeros(5, 3, device=device)
    expect[:4] = weight[2:6]
    assert torch.equal(src.grad, expect)
    src.grad = None
    (take_rows(src, 1, 3, 6) * weight[:6]).sum().backward()
    expect = torch.zeros(5, 3, device=device)
    expect[1:4] = weight[:3]
    assert torch.equal(src.grad, expect)


def test_launcher_errors():
    x = torch.zeros(4, 3)
    with pytest.raises(DpxValueError, match=r"start=2, count=3.*start \+ count <= rows \(4\)"):
        place_rows(x, 2, 3, 4)
    with pytest.raises(DpxValueError, match=r"count <= src rows \(4\)"):
        place_rows(x, 0, 5, 8)
    with pytest.raises(DpxValueError, match=r"start \+ count <= src rows \(4\)"):
        take_rows(x, 3, 2, 8)
    with pytest.raises(DpxValueError, match="start=-1"):
        take_rows(x, -1, 2, 8)
    with pytest.raises(DpxTypeError, match="count=1.5"):
        take_rows(x, 0, 1.5, 8)
    with pytest.raises(DpxTypeError, match="int32"):
        take_rows(x, 0, torch.tensor([1]), 8)
    with pytest.raises(DpxValueError, match="contiguous"):
        take_rows(torch.zeros(3, 4).t(), 0, 1, 2)
    with pytest.raises(DpxValueError, match=r"out has shape \(3, 3\)"):
        take_rows(x, 0, 1, 2, out=torch.zeros(3, 3))
    with pytest.raises(DpxValueError, match="alias"):
        take_rows(x, 0, 1, 2, out=x[2:])
    with pytest.raises(DpxValueError, match="rows=-2"):
        take_rows(x, 0, 0, -2)


# ---------------------------------------------------------------- chunk tables
def _ref_unpack(src, firsts, lens, rows):
    n = len(firsts)
    block = src.shape[0] // n
    out = torch.zeros((rows, *src.shape[1:]), dtype=src.dtype, device=src.device)
    for r, (f, ln) in enumerate(zip(firsts, lens)):
        out[f:f + ln] = src[r * block:r * block + ln]
    return out


def _ref_pack(src, firsts, lens, block):
    out = torch.zeros((len(firsts) * block, *src.shape[1:]), dtype=src.dtype, device=src.device)
    for r, (f, ln) in enumerate(zip(firsts, lens)):
        out[r * block:r * block + ln] = src[f:f + ln]
    return out


CHUNK_CASES = [  # (firsts, lens, block, rows, rest): chunks in rank order, gaps and empties
    ([0, 2, 2, 4], [2, 0, 2, 2], 2, 8, (5,)),
    ([0, 3, 9], [3, 3, 1], 3, 12, (2, 3)),
    ([1, 7], [4, 0], 5, 9, (1029,)),
    ([0], [0], 0, 4, (7,)),
    ([0, 4, 8, 12, 16, 20, 24, 28], [4] * 8, 4, 32, (130,)),
]


@pytest.mark.parametrize("impl", passes_params())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.int64])
@pytest.mark.parametrize("case", CHUNK_CASES)
def test_pack_and_unpack_match_indexing(impl, dtype, case):
    from dpx_torch import pack_rows, unpack_rows

    device, P = impl
    firsts, lens, block, rows, rest = case
    gen = torch.Generator().manual_seed(len(firsts) * 31 + rows)
    f = torch.tensor(firsts, dtype=torch.int32, device=device)
    ln = torch.tensor(lens, dtype=torch.int32, device=device)
    src = _rand((len(firsts) * block, *rest), dtype, gen, device)
    assert torch.equal(unpack_rows(src, f, ln, rows, passes=P),
                       _ref_unpack(src, firsts, lens, rows))
    glob = _rand((rows, *rest), dtype, gen, device)
    assert torch.equal(pack_rows(glob, f, ln, block, passes=P),
                       _ref_pack(glob, firsts, lens, block))
    big, out = _poisoned(rows, rest, dtype, device)    # the passes write only out
    P.unpack(src, f, ln, block, out)
    _check_guards(big)
    assert torch.equal(out, _ref_unpack(src, firsts, lens, rows))
    big, out = _poisoned(len(firsts) * block, rest, dtype, device)
    P.pack(glob, f, ln, block, out)
    _check_guards(big)
    assert torch.equal(out, _ref_pack(glob, firsts, lens, block))


@pytest.mark.parametrize("impl", passes_params())
def test_chunk_tables_out_of_range_stay_in_bounds(impl):
    """A wrong device table (chunks longer than the block, past the buffers) is clipped to
    the buffers: no stray write, no stray read."""
    device, P = impl
    src = torch.arange(24, dtype=torch.float32, device=device).reshape(6, 4) + 1
    f = torch.tensor([0, 5], dtype=torch.int32, device=device)
    ln = torch.tensor([100, 100], dtype=torch.int32, device=device)
    big, out = _poisoned(7, (4,), torch.float32, device)
    P.unpack(src, f, ln, 3, out)
    _check_guards(big)
    assert torch.equal(out[:3], src[:3]) and torch.equal(out[5:], src[3:5])
    big, out = _poisoned(6, (4,), torch.float32, device)
    P.pack(src, f, ln, 3, out)
    _check_guards(big)
    assert torch.equal(out[:3], src[:3]) and torch.equal(out[3], src[5]) and not out[4:].any()


@pytest.mark.parametrize("device", device_params())
def test_pack_and_unpack_are_adjoint(device):
    from dpx_torch import pack_rows, unpack_rows

    f = torch.tensor([0, 3, 4], dtype=torch.int32, device=device)
    ln = torch.tensor([3, 0, 2], dtype=torch.int32, device=device)
    x = torch.randn(9, 3, device=device, requires_grad=True)
    w = torch.randn(8, 3, device=device)
    (unpack_rows(x, f, ln, 8) * w).sum().backward()
    assert torch.equal(x.grad, _ref_pack(w, [0, 3, 4], [3, 0, 2], 3))
    y = torch.randn(8, 3, device=device, requires_grad=True)
    w2 = torch.randn(9, 3, device=device)
    (pack_rows(y, f, ln, 3) * w2).sum().backward()
    assert torch.equal(y.grad, _ref_unpack(w2, [0, 3, 4], [3, 0, 2], 8))


def test_passes_skip_work_that_cannot_matter():
    """No launch for a pass over zero rows, no read of a source when no row moves, no zero
    pass over an empty range: a pass does only the work its output needs."""
    from dpx_torch.shims.triton_launch import JitLauncher
    from dpx_torch.passes import TorchPasses, TritonPasses

    launches = []

    class Counting(JitLauncher):
        def launch(self, kernel, grid, device, args, consts, num_warps):
            launches.append(kernel)
            super().launch(kernel, grid, device, args, consts, num_warps)

        def bind(self, kernel, device, consts, num_warps, pointers):
            launches.append(kernel)
            return super().bind(kernel, device, consts, num_warps, pointers)

    kernels = TritonPasses(Counting())
    empty = torch.empty(0, 4)
    kernels.move(torch.zeros(3, 4), 0, 0, 0, empty)       # an idle replica's empty output
    kernels.zero(empty, 0, 0)
    kernels.quantize(torch.zeros(3, 128), 0, 0, torch.empty(0, 132, dtype=torch.uint8))
    kernels.dequantize(torch.empty(0, 132, dtype=torch.uint8), torch.empty(0, 128))
    assert launches == []
    # torch ops: no row to move reads nothing (a meta source would fail if read) and
    # writes the zeros; a full copy zeroes nothing
    out = torch.full((5, 4), 7.0)
    TorchPasses().move(torch.empty(9, 4, device="meta"), 0, 2, 0, out)
    assert not out.any()
    calls = []
    real_zero = torch.Tensor.zero_
    torch.Tensor.zero_ = lambda t: (calls.append(t.shape[0]), real_zero(t))[1]
    try:
        src = torch.arange(20.0).view(5, 4)
        go = TorchPasses().bind_move(5, 5, 4, torch.float32, src.device, 0, 0, 5)
        go(src, out)
        TorchPasses().zero(out, 0, 5)
    finally:
        torch.Tensor.zero_ = real_zero
    assert torch.equal(out, src) and calls == []
