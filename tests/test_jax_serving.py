"""Serving features of dpx_jax on 8 simulated CPU devices, against the NumPy reference (the
one dpx_torch is checked against, bitwise): fp8, nvfp4 and mxfp4 wire gathers (wire rows and
dequantized),
pytrees of tensors in one gather, pad-row masking, counts exchanged on the device; capacity
plans compile once for new counts."""

from __future__ import annotations

import functools

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import dpx  # noqa: E402
import dpx_jax  # noqa: E402
from jax_harness import SPEC, mesh_for, shard  # noqa: E402
from reference import (dequantize_fp4, dequantize_fp8, local_inputs,  # noqa: E402
                       quantize_fp4, quantize_fp8, real_rows, ref_gather)

DT = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
BITS = {"float32": np.int32, "bfloat16": np.int16, "float16": np.int16}
H = 256
#: The fp4 wires, with nvfp4's global scale.
FP4 = (("nvfp4", 0.75), ("mxfp4", None))


@functools.cache
def serving_fn(plan: dpx.DpPlan, partial: bool, with_counts: bool):
    """One jitted shard_map: fp8, nvfp4 and mxfp4 gathers (wire rows and dequantized; fp4
    dequantized in a pytree with the ids), a dict of three tensors in one gather, the
    masked ids, the pad mask, and the exchanged counts."""
    mesh = mesh_for(plan.layout)
    sharded = plan.sharded

    def body(x, ids, w, counts, mine):
        c = counts if with_counts else None
        out = {}
        if plan.mode is not dpx.PaddingMode.SUM_LEN:
            out["payload"], out["scales"] = dpx_jax.gather(x, plan, partial=partial, counts=c,
                                                           wire="fp8", dequantize=False)
            out["deq"] = dpx_jax.gather(x, plan, partial=partial, counts=c, wire=dpx.Wire.FP8)
            for wire, g in FP4 if partial else ():  # (compile time: partial calls only)
                out[f"{wire}_p"], out[f"{wire}_s"] = dpx_jax.gather(
                    x, plan, partial=partial, counts=c, wire=wire, wire_scale=g,
                    dequantize=False)
                # nvfp4's scale one for every leaf (MAX_LEN) or one each, None for the
                # native leaf (GATHERV)
                each = g is not None and plan.mode is dpx.PaddingMode.GATHERV
                pair = dpx_jax.gather({"h": x, "ids": ids}, plan, counts=c,
                                      partial={"h": partial, "ids": False},
                                      wire={"h": wire, "ids": "native"},
                                      wire_scale={"h": g, "ids": None} if each else g)
                out[f"{wire}_deq"], out[f"{wire}_ids"] = pair["h"], pair["ids"]
        tree = dpx_jax.gather({"h": x, "ids": ids, "w": w}, plan, counts=c,
                              partial={"h": partial, "ids": False, "w": False})
        out.update(tree)
        out["masked"] = dpx_jax.mask_pad_rows(tree["ids"], plan, counts=c, fill=-1)
        out["pad"] = dpx_jax.pad_row_mask(plan, counts=c)[None]
        out["exchanged"] = dpx_jax.exchange_counts(mine, shards=sharded).reshape(1, -1)
        return out

    f = jax.shard_map(body, mesh=mesh, in_specs=(SPEC, SPEC, SPEC, P(), SPEC),
                      out_specs=SPEC)
    return jax.jit(f)


