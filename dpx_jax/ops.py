"""DP-attention gather / scatter / reduce_scatter for use inside ``jax.shard_map``.

Call these inside ``jax.shard_map(f, mesh=make_mesh(layout), in_specs=P(AXES),
out_specs=P(AXES))`` (``check_vma`` on or off). Per device (rank ``r``, replica ``d``,
attn-tp rank ``t``; ``n_d`` real rows; ``H...`` trailing dims)::

    gather(local [>= rows needed, H...], plan, partial) -> [plan.global_rows, H...]
    scatter(global_ [global_rows, H...], plan)          -> [plan.max_slot_rows, H...]
    reduce_scatter(global_ [global_rows, H...], plan)   -> [plan.max_slot_rows, H...]

The first ``plan.slot_rows[d]`` rows of a scatter/reduce_scatter output equal what
``dpx_torch`` returns for replica d; every row past ``n_d`` is zero. ``plan`` is static;
``counts`` (int32 ``[dp_size]``, capacity plans only) carries the real counts of this step
as data, so new counts never recompile.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from dpx.errors import DpxTypeError, DpxValueError
from dpx.modes import PaddingMode
from dpx.plan import DpPlan
from dpx_jax.mesh import AXES
from dpx_jax.rows import Impl, place_rows, resolve_impl, take_rows

TP = "tp"


@dataclass(frozen=True)
class _Step:
    """This device's view of one call: indices, counts and offsets as traced int32."""

    plan: DpPlan
    impl: Impl
    d: jax.Array
    t: jax.Array
    r: jax.Array
    counts: jax.Array      # [dp]
    offsets: jax.Array     # [dp]

    @property
    def n_d(self) -> jax.Array:
        return self.counts[self.d]

    @property
    def off_d(self) -> jax.Array:
        return self.offsets[self.d]

    @property
    def tp(self) -> int:
        return self.plan.layout.attn_tp_size

    def place(self, x, start, count, rows):
        return place_rows(x, start, count, rows, impl=self.impl)

    def take(self, x, start, count, rows):
        return take_rows(x, start, count, rows, impl=self.impl)

    def chunks(self) -> tuple[int, jax.Array, jax.Array]:
        """GATHERV chunking: replica d's slot is split in ``C = max_slot_rows / tp`` rows per
        attn-tp rank; rank (d, t) owns ``len`` rows from ``off_d + min(t*C, S_d)``. Returns ``C`` and
        every rank's first row and length (arrays of ``world_size``)."""
        C = self.plan.max_slot_rows // self.tp
        tp = self.tp
        aligned = (self.counts + (tp - 1)) // tp * tp
        slots = jnp.full_like(aligned, self.plan.slot_rows[0]) \
            if self.plan.mode is PaddingMode.MAX_LEN else aligned
        t = jnp.tile(jnp.arange(tp, dtype=jnp.int32), self.plan.layout.dp_size)
        d = jnp.repeat(jnp.arange(self.plan.layout.dp_size, dtype=jnp.int32), tp)
        # a chunk past the slot's end is empty and starts at that end, so chunk ends rise
        # monotonically in rank order (the chunks tile the buffer)
        firsts = self.offsets[d] + jnp.minimum(t * C, slots[d])
        lens = jnp.clip(slots[d] - t * C, 0, C)
        return C, firsts.astype(jnp.int32), lens.astype(jnp.int32)


def _step(plan: DpPlan, counts, impl) -> _Step:
    if not isinstance(plan, DpPlan):
        raise DpxTypeError(f"plan must be a dpx.DpPlan, got {type(plan).__name__}")
    if plan.layout.cp_size != 1:
        raise DpxValueError(f"dpx_jax supports cp_size=1; plan.layout has cp_size="
                            f"{plan.layout.cp_size}")
    lay = plan.layout
    if counts is None:
        c = jnp.asarray(plan.num_tokens, jnp.int32)
        o = jnp.asarray(plan.offsets, jnp.int32)
    else:
        if not plan.is_static:
            raise DpxValueError("counts= needs a capacity plan (plan_step(..., capacity=))")
        if getattr(counts, "shape", None) != (lay.dp_size,) or not jnp.issubdtype(
                counts.dtype, jnp.integer):
            raise DpxTypeError(f"counts must be an integer array of shape ({lay.dp_size},), "
                               f"got {getattr(counts, 'shape', counts)!r}")
        c = counts.astype(jnp.int32)
        if plan.dynamic_offsets:
            tp = lay.attn_tp_size
            aligned = (c + (tp - 1)) // tp * tp
            o = jnp.cumsum(aligned) - aligned
        else:
            o = jnp.asarray(plan.offsets, jnp.int32)
    return _step_from(plan, c, o, impl)


