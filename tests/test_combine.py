"""The quantized combine (``reduce_scatter(..., wire=...)``, docs/semantics.md "The quantized
combine"), cheapest first: its schedules and rules, the float32 addition JAX's XLA path
writes in integers, the receive pass of every implementation (torch ops, the Triton kernel
in Triton's interpreter, XLA) against the NumPy reference on crafted edge values, the
stated error bound (holds and is reached), then whole calls on gloo worlds 1-4 and on 8
JAX CPU devices, bit for bit against the same reference (so torch = JAX)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import dpx
from dpx import wire as W
from reference import as_dtype, bits_of, combine_sum, quantize_fp4, quantize_fp8

WIRES = (("fp8", None), ("nvfp4", 0.75), ("mxfp4", None))
DTYPES = ("float32", "bfloat16", "float16")
H = 256


# ---------------------------------------------------------------- schedules and rules
@pytest.mark.parametrize("mode", ["max_len", "sum_len", "gatherv"])
def test_every_mode_combines_after_one_all_to_all(mode):
    """Every mode takes the all-to-all route: the quantize (after a pack unless the input's
    chunks are its blocks, or travel as they lie), one world all-to-all of wire rows -- of
    each chunk's rows alone where the sizes are host ints on a per-root transport, SUM_LEN
    and GATHERV -- one summing pass, then the slot; on every transport, for a known and a
    symbolic rank, with host and device counts -- but the peer transport, which quantizes
    the input once and pulls each rank's chunk (its real rows) from every rank."""
    lay = dpx.DpLayout(world_size=8, dp_size=4, cp_size=2)
    plan = dpx.plan_step([5, 0, 3, 7], lay, mode=mode)
    cap = dpx.plan_step([0] * 4, lay, mode=mode, capacity=8 if mode == "max_len" else 32)
    for p in (plan, cap):
        s = dpx.build_schedule(p, "reduce_scatter", rank=3, wire="nvfp4", transport="peer",
                               device_counts=p is cap)
        kinds = [st.kind for st in s.steps]
        assert kinds[:3] == (["check_counts"] if p is cap else []) + [
            "quantize", "reduce_scatter_v", *([] if p is cap else ["all_gather"])][:3], kinds
        assert s.is_wire("wire_send") and not s.is_wire("chunk")
    for transport, rank, p in itertools.product(
            [t for t in dpx.Transport if t is not dpx.Transport.PEER], (None, 3), (plan, cap)):
        s = dpx.build_schedule(plan if p is plan else cap, "reduce_scatter", rank=rank,
                               wire="nvfp4", transport=transport,
                               device_counts=p is cap)
        kinds = [st.kind for st in s.steps]
        start = kinds.index("quantize")
        variable = (mode != "max_len" and transport is dpx.Transport.PER_ROOT
                    and rank is not None and p is plan)
        coll = "all_to_all_v" if variable else "all_to_all"
        assert kinds[start:start + 3] == ["quantize", coll, "dequantize_sum"], kinds
        packed = [] if mode == "max_len" or variable else ["pack"]
        assert kinds[:start] == (["check_counts"] if p is cap else []) + packed, kinds
        assert "reduce_scatter" not in kinds and "all_reduce" not in kinds
        assert s.is_wire("wire_send") and s.is_wire("wire_recv") and not s.is_wire("chunk")
        assert next(st for st in s.steps if st.kind == "dequantize_sum").parts == 8


def test_the_wire_rules_name_the_op():
    lay = dpx.DpLayout(world_size=4, dp_size=2)
    plan = dpx.plan_step([3, 1], lay, mode="sum_len")
    with pytest.raises(dpx.DpxValueError, match="copy mode"):
        dpx.build_schedule(plan, "gather", rank=0, wire="fp8")
    with pytest.raises(dpx.DpxValueError, match="applies to gather and reduce_scatter"):
        dpx.build_schedule(plan, "scatter", rank=0, wire="fp8")
    assert dpx.build_schedule(plan, "reduce_scatter", rank=0, wire="fp8").steps


