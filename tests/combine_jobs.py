"""The quantized combine (``reduce_scatter(..., wire=...)``) on every rank of a gloo world
(see harness.py), bit for bit against reference.py's definition: every call form, edge
values in one source only, the gradient, and ``validate=True`` naming a wire or scale that
differs between ranks."""

from __future__ import annotations

import numpy as np
import torch

import dpx
from harness import raised
from reference import bits_of, global_inputs, ref_combine_rank
from torch_jobs import DTYPES, _plan_of, _t

#: The wires a combine job runs, with nvfp4's global scale (small enough that a block
#: holding 5000 saturates: 5000 * 0.75 / 6 > 448).
WIRES = (("fp8", None), ("nvfp4", 0.75), ("mxfp4", None))
WIDTH = 256


def with_edges(globs: list[np.ndarray]) -> list[np.ndarray]:
    """Each rank's buffer with edge values by row (every row, pad rows too): row % 7 == 1:
    a NaN on rank 0 only; 2: +inf on the last rank only; 3: zeros everywhere; 4: -0.0 in
    the first two fp4 blocks of 16 everywhere; 5: 5000 on rank 0 only (saturates nvfp4);
    6: 60000 everywhere in column 1 (the sum passes float16's range)."""
    out = []
    W = len(globs)
    for s, g in enumerate(globs):
        g = g.copy()
        rows = np.arange(g.shape[0]) % 7
        if s == 0:
            g[rows == 1, 3] = np.nan
            g[rows == 5, 0] = 5000.0
        if s == W - 1:
            g[rows == 2, 5] = np.inf
        g[rows == 3] = 0.0
        g[np.ix_(rows == 4, np.arange(32))] = -0.0
        g[rows == 6, 1] = 60000.0
        out.append(g)
    return out


def inputs(plan, seed: int, dtype: torch.dtype) -> list[np.ndarray]:
    """Every rank's ``global_`` (with :func:`with_edges`) as float32 values of ``dtype``."""
    globs = with_edges(global_inputs(seed, plan, (WIDTH,), floats=True))
    return [_t(g, dtype).float().cpu().numpy() for g in globs]


def _same_bits(name: str, got: torch.Tensor, want: np.ndarray, case) -> None:
    g = got.detach().cpu()
    g = g.view({4: torch.int32, 2: torch.int16}[g.element_size()]).numpy()
    w = bits_of(want)
    if g.shape != w.shape or not np.array_equal(g.view(w.dtype), w):
        bad = int((g.view(w.dtype) != w).sum()) if g.shape == w.shape else "shape"
        raise AssertionError(f"{name} differs bitwise for case {case}: {bad} elements")


def check_combine(ctx, layout_args, cases, *, kernels: bool = False) -> int:
    """Each case (as torch_jobs' cases, float dtypes): ``reduce_scatter(wire=...)`` on each
    wire equals the reference bit for bit -- called plainly, again (the fast path), through
    ``prepare_reduce_scatter`` and ``reduce_scatter_async`` -- and with a global_ that
    requires grad its gradient is the native reduce_scatter's. ``kernels``: through the
    Triton kernels (Triton's interpreter)."""
    layout = dpx.DpLayout(*layout_args)
    comm = ctx.kernel_comm(layout) if kernels else ctx.comm(layout)
    r = ctx.rank
    done = 0
    for case in cases:
        dtype = DTYPES[case["dtype"]]
        name = case["dtype"]
        plan, counts_t, eff = _plan_of(layout, case)
        globs = inputs(plan, case.get("seed", 0), dtype)
        x = _t(globs[r], dtype)
        for wire, g in WIRES:
            want = ref_combine_rank(globs, plan, r, wire, name, g, eff)
            kw = dict(counts=counts_t, wire=wire, wire_scale=g)
            _same_bits(f"reduce_scatter(wire={wire})", comm.reduce_scatter(x, plan, **kw),
                       want, case)
            _same_bits(f"reduce_scatter(wire={wire}) again",
                       comm.reduce_scatter(x, plan, **kw), want, case)
            done += 2
            if not case.get("forms"):
                continue
            op = comm.prepare_reduce_scatter(x, plan, **kw)
            _same_bits(f"prepare_reduce_scatter(wire={wire})", op(x, counts=counts_t), want,
                       case)
            out, work = comm.reduce_scatter_async(x, plan, key="combine", **kw)
            work.wait()
            _same_bits(f"reduce_scatter_async(wire={wire})", out, want, case)
            done += 2
        if case.get("forms"):
            done += _check_gradient(comm, plan, counts_t, x, case)
    return done


def _check_gradient(comm, plan, counts_t, x, case) -> int:
    """The gradient of a quantized combine is the native one's (the quantization passed
    straight through): both backward passes give the same bits."""
    xs = [x.detach().clone().requires_grad_() for _ in range(2)]
    outs = [comm.reduce_scatter(xs[0], plan, counts=counts_t, wire="fp8"),
            comm.reduce_scatter(xs[1], plan, counts=counts_t)]
    g = torch.linspace(-1, 1, outs[0].numel()).reshape(outs[0].shape).to(x.device, x.dtype)
    for o in outs:
        o.backward(g)
    assert torch.equal(xs[0].grad, xs[1].grad), f"combine gradient differs, case {case}"
    return 1


def check_combine_validate(ctx, layout_args) -> dict:
    """Under ``validate=True``: the last rank gives another wire, then another nvfp4 scale;
    every rank raises the same error naming them. Without validate, a rank's bad input
    (a width the wire cannot take) raises on that rank before any collective."""
    layout = dpx.DpLayout(*layout_args)
    r, W = ctx.rank, layout.world_size
    comm = ctx.comm(layout, validate=True)
    plan = dpx.plan_step([3] * layout.dp_size, layout, mode="sum_len")
    x = torch.ones(plan.global_rows, WIDTH)
    last = r == W - 1
    res = {
        "wire": raised(lambda: comm.reduce_scatter(x, plan, wire="mxfp4" if last else "fp8")),
        "scale": raised(lambda: comm.reduce_scatter(x, plan, wire="nvfp4",
                                                    wire_scale=2.0 if last else 1.0)),
        "width": raised(lambda: ctx.comm(layout).reduce_scatter(
            torch.ones(plan.global_rows, 100), plan, wire="fp8")),
    }
    # every rank agrees again: the communicator still works
    want = ref_combine_rank([x.numpy()] * W, plan, r, "fp8", "float32")
    res["after"] = bool(np.array_equal(comm.reduce_scatter(x, plan, wire="fp8").numpy(),
                                       want))
    return res