def run_serving(plan, partial, dtype="bfloat16", seed=0, counts=None):
    lay = plan.layout
    W = lay.world_size
    eff = None
    if counts is not None:
        eff = tuple(tuple(x) for x in counts) if plan.sharded else tuple(counts)
    rows = plan.max_slot_rows
    locs = local_inputs(seed, plan, (H,), partial=partial, rows=rows, eff=eff,
                        floats=not partial)
    ids_l = local_inputs(seed + 1, plan, (8,), partial=False, rows=rows, eff=eff)
    w_l = local_inputs(seed + 2, plan, (8,), partial=False, rows=rows, eff=eff, floats=True)
    mesh = mesh_for(lay)
    table = eff if eff is not None else (plan.cp_shards if plan.sharded else plan.num_tokens)
    mine = []
    for r in range(W):
        c = lay.coords(r)
        mine.append(np.array([table[c.attn_dp_rank][c.attn_cp_rank] if plan.sharded
                              else table[c.attn_dp_rank]]))
    f = serving_fn(plan, partial, counts is not None)
    out = f(shard(mesh, locs, DT[dtype]), shard(mesh, ids_l, jnp.int32),
            shard(mesh, w_l, jnp.float32), jnp.asarray(table, jnp.int32),
            shard(mesh, mine, jnp.int32))
    real = real_rows(plan, eff)
    want_x = np.asarray(jnp.asarray(ref_gather(locs, plan, partial=partial, counts=eff),
                                    DT[dtype]).astype(jnp.float32))
    want_ids = ref_gather(ids_l, plan, partial=False, counts=eff)
    want_w = ref_gather(w_l, plan, partial=False, counts=eff)
    got = {k: np.asarray(v) for k, v in out.items()}
    for r in range(W):
        blk = {k: v.reshape(W, -1, *v.shape[1:])[r] for k, v in got.items()}
        np.testing.assert_array_equal(blk["h"].astype(np.float32), want_x)
        np.testing.assert_array_equal(blk["ids"], want_ids)
        np.testing.assert_array_equal(blk["w"], want_w)
        np.testing.assert_array_equal(blk["masked"], np.where(real[:, None], want_ids, -1))
        np.testing.assert_array_equal(blk["pad"][0], ~real)
        np.testing.assert_array_equal(blk["exchanged"].reshape(-1),
                                      np.asarray(table).reshape(-1))
        if "payload" in blk:
            payload, scales = quantize_fp8(want_x, real)
            np.testing.assert_array_equal(blk["payload"].view(np.uint8), payload)
            np.testing.assert_array_equal(blk["scales"].view(np.int32), scales.view(np.int32))
            deq = np.asarray(jnp.asarray(dequantize_fp8(payload, scales)).astype(DT[dtype]))
            np.testing.assert_array_equal(blk["deq"].view(BITS[dtype]), deq.view(BITS[dtype]))
            for wire, g in FP4 if partial else ():
                payload, scales = quantize_fp4(want_x, real, wire, g)
                np.testing.assert_array_equal(blk[f"{wire}_p"], payload)
                np.testing.assert_array_equal(blk[f"{wire}_s"], scales)
                deq = np.asarray(jnp.asarray(dequantize_fp4(payload, scales, wire, g))
                                 .astype(DT[dtype]))
                np.testing.assert_array_equal(blk[f"{wire}_deq"].view(BITS[dtype]),
                                              deq.view(BITS[dtype]))
                np.testing.assert_array_equal(blk[f"{wire}_ids"], want_ids)
    return f


@pytest.mark.parametrize("layout", [(8, 4), (8, 2, 2), (4, 1)],
                         ids=lambda l: f"w{l[0]}dp{l[1]}" + (f"cp{l[2]}" if len(l) > 2 else ""))
@pytest.mark.parametrize("mode", ["max_len", "gatherv", "sum_len"])
def test_serving_features(layout, mode):
    lay = dpx.DpLayout(*layout)
    dp = lay.dp_size
    idle = [0 if i % 2 else 3 + 2 * i for i in range(dp)]
    run_serving(dpx.plan_step(idle, lay, mode=mode), True, "bfloat16", seed=1)
    run_serving(dpx.plan_step([5] * dp, lay, mode=mode), False, "float32", seed=2)
    if lay.cp_size > 1:
        shards = [(n, 0) if i % 2 else (1, n - 1) for i, n in enumerate([4, 7][:dp])]
        run_serving(dpx.plan_step([4, 7][:dp], lay, mode=mode, cp_shards=shards), True,
                    "float16", seed=3)
    cap = 12 if mode == "max_len" else 12 * dp
    plan = dpx.plan_step([0] * dp, lay, mode=mode, capacity=cap)
    f = None
    for i, run in enumerate(([5] + [0] * (dp - 1), [min(12, 2 + i) for i in range(dp)])):
        f = run_serving(plan, i == 0, "bfloat16", seed=4 + i, counts=run)
    assert f._cache_size() == 1, "new counts must not recompile"


