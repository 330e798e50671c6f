"""DP-attention gather / scatter / reduce_scatter for use inside ``jax.shard_map``.

Call these inside ``jax.shard_map(f, mesh=make_mesh(layout), in_specs=P(AXES),
out_specs=P(AXES))`` (``check_vma`` on or off). Per device (rank ``r``, replica ``d``,
attn-tp rank ``t``; ``n_d`` real rows; ``H...`` trailing dims)::

    gather(local [>= rows needed, H...], plan, partial) -> [plan.global_rows, H...]
    scatter(global_ [global_rows, H...], plan)          -> [plan.max_slot_rows, H...]
    reduce_scatter(global_ [global_rows, H...], plan)   -> [plan.max_slot_rows, H...]
    reduce_scatter(..., wire="fp8" | "nvfp4" | "mxfp4")  the quantized combine, same shapes

The first ``plan.slot_rows[d]`` rows of a scatter/reduce_scatter output equal what
``dpx_torch`` returns for replica d; every row past ``n_d`` is zero. ``plan`` is static;
``counts`` (int32 ``[dp_size]``, capacity plans only) carries the real counts of this step
as data, so new counts never recompile.

Each op runs the planner's schedule (``dpx.build_schedule`` with a symbolic rank: one
program for every device) through :mod:`dpx_jax.interpreter`. The transport follows the
mesh's devices: on GPUs a GATHERV plan moves its chunks with ``lax.ragged_all_to_all``; on
CPUs, which have no ragged collective, its schedule moves every rank's block in an equal
all-gather and unpacks the chunks in one pass (same result). Gradients: every op is a
``jax.custom_vjp`` whose backward runs the schedule of the adjoint op (``dpx.Op.adjoint``),
as ``dpx_torch`` does; a gather's copies of one value differ (:func:`gather`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from dpx import values as V
from dpx import wire as W
from dpx.errors import DpxTypeError, DpxValueError
from dpx.extents import first_copy, op_rows
from dpx.modes import Op, Transport, Wire
from dpx.plan import DpPlan, check_plan
from dpx.routes import symbolic_rank
from dpx.schedule import build_schedule, check_ride
from dpx_jax.counts import check_n_local
from dpx_jax.interpreter import JaxValues, run_schedule
from dpx_jax.mesh import DEFAULT_AXES, Axes
from dpx_jax.rows import Impl, is_array, match_vma, on_gpu, resolve_impl, vary_over
from dpx_jax.wire import split_wire

__all__ = ["gather", "gather_with_counts", "reduce_scatter", "scatter", "scatter_columns"]


@dataclass(frozen=True)
class _Spec:
    """Everything static about one call (hashable: a ``nondiff_argnum``)."""

    plan: DpPlan
    op: Op
    partial: bool
    device_counts: bool
    transport: Transport
    impl: Impl
    in_rows: int
    out_rows: int
    wire: Wire = Wire.NATIVE
    dequantize: bool = True
    axes: Axes = DEFAULT_AXES
    wire_scale: float | None = None
    #: the counts ride the gather (its ``counts`` argument is the device's own count)
    ride: bool = False

    def schedule(self):
        return build_schedule(self.plan, self.op, rank=None, partial=self.partial,
                              device_counts=self.device_counts, transport=self.transport,
                              in_rows=self.in_rows, out_rows=self.out_rows, wire=self.wire,
                              dequantize=self.dequantize, counts_ride=self.ride)

    def adjoint(self) -> "_Spec":
        """The backward's call: the adjoint op, in the native dtype (a quantized combine's
        gradient passes the quantization straight through)."""
        if self.ride:
            raise DpxValueError("gather_with_counts has no gradient; gather with counts= "
                                "(from exchange_counts) to differentiate")
        if self.wire is not Wire.NATIVE and self.op is Op.GATHER:
            raise DpxValueError(f"gather(wire='{self.wire.value}') has no gradient "
                                f"({self.wire.value} rounding); gather in the native dtype to "
                                f"differentiate")
        return _Spec(self.plan, self.op.adjoint, True, self.device_counts, self.transport,
                     self.impl, self.out_rows, self.in_rows, axes=self.axes)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _run(x: jax.Array, counts: jax.Array | None, spec: _Spec) -> jax.Array:
    # Typed as varying over the whole world: each device's output has its own cotangent,
    # which is what the adjoint schedule expects (an invariant output's cotangent would
    # arrive already summed over the devices).
    if spec.ride:   # (out, the counts that arrived), ``counts`` the device's own
        return jax.tree.map(lambda a: vary_over(a, spec.axes.world), run_schedule(
            spec.schedule(), x, None, spec.impl, spec.axes, spec.wire_scale, counts))
    return vary_over(run_schedule(spec.schedule(), x, counts, spec.impl, spec.axes,
                                  spec.wire_scale), spec.axes.world)


def _run_fwd(x, counts, spec):
    if spec.wire is not Wire.NATIVE or spec.ride:  # refused before the forward runs
        spec.adjoint()
    return _run(x, counts, spec), (counts, x[:0])


def _run_bwd(spec, res, g):
    counts, like = res
    adj = spec.adjoint()
    grad = run_schedule(adj.schedule(), vary_over(g, adj.axes.world), counts, adj.impl,
                        adj.axes)
    # copies of one value (a gather's attn-tp or CP copies): the first copy, which stands
    # for the value, takes its gradient; JAX sums the copies' cotangents wherever they
    # come from one value (a replicated weight, an input typed replicated): it counts once
    keep = first_copy(spec.plan.layout, spec.op, partial=spec.partial,
                      sharded=spec.plan.sharded, rank=symbolic_rank())
    if not isinstance(keep, int):
        grad = jnp.where(V.evaluate(keep, JaxValues(None, spec.axes)) != 0, grad,
                         jnp.zeros_like(grad))
    return (match_vma(grad, like),
            None if counts is None else np.zeros(counts.shape, jax.dtypes.float0))


_run.defvjp(_run_fwd, _run_bwd)


def _counts(plan: DpPlan, counts) -> jax.Array | None:
    """Device counts as the schedules read them (a shard table flattened row by row)."""
    if counts is None:
        return None
    if not plan.is_static:
        raise DpxValueError("counts= needs a capacity plan (plan_step(..., capacity=))")
    lay = plan.layout
    shape = (lay.dp_size, lay.cp_size) if plan.sharded else (lay.dp_size,)
    what = "shard counts" if plan.sharded else "counts"
    got_shape = getattr(counts, "shape", None)
    dtype = getattr(counts, "dtype", None)
    if got_shape != shape:
        raise DpxTypeError(f"counts must be an integer array of shape {shape} ({what} of "
                           f"this step), got shape {got_shape!r}")
    if dtype is None or not jnp.issubdtype(dtype, jnp.integer):
        raise DpxTypeError(f"counts must be an integer array ({what} of this step), got "
                           f"dtype {dtype}")
    return counts.astype(jnp.int32).reshape(-1)


def _check_rows(name: str, x, rows: int, *, exact: bool) -> None:
    if not is_array(x):
        raise DpxTypeError(f"{name} must be an array, got {type(x).__name__}")
    if len(x.shape) < 1:
        raise DpxValueError(f"{name} must be an array with a row dimension")
    if (x.shape[0] != rows) if exact else (x.shape[0] < rows):
        rule = "exactly" if exact else "at least"
        raise DpxValueError(f"{name} has {x.shape[0]} rows per device; the plan needs "
                            f"{rule} {rows}")


def _axes(axes: object) -> Axes:
    if not isinstance(axes, Axes):
        raise DpxTypeError(f"axes={axes!r} must be a dpx_jax.Axes")
    return axes


def _call(x, plan: DpPlan, op: Op, partial: bool, c: jax.Array | None, impl,
          out_rows: int, wire: Wire = Wire.NATIVE, dequantize: bool = True,
          axes: Axes = DEFAULT_AXES, wire_scale: float | None = None,
          ride: bool = False) -> jax.Array:
    if x.dtype == jnp.bool_ and (op is Op.REDUCE_SCATTER or (op is Op.GATHER and partial)):
        raise DpxTypeError(f"{'gather(partial=True)' if op is Op.GATHER else op.value} sums "
                           f"its ranks' values, and a bool array has no sum: pass it as "
                           f"an integer dtype")
    impl = resolve_impl(impl)
    axes = _axes(axes)
    axes.check(plan.layout)
    transport = Transport.RAGGED if on_gpu() else Transport.EQUAL
    spec = _Spec(plan, op, partial, c is not None, transport, impl, x.shape[0], out_rows,
                 wire, W.dequantized(wire, dequantize), axes, wire_scale, ride)
    return _run(x, c, spec)


def gather(local, plan: DpPlan, *, partial, counts: jax.Array | None = None,
           impl: Impl | str = Impl.AUTO, wire: Wire | str = Wire.NATIVE,
           dequantize: bool = True, axes: Axes = DEFAULT_AXES, wire_scale=None):
    """Per device ``local [>= rows, H...] -> [plan.global_rows, H...]`` (see module doc).

    Slot d row ``j < n_d`` holds the sum over replica d's attn-tp ranks of ``local[j]``
    (``partial``) or the one value they all hold (the routes read each rank's own block of
    it, or the first copy's whole); every other row is zero. Gradients (``reduce_scatter``
    of the cotangent): ``partial`` gives every attn-tp rank the slot's gradient (the
    adjoint of the sum); copies of one value -- the attn-tp ranks' when not ``partial``,
    the CP ranks' unless the plan shards the rows -- give it to the first copy (attn-tp
    rank 0, CP rank 0) and zeros to the others, as JAX sums the copies' cotangents where
    they come from one value (a weight replicated over the mesh, an input typed
    replicated); with ``check_vma=False`` and ``jax.grad`` inside the ``shard_map`` body,
    psum a replicated parameter's gradient over the copies' axes yourself.

    ``wire="fp8"`` / ``"nvfp4"`` / ``"mxfp4"`` (MAX_LEN / GATHERV plans, float ``[rows,
    H]``, ``H`` a multiple of 128 / 16 / 32; nvfp4 takes the global scale ``wire_scale=g``,
    a Python float): the world collective moves quantized wire rows (:mod:`dpx.wire`); the
    result is dequantized to ``local``'s dtype, or with ``dequantize=False`` is ``(payload,
    scales)``: fp8 ``(float8_e4m3fn [global_rows, H], float32 [global_rows, H/128])``, fp4
    ``(uint8 [global_rows, H/2], uint8 [global_rows, H/16 or H/32])``. Not differentiable.

    ``local`` may be any pytree of arrays: ``partial`` (and ``wire``, ``wire_scale``) is
    then a matching pytree, or one value for every leaf (one ``wire_scale`` applies to the
    nvfp4 leaves); the result has ``local``'s structure.

    ``axes`` (every op takes it) names the caller's mesh axes of the dp, cp and tp
    dimensions (:class:`dpx_jax.Axes`); other mesh axes are outside the DP-attention group.
    """
    if not is_array(local):
        leaves, tree = jax.tree.flatten(local)
        for x in leaves:
            if not is_array(x):
                raise DpxTypeError("local must be an array or a pytree of arrays; a leaf is "
                                   f"{x!r:.60} ({type(x).__name__})")
        flags = [_per_leaf(name, v, tree, len(leaves))
                 for name, v in (("partial", partial), ("wire", wire))]
        if wire_scale is None or isinstance(wire_scale, (int, float)):
            scales = [wire_scale if Wire.parse(w) is Wire.NVFP4 else None for w in flags[1]]
        else:
            scales = _per_leaf("wire_scale", wire_scale, tree, len(leaves))
        return jax.tree.unflatten(tree, [
            gather(x, plan, partial=p, counts=counts, impl=impl, wire=w, dequantize=dequantize,
                   axes=axes, wire_scale=g)
            for x, p, w, g in zip(leaves, *flags, scales)])
    if not isinstance(partial, bool):
        raise DpxTypeError(f"partial={partial!r} must be a bool")
    wire = Wire.parse(wire)
    deq = W.dequantized(wire, dequantize)
    check_plan(plan)
    g = W.check_wire_scale(wire, wire_scale)
    if wire is not Wire.NATIVE:
        W.check_wire(wire, plan.mode, tuple(local.shape), jnp.dtype(local.dtype).name)
    c = _counts(plan, counts)
    _check_rows("local", local, op_rows(plan, Op.GATHER, None, device_counts=c is not None).need,
                exact=False)
    out = _call(local, plan, Op.GATHER, partial, c, impl, plan.global_rows, wire, dequantize,
                axes, g)
    return out if deq else split_wire(out, wire)


def gather_with_counts(local: jax.Array, plan: DpPlan, *, partial: bool, n_local: jax.Array,
                       shards: bool = False, impl: Impl | str = Impl.AUTO,
                       wire: Wire | str = Wire.NATIVE, dequantize: bool = True,
                       axes: Axes = DEFAULT_AXES, wire_scale=None):
    """``gather(local, plan, counts=exchange_counts(n_local, shards=shards), ...)`` with the
    counts riding the gather: the passes before its world all-gather read only this
    device's own count ``n_local`` (int32 ``(1,)``), and the exchange's all-gather is
    issued beside the rows' (a capacity plan in MAX_LEN or GATHERV). Returns ``(result,
    counts)``: the counts ``exchange_counts`` returns (``[dp]``, or ``[dp, cp]`` with
    ``shards``). Not differentiable (docs/semantics.md, "Counts that ride the gather")."""
    if not isinstance(partial, bool):
        raise DpxTypeError(f"partial={partial!r} must be a bool")
    check_plan(plan)
    check_ride(plan, Op.GATHER, shards=shards)
    check_n_local(n_local)
    wire = Wire.parse(wire)
    deq = W.dequantized(wire, dequantize)
    g = W.check_wire_scale(wire, wire_scale)
    if wire is not Wire.NATIVE:
        W.check_wire(wire, plan.mode, tuple(local.shape), jnp.dtype(local.dtype).name)
    _check_rows("local", local, op_rows(plan, Op.GATHER, None, device_counts=True).need,
                exact=False)
    out, counts = _call(local, plan, Op.GATHER, partial, jnp.reshape(n_local, (1,)), impl,
                        plan.global_rows, wire, dequantize, axes, g, ride=True)
    if not deq:
        out = split_wire(out, wire)
    lay = plan.layout
    return out, counts.reshape(lay.dp_size, lay.cp_size) if shards else counts


def _per_leaf(name: str, value, tree, n: int) -> list:
    """One flag per leaf: ``value`` itself for every leaf, or a pytree like ``local``'s."""
    if isinstance(value, (bool, str, Wire)):
        return [value] * n
    # None is a leaf (a native leaf's wire_scale), not an empty subtree
    leaves, vtree = jax.tree.flatten(value, is_leaf=lambda v: v is None)
    if vtree != tree:
        raise DpxValueError(f"{name} must be one flag or a pytree of flags shaped like "
                            f"local ({tree}); got {vtree}")
    return leaves


