"""Runs a :class:`dpx.Schedule` inside ``jax.shard_map``: one small handler per step kind.

JAX runs one program on every device, so its schedules are built for a symbolic rank
(``rank=None``): the rank's coordinates are ``lax.axis_index`` values and every row number
that depends on them, or on device counts, is a :mod:`dpx.expr` expression evaluated here
with :class:`JaxValues`. Steps are functional: each binds a new array to its destination
buffer name.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax

from jax.experimental import checkify

from dpx import expr as X
from dpx import values as V
from dpx.counts import own_entry
from dpx.errors import DpxValueError
from dpx.modes import Group
from dpx.schedule import Schedule
from dpx.steps import (IN, OUT, AllGather, AllGatherCounts, AllGatherV, AllReduce, AllToAll,
                       CheckCounts, Dequantize, DequantizeSum, JoinColumns, Move, Pack,
                       Quantize, ReduceScatter, ReduceScatterV, Ref, SplitColumns, Step,
                       Unpack, Zero)
from dpx.wire import wire_row_bytes
from dpx_jax.counts import exchange_counts
from dpx_jax.mesh import DEFAULT_AXES, Axes
from dpx_jax.rows import Impl, _pack, _unpack, move, vary_over
from dpx_jax.wire import dequantize, dequantize_sum, quantize_take

__all__ = ["group_axes", "HANDLERS", "JaxValues", "run_schedule"]



def group_axes(axes: Axes, group: Group) -> tuple[str, ...]:
    """The mesh axes of a group: the world is all of them (device order is rank order),
    the attn-tp group ``tp``'s, a replica ``cp``'s and ``tp``'s."""
    if group is Group.WORLD:
        return axes.world
    if group is Group.ATTN_TP:
        return axes.of("tp")
    return axes.of("cp") + axes.of("tp")


def _coord_axes(axes: Axes, name: str) -> tuple[str, ...]:
    return axes.world if name == X.Coord.RANK else axes.of(name)


class JaxValues(V.ArrayOps):
    """:class:`dpx.values.ArrayOps` on int32 JAX arrays inside ``shard_map``."""

    def __init__(self, counts: jax.Array | None, axes: Axes = DEFAULT_AXES) -> None:
        self._counts = counts
        self._axes = axes

    def counts(self) -> jax.Array:
        if self._counts is None:
            raise DpxValueError("this schedule reads device counts; pass counts=")
        return self._counts

    def set_counts(self, counts: jax.Array) -> None:
        self._counts = counts

    def coord(self, name: str) -> jax.Array:
        names = _coord_axes(self._axes, name)
        return lax.axis_index(names) if names else jnp.int32(0)

    def const(self, value: int | tuple) -> Any:
        return value if isinstance(value, int) else jnp.asarray(value, jnp.int32)

    def param(self, name: str) -> int:
        raise DpxValueError(f"parameter {name!r} should have been filled in")

    def eq(self, a: Any, b: Any) -> Any:
        return (a == b).astype(jnp.int32)

    def minimum(self, a: Any, b: Any) -> Any:
        return jnp.minimum(a, b)

    def maximum(self, a: Any, b: Any) -> Any:
        return jnp.maximum(a, b)

    def clip(self, a: Any, lo: int, hi: int) -> Any:
        return jnp.clip(a, lo, hi)

    def cumsum_excl(self, v: jax.Array) -> jax.Array:
        return (jnp.cumsum(v) - v).astype(jnp.int32)

    def group_sum(self, v: jax.Array, k: int) -> jax.Array:
        return jnp.sum(v.reshape(-1, k), axis=1).astype(jnp.int32)

    def group_cumsum_excl(self, v: jax.Array, k: int) -> jax.Array:
        g = v.reshape(-1, k)
        return (jnp.cumsum(g, axis=1) - g).reshape(-1).astype(jnp.int32)

    def gather(self, v: jax.Array, indices: tuple[int, ...]) -> jax.Array:
        return v[jnp.asarray(indices, jnp.int32)]

    def index(self, v: jax.Array, i: Any) -> jax.Array:
        return v[i]



