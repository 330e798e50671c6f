"""The row passes for JAX: the ``dpx.kernels`` Triton kernels through jax-triton on GPU, an
XLA (jnp) implementation of the same functions elsewhere.

``move_rows(src [m, *rest], src_start, dst_start, count, rows) -> [rows, *rest]``:
``out[dst_start + j] = src[src_start + j]`` for ``j < count``, zeros elsewhere (the one
kernel behind a schedule's :class:`dpx.steps.Move`); ``place_rows`` and ``take_rows`` are
its two common forms:

``place_rows(src [m, *rest], start, count, rows) -> [rows, *rest]``: ``out[start + j] =
src[j]`` for ``j < count`` (and ``j < m``), zeros elsewhere.
``take_rows(src [m, *rest], start, count, rows) -> [rows, *rest]``: ``out[j] = src[start +
j]`` for ``j < count`` (and ``start + j < m``), zeros elsewhere.

``start`` and ``count`` are Python ints or int32 scalars (traced values are fine: they are
read on the device, so new values never recompile). ``rows`` is static. Both functions are
linear and adjoint to each other; a ``custom_vjp`` uses that, so ``jax.grad`` works through
either implementation. The XLA version gathers with clipped indices and masks, so no
``dynamic_update_slice`` index clamping can move a slot.
"""

from __future__ import annotations

import enum
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from dpx.errors import DpxTypeError, DpxValueError

__all__ = [
    "Impl", "is_array", "match_vma", "move", "move_rows", "on_gpu", "pack_rows", "place_rows",
    "platform", "resolve_impl", "take_rows", "unpack_rows", "vary_like", "vary_over"
]


class Impl(enum.Enum):
    """Which implementation runs the row kernels."""

    AUTO = "auto"
    TRITON = "triton"
    XLA = "xla"

    @classmethod
    def parse(cls, value: "Impl | str") -> "Impl":
        if isinstance(value, cls):
            return value
        for m in cls:
            if isinstance(value, str) and value.lower() == m.value:
                return m
        raise DpxValueError(f"impl={value!r} must be one of 'auto', 'triton', 'xla'")


_GPU_PLATFORMS = frozenset({"gpu", "cuda", "rocm"})


def platform() -> str:
    """The platform the current program runs on: the devices of the mesh being traced
    (inside ``shard_map``, or under ``jax.sharding.use_mesh``), else JAX's default
    backend. A CPU mesh on a GPU host is ``"cpu"``."""
    mesh = jax.sharding.get_abstract_mesh()
    device = None if mesh.empty else getattr(mesh, "abstract_device", None)
    if device is not None:
        return device.platform
    return jax.default_backend()


def on_gpu() -> bool:
    return platform() in _GPU_PLATFORMS


def resolve_impl(impl: Impl | str) -> Impl:
    """``AUTO`` -> ``TRITON`` on GPU devices (see :func:`platform`) with jax-triton
    available, else ``XLA``."""
    impl = Impl.parse(impl)
    if impl is not Impl.AUTO:
        return impl
    if not on_gpu():
        return Impl.XLA
    from dpx_jax.triton_shim import jax_triton

    return Impl.TRITON if jax_triton() is not None else Impl.XLA


def _index(name: str, v) -> jax.Array:
    if isinstance(v, bool):
        raise DpxTypeError(f"{name}={v!r} must be an int or an int32 scalar")
    if isinstance(v, int):
        if v < 0 or v >= 2**31:
            raise DpxValueError(f"{name}={v} must be in [0, 2**31)")
        return jnp.int32(v)
    if not hasattr(v, "dtype") or not jnp.issubdtype(v.dtype, jnp.integer) or jnp.ndim(v) not in (0, 1) \
            or (jnp.ndim(v) == 1 and v.shape[0] != 1):
        raise DpxTypeError(f"{name} must be an int or an integer scalar array, got {v!r}")
    return jnp.reshape(v, ()).astype(jnp.int32)


# ---------------------------------------------------------------- XLA implementation
def _mask(ok: jax.Array, vals: jax.Array) -> jax.Array:
    return jnp.where(ok.reshape(ok.shape + (1,) * (vals.ndim - 1)), vals,
                     jnp.zeros((), vals.dtype))