def _step_from(plan: DpPlan, counts, offsets, impl) -> _Step:
    return _Step(plan, resolve_impl(impl), lax.axis_index("dp"), lax.axis_index(TP),
                 lax.axis_index(AXES), counts, offsets)


def _check_rows(name: str, x, rows: int, *, exact: bool) -> None:
    if not hasattr(x, "shape") or len(x.shape) < 1:
        raise DpxValueError(f"{name} must be an array with a row dimension")
    if (x.shape[0] != rows) if exact else (x.shape[0] < rows):
        rule = "exactly" if exact else "at least"
        raise DpxValueError(f"{name} has {x.shape[0]} rows per device; the plan needs "
                            f"{rule} {rows}")


def _on_cpu() -> bool:
    return jax.default_backend() == "cpu"


# ---------------------------------------------------------------- gather
def gather(local: jax.Array, plan: DpPlan, *, partial: bool, counts: jax.Array | None = None,
           impl: Impl | str = Impl.AUTO) -> jax.Array:
    """Per device ``local [>= rows, H...] -> [plan.global_rows, H...]`` (see module doc).

    Slot d row ``j < n_d`` holds the sum over replica d's attn-tp ranks of ``local[j]``
    (``partial``) or attn-tp rank 0's ``local[j]``; every other row is zero. Gradients: both
    give every attn-tp rank the whole slot's gradient (``reduce_scatter`` of the cotangent):
    the adjoint of the partial sum, and the gradient of the one replicated value.
    """
    if not isinstance(partial, bool):
        raise DpxTypeError(f"partial={partial!r} must be a bool")
    s = _step(plan, counts, impl)
    need = plan.max_slot_rows if plan.is_static else max(plan.num_tokens)
    _check_rows("local", local, need, exact=False)
    if partial:
        return _gather(local, plan, True, s)
    return _gather_replicated(local, plan, s.counts, s.offsets, impl, local.shape[0])


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 4, 5))
def _gather_replicated(local, plan, counts, offsets, impl, rows):
    """Replicated gather. Its gradient treats the attn-tp copies as one replicated value:
    every attn-tp rank receives the whole slot gradient (``reduce_scatter`` of the
    cotangent), as a replicated activation's backward expects."""
    return _gather(local, plan, False, _step_from(plan, counts, offsets, impl))


def _gather_replicated_fwd(local, plan, counts, offsets, impl, rows):
    return _gather_replicated(local, plan, counts, offsets, impl, rows), (local, counts, offsets)


def _gather_replicated_bwd(plan, impl, rows, res, ct):
    # the partial gather's pullback: every attn-tp rank gets its replica's slot gradient
    local, counts, offsets = res
    s = _step_from(plan, counts, offsets, impl)
    _, pullback = jax.vjp(lambda x: _gather(x, plan, True, s), local)
    (g,) = pullback(ct)
    return (g, np.zeros(counts.shape, dtype=jax.dtypes.float0),
            np.zeros(offsets.shape, dtype=jax.dtypes.float0))


_gather_replicated.defvjp(_gather_replicated_fwd, _gather_replicated_bwd)


def _gather(local, plan: DpPlan, partial: bool, s: _Step) -> jax.Array:
    rest = local.shape[1:]
    if plan.global_rows == 0:
        return jnp.zeros((0, *rest), local.dtype)
    if plan.mode is PaddingMode.SUM_LEN:
        count = s.n_d if partial else jnp.where(s.t == 0, s.n_d, 0)
        return lax.psum(s.place(local, s.off_d, count, plan.global_rows), AXES)
    C = plan.max_slot_rows // s.tp
    chunk = _my_chunk(s, local, partial, C)
    if plan.mode is PaddingMode.MAX_LEN:
        return lax.all_gather(chunk, AXES, axis=0, tiled=True)
    return _all_gather_v(s, chunk, rest, local.dtype)


def _my_chunk(s: _Step, local, partial: bool, C: int):
    """Rows ``[t*C, (t+1)*C)`` of replica d's zero-padded slot, summed over the attn-tp
    group when ``partial``."""
    if s.tp == 1:
        return s.place(local, 0, s.n_d, C)
    if partial:
        padded = s.place(local, 0, s.n_d, C * s.tp)
        return lax.psum_scatter(padded, TP, scatter_dimension=0, tiled=True)
    start = s.t * C
    return s.take(local, start, jnp.clip(s.n_d - start, 0, C), C)