class _Run:
    """One program's buffers and evaluated values."""

    def __init__(self, sched: Schedule, x: jax.Array, counts: jax.Array | None, impl: Impl,
                 axes: Axes = DEFAULT_AXES, wire_scale: float | None = None):
        self.sched, self.impl, self.axes = sched, impl, axes
        self.wire, self.wire_scale = sched.wire, wire_scale
        self.rest, self.dtype = x.shape[1:], x.dtype
        self.parts = sched.plan.layout.world_size
        if sched.is_wide(IN):  # narrow rows: the input's columns over the parts
            self.rest = (x.shape[1] // self.parts,)
        self.env: dict[str, jax.Array] = {IN: x}
        self.rows = dict(sched.scratch)
        self.rows[OUT] = sched.out_rows
        self.ops = JaxValues(counts, axes)
        self.memo: dict = {}
        #: this device's own count when the counts ride the gather (run_schedule)
        self.ride_own: jax.Array | None = None

    def value(self, v: Any) -> Any:
        return v if isinstance(v, int) else V.evaluate(v, self.ops, self.memo)

    def read(self, r: Ref) -> jax.Array:
        t = self.env[r.buf]
        if r.first == 0 and r.rows is None:
            return t
        return t[r.first:] if r.rows is None else t[r.first:r.first + r.rows]

    def write(self, r: Ref, value: jax.Array) -> None:
        if r.first == 0 and r.rows is None:
            self.env[r.buf] = value
            return
        base = self.env.get(r.buf)
        if base is None:
            base = self.zeros(self.rows[r.buf], r.buf)
        end = base.shape[0] if r.rows is None else r.first + r.rows
        self.env[r.buf] = base.at[r.first:end].set(value)

    def zeros(self, rows: int, buf: str = IN) -> jax.Array:
        if self.sched.is_wire(buf):
            return jnp.zeros((rows, wire_row_bytes(self.rest[0], self.wire)), jnp.uint8)
        if self.sched.is_wide(buf):
            return jnp.zeros((rows, self.parts * self.rest[0]), self.dtype)
        return jnp.zeros((rows, *self.rest), self.dtype)


def _check(s: CheckCounts, run: _Run) -> None:
    """The plan's rule on the device counts, as a ``checkify`` check: reported when the
    caller runs under ``checkify.checkify``, nothing otherwise (the passes stay inside their
    buffers whatever the counts)."""
    r = s.rule
    n = run.ops.counts().reshape(-1, r.group).sum(axis=1)
    c = run.ops.counts()
    checkify.debug_check(jnp.all(c >= 0), "dpx: device counts {} have a negative entry", c)
    if r.max_each is not None:
        checkify.debug_check(jnp.all(n <= r.max_each),
                             f"dpx: device counts {{}} exceed the MAX_LEN capacity "
                             f"{r.max_each} (each replica's slot)", n)
    if r.max_sum is not None:
        aligned = (jnp.maximum(n, 0) + r.align - 1) // r.align * r.align
        checkify.debug_check(jnp.sum(aligned) <= r.max_sum,
                             f"dpx: device counts {{}} aligned to {r.align} sum past the "
                             f"capacity's {r.max_sum} rows", n)


def _move(s: Move, run: _Run) -> None:
    run.write(s.dst, move(run.read(s.src), run.value(s.src_start), run.value(s.dst_start),
                          run.value(s.count), s.rows, run.impl))


def _quantize(s: Quantize, run: _Run) -> None:
    run.write(s.dst, quantize_take(run.read(s.src), run.value(s.start), run.value(s.count),
                                   s.rows, run.impl, run.wire, run.wire_scale))


def _dequantize(s: Dequantize, run: _Run) -> None:
    run.write(s.dst, dequantize(run.read(s.src), run.dtype, run.impl, run.wire,
                                run.wire_scale))


def _dequantize_sum(s: DequantizeSum, run: _Run) -> None:
    run.write(s.dst, dequantize_sum(run.read(s.src), s.parts, run.dtype, run.impl, run.wire,
                                    run.wire_scale))


def _zero(s: Zero, run: _Run) -> None:
    # keep the window, zero the rest: a move of the window onto itself
    start = run.value(s.keep_start)
    run.write(s.buf, move(run.read(s.buf), start, start, run.value(s.keep_count), s.rows,
                          run.impl))


def _table(run: _Run, v) -> jax.Array:
    return jnp.asarray(run.value(v), jnp.int32).reshape(-1)


def _pack_step(s: Pack, run: _Run) -> None:
    run.write(s.dst, _pack(run.read(s.src), _table(run, s.firsts), _table(run, s.lens),
                           s.block, run.impl))


def _unpack_step(s: Unpack, run: _Run) -> None:
    run.write(s.dst, _unpack(run.read(s.src), _table(run, s.firsts), _table(run, s.lens),
                             s.rows, run.impl))


def _join_columns(s: JoinColumns, run: _Run) -> None:
    src = run.read(s.src)
    rows, count, block = run.value(s.rows), run.value(s.count), run.value(s.block)
    w = src.shape[1]
    joined = src.reshape(s.parts, block, w)[:, :count].transpose(1, 0, 2)
    joined = joined.reshape(count, s.parts * w)
    if rows > count:
        joined = jnp.concatenate([joined, jnp.zeros((rows - count, s.parts * w), src.dtype)])
    run.write(s.dst, joined)


def _split_columns(s: SplitColumns, run: _Run) -> None:
    src = run.read(s.src)
    count, block = run.value(s.count), run.value(s.block)
    w = src.shape[1] // s.parts
    parts = src[:count].reshape(count, s.parts, w).transpose(1, 0, 2)
    if block > count:
        parts = jnp.concatenate([parts, jnp.zeros((s.parts, block - count, w), src.dtype)],
                                axis=1)
    run.write(s.dst, parts.reshape(s.parts * block, w))


def _all_to_all(s: AllToAll, run: _Run) -> None:
    x = run.read(s.src)
    if s.rows:
        x = lax.all_to_all(x, group_axes(run.axes, s.group), 0, 0, tiled=True)
    run.write(s.dst, x)


def _equal(collective, s: AllGather | ReduceScatter, run: _Run) -> None:
    """An equal all-gather / reduce-scatter over the group's mesh axes (none: the group is
    this device alone, and the rows stay as they are)."""
    x = run.read(s.src)
    names = group_axes(run.axes, s.group)
    if names and s.rows:   # (typed varying over the group: an input may be typed invariant)
        x = collective(vary_over(x, names), names)
    elif names:
        x = jnp.zeros((0, *x.shape[1:]), x.dtype)
    run.write(s.dst, x)


def _all_gather(s: AllGather, run: _Run) -> None:
    _equal(lambda x, n: lax.all_gather(x, n, axis=0, tiled=True), s, run)


def _all_gather_counts(s: AllGatherCounts, run: _Run) -> None:
    """The all-gather, and beside it every device's own count exchanged as
    :func:`dpx_jax.exchange_counts` exchanges them: the counts from here on."""
    _all_gather(s, run)
    full = exchange_counts(run.ride_own, shards=run.sched.plan.sharded, axes=run.axes)
    run.ops.set_counts(full.reshape(-1))
    run.memo.clear()


def _reduce_scatter(s: ReduceScatter, run: _Run) -> None:
    _equal(lambda x, n: lax.psum_scatter(x, n, scatter_dimension=0, tiled=True), s, run)


def _all_reduce(s: AllReduce, run: _Run) -> None:
    x = run.read(s.buf)
    names = group_axes(run.axes, s.group)
    if s.rows and names:
        # a bool buffer is summed as uint8 (one writer a row, the others zeros: exact)
        # and keeps its dtype, which psum would promote
        x = vary_over(x, names)   # (a row's writer varies; its copies' zeros may not)
        x = lax.psum(x.astype(jnp.uint8), names).astype(x.dtype) if x.dtype == jnp.bool_ \
            else lax.psum(x, names)
    run.write(s.buf, x)


def _all_gather_v(s: AllGatherV, run: _Run) -> None:
    chunk = run.read(s.src)
    firsts, lens = run.value(s.firsts), run.value(s.lens)
    names = group_axes(run.axes, s.group)
    me = lax.axis_index(names)
    world = lens.shape[0]
    out = run.zeros(s.rows, s.dst.buf)
    if s.rows:
        out = lax.ragged_all_to_all(
            chunk, out, jnp.zeros((world,), jnp.int32), jnp.full((world,), lens[me]),
            jnp.full((world,), firsts[me]), lens, axis_name=names)
    run.write(s.dst, out)


def _reduce_scatter_v(s: ReduceScatterV, run: _Run) -> None:
    x = run.read(s.src)
    firsts, lens = run.value(s.firsts), run.value(s.lens)
    names = group_axes(run.axes, s.group)
    me = lax.axis_index(names)
    world, B = lens.shape[0], s.block
    if not (s.rows and B):
        run.write(s.dst, run.zeros(B))
        return
    staged = jnp.zeros((world * B, *x.shape[1:]), x.dtype)
    staged = lax.ragged_all_to_all(
        x, staged, firsts, lens, jnp.full((world,), me * B, jnp.int32),
        jnp.full((world,), lens[me]), axis_name=names)
    run.write(s.dst, staged.reshape(world, B, *x.shape[1:]).sum(axis=0).astype(x.dtype))


#: The JAX frontend's handler of every step kind its schedules hold (the ragged and equal
#: transports: :func:`dpx.steps.kinds_for`).
HANDLERS: dict[type[Step], Callable[[Any, _Run], None]] = {
    CheckCounts: _check, Move: _move, Zero: _zero, Quantize: _quantize,
    Dequantize: _dequantize, DequantizeSum: _dequantize_sum, Pack: _pack_step,
    Unpack: _unpack_step, AllGather: _all_gather, AllGatherCounts: _all_gather_counts,
    ReduceScatter: _reduce_scatter, AllReduce: _all_reduce, AllGatherV: _all_gather_v,
    ReduceScatterV: _reduce_scatter_v, JoinColumns: _join_columns, SplitColumns: _split_columns,
    AllToAll: _all_to_all,
}


def run_schedule(sched: Schedule, x: jax.Array, counts: jax.Array | None,
                 impl: Impl, axes: Axes = DEFAULT_AXES,
                 wire_scale: float | None = None, ride_own: jax.Array | None = None):
    """``sched`` on this device's ``x`` (``"in"``); returns ``"out"``. ``axes`` names the
    mesh axes of the layout's dimensions; ``wire_scale``: nvfp4's global scale.
    ``ride_own``: this device's own count (int32 ``[1]``) when the counts ride the gather
    (``counts`` is None): returns ``("out", the counts that arrived)``."""
    if ride_own is not None:
        counts = _own_counts(sched, ride_own, axes)
    run = _Run(sched, x, counts, impl, axes, wire_scale)
    run.ride_own = ride_own
    for step in sched.steps:
        handler = HANDLERS.get(type(step))
        if handler is None:
            raise DpxValueError(f"dpx_jax cannot run a {step.kind} step (its schedules use "
                                f"the ragged or equal transports)")
        handler(step, run)
    return run.env[OUT] if ride_own is None else (run.env[OUT], run.ops.counts())


def _own_counts(sched: Schedule, n: jax.Array, axes: Axes) -> jax.Array:
    """The counts vector (flat, as schedules read it) holding only this device's own count
    (its replica's, or its CP shard's), zeros elsewhere."""
    lay, sharded = sched.plan.layout, sched.plan.sharded
    ops = JaxValues(None, axes)
    i = own_entry(ops.coord(X.Coord.DP), ops.coord(X.Coord.CP), lay.cp_size, shards=sharded)
    size = lay.dp_size * (lay.cp_size if sharded else 1)
    return jnp.zeros((size,), jnp.int32).at[i].set(n.reshape(-1)[0].astype(jnp.int32))