def _move_xla(src, src_start, dst_start, count, rows: int):
    m = src.shape[0]
    if rows == 0 or m == 0:
        return jnp.zeros((rows, *src.shape[1:]), src.dtype)
    j = jnp.arange(rows, dtype=jnp.int32) - dst_start
    s = j + src_start
    ok = (j >= 0) & (j < count) & (s >= 0) & (s < m)
    return _mask(ok, jnp.take(src, jnp.clip(s, 0, m - 1), axis=0))


def _take_xla(src, start, count, rows: int):
    return _move_xla(src, start, jnp.int32(0), count, rows)


# ---------------------------------------------------------------- Triton implementation
def _triton_move(src, src_start, dst_start, count, rows: int):
    from dpx.kernels import launch
    from dpx_jax.triton_shim import triton_call

    m, rest = src.shape[0], src.shape[1:]
    width = math.prod(rest)
    if rows == 0 or width == 0:
        return jnp.zeros((rows, *rest), src.dtype)
    lt = launch.move_launch(m, rows, width, jnp.dtype(src.dtype).itemsize, src_start_ptr=True,
                            dst_start_ptr=True, count_ptr=True)
    out = triton_call(
        src.reshape(m, width), src_start.reshape(1), dst_start.reshape(1), count.reshape(1),
        0, 0, 0, m, rows, kernel=lt.kernel, out=jax.ShapeDtypeStruct((rows, width), src.dtype),
        grid=lt.grid, num_warps=lt.warps, **lt.consts)
    # triton_call's outputs are typed invariant; they vary like the inputs
    return vary_like(out.reshape(rows, *rest), src, src_start, dst_start, count)


def _vma(x) -> frozenset:
    """Mesh axes ``x`` varies over (``.vma`` on some JAX versions, ``.mat.varying`` on
    others); empty outside ``shard_map``."""
    t = jax.typeof(x)
    mat = getattr(t, "mat", None)
    if mat is not None and hasattr(mat, "varying"):
        return frozenset(mat.varying)
    return frozenset(getattr(t, "vma", ()) or ())


def match_vma(g: jax.Array, like: jax.Array) -> jax.Array:
    """A cotangent ``g`` typed like the primal ``like``: summed over the mesh axes that
    ``like`` is invariant over (each device contributed a share of its cotangent) and cast
    to vary over the axes ``like`` varies over."""
    extra = _vma(g) - _vma(like)
    if extra:
        g = jax.lax.psum(g, tuple(sorted(extra)))
    return vary_like(g, like)


def vary_over(x: jax.Array, axes: tuple[str, ...]) -> jax.Array:
    """``x`` cast to vary over every axis of ``axes`` (a no-op without ``check_vma``)."""
    missing = frozenset(axes) - _vma(x)
    if not missing:
        return x
    return jax.lax.pcast(x, tuple(sorted(missing)), to="varying")


def vary_like(x: jax.Array, *refs) -> jax.Array:
    """``x`` cast to vary over every mesh axis any of ``refs`` varies over (inside
    ``shard_map`` with ``check_vma``; a no-op elsewhere)."""
    missing = frozenset().union(*(_vma(r) for r in refs)) - _vma(x)
    if not missing:
        return x
    return jax.lax.pcast(x, tuple(sorted(missing)), to="varying")


def _run_move(impl: Impl, src, src_start, dst_start, count, rows: int):
    if impl is Impl.TRITON:
        return _triton_move(src, src_start, dst_start, count, rows)
    return _move_xla(src, src_start, dst_start, count, rows)