def test_jax_refuses_what_torch_refuses():
    """The catalogue's combine errors from dpx_jax (raised before any collective)."""
    pytest.importorskip("jax")
    import jax.numpy as jnp

    import dpx_jax

    plan = dpx.plan_step([5], dpx.DpLayout(1, 1), mode="gatherv")
    with pytest.raises(dpx.DpxValueError, match=r"H=100 must be a positive multiple of 128"):
        dpx_jax.reduce_scatter(jnp.zeros((5, 100)), plan, wire="fp8")
    with pytest.raises(dpx.DpxTypeError, match=r"global_ has dtype int32"):
        dpx_jax.reduce_scatter(jnp.zeros((5, 64), jnp.int32), plan, wire="mxfp4")
    with pytest.raises(dpx.DpxValueError, match=r"needs global_ of shape \[rows, H\]"):
        dpx_jax.reduce_scatter(jnp.zeros((5, 2, 128)), plan, wire="fp8")
    with pytest.raises(dpx.DpxValueError, match=r"needs wire_scale="):
        dpx_jax.reduce_scatter(jnp.zeros((5, 64)), plan, wire="nvfp4")


def test_jax_raises_the_catalogue_errors_it_shares():
    """docs/errors.md's rows marked dpx_jax (the gather's fp4 wires and global scale, the
    riding counts' plan, mask_pad_rows), raised by dpx_jax before any collective, with
    the catalogue's class and message."""
    pytest.importorskip("jax")
    import jax.numpy as jnp

    import dpx_jax

    lay = dpx.DpLayout(1, 1)
    copy = dpx.plan_step([5], lay, mode="gatherv")
    summed = dpx.plan_step([5], lay, mode="sum_len")
    x = jnp.zeros((5, 64))
    cases = [
        (lambda: dpx_jax.gather(x, summed, partial=True, wire="mxfp4"), dpx.DpxValueError,
         r"wire='mxfp4' needs a copy mode \(max_len or gatherv\)"),
        (lambda: dpx_jax.gather(jnp.zeros((5, 40)), copy, partial=True, wire="nvfp4",
                                wire_scale=1.0), dpx.DpxValueError,
         r"wire='nvfp4' quantizes blocks of 16 elements: H=40 must be a positive multiple"),
        (lambda: dpx_jax.gather(x, copy, partial=True, wire="nvfp4"), dpx.DpxValueError,
         r"wire='nvfp4' needs wire_scale=: the global scale g"),
        (lambda: dpx_jax.gather(x, copy, partial=True, wire="nvfp4", wire_scale=-2.0),
         dpx.DpxValueError, r"wire_scale=-2.0: nvfp4's global scale must be a positive"),
        (lambda: dpx_jax.gather(x, copy, partial=True, wire="nvfp4",
                                wire_scale=jnp.float32(1.0)), dpx.DpxTypeError,
         r"wire_scale must be a Python float"),
        (lambda: dpx_jax.gather(x, copy, partial=True, wire="mxfp4", wire_scale=1.0),
         dpx.DpxValueError, r"wire_scale applies to wire='nvfp4', not wire='mxfp4'"),
        (lambda: dpx_jax.gather_with_counts(x, copy, partial=True,
                                            n_local=jnp.zeros(1, jnp.int32)),
         dpx.DpxValueError, r"counts ride the gather of a capacity plan"),
        (lambda: dpx_jax.gather(x, copy, partial=True, wire="mxfp4", dequantize="no"),
         dpx.DpxTypeError, r"dequantize='no' must be a bool"),
        (lambda: dpx_jax.mask_pad_rows(jnp.zeros((4, 2)), copy), dpx.DpxValueError,
         r"t must be an array of plan.global_rows=5 rows"),
        (lambda: dpx_jax.mask_pad_rows(jnp.zeros((5, 2)), copy,
                                       counts=jnp.zeros(1, jnp.int32)),
         dpx.DpxValueError, r"counts= needs a capacity plan"),
    ]
    for fn, cls, pattern in cases:
        with pytest.raises(cls, match=pattern):
            fn()


