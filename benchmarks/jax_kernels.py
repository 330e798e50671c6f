"""The same place kernel launched from JAX (jax-triton) and from torch, against XLA's own
versions, on a GPU; all in one process and one run.

    XLA_PYTHON_CLIENT_PREALLOCATE=false python benchmarks/jax_kernels.py

Per size (``G`` global rows, one ``n = G/8``-row slot placed at offset ``3n``, hidden 7168
bf16), device time per call of:
  torch_triton : dpx_torch.place_rows (CUDA events, back-to-back calls)
  jax_triton   : dpx_jax.place_rows(impl="triton"), K calls inside one jitted fori_loop
  jax_xla      : dpx_jax.place_rows(impl="xla") (gather + mask), same loop
  jax_dus      : jnp.zeros + lax.dynamic_update_slice, same loop
  jax_triton_dispatch : one jitted call per dispatch, back-to-back, one sync at the end
  *_unrolled : 20 calls unrolled in one jitted program (no loop overhead)
Ratios are against torch_triton measured in the same run. Writes jax_kernels.csv.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

import dpx_jax
from common import cuda_time_us, out_dir, print_table, write_csv
from dpx_torch import place_rows

K = 50


def _per_call_us(f, src, calls: int) -> float:
    """Wall time per call of one jitted program holding ``calls`` calls (median of 5, after
    a warm-up run that compiles it)."""
    jax.block_until_ready(f(src))
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        jax.block_until_ready(f(src))
        times.append((time.perf_counter() - t0) * 1e6 / calls)
    return float(np.median(times))


def _loop_us(make_one, src, shape) -> float:
    """Device time per call of ``make_one(src, i)`` run K times in one jitted loop; each
    iteration's whole output is the loop carry, so no part of it can be optimised away."""
    def body(i, buf):
        del buf
        return make_one(src, i)

    return _per_call_us(jax.jit(lambda s: lax.fori_loop(0, K, body, jnp.zeros(shape, s.dtype))),
                        src, K)


def _unrolled_us(make_one, src, k: int = 20) -> float:
    """Device time per call of ``k`` calls unrolled in one jitted program (every output
    returned, so none is dropped; no loop overhead)."""
    return _per_call_us(jax.jit(lambda s: tuple(make_one(s, i) for i in range(k))), src, k)


def _dispatch_us(fn, src) -> float:
    jax.block_until_ready(fn(src, 0))
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        out = None
        for i in range(K):
            out = fn(src, i)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) * 1e6 / K)
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--dp", type=int, default=8)
    args = ap.parse_args()
    H, dp = args.hidden, args.dp
    rows = []
    for name, per in (("decode", 32), ("mid", 512), ("prefill", 4096)):
        G, n = dp * per, per
        slot_t = torch.randn(n, H, device="cuda").to(torch.bfloat16)
        out_t = torch.empty(G, H, device="cuda", dtype=torch.bfloat16)
        t_torch = cuda_time_us(lambda: place_rows(slot_t, 3 * n, n, G, out=out_t))
        src = jnp.asarray(slot_t.float().cpu().numpy(), jnp.bfloat16)

        def tri(s, i):
            return dpx_jax.place_rows(s, (i % dp) * n, jnp.int32(n), G, impl="triton")

        def xla(s, i):
            return dpx_jax.place_rows(s, (i % dp) * n, jnp.int32(n), G, impl="xla")

        def dus(s, i):
            return lax.dynamic_update_slice(jnp.zeros((G, H), s.dtype), s, ((i % dp) * n, 0))

        t_tri = _loop_us(tri, src, (G, H))
        t_tri_unrolled = _unrolled_us(tri, src)
        t_dus_unrolled = _unrolled_us(dus, src)
        t_xla = _loop_us(xla, src, (G, H))
        t_dus = _loop_us(dus, src, (G, H))
        one = jax.jit(lambda s, i: dpx_jax.place_rows(s, i * 0 + 3 * n, jnp.int32(n), G,
                                                       impl="triton"))
        t_disp = _dispatch_us(one, src)
        a = np.asarray(one(src, 0).astype(jnp.float32))
        b = out_t.float().cpu().numpy()
        assert np.array_equal(a, b), "jax-triton and torch-launched kernels disagree"
        rows.append(dict(name=name, global_rows=G, MiB=round(G * H * 2 / 2**20, 1),
                         torch_triton_us=t_torch, jax_triton_us=t_tri,
                         jax_triton_unrolled_us=t_tri_unrolled,
                         jax_dus_unrolled_us=t_dus_unrolled,
                         jax_triton_unrolled_vs_torch=t_tri_unrolled / t_torch,
                         jax_xla_us=t_xla,
                         jax_dus_us=t_dus, jax_triton_dispatch_us=t_disp,
                         jax_triton_vs_torch=t_tri / t_torch, jax_xla_vs_torch=t_xla / t_torch,
                         jax_dus_vs_torch=t_dus / t_torch))
    print(f"device: {torch.cuda.get_device_name()}  jax {jax.__version__}  torch "
          f"{torch.__version__}  hidden={H} bfloat16  K={K} calls per loop")
    print_table(rows, list(rows[0]))
    write_csv(out_dir() / "jax_kernels.csv", rows)


if __name__ == "__main__":
    main()