def test_fp8_rules():
    lay = dpx.DpLayout(4, 2)
    mesh = mesh_for(lay)
    x = jnp.zeros((4 * 8, 256), jnp.bfloat16)

    def call(plan, arr, **kw):
        return jax.shard_map(lambda v: dpx_jax.gather(v, plan, partial=True, **kw), mesh=mesh,
                             in_specs=SPEC, out_specs=SPEC)(arr)

    with pytest.raises(dpx.DpxValueError, match="copy mode"):
        call(dpx.plan_step([3, 1], lay, mode="sum_len"), x, wire="fp8")
    with pytest.raises(dpx.DpxValueError, match="multiple of 128"):
        call(dpx.plan_step([3, 1], lay, mode="max_len"), x[:, :100], wire="fp8")
    with pytest.raises(dpx.DpxTypeError, match="quantizes"):
        call(dpx.plan_step([3, 1], lay, mode="max_len"), x.astype(jnp.int32), wire="fp8")
    with pytest.raises(dpx.DpxValueError, match="no gradient"):
        plan = dpx.plan_step([3, 1], lay, mode="max_len")
        jax.grad(lambda v: call(plan, v, wire="fp8").astype(jnp.float32).sum())(x)


@pytest.mark.parametrize("layout_args", [(8, 4), (8, 2, 2), (8, 1, 4)],
                         ids=lambda l: "w{}dp{}".format(*l) + (f"cp{l[2]}" if len(l) > 2 else ""))
def test_each_device_knows_its_real_rows(layout_args):
    """local_count / local_row_mask inside shard_map give every device its real rows (its
    replica's count, or its CP shard), for host counts, shard tables and capacity plans'
    device counts, against the reference's rows of each rank."""
    from reference import held

    layout = dpx.DpLayout(*layout_args)
    dp, cp = layout.dp_size, layout.cp_size
    mesh = dpx_jax.make_mesh(layout)
    plans = [(dpx.plan_step([3 + 2 * d if d % 2 == 0 else 0 for d in range(dp)], layout),
              None)]
    if cp > 1:   # shards of unequal size, one CP rank idle
        plans.append((dpx.plan_step([5] * dp, layout,
                                    cp_shards=[[5 - (cp - 2)] + [1] * (cp - 2) + [0]] * dp),
                      None))
    cap = dpx.plan_step([0] * dp, layout, capacity=16)
    plans.append((cap, [1 + d for d in range(dp)]))
    for plan, dev in plans:
        counts = None if dev is None else jnp.asarray(dev, jnp.int32)

        def body(c):
            return (dpx_jax.local_count(plan, counts=c if dev is not None else None)[None],
                    dpx_jax.local_row_mask(plan, counts=c if dev is not None else None))

        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=(P(dpx_jax.AXES),
                                                                              P(dpx_jax.AXES)),
                                  check_vma=False))
        n, mask = f(jnp.zeros(dp, jnp.int32) if counts is None else counts)
        want = [held(plan, r, dev)[1] for r in range(layout.world_size)]
        assert np.asarray(n).tolist() == want, (plan, dev)
        m = np.asarray(mask).reshape(layout.world_size, plan.max_slot_rows)
        for r, k in enumerate(want):
            assert m[r, :k].all() and not m[r, k:].any()
    # a plan of another layout on this mesh: the ops' error, not another layout's rows
    other = dpx.plan_step([3, 5], dpx.DpLayout(8, 2))
    for fn in (dpx_jax.local_count, dpx_jax.local_row_mask):
        with pytest.raises(dpx.DpxValueError, match=r"spans \d devices; layout world=8 dp=2 "):
            jax.shard_map(lambda c: fn(other)[None], mesh=mesh, in_specs=P(),
                          out_specs=P(dpx_jax.AXES), check_vma=False)(jnp.zeros(2))


@functools.cache
def _fp8_fn(plan: dpx.DpPlan, partial: bool, with_counts: bool):
    mesh = mesh_for(plan.layout)

    def body(x, counts):
        c = counts if with_counts else None
        p, s = dpx_jax.gather(x, plan, partial=partial, counts=c, wire="fp8",
                              dequantize=False)
        return p, s, dpx_jax.gather(x, plan, partial=partial, counts=c, wire="fp8")

    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(SPEC, P()), out_specs=SPEC))


@pytest.mark.parametrize("layout", [(8, 4), (8, 2, 2)],
                         ids=lambda l: f"w{l[0]}dp{l[1]}" + (f"cp{l[2]}" if len(l) > 2 else ""))
