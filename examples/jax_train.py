"""A MoE block trained with optax inside ``jit`` + ``shard_map`` through dpx_jax, on the
example's own mesh (axes "data" and "model"), against a dense single-device reference.

    python examples/jax_train.py [--steps 6]

8 simulated CPU devices (``jax_num_cpu_devices``; drop that line on GPUs): 4 DP replicas
of attn-TP 2. Each replica's attention is split by heads over "model" (a partial sum); the
layer gathers every replica's tokens (``dpx_jax.gather(partial=True)``), routes them
(top-k), runs an MoE whose every expert is split over all 8 devices, and reduce-scatters
back (``dpx_jax.reduce_scatter``); pad rows are masked out of the routing
(``mask_pad_rows``). The token counts change every step under one capacity plan, so the
training step compiles once. Prints both loss curves and ``RESULT: loss curve matches the
dense reference`` when they agree within 1e-4 (relative).
"""

from __future__ import annotations

import argparse

import jax

jax.config.update("jax_num_cpu_devices", 8)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import dpx  # noqa: E402
import dpx_jax  # noqa: E402

H, HEADS, E, TOPK, F, CAP = 128, 4, 4, 2, 16, 8
DP, TP = 4, 2
AXES = dpx_jax.Axes(dp="data", cp=None, tp="model")
WORLD = ("data", "model")
# specs written as JAX prints them (no trailing None): the updated params come back with
# these, so the second step finds the first step's compilation
SPECS = dict(wq=P(None, "model"), wk=P(None, "model"), wv=P(None, "model"),
             wo=P("model"), router=P(), w1=P(None, None, WORLD), w2=P(None, WORLD))


def init(key) -> dict:
    ks = jax.random.split(key, 7)
    n = lambda k, *s, scale: jax.random.normal(k, s, jnp.float32) * scale
    return dict(wq=n(ks[0], H, H, scale=H ** -0.5), wk=n(ks[1], H, H, scale=H ** -0.5),
                wv=n(ks[2], H, H, scale=H ** -0.5), wo=n(ks[3], H, H, scale=H ** -0.5),
                router=n(ks[4], H, E, scale=1.0), w1=n(ks[5], E, H, F * DP * TP, scale=H ** -0.5),
                w2=n(ks[6], E, F * DP * TP, H, scale=(F * DP * TP) ** -0.5))


def attention(x, p, heads: int):
    """Causal attention of one replica's rows over ``heads`` heads (the columns of the
    projections it is given); returns their share of the output projection."""
    d = H // HEADS
    n = x.shape[0]
    q, k, v = ((x @ p[w]).reshape(n, heads, d).transpose(1, 0, 2) for w in ("wq", "wk", "wv"))
    s = jnp.where(jnp.tril(jnp.ones((n, n), bool)), q @ k.transpose(0, 2, 1) / d ** 0.5, -1e9)
    return (jax.nn.softmax(s, -1) @ v).transpose(1, 0, 2).reshape(n, heads * d) @ p["wo"]


def moe(g, ids, p):
    """Top-k MoE over rows ``g`` with expert columns ``p['w1']`` / ``p['w2']`` (a partial
    sum over column slices); ids of -1 select no expert."""
    logits = g @ p["router"]
    vals, _ = jax.lax.top_k(logits, TOPK)
    wts = jax.nn.softmax(vals, -1)
    gate = jnp.sum(jax.nn.one_hot(ids, E) * wts[..., None], axis=1)   # [rows, E]
    h = jax.nn.relu(jnp.einsum("rh,ehf->erf", g, p["w1"]))
    return jnp.einsum("re,erh->rh", gate, jnp.einsum("erf,efh->erh", h, p["w2"]))


def top_ids(g, p):
    return jax.lax.top_k(g @ p["router"], TOPK)[1].astype(jnp.int32)