def test_capacity_plans_with_device_counts_check_them_first():
    lay = dpx.DpLayout(world_size=4, dp_size=4)
    plan = dpx.plan_step([0] * 4, lay, mode="gatherv", capacity=32)
    s = dpx.build_schedule(plan, "reduce_scatter", rank=None, wire="mxfp4",
                           device_counts=True)
    assert [st.kind for st in s.steps][:2] == ["check_counts", "pack"]


def test_explain_prices_the_combine_on_the_wire():
    text = dpx.explain(dpx.plan_step([3, 0, 7, 5], dpx.DpLayout(8, 4), mode="max_len"),
                       hidden=1024, wire="fp8")
    assert "reduce_scatter(wire='fp8'): 5 steps" in text
    assert "dequantize_sum" in text


# ---------------------------------------------------------------- XLA's float32 addition
def test_xla_addition_in_integers_is_ieee_float32():
    """``add_f32_bits`` against NumPy's float32 addition (IEEE, subnormals kept) on
    subnormals, exponents near each other and far apart, cancellations, near-overflow and
    non-finite operands; a zero sum is +0.0."""
    pytest.importorskip("jax")
    import jax
    import jax.numpy as jnp

    from dpx_jax.wire import add_f32_bits

    rng = np.random.default_rng(7)
    n = 200_000
    a = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    b = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    kind = rng.integers(0, 5, n)
    keep = np.uint32(0x807FFFFF)
    b = np.where(kind == 0, b & keep, b)                                       # subnormal
    b = np.where(kind == 1, (b & keep) | (a & np.uint32(0x7F800000)), b)       # same exponent
    b = np.where(kind == 2, (a ^ np.uint32(0x80000000)) + (b & 3), b)          # cancellation
    a = np.where(kind == 3, (a & keep) | np.uint32(0x7F000000), a)             # near overflow
    b = np.where(kind == 3, (b & keep) | np.uint32(0x7F000000), b)
    a = np.where(kind == 4, a & keep, a)                                       # both subnormal
    b = np.where(kind == 4, b & keep, b)
    got = np.asarray(jax.jit(add_f32_bits)(jnp.asarray(a.view(np.int32)),
                                           jnp.asarray(b.view(np.int32)))).view(np.uint32)
    with np.errstate(all="ignore"):
        want = a.view(np.float32) + b.view(np.float32)
    nan = np.isnan(want)
    assert np.isnan(got.view(np.float32))[nan].all()
    want_bits = np.where(want == 0, np.uint32(0), want.view(np.uint32))
    bad = np.nonzero((got != want_bits) & ~nan)[0]
    assert bad.size == 0, [(hex(a[i]), hex(b[i]), hex(got[i])) for i in bad[:5]]
    assert (kind == 4).sum() > 1000 and (want[kind == 4] != 0).any()


# ---------------------------------------------------------------- the receive pass
def _sources(wire: str, parts: int, seed: int) -> list[np.ndarray]:
    """``parts`` float32 ``[8, H]`` sources: random rows, then crafted ones -- a NaN in
    source 0 only, +inf in the last source only, zeros, -0.0, a sum whose float32 result
    depends on the order, float32-subnormal blocks (mxfp4), a sum past float32's range."""
    rng = np.random.default_rng(seed)
    out = []
    for p in range(parts):
        x = (rng.standard_normal((8, H)) * np.exp2(rng.integers(-6, 7, (8, 1)))).astype(
            np.float32)
        if p == 0:
            x[1, 3] = np.nan
        if p == parts - 1:
            x[1, 40] = np.inf
        x[2] = 0.0
        x[3, :64] = -0.0
        # row 4, block 0: 1 on source 0, 2**-24 on the others (exact on mxfp4): in rank
        # order 1 + 2**-24 rounds back to 1 each time; in another order it would not
        x[4, :32] = 1.0 if p == 0 else 2.0 ** -24
        x[5, :32] = 2.0 ** -130 * (1 + (np.arange(32) % 4)) * (-1) ** p   # subnormal
        x[6, :128] = 3.0e38                                             # past float32
        out.append(x)
    return out


