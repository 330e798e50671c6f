"""On one GPU, the torch-launched and the jax-triton-launched kernels give the same bits."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")

from conftest import jax_gpu_available  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not (torch.cuda.is_available() and jax_gpu_available()), reason="needs torch and JAX on a GPU")]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "int32"])
def test_torch_and_jax_triton_kernels_bitwise(dtype):
    import jax.numpy as jnp

    import dpx_jax
    import dpx_torch

    rng = np.random.default_rng(5)
    for m, width, start, count, rows in [(40, 7168, 17, 33, 64), (5, 1029, 2, 3, 9),
                                         (0, 16, 0, 0, 4), (300, 130, 100, 200, 300)]:
        x = rng.integers(-100, 100, (m, width)).astype(np.float32)
        tx = torch.from_numpy(x).to(getattr(torch, dtype)).cuda()
        jx = jnp.asarray(x, getattr(jnp, dtype))
        for t_fn, j_fn, s, c in ((dpx_torch.place_rows, dpx_jax.place_rows, start, count),
                                 (dpx_torch.take_rows, dpx_jax.take_rows, 0, min(count, m))):
            st = torch.tensor([s], dtype=torch.int32, device="cuda")
            ct = torch.tensor([c], dtype=torch.int32, device="cuda")
            a = t_fn(tx, st, ct, rows).float().cpu().numpy()
            b = np.asarray(j_fn(jx, jnp.int32(s), jnp.int32(c), rows, impl="triton")
                           .astype(jnp.float32))
            assert np.array_equal(a, b), (dtype, m, width, t_fn.__name__)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32"])
def test_torch_and_jax_triton_chunk_kernels_bitwise(dtype):
    import jax.numpy as jnp

    import dpx_jax
    import dpx_torch

    rng = np.random.default_rng(6)
    for firsts, lens, block, rows in [([0, 2, 2, 4], [2, 0, 2, 2], 2, 8), ([3, 40], [30, 7], 32, 64)]:
        x = rng.integers(-100, 100, (len(firsts) * block, 7168)).astype(np.float32)
        y = rng.integers(-100, 100, (rows, 7168)).astype(np.float32)
        tf = torch.tensor(firsts, dtype=torch.int32, device="cuda")
        tl = torch.tensor(lens, dtype=torch.int32, device="cuda")
        jf, jl = jnp.asarray(firsts, jnp.int32), jnp.asarray(lens, jnp.int32)
        tx = torch.from_numpy(x).to(getattr(torch, dtype)).cuda()
        ty = torch.from_numpy(y).to(getattr(torch, dtype)).cuda()
        a = dpx_torch.unpack_rows(tx, tf, tl, rows).float().cpu().numpy()
        b = np.asarray(dpx_jax.unpack_rows(jnp.asarray(x, getattr(jnp, dtype)), jf, jl, rows,
                                           impl="triton").astype(jnp.float32))
        assert np.array_equal(a, b)
        a = dpx_torch.pack_rows(ty, tf, tl, block).float().cpu().numpy()
        b = np.asarray(dpx_jax.pack_rows(jnp.asarray(y, getattr(jnp, dtype)), jf, jl, block,
                                         impl="triton").astype(jnp.float32))
        assert np.array_equal(a, b)