@pytest.mark.parametrize("mode", ["max_len", "gatherv"])
def test_fp8_wire_carries_nan_and_inf_by_its_rule(layout, mode):
    """The JAX fp8 gather of rows holding NaN, +-inf and huge values: bit for bit the
    format's non-finite rule (the NumPy reference dpx_torch is held to as well)."""
    lay = dpx.DpLayout(*layout)
    dp = lay.dp_size
    counts = [6 if i % 2 == 0 else 0 for i in range(dp)]
    cases = [(dpx.plan_step(counts, lay, mode=mode), True, "bfloat16", None),
             (dpx.plan_step(counts, lay, mode=mode), False, "float16", None),
             (dpx.plan_step([0] * dp, lay, mode=mode, capacity=12), True, "float32",
              counts)]
    for plan, partial, dtype, dev in cases:
        _nonfinite_case(lay, plan, partial, dtype, dev)


def _nonfinite_case(lay, plan, partial, dtype, dev) -> None:
    """One case of the test above (3e38 overflows float16 to inf on purpose)."""
    from reference import as_dtype, bits_of, with_nonfinite

    dp, W = lay.dp_size, lay.world_size
    with np.errstate(over="ignore"):
        eff = None if dev is None else tuple(dev)
        locs = with_nonfinite(local_inputs(3, plan, (H,), partial=partial,
                                           rows=plan.max_slot_rows, eff=eff), plan, eff)
        f = _fp8_fn(plan, partial, dev is not None)
        p, s, g = f(shard(mesh_for(lay), locs, DT[dtype]),
                    jnp.asarray(dev if dev is not None else [0] * dp, jnp.int32))
        want = np.asarray(jnp.asarray(ref_gather(locs, plan, partial=partial, counts=eff),
                                      DT[dtype]).astype(jnp.float32))
        payload, scales = quantize_fp8(want, real_rows(plan, eff))
        deq = bits_of(as_dtype(dequantize_fp8(payload, scales), dtype))
        p = np.asarray(p).reshape(W, -1, H)
        s = np.asarray(s).reshape(W, -1, H // 128)
        g = np.asarray(g).reshape(W, -1, H)
        for r in range(W):
            np.testing.assert_array_equal(p[r].view(np.uint8), payload)
            np.testing.assert_array_equal(s[r].view(np.int32), scales.view(np.int32))
            np.testing.assert_array_equal(g[r].view(deq.dtype), deq)
        assert np.isnan(g[0][~np.isfinite(want)].astype(np.float32)).all()


@functools.cache
def ride_fn(plan: dpx.DpPlan, partial: bool, wire: str):
    """One jitted program: gather_with_counts beside gather(counts=exchange_counts(...))."""
    sharded = plan.sharded

    def body(x, n):
        got, counts = dpx_jax.gather_with_counts(x, plan, partial=partial, n_local=n,
                                                 shards=sharded, wire=wire)
        c = dpx_jax.exchange_counts(n, shards=sharded)
        return got, dpx_jax.gather(x, plan, partial=partial, counts=c, wire=wire), \
            counts.reshape(1, -1), c.reshape(1, -1)

    return jax.jit(jax.shard_map(body, mesh=mesh_for(plan.layout), in_specs=(SPEC, SPEC),
                                 out_specs=(SPEC,) * 4))


@pytest.mark.parametrize("layout", [(8, 4), (8, 2, 2)],
                         ids=lambda l: f"w{l[0]}dp{l[1]}" + (f"cp{l[2]}" if len(l) > 2 else ""))
def test_counts_ride_the_gather(layout):
    """gather_with_counts: the rows and counts of gather(counts=exchange_counts(n_local)),
    bit for bit, for MAX_LEN and GATHERV capacity plans (CP shard tables too), partial and
    replicated, fp8; new counts do not recompile; SUM_LEN and gradients are refused."""
    lay = dpx.DpLayout(*layout)
    dp, cp, W = lay.dp_size, lay.cp_size, lay.world_size
    mesh = mesh_for(lay)
    for mode in ("max_len", "gatherv"):
        cap = 8 if mode == "max_len" else 8 * dp
        plans = [(dpx.plan_step([0] * dp, lay, mode=mode, capacity=cap), False)]
        if cp > 1:
            plans.append((dpx.plan_step([0] * dp, lay, mode=mode, capacity=cap,
                                        cp_shards=[[0] * cp] * dp), True))
        for plan, sharded in plans:
            for partial, wire in ((True, "native"), (False, "fp8")):
                f = ride_fn(plan, partial, wire)
                for run in ([5, 0, 3, 8][:dp], [1] * dp):
                    mine = []
                    for r in range(W):
                        c = lay.coords(r)
                        n = run[c.attn_dp_rank]
                        mine.append(np.array([(n + c.attn_cp_rank) % 3 if sharded else n]))
                    x = [np.random.default_rng(r).standard_normal((plan.max_slot_rows, H))
                         for r in range(W)]
                    got, want, counts, c = f(shard(mesh, x, jnp.bfloat16),
                                             shard(mesh, mine, jnp.int32))
                    assert np.array_equal(np.asarray(got).view(np.int16),
                                          np.asarray(want).view(np.int16)), (mode, sharded)
                    assert np.array_equal(np.asarray(counts), np.asarray(c))
                assert f._cache_size() == 1, "new counts must not recompile"
    sum_len = dpx.plan_step([0] * dp, lay, mode="sum_len", capacity=8 * dp)
    with pytest.raises(dpx.DpxValueError, match="max_len or gatherv"):
        dpx_jax.gather_with_counts(jnp.zeros((8, H)), sum_len, partial=True,
                                   n_local=jnp.zeros(1, jnp.int32))
    plan = dpx.plan_step([0] * dp, lay, mode="max_len", capacity=8)
    with pytest.raises(dpx.DpxValueError, match="cp_shards is None"):
        dpx_jax.gather_with_counts(jnp.zeros((8, H)), plan, partial=True,
                                   n_local=jnp.zeros(1, jnp.int32), shards=True)
    g = jax.shard_map(lambda v, n: dpx_jax.gather_with_counts(v, plan, partial=True,
                                                              n_local=n)[0],
                      mesh=mesh, in_specs=(SPEC, SPEC), out_specs=SPEC)
    with pytest.raises(dpx.DpxValueError, match="no gradient"):
        jax.grad(lambda v: g(v, jnp.ones((W,), jnp.int32)).sum())(jnp.zeros((8 * W, H)))


def test_wire_calls_of_no_rows():
    """A step with no row anywhere (every replica idle), on every wire: empty results of
    the wire's widths, wire rows and dequantized, gather and the quantized combine alike
    (as dpx_torch gives them)."""
    lay = dpx.DpLayout(1, 1)
    mesh = mesh_for(lay)
    x = jnp.zeros((0, H), jnp.bfloat16)
    wires = (("fp8", None),) + FP4
    for mode in ("max_len", "gatherv"):
        plan = dpx.plan_step([0], lay, mode=mode)

        def body(x):
            out = {}
            for wire, g in wires:
                out[wire] = dpx_jax.gather(x, plan, partial=True, wire=wire, wire_scale=g)
                out[f"{wire}_rows"] = dpx_jax.gather(x, plan, partial=True, wire=wire,
                                                     wire_scale=g, dequantize=False)
                out[f"{wire}_rs"] = dpx_jax.reduce_scatter(x, plan, wire=wire, wire_scale=g)
            return out

        got = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(SPEC,), out_specs=SPEC))(x)
        for wire, _ in wires:
            payload, scales = got[f"{wire}_rows"]
            block = {"fp8": 128, "nvfp4": 16, "mxfp4": 32}[wire]
            assert payload.shape == (0, H if wire == "fp8" else H // 2), (mode, wire)
            assert scales.shape == (0, H // block), (mode, wire)
            assert got[wire].shape == got[f"{wire}_rs"].shape == (0, H), (mode, wire)
            assert got[wire].dtype == jnp.bfloat16, (mode, wire)


def test_exchange_counts_names_a_bad_count():
    """A device's count that is not one integer: the error names its dtype and shape (or
    the value), before any collective."""
    from dpx import DpxTypeError

    for bad, said in ((jnp.ones((1,), jnp.float32), r"got shape \(1,\) dtype float32"),
                      (jnp.ones((2,), jnp.int32), r"got shape \(2,\) dtype int32"),
                      (3.0, "got 3.0")):
        with pytest.raises(DpxTypeError, match=r"n_local must be one integer per device.*"
                                               + said):
            dpx_jax.exchange_counts(bad)
