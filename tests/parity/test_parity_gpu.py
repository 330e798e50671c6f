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