def scatter(global_: jax.Array, plan: DpPlan, *, counts: jax.Array | None = None,
            impl: Impl | str = Impl.AUTO, axes: Axes = DEFAULT_AXES) -> jax.Array:
    """Per device ``global_ [global_rows, H...] -> [plan.max_slot_rows, H...]``: replica d's
    real rows of an already reduced buffer, then zeros. No collective."""
    check_plan(plan)
    c = _counts(plan, counts)
    _check_rows("global_", global_, plan.global_rows, exact=True)
    return _call(global_, plan, Op.SCATTER, True, c, impl, plan.max_slot_rows, axes=axes)


def reduce_scatter(global_: jax.Array, plan: DpPlan, *, counts: jax.Array | None = None,
                   impl: Impl | str = Impl.AUTO, axes: Axes = DEFAULT_AXES,
                   wire: Wire | str = Wire.NATIVE, wire_scale=None) -> jax.Array:
    """Per device ``global_ [global_rows, H...] -> [plan.max_slot_rows, H...]``: row
    ``j < n_d`` is the sum over every device of ``global_[off_d + j]``; other rows are 0.
    The adjoint of ``gather(partial=True)``.

    ``wire="fp8"`` / ``"nvfp4"`` / ``"mxfp4"`` (the quantized combine; every mode, float
    ``[global_rows, H]``, ``H`` a multiple of 128 / 16 / 32; nvfp4 takes ``wire_scale=g``):
    each device's rows travel on the gather's wire format and row ``j < n_d`` is the
    float32 sum over world ranks in order, from +0.0, of the dequantized rows, rounded to
    ``global_``'s dtype -- bit for bit ``dpx_torch``'s (docs/semantics.md, "The quantized
    combine"). Differentiable: the gradient is the native gather of the cotangent (the
    quantization passed straight through)."""
    check_plan(plan)
    wire = Wire.parse(wire)
    c = _counts(plan, counts)
    _check_rows("global_", global_, plan.global_rows, exact=True)
    g = W.check_wire_scale(wire, wire_scale)
    if wire is not Wire.NATIVE:
        W.check_wire(wire, plan.mode, tuple(global_.shape), jnp.dtype(global_.dtype).name,
                     "global_", Op.REDUCE_SCATTER)
    return _call(global_, plan, Op.REDUCE_SCATTER, True, c, impl, plan.max_slot_rows,
                 wire, True, axes, g)


def scatter_columns(shard: jax.Array, plan: DpPlan, *, counts: jax.Array | None = None,
                    impl: Impl | str = Impl.AUTO, axes: Axes = DEFAULT_AXES) -> jax.Array:
    """Per device ``shard [global_rows, C] -> [plan.max_slot_rows, world_size * C]``: the
    LM-head scatter. Device (world rank) ``s`` holds columns ``[s*C, (s+1)*C)`` of the
    gathered rows; every device gets its replica's rows (its CP shard's, with CP shards)
    with every column, pad rows zero -- :func:`scatter` of the all-gathered columns, in
    one ``lax.all_to_all`` (docs/semantics.md, "The LM-head scatter")."""
    check_plan(plan)
    c = _counts(plan, counts)
    _check_rows("shard", shard, plan.global_rows, exact=True)
    if len(shard.shape) != 2:
        raise DpxValueError(f"shard has shape {tuple(shard.shape)}; scatter_columns takes "
                            f"[global_rows, C] (this device's C columns)")
    return _call(shard, plan, Op.SCATTER_COLUMNS, True, c, impl, plan.max_slot_rows,
                 axes=axes)
