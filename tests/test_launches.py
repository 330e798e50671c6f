"""Each kernel has one launch description (``dpx.kernels.launch``): its constexprs in the
kernel's signature order, its pointers the kernel's pointer arguments, and both frontends
launch every kernel exactly as described -- torch's passes and JAX's jax-triton calls
(recorded here without a GPU) give the same kernel, grid, warps, constexprs and argument
count for the same shapes."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from dpx.kernels import launch as L
from dpx.modes import Wire
from dpx.wire import wire_row_bytes


def _descriptions():
    yield L.move_launch(10, 20, 96, 2, src_start_ptr=True, dst_start_ptr=False,
                        count_ptr=True)
    yield L.zero_launch(20, 96, 4, start_ptr=False, count_ptr=True)
    for pack in (True, False):
        yield L.chunks_launch(pack, 12, 96, 2)
    yield L.mask_launch(12, 96)
    yield L.check_launch(8, 2, 2, 64, None)
    for wire in (Wire.FP8, Wire.NVFP4, Wire.MXFP4):
        yield L.quantize_launch(wire, 10, 12, 256, 2, start_ptr=True, count_ptr=False,
                                compiled=True)
        yield L.dequantize_launch(wire, 12, 256, "bfloat16", compiled=False)
        yield L.dequantize_sum_launch(wire, 6, 4, 256, "float32", compiled=True)


@pytest.mark.parametrize("lt", list(_descriptions()), ids=lambda lt: lt.kernel.__name__)
def test_a_description_matches_its_kernel(lt):
    params = list(inspect.signature(lt.kernel.fn).parameters.values())
    const = [p.name for p in params if p.annotation in ("tl.constexpr",) or
             "constexpr" in str(p.annotation)]
    runtime = [p.name for p in params if p.name not in const]
    assert list(lt.consts) == const            # every constexpr, in signature order
    assert [runtime[i] for i in lt.pointers] == [n for n in runtime if n.endswith("_ptr")]
    assert runtime[lt.pointers[-1]] in ("out_ptr", "buf_ptr", "flag_ptr")
    assert all(g >= 1 for g in lt.grid) and lt.warps in (1, 2, 4, 8, 16)


class _Recorder:
    """A launcher recording each launch: (kernel, grid, warps, constexprs, argument
    count)."""

    def __init__(self):
        self.log = []

    def bind(self, kernel, device, consts, warps, pointers):
        rec = self

        class Bound:
            @staticmethod
            def tensors(grid, args):
                rec.log.append((kernel.__name__, tuple(grid), warps, dict(consts), len(args)))
        return Bound()

    def launch(self, kernel, grid, device, args, consts, warps):
        self.bind(kernel, device, consts, warps, ()).tensors(grid, args)


@pytest.fixture()
def jax_log(monkeypatch):
    """``dpx_jax``'s jax-triton calls, recorded (the output: zeros)."""
    pytest.importorskip("jax")
    import jax.numpy as jnp

    import dpx_jax.triton_shim as shim

    log = []

    def triton_call(*args, out, kernel, grid, num_warps, **consts):
        log.append((kernel.__name__, tuple(grid), num_warps, consts, len(args) + 1))
        return jnp.zeros(out.shape, out.dtype)
    monkeypatch.setattr(shim, "triton_call", triton_call)
    return log


def test_both_frontends_launch_as_described(jax_log):
    import jax.numpy as jnp

    from dpx_jax import rows as jrows
    from dpx_jax import wire as jwire
    from dpx_torch.passes import TritonPasses

    rec = _Recorder()
    tp = TritonPasses(rec, max_launches=0)
    i32 = lambda v: torch.tensor([v], dtype=torch.int32)  # noqa: E731
    src = torch.zeros(10, 4, 24, dtype=torch.bfloat16)
    tp.move(src, i32(1), i32(2), i32(5), torch.empty(20, 4, 24, dtype=torch.bfloat16))
    jrows.move_rows(jnp.zeros((10, 4, 24), jnp.bfloat16), 1, 2, 5, 20, impl="triton")
    firsts, lens = torch.tensor([0, 6], dtype=torch.int32), torch.tensor([3, 2],
                                                                          dtype=torch.int32)
    tp.unpack(torch.zeros(8, 96), firsts, lens, 4, torch.empty(9, 96))
    jrows.unpack_rows(jnp.zeros((8, 96)), np.array([0, 6]), np.array([3, 2]), 9,
                      impl="triton")
    tp.pack(torch.zeros(9, 96), firsts, lens, 4, torch.empty(8, 96))
    jrows.pack_rows(jnp.zeros((9, 96)), np.array([0, 6]), np.array([3, 2]), 4, impl="triton")
    for wire, g in ((Wire.FP8, None), (Wire.NVFP4, 0.5), (Wire.MXFP4, None)):
        x = torch.zeros(10, 256, dtype=torch.bfloat16)
        w = torch.empty(12, wire_row_bytes(256, wire), dtype=torch.uint8)
        tp.quantize(x, i32(1), i32(8), w, wire, g)
        tp.dequantize(w, torch.empty(12, 256, dtype=torch.float16), wire, g)
        jw = jwire.quantize_take(jnp.zeros((10, 256), jnp.bfloat16), 1, 8, 12,
                                 jrows.Impl.TRITON, wire, g)
        jwire.dequantize(jw, jnp.float16, jrows.Impl.TRITON, wire, g)
        tp.dequantize_sum(w, torch.empty(3, 256, dtype=torch.bfloat16), 4, wire, g)
        jwire.dequantize_sum(jw, 4, jnp.bfloat16, jrows.Impl.TRITON, wire, g)
    # the torch launches were bound for CPU tensors: compiled=False where the kernels
    # take COMPILED; the JAX ones compile
    torch_log = [(k, grid, w, {n: (True if n == "COMPILED" else v) for n, v in c.items()},
                  nargs) for k, grid, w, c, nargs in rec.log]
    assert len(torch_log) == len(jax_log) == 12
    for t, j in zip(torch_log, jax_log):
        assert t == j, (t, j)