def make_loss(plan: dpx.DpPlan, mesh: Mesh):
    def body(p, x, tgt, counts):
        att = attention(x, p, HEADS // TP)
        g = dpx_jax.gather(att, plan, partial=True, counts=counts, axes=AXES)
        ids = dpx_jax.mask_pad_rows(top_ids(g, p), plan, counts=counts, fill=-1)
        y = dpx_jax.reduce_scatter(moe(g, ids, p), plan, counts=counts, axes=AXES)
        real = dpx_jax.local_row_mask(plan, counts=counts, axes=AXES)[:CAP, None]
        err = jnp.where(real, (y[:CAP] + x - tgt) ** 2, 0.0)
        # every "model" device holds its replica's rows: count them once
        return jax.lax.psum(jnp.sum(err) / TP, WORLD)

    f = jax.shard_map(body, mesh=mesh, in_specs=(SPECS, P("data"), P("data"), P()),
                      out_specs=P())
    return lambda p, x, tgt, counts: f(p, x, tgt, counts) / jnp.maximum(jnp.sum(counts), 1)


def dense_loss(p, xs, tgts, counts):
    """The reference: every replica's rows on one device with whole weights, the loss over
    the real rows alone (a replica's first ``counts[d]`` rows: causal attention never
    reads a later row, and the MoE treats every row alone, so the rows past a replica's
    count change nothing the loss sees). Static shapes: it compiles once for every
    step's counts."""
    g = jnp.concatenate([attention(x, p, HEADS) for x in xs])
    y = moe(g, top_ids(g, p), p)
    real = (jnp.arange(CAP)[None, :] < counts[:, None]).reshape(-1, 1)
    err = jnp.where(real, (y + xs.reshape(-1, H) - tgts.reshape(-1, H)) ** 2, 0.0)
    return jnp.sum(err) / jnp.maximum(jnp.sum(counts), 1)


def batches(steps: int):
    rng = np.random.default_rng(0)
    for s in range(steps):
        counts = [int(c) for c in rng.integers(0, CAP + 1, DP)]
        counts[s % DP] = 0  # an idle replica every step
        x = rng.standard_normal((DP, CAP, H)).astype(np.float32)
        yield counts, x, np.tanh(x[..., ::-1]).copy()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    mesh = Mesh(np.array(jax.devices()[:DP * TP]).reshape(DP, TP), WORLD)
    lay = dpx.DpLayout(DP * TP, DP)
    plan = dpx.plan_step([0] * DP, lay, mode="max_len", capacity=CAP)
    loss_fn = make_loss(plan, mesh)
    opt = optax.adam(1e-2)

    @jax.jit
    def step(p, state, x, tgt, counts):
        loss, grads = jax.value_and_grad(loss_fn)(p, x, tgt, counts)
        upd, state = opt.update(grads, state, p)
        return optax.apply_updates(p, upd), state, loss

    params = init(jax.random.key(0))
    ref = dict(params)
    params = {k: jax.device_put(v, NamedSharding(mesh, SPECS[k])) for k, v in params.items()}
    # the optimizer state on the mesh too (its step count would otherwise start on one
    # device and the second call would compile again for the new placement)
    on_mesh = lambda a: a if isinstance(a.sharding, NamedSharding) else jax.device_put(
        a, NamedSharding(mesh, P()))
    state, ref_state = jax.tree.map(on_mesh, opt.init(params)), opt.init(ref)
    dense_grad = jax.jit(jax.value_and_grad(dense_loss))
    data = NamedSharding(mesh, P("data"))
    curve, ref_curve = [], []
    for counts, x, tgt in batches(args.steps):
        params, state, loss = step(params, state, jax.device_put(x.reshape(-1, H), data),
                                   jax.device_put(tgt.reshape(-1, H), data),
                                   jnp.asarray(counts, jnp.int32))
        # the reference's pad rows are zeros where dpx's hold random values: a pad row
        # that reached a real one would show as a difference
        pad = np.arange(CAP)[None, :, None] >= np.asarray(counts)[:, None, None]
        rl, rg = dense_grad(ref, np.where(pad, 0.0, x).astype(np.float32), tgt,
                            jnp.asarray(counts, jnp.int32))
        upd, ref_state = opt.update(rg, ref_state, ref)
        ref = optax.apply_updates(ref, upd)
        curve.append(float(loss))
        ref_curve.append(float(rl))
    print("dpx_jax loss: " + " ".join(f"{v:.5f}" for v in curve))
    print("dense loss:   " + " ".join(f"{v:.5f}" for v in ref_curve))
    compiles = step._cache_size()
    print(f"training step compiled {compiles} time(s) for {args.steps} steps of new counts")
    assert compiles == 1 and dense_grad._cache_size() == 1, "new counts must not recompile"
    np.testing.assert_allclose(curve, ref_curve, rtol=1e-4)
    print("RESULT: loss curve matches the dense reference")


if __name__ == "__main__":
    main()