def _all_gather_v(s: _Step, chunk, rest, dtype):
    G = s.plan.global_rows
    C, firsts, lens = s.chunks()
    world = s.plan.layout.world_size
    if not _on_cpu():
        out = jnp.zeros((G, *rest), dtype)
        return lax.ragged_all_to_all(
            chunk, out, jnp.zeros((world,), jnp.int32), jnp.full((world,), lens[s.r]),
            jnp.full((world,), firsts[s.r]), lens, axis_name=AXES)
    # CPU route (ragged_all_to_all is unimplemented on XLA:CPU): gather padded chunks, then
    # pick every global row from its owner's chunk. Same result, bit for bit.
    gathered = lax.all_gather(chunk, AXES, axis=0, tiled=True)  # [world*C, H...]
    i = jnp.arange(G, dtype=jnp.int32)
    ends = firsts + lens
    owner = jnp.clip(jnp.searchsorted(ends, i, side="right"), 0, world - 1).astype(jnp.int32)
    src = owner * C + (i - firsts[owner])
    ok = (i < ends[-1]) & (i >= firsts[owner])
    vals = jnp.take(gathered, jnp.clip(src, 0, world * C - 1), axis=0)
    return jnp.where(ok.reshape((G,) + (1,) * len(rest)), vals, jnp.zeros((), dtype))


# ---------------------------------------------------------------- scatter
def scatter(global_: jax.Array, plan: DpPlan, *, counts: jax.Array | None = None,
            impl: Impl | str = Impl.AUTO) -> jax.Array:
    """Per device ``global_ [global_rows, H...] -> [plan.max_slot_rows, H...]``: replica d's
    real rows of an already reduced buffer, then zeros. No collective."""
    s = _step(plan, counts, impl)
    _check_rows("global_", global_, plan.global_rows, exact=True)
    return s.take(global_, s.off_d, s.n_d, plan.max_slot_rows)


# ---------------------------------------------------------------- reduce_scatter
def reduce_scatter(global_: jax.Array, plan: DpPlan, *, counts: jax.Array | None = None,
                   impl: Impl | str = Impl.AUTO) -> jax.Array:
    """Per device ``global_ [global_rows, H...] -> [plan.max_slot_rows, H...]``: row
    ``j < n_d`` is the sum over every device of ``global_[off_d + j]``; other rows are 0.
    The adjoint of ``gather(partial=True)``."""
    s = _step(plan, counts, impl)
    _check_rows("global_", global_, plan.global_rows, exact=True)
    return _reduce_scatter(global_, plan, s)


def _reduce_scatter(global_, plan: DpPlan, s: _Step) -> jax.Array:
    rest = global_.shape[1:]
    rows = plan.max_slot_rows
    if plan.global_rows == 0:
        return jnp.zeros((rows, *rest), global_.dtype)
    if plan.mode is PaddingMode.SUM_LEN:
        return s.take(lax.psum(global_, AXES), s.off_d, s.n_d, rows)
    if plan.mode is PaddingMode.MAX_LEN:
        mine = lax.psum_scatter(global_, AXES, scatter_dimension=0, tiled=True)
    else:
        mine = _reduce_scatter_v(s, global_, rest)
    slot = lax.all_gather(mine, TP, axis=0, tiled=True) if s.tp > 1 else mine
    return s.take(slot, 0, s.n_d, rows)


def _reduce_scatter_v(s: _Step, global_, rest):
    """This rank's GATHERV chunk summed over every device: ``[C, H...]``."""
    C, firsts, lens = s.chunks()
    world = s.plan.layout.world_size
    if not _on_cpu():
        staged = jnp.zeros((world * C, *rest), global_.dtype)
        staged = lax.ragged_all_to_all(
            global_, staged, firsts, lens, jnp.full((world,), s.r * C, jnp.int32),
            jnp.full((world,), lens[s.r]), axis_name=AXES)
        return staged.reshape(world, C, *rest).sum(axis=0).astype(global_.dtype)
    # CPU route: block j holds receiver j's chunk of my buffer (zero past its length);
    # an all_to_all hands every receiver its blocks, which it sums in rank order.
    k = jnp.arange(C, dtype=jnp.int32)
    idx = firsts[:, None] + k[None, :]
    ok = k[None, :] < lens[:, None]
    G = global_.shape[0]
    blocks = jnp.take(global_, jnp.clip(idx, 0, G - 1).reshape(-1), axis=0)
    blocks = jnp.where(ok.reshape((world * C,) + (1,) * len(rest)), blocks,
                       jnp.zeros((), global_.dtype)).reshape(world, C, *rest)
    recv = lax.all_to_all(blocks, AXES, 0, 0, tiled=False)
    return recv.sum(axis=0).astype(global_.dtype)