def _int_zero_cotangent(x):
    return np.zeros(np.shape(x), dtype=jax.dtypes.float0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _move(src, src_start, dst_start, count, rows: int, src_rows: int, impl: Impl):
    return _run_move(impl, src, src_start, dst_start, count, rows)


def _move_fwd(src, src_start, dst_start, count, rows, src_rows, impl):
    return (_run_move(impl, src, src_start, dst_start, count, rows),
            (src_start, dst_start, count, src[:0]))


def _move_bwd(rows, src_rows, impl, res, g):
    src_start, dst_start, count, like = res  # the adjoint moves the rows back
    return (match_vma(_move(g, dst_start, src_start, count, src_rows, rows, impl), like),
            _int_zero_cotangent(src_start), _int_zero_cotangent(dst_start),
            _int_zero_cotangent(count))


_move.defvjp(_move_fwd, _move_bwd)


def move(src, src_start, dst_start, count, rows: int, impl: Impl) -> jax.Array:
    """:func:`move_rows` without checks (the interpreter's; ``impl`` resolved)."""
    return _move(src, _index("src_start", src_start), _index("dst_start", dst_start),
                 _index("count", count), rows, src.shape[0], impl)


def is_array(x) -> bool:
    """Whether ``x`` is an array (a ``jax.Array``, a tracer, a NumPy array): every op's
    input rule, before its shape is read."""
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _check(name: str, src, rows) -> None:
    if not is_array(src):
        raise DpxTypeError(f"{name}: src must be an array, got {type(src).__name__}")
    if len(src.shape) < 1:
        raise DpxValueError(f"{name}: src must be an array with a row dimension")
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        raise DpxValueError(f"{name}: rows={rows!r} must be a static int >= 0")


def move_rows(src: jax.Array, src_start, dst_start, count, rows: int, *,
              impl: Impl | str = Impl.AUTO) -> jax.Array:
    """``src [m, *rest] -> [rows, *rest]``: ``out[dst_start + j] = src[src_start + j]`` for
    ``j < count``, zeros elsewhere (rows outside either buffer are never read or written).
    Differentiable: the adjoint moves the rows back."""
    _check("move_rows", src, rows)
    return move(src, src_start, dst_start, count, rows, resolve_impl(impl))


def place_rows(src: jax.Array, start, count, rows: int, *, impl: Impl | str = Impl.AUTO) -> jax.Array:
    """``src [m, *rest] -> [rows, *rest]``; see the module docstring."""
    _check("place_rows", src, rows)
    if isinstance(start, int) and isinstance(count, int) and not isinstance(count, bool) \
            and (count > src.shape[0] or start + count > rows):
        raise DpxValueError(f"place_rows: start={start}, count={count} must satisfy count <= "
                            f"src rows ({src.shape[0]}) and start + count <= rows ({rows})")
    return move(src, 0, start, count, rows, resolve_impl(impl))


def take_rows(src: jax.Array, start, count, rows: int, *, impl: Impl | str = Impl.AUTO) -> jax.Array:
    """``src [m, *rest] -> [rows, *rest]``; see the module docstring."""
    _check("take_rows", src, rows)
    if isinstance(start, int) and isinstance(count, int) and not isinstance(count, bool) \
            and (start + count > src.shape[0] or count > rows):
        raise DpxValueError(f"take_rows: start={start}, count={count} must satisfy start + "
                            f"count <= src rows ({src.shape[0]}) and count <= rows ({rows})")
    return move(src, start, 0, count, rows, resolve_impl(impl))


# ---------------------------------------------------------------- chunk tables
# ``unpack_rows(src [n*block, *rest], firsts, lens, rows) -> [rows, *rest]`` and
# ``pack_rows(src [m, *rest], firsts, lens, block) -> [n*block, *rest]`` (see
# ``dpx_torch.rows``): the same kernels on GPU, an XLA implementation elsewhere; adjoint.

def _unpack_xla(src, firsts, lens, rows: int):
    n = firsts.shape[0]
    if rows == 0 or src.shape[0] == 0 or n == 0:
        return jnp.zeros((rows, *src.shape[1:]), src.dtype)
    block = src.shape[0] // n
    i = jnp.arange(rows, dtype=jnp.int32)[:, None]
    length = jnp.minimum(lens, block)[None, :]
    hit = (i >= firsts[None, :]) & (i < firsts[None, :] + length)
    r = jnp.arange(n, dtype=jnp.int32)[None, :]
    idx = jnp.max(jnp.where(hit, r * block + i - firsts[None, :], -1), axis=1)
    ok = idx >= 0
    return _mask(ok, jnp.take(src, jnp.clip(idx, 0, src.shape[0] - 1), axis=0))


def _pack_xla(src, firsts, lens, block: int):
    n = firsts.shape[0]
    rows = n * block
    if rows == 0 or src.shape[0] == 0:
        return jnp.zeros((rows, *src.shape[1:]), src.dtype)
    i = jnp.arange(rows, dtype=jnp.int32)
    r, j = i // block, i % block
    s = firsts[r] + j
    ok = (j < lens[r]) & (s >= 0) & (s < src.shape[0])
    return _mask(ok, jnp.take(src, jnp.clip(s, 0, src.shape[0] - 1), axis=0))


def _triton_chunks(pack: bool, src, firsts, lens, block: int, rows: int):
    from dpx.kernels import launch
    from dpx_jax.triton_shim import triton_call

    m, rest = src.shape[0], src.shape[1:]
    width = math.prod(rest)
    if rows == 0 or width == 0:
        return jnp.zeros((rows, *rest), src.dtype)
    lt = launch.chunks_launch(pack, rows, width, jnp.dtype(src.dtype).itemsize)
    out = triton_call(
        src.reshape(m, width), firsts, lens, m, rows, firsts.shape[0], block,
        kernel=lt.kernel, out=jax.ShapeDtypeStruct((rows, width), src.dtype), grid=lt.grid,
        num_warps=lt.warps, **lt.consts)
    return vary_like(out.reshape(rows, *rest), src, firsts, lens)


def _run_unpack(impl: Impl, src, firsts, lens, rows: int):
    if impl is Impl.TRITON:
        block = src.shape[0] // max(firsts.shape[0], 1)
        return _triton_chunks(False, src, firsts, lens, block, rows)
    return _unpack_xla(src, firsts, lens, rows)


def _run_pack(impl: Impl, src, firsts, lens, block: int):
    if impl is Impl.TRITON:
        return _triton_chunks(True, src, firsts, lens, block, firsts.shape[0] * block)
    return _pack_xla(src, firsts, lens, block)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _unpack(src, firsts, lens, rows: int, impl: Impl):
    return _run_unpack(impl, src, firsts, lens, rows)


def _unpack_fwd(src, firsts, lens, rows, impl):
    return _run_unpack(impl, src, firsts, lens, rows), (firsts, lens, src[:0], src.shape[0])


def _unpack_bwd(rows, impl, res, g):
    firsts, lens, like, src_rows = res
    block = src_rows // max(firsts.shape[0], 1)
    return (match_vma(_pack(g, firsts, lens, block, impl), like),
            _int_zero_cotangent(firsts), _int_zero_cotangent(lens))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _pack(src, firsts, lens, block: int, impl: Impl):
    return _run_pack(impl, src, firsts, lens, block)


def _pack_fwd(src, firsts, lens, block, impl):
    return _run_pack(impl, src, firsts, lens, block), (firsts, lens, src[:0], src.shape[0])


def _pack_bwd(block, impl, res, g):
    firsts, lens, like, src_rows = res
    return (match_vma(_unpack(g, firsts, lens, src_rows, impl), like),
            _int_zero_cotangent(firsts), _int_zero_cotangent(lens))


_unpack.defvjp(_unpack_fwd, _unpack_bwd)
_pack.defvjp(_pack_fwd, _pack_bwd)


def _table(name: str, v) -> jax.Array:
    if not hasattr(v, "dtype") or not jnp.issubdtype(v.dtype, jnp.integer) or jnp.ndim(v) != 1:
        raise DpxTypeError(f"{name} must be a 1-d integer array, got {v!r}")
    return v.astype(jnp.int32)


def unpack_rows(src: jax.Array, firsts, lens, rows: int, *,
                impl: Impl | str = Impl.AUTO) -> jax.Array:
    """``src [n*block, *rest] -> [rows, *rest]``: chunk ``r`` of ``block = src rows // n``
    rows, its first ``lens[r]``, moved to rows ``firsts[r]...``; other rows 0."""
    _check("unpack_rows", src, rows)
    firsts, lens = _table("firsts", jnp.asarray(firsts)), _table("lens", jnp.asarray(lens))
    n = firsts.shape[0]
    if n == 0 or src.shape[0] % n or lens.shape[0] != n:
        raise DpxValueError(f"unpack_rows: src has {src.shape[0]} rows; it must be {n} "
                            f"chunks of equal size, one per firsts/lens entry")
    return _unpack(src, firsts, lens, rows, resolve_impl(impl))


def pack_rows(src: jax.Array, firsts, lens, block: int, *,
              impl: Impl | str = Impl.AUTO) -> jax.Array:
    """``src [m, *rest] -> [n*block, *rest]``: ``src[firsts[r] : firsts[r] + lens[r]]``
    moved to rows ``r*block...``, zeros after each chunk."""
    _check("pack_rows", src, block)
    firsts, lens = _table("firsts", jnp.asarray(firsts)), _table("lens", jnp.asarray(lens))
    if lens.shape != firsts.shape:
        raise DpxValueError("pack_rows: firsts and lens must have the same length")
    return _pack(src, firsts, lens, block, resolve_impl(impl))