def _wire_bytes(x: np.ndarray, wire: str, g) -> np.ndarray:
    real = np.ones(x.shape[0], bool)
    if wire == "fp8":
        payload, scales = quantize_fp8(x, real)
        return np.concatenate([payload, scales.view(np.uint8).reshape(x.shape[0], -1)], 1)
    payload, scales = quantize_fp4(x, real, wire, g)
    return np.concatenate([payload, scales], 1)


def _impls():
    """The receive pass of every implementation this machine runs: ``name, run(src uint8
    [parts * rows, RB], parts, dtype name, wire, g) -> uint bits``."""
    import torch

    from dpx.modes import Wire
    from dpx_torch.passes import TorchPasses, TritonPasses
    from dpx_torch.shims.triton_launch import JIT

    tdt = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

    def torch_run(passes):
        def run(src, parts, dtype, wire, g):
            out = torch.empty(src.shape[0] // parts, H, dtype=tdt[dtype])
            passes.dequantize_sum(torch.from_numpy(src), out, parts, Wire(wire), g)
            return out.view(torch.int32 if dtype == "float32" else torch.int16).numpy()
        return run

    impls = [("torch ops", torch_run(TorchPasses())),
             ("triton interpreter", torch_run(TritonPasses(JIT)))]
    if torch.cuda.is_available():   # the compiled kernel
        def cuda_run(src, parts, dtype, wire, g):
            out = torch.empty(src.shape[0] // parts, H, dtype=tdt[dtype], device="cuda")
            TritonPasses().dequantize_sum(torch.from_numpy(src).cuda(), out, parts,
                                          Wire(wire), g)
            return out.cpu().view(torch.int32 if dtype == "float32" else torch.int16).numpy()
        impls.append(("triton compiled", cuda_run))
    try:
        import jax.numpy as jnp

        from dpx_jax.rows import Impl
        from dpx_jax.wire import dequantize_sum
    except ImportError:
        return impls

    def jax_run(impl):
        def run(src, parts, dtype, wire, g):
            res = np.asarray(dequantize_sum(jnp.asarray(src), parts, getattr(jnp, dtype),
                                            impl, Wire(wire), g))
            return res.view(np.int32 if dtype == "float32" else np.int16)
        return run
    impls.append(("jax xla", jax_run(Impl.XLA)))   # on the default backend (a GPU's too)
    from dpx_jax.triton_shim import jax_triton

    if __import__("conftest").jax_gpu_available() and jax_triton() is not None:
        impls.append(("jax-triton", jax_run(Impl.TRITON)))
    return impls


@pytest.mark.parametrize("wire,g", WIRES, ids=[w for w, _ in WIRES])
def test_every_receive_pass_gives_the_reference_bits(wire, g):
    impls = _impls()
    for parts, dtype in itertools.product((1, 2, 3, 8), DTYPES):
        xs = _sources(wire, parts, seed=parts)
        src = np.concatenate([_wire_bytes(x, wire, g) for x in xs])
        total = combine_sum(xs, wire, g)
        want = bits_of(as_dtype(total, dtype))
        for name, run in impls:
            got = run(src, parts, dtype, wire, g).view(want.dtype)
            bad = np.argwhere(got != want)
            assert bad.size == 0, f"{name} {wire} parts={parts} {dtype}: {bad[:4].tolist()}"
        # the definition itself (the bits above are the reference's): NaN from one
        # source; +inf from one source as its wire carries it; +0.0; rank order; no flush
        # of subnormals; a float32 sum past the range
        assert np.isnan(total[1, 3])
        inf_arrives = {"fp8": np.isnan, "nvfp4": np.isfinite, "mxfp4": np.isposinf}[wire]
        assert inf_arrives(total[1, 40]), total[1, 40]
        assert (total[2].view(np.uint32) == 0).all() and \
            (total[3, :64].view(np.uint32) == 0).all(), "a zero sum is +0.0"
        if wire == "mxfp4":
            assert (total[4, :32] == 1.0).all(), "rank order: 1 + 2**-24 + ... stays 1"
            sub = np.abs(total[5, :32])
            assert (sub < 2.0 ** -126).all() and (sub > 0).any() == (parts % 2 == 1)
        past = np.isposinf(total[6, :128])
        assert past.all() == (parts > 1 and wire != "nvfp4") and (past.any() == past.all())


@pytest.mark.gpu
@pytest.mark.parametrize("wire", ["nvfp4", "mxfp4"])
def test_compiled_receive_pass_on_every_code_and_scale(wire):
    """The compiled summing pass and dequantize against the CPU torch ops, bit for bit, on
    wire rows of random bytes: every e2m1 code in every position, every scale byte a
    quantize writes (the NaN block's included), nvfp4 at global scales across its range, 1
    to 8 sources, every output dtype."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from dpx.modes import Wire
    from dpx_torch.passes import TorchPasses, TritonPasses

    h, rows = 1024, 96
    rb = W.wire_row_bytes(h, Wire(wire))
    gen = torch.Generator().manual_seed(11)
    scales = (0.37, 2.0 ** -64, 2.0 ** 64, 537.6) if wire == "nvfp4" else (None,)
    for parts, g in itertools.product((1, 2, 3, 8), scales):
        src = torch.randint(0, 256, (parts * rows, rb), dtype=torch.uint8, generator=gen)
        if wire == "nvfp4":
            src[:, h // 2:] &= 0x7F          # e4m3 scales are positive
        src.view(parts, rows, rb)[:, 0] = 0    # a zero row in every source
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            bits = torch.int32 if dtype == torch.float32 else torch.int16
            want = torch.empty(rows, h, dtype=dtype)
            got = torch.empty(rows, h, dtype=dtype, device="cuda")
            if parts == 1:
                TorchPasses().dequantize(src, want, Wire(wire), g)
                TritonPasses().dequantize(src.cuda(), got, Wire(wire), g)
            else:
                TorchPasses().dequantize_sum(src, want, parts, Wire(wire), g)
                TritonPasses().dequantize_sum(src.cuda(), got, parts, Wire(wire), g)
            bad = (got.cpu().view(bits) != want.view(bits)).nonzero()
            assert bad.numel() == 0, (wire, parts, g, dtype, bad[:4].tolist())
            assert want.isnan().any() and (want == 0).any() and want.isfinite().any()


def _bound(xs: list[np.ndarray], wire: str, g) -> np.ndarray:
    """Per element: the sum of the sources' wire error bounds (docs/semantics.md) plus the
    float32 additions' ``gamma_(W-1) * sum |v|``, ``gamma_k = k u / (1 - k u)``, ``u =
    2**-24``."""
    from reference import wire_round_trip

    total = np.zeros(xs[0].shape)
    vabs = np.zeros(xs[0].shape)
    for x in xs:
        ax = np.abs(x.astype(np.float64))
        if wire == "fp8":
            amax = ax.reshape(x.shape[0], -1, 128).max(-1)
            scale = np.repeat(np.maximum(amax, W.EPS) / W.FP8_MAX, 128, axis=1)
            total += 2.0 ** -4 * ax + 2.0 ** -10 * scale
        else:
            bs = 16 if wire == "nvfp4" else 32
            amax = ax.reshape(x.shape[0], -1, bs).max(-1)
            if wire == "nvfp4":
                import ml_dtypes

                sb = quantize_fp4(x, np.ones(x.shape[0], bool), wire, g)[1]
                u = sb.view(ml_dtypes.float8_e4m3fn).astype(np.float64) / np.float32(g)
            else:
                u = np.exp2(np.clip(np.floor(np.log2(np.maximum(amax, 2.0 ** -149))) - 2,
                                    -127, 127))
            u = np.repeat(u, bs, axis=1)
            total += np.maximum(ax, u) / 4 + np.maximum(0, ax - 6 * u)
        vabs += np.abs(wire_round_trip(x, wire, g).astype(np.float64))
    k = (len(xs) - 1) * 2.0 ** -24
    return total + k / (1 - k) * vabs


@pytest.mark.parametrize("wire,g", WIRES, ids=[w for w, _ in WIRES])
def test_the_error_bound_holds_and_is_reached(wire, g):
    """``|sum - exact| <= sum_s e_s + gamma_(W-1) sum_s |v_s|`` before the rounding to the
    output dtype, on random rows of mixed magnitudes (no block past nvfp4's range);
    and reached within 1% where every source holds an element at a rounding tie."""
    rng = np.random.default_rng(3)
    for parts in (1, 2, 4, 8):
        xs = [(rng.standard_normal((16, H)) * np.exp2(rng.integers(-8, 4, (16, 1)))).astype(
            np.float32) for _ in range(parts)]
        exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
        err = np.abs(combine_sum(xs, wire, g).astype(np.float64) - exact)
        bound = _bound(xs, wire, g)
        assert (err <= bound * (1 + 1e-9)).all(), np.max(err / bound)
    # reached: in every source one element a quarter of its block's unit (rounds to 0 on
    # fp4: the bound's |x| / 4 exactly), or halfway between two e4m3 codes (fp8: 17 between
    # 16 and 18, where the bound's 2**-4 |x| is 1.0625 and the error 1)
    xs = []
    for _ in range(4):
        x = np.zeros((1, H), np.float32)
        if wire == "fp8":
            x[0, 0], x[0, 1] = 448.0, 17.0     # the group's scale is 1
        else:
            x[0, 0] = 6.0 / np.float32(g) if wire == "nvfp4" else 6.0   # the unit: 1 / g, 1
            x[0, 1] = x[0, 0] / 24
        xs.append(x)
    exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
    err = np.abs(combine_sum(xs, wire, g).astype(np.float64) - exact)[0, 1]
    assert err >= (0.94 if wire == "fp8" else 0.99) * _bound(xs, wire, g)[0, 1], err


# ---------------------------------------------------------------- whole calls: gloo worlds
LAYOUTS = [(1, 1), (2, 1), (2, 2), (3, 3), (4, 2), (4, 4), (4, 1, 2), (4, 2, 2)]


def _layout_id(l: tuple) -> str:
    return f"w{l[0]}dp{l[1]}" + (f"cp{l[2]}" if len(l) > 2 else "")


def _cases(dp: int, cp: int) -> list[dict]:
    """Every mode x float dtype with an idle replica; capacity plans with device counts in
    every mode; CP shard tables (one CP rank idle); the first case of each kind also runs
    the other call forms and the gradient."""
    idle = [0 if i % 2 else 3 + i for i in range(dp)]
    cases = [dict(counts=idle, mode=m, dtype=t, seed=i, forms=i == 0)
             for i, (m, t) in enumerate(itertools.product(("max_len", "gatherv", "sum_len"),
                                                          DTYPES))]
    for j, mode in enumerate(("max_len", "gatherv", "sum_len")):
        cap = 12 if mode == "max_len" else 12 * dp
        cases.append(dict(counts=[0] * dp, mode=mode, capacity=cap, dtype="bfloat16",
                          run_counts=[min(5 + i, 12) if i % 2 == 0 else 0 for i in range(dp)],
                          seed=20 + j, forms=j == 0))
    if cp > 1:
        cases += [dict(counts=[5] * dp, shards=[[5 - i] + [i] + [0] * (cp - 2)
                                                 for i in range(dp)],
                       mode=m, dtype="bfloat16", seed=30 + j, forms=j == 0)
                  for j, m in enumerate(("max_len", "gatherv"))]
    return cases


@pytest.mark.multiproc
@pytest.mark.parametrize("layout", LAYOUTS, ids=_layout_id)
def test_combine_on_gloo_worlds(gloo_worlds, layout):
    cp = layout[2] if len(layout) > 2 else 1
    cases = _cases(layout[1], cp)
    done = gloo_worlds(layout[0]).run("combine_jobs:check_combine", layout, cases,
                                      timeout=300)
    forms = sum(1 for c in cases if c["forms"])
    assert done == [2 * len(WIRES) * len(cases) + (2 * len(WIRES) + 1) * forms] * layout[0]


@pytest.mark.multiproc
@pytest.mark.parametrize("layout", [(4, 2, 2)], ids=_layout_id)
def test_combine_through_the_kernels(gloo_worlds, layout):
    """The same through the Triton kernels (Triton's interpreter on CPU tensors)."""
    cases = [c for c in _cases(layout[1], layout[2]) if c["dtype"] == "bfloat16"][:4]
    done = gloo_worlds(layout[0]).run("combine_jobs:check_combine", layout, cases,
                                      kernels=True, timeout=300)
    assert len(set(done)) == 1 and done[0] >= 2 * len(WIRES) * len(cases)


@pytest.mark.multiproc
def test_validate_names_a_wire_or_scale_that_differs(gloo_worlds):
    res = gloo_worlds(4).run("combine_jobs:check_combine_validate", (4, 2))
    for key, needle in (("wire", "reduce_scatter/mxfp4"), ("scale", "scale=2.0")):
        msgs = {r[key] for r in res}
        assert len(msgs) == 1 and needle in msgs.pop(), (key, res[0][key])
    assert all("multiple of 128" in r["width"] for r in res)
    assert all(r["after"] for r in res)


# ---------------------------------------------------------------- whole calls: JAX
def _jax_combine(plan, with_counts: bool):
    """One jitted shard_map per plan: the combine on each wire."""
    import jax
    from jax.sharding import PartitionSpec as P

    import dpx_jax
    from jax_harness import SPEC, mesh_for

    def body(x, counts):
        c = counts if with_counts else None
        return tuple(dpx_jax.reduce_scatter(x, plan, counts=c, wire=w, wire_scale=g)
                     for w, g in WIRES)

    return jax.jit(jax.shard_map(body, mesh=mesh_for(plan.layout), in_specs=(SPEC, P()),
                                 out_specs=(SPEC,) * len(WIRES)))


def _jax_plans(layout: tuple) -> list[tuple]:
    lay = dpx.DpLayout(*layout)
    dp = lay.dp_size
    idle = [0 if i % 2 else 3 + 2 * i for i in range(dp)]
    out = [(dpx.plan_step(idle, lay, mode=m), [None], t)
           for m, t in zip(("max_len", "gatherv", "sum_len"), DTYPES)]
    out.append((dpx.plan_step([0] * dp, lay, mode="gatherv", capacity=12 * dp),
                [[5 if i % 2 == 0 else 0 for i in range(dp)], [12] * dp], "bfloat16"))
    if lay.cp_size > 1:
        shards = [(n, 0) if i % 2 else (1, n - 1) for i, n in enumerate([4, 7][:dp])]
        out.append((dpx.plan_step([4, 7][:dp], lay, mode="max_len", cp_shards=shards),
                    [None], "float16"))
    return out


@pytest.mark.parametrize("layout", [(8, 4), (8, 2, 2)], ids=_layout_id)
def test_combine_on_jax_devices(layout):
    """``dpx_jax.reduce_scatter(wire=...)`` on 8 CPU devices (XLA path) equals the
    reference bit for bit: every mode, idle replicas, a capacity plan with device counts,
    CP shards, every float dtype, the edge values of the gloo jobs."""
    pytest.importorskip("jax")
    import jax.numpy as jnp

    from combine_jobs import inputs
    from jax_harness import mesh_for, shard
    from reference import ref_combine_rank

    dt = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
    import torch

    for i, (plan, runs, dtype) in enumerate(_jax_plans(layout)):
        W = plan.layout.world_size
        globs = inputs(plan, 40 + i, getattr(torch, dtype))
        f = _jax_combine(plan, runs[0] is not None)
        for run in runs:   # new device counts: the same compiled program
            counts = jnp.asarray(run if run is not None else [0] * plan.layout.dp_size,
                                 jnp.int32)
            outs = f(shard(mesh_for(plan.layout), globs, dt[dtype]), counts)
            eff = None if run is None else tuple(run)
            for (wire, g), out in zip(WIRES, outs):
                got = np.asarray(out).reshape(W, plan.max_slot_rows, H)
                for r in range(W):
                    k = plan.slot_rows[plan.layout.coords(r).attn_dp_rank]
                    want = bits_of(ref_combine_rank(globs, plan, r, wire, dtype, g, eff))
                    assert np.array_equal(got[r, :k].view(want.dtype), want[:k]), \
                        (wire, dtype, r, plan)
                    assert not got[r, k:].any(), (wire, r)
        assert f._cache_size() == 1, "new counts must not recompile"


def test_jax_combine_gradient_is_the_native_one():
    """The gradient of a quantized combine is the native reduce_scatter's (the native
    gather of the cotangent), under jit and shard_map."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    import dpx_jax
    from jax_harness import SPEC, mesh_for

    lay = dpx.DpLayout(8, 4)
    plan = dpx.plan_step([3, 0, 5, 2], lay, mode="gatherv")
    x = jnp.asarray(np.random.default_rng(0).standard_normal((8 * plan.global_rows, H)),
                    jnp.float32)
    w = jnp.asarray(np.random.default_rng(1).standard_normal((8 * plan.max_slot_rows, H)),
                    jnp.float32)

    def loss(wire):
        f = jax.shard_map(lambda v: dpx_jax.reduce_scatter(v, plan, wire=wire),
                          mesh=mesh_for(lay), in_specs=SPEC, out_specs=SPEC)
        return jax.jit(jax.grad(lambda v: (f(v) * w).sum()))

    g8, g = loss("fp8")(x), loss("native")(x)
    assert np.array_equal(np.asarray(g8), np.asarray(g)) and np.abs(np.asarray(g)).sum() > 0


def test_a_wide_summing_pass_steps_sources_in_int64():
    """``WIDE`` (buffers of 2**31 bytes or more): the summing pass's step from one source to
    the next, ``rows * ROW_BYTES``, is a 64-bit product. 600,000 nvfp4 rows of 7,168 are
    2.4 GB a source: a 32-bit product would wrap and read before the buffer. Compiled for
    sm_90 without a GPU (the PTX of the launch dpx makes)."""
    pytest.importorskip("triton")
    import re

    import kernel_digest as kd
    from dpx.kernels import launch as L
    from dpx.modes import Wire

    lt = L.dequantize_sum_launch(Wire.NVFP4, 600_000, 2, 7168, "bfloat16", compiled=True)
    rb = W.wire_row_bytes(7168, Wire.NVFP4)
    assert lt.consts["WIDE"] and 600_000 * rb >= 2 ** 31
    ptx = kd.compile_case(lt.kernel, {"src_ptr": "*u8", "out_ptr": "*bf16"}, lt.consts,
                          lt.warps).asm["ptx"]
    assert re.search(rf"m(?:ul|ad)\.wide\.s32\s+%rd\d+, %r\d+, {rb}\b", ptx), "no 64-bit step"
    assert not re.search(rf"mul\.lo\.s32\s+%r\d+, %r\d+, {rb}\b", ptx), "a 32-bit step"


@pytest.mark.parametrize("wire", ["fp8", "nvfp4", "mxfp4"])
def test_the_summing_pass_fuses_only_exact_products(wire):
    """The compiled summing pass (sm_90, no GPU needed) adds each source's values with one
    rounding each: nvfp4's value is a power of two times a block factor, an exact product,
    so it goes in as one ``fma.rn.f32`` per element and source (the same bits as the
    product's addition); fp8's and mxfp4's products can round (or overflow), so they are
    multiplied, then added by ``add.rn.f32``, never fused."""
    pytest.importorskip("triton")
    import re

    import kernel_digest as kd
    from dpx.kernels import launch as L
    from dpx.modes import Wire

    parts = 4
    lt = L.dequantize_sum_launch(Wire(wire), 512, parts, 7168, "bfloat16", compiled=True)
    ptx = kd.compile_case(lt.kernel, {"src_ptr": "*u8", "out_ptr": "*bf16"}, lt.consts,
                          lt.warps).asm["ptx"]
    fma = len(re.findall(r"\bfma\.rn\.f32\b", ptx))
    add = len(re.findall(r"\badd\.rn\.f32\b", ptx))
    per = lt.consts["BLOCK_B"] * W.block(Wire(wire)) // (32 * lt.warps) if wire != "fp8" \
        else None
    if wire == "nvfp4":
        assert add == 0 and fma == parts * per, (fma, add, per)
    else:
        assert fma == 0 and add > 0 and add % parts == 0, (fma, add)
