"""Integer expressions over the counts, the rank's coordinates and a call's sizes.

A template's row numbers are the geometry built with these constructors over three
leaves: :func:`counts_leaf`, :func:`coord` and :func:`param`. Constant operands fold with
:data:`dpx.ints.INTS`. :data:`OPS` lists every op once; :mod:`dpx.values` evaluates
from it. ``//`` floors by a positive constant; comparisons give 0 or 1.
"""

from __future__ import annotations

import operator
from functools import reduce
from typing import Any, Callable, NamedTuple, Sequence

from dpx.ints import INTS

__all__ = ["add", "BINARY", "ceil_align", "ceil_div", "clip", "Coord", "coord", "counts_leaf",
           "deps_of", "DEVICE_OPS", "eq", "exclusive_cumsum", "Expr", "floordiv", "gather",
           "group_cumsum_excl", "group_sum", "index", "land", "maximum", "minimum", "mul", "OPS",
           "param", "PARAMS", "render", "repeat", "size_of", "sub", "vall", "vmax", "vsum"]

#: Leaf kinds a node depends on (:attr:`Expr.deps`, a bit set).
COUNTS, COORD, PARAM = 1, 2, 4

#: Parameters of a call, in the order :func:`dpx.values.compile_host` functions take them.
PARAMS: tuple[str, ...] = ("in_rows", "out_rows")


class Expr:
    """A node: ``size`` the vector length (``None``: scalar), ``deps`` its leaf kinds;
    :meth:`key` a structural key (nodes compare by identity)."""

    __slots__ = ("op", "args", "size", "deps", "_key")

    def __init__(self, op: str, args: tuple, size: int | None, deps: int) -> None:
        self.op, self.args, self.size, self.deps = op, args, size, deps
        self._key: tuple | None = None

    def key(self) -> tuple:
        k = self._key
        if k is None:
            k = self._key = (self.op, self.size) + tuple(
                a.key() if isinstance(a, Expr) else a for a in self.args)
        return k

    def __repr__(self) -> str:
        return f"Expr({render(self)})"

    def __str__(self) -> str:
        return render(self)


class Coord:
    """Names of the rank-coordinate leaves."""

    DP, CP, TP, RANK = "dp", "cp", "tp", "rank"


def counts_leaf(size: int) -> Expr:
    """The counts vector of ``size`` entries (``dp_size``, or ``dp*cp`` shards)."""
    return Expr("counts", (), size, COUNTS)


def coord(name: str) -> Expr:
    """This rank's coordinate ``name`` (one of :class:`Coord`)."""
    return Expr("coord", (name,), None, COORD)


def param(name: str) -> Expr:
    """A host int of the call (one of :data:`PARAMS`)."""
    if name not in PARAMS:
        raise ValueError(f"unknown parameter {name!r}: expected one of {PARAMS}")
    return Expr("param", (name,), None, PARAM)


def deps_of(v: object) -> int:
    """The leaf kinds ``v`` depends on (0: a constant)."""
    return v.deps if isinstance(v, Expr) else 0


def size_of(v: object) -> int | None:
    return v.size if isinstance(v, Expr) else len(v) if isinstance(v, tuple) else None


def _node(op: str, *args: Any, size: Any = "vec") -> Expr:
    """A new node; ``size="vec"``: the operands' common vector length."""
    if size == "vec":
        sizes = {s for s in map(size_of, args) if s is not None}
        if len(sizes) > 1:
            raise ValueError(f"vector lengths differ: {sorted(sizes)}")
        size = sizes.pop() if sizes else None
    return Expr(op, args, size, reduce(operator.or_, map(deps_of, args), 0))


def _const(*args: Any) -> bool:
    return not any(isinstance(a, Expr) for a in args)


# ---------------------------------------------------------------- constructors
def add(a: Any, b: Any) -> Any:
    if _const(a, b):
        return INTS.add(a, b)
    return a if type(b) is int and b == 0 else b if type(a) is int and a == 0 else \
        _node("add", a, b)


def sub(a: Any, b: Any) -> Any:
    if _const(a, b):
        return INTS.sub(a, b)
    return a if type(b) is int and b == 0 else _node("sub", a, b)


def mul(a: Any, b: Any) -> Any:
    if _const(a, b):
        return INTS.mul(a, b)
    for x, y in ((a, b), (b, a)):
        if type(x) is int and x in (0, 1):
            return y if x else ((0,) * y.size if y.size is not None else 0)
    return _node("mul", a, b)


def floordiv(a: Any, b: int) -> Any:
    if type(b) is not int or b <= 0:
        raise ValueError(f"floordiv needs a positive int divisor, got {b!r}")
    return INTS.floordiv(a, b) if _const(a) else a if b == 1 else _node("floordiv", a, b)


def _plain(op: str, scalar: bool = False) -> Callable[..., Any]:
    """The constructor of ``op`` that only folds constants (``scalar``: a reduction)."""
    fold = getattr(INTS, op)

    def make(*args: Any) -> Any:
        return fold(*args) if _const(*args) else \
            _node(op, *args, **({"size": None} if scalar else {}))
    make.__name__ = op
    return make


minimum, maximum = _plain("minimum"), _plain("maximum")
#: The largest entry (0 for an empty vector), the sum, 1 when every entry is nonzero.
vmax, vsum, vall = _plain("vmax", True), _plain("vsum", True), _plain("vall", True)


def eq(a: Any, b: Any) -> Any:
    """1 where ``a == b`` else 0 (a scalar compared with itself folds to 1)."""
    if _const(a, b):
        return INTS.eq(a, b)
    if size_of(a) is None and size_of(b) is None and isinstance(a, Expr) \
            and isinstance(b, Expr) and (a is b or a.key() == b.key()):
        return 1
    return _node("eq", a, b)


def land(a: Any, b: Any) -> Any:
    """Logical and of two 0/1 values."""
    if _const(a, b):
        return INTS.land(a, b)
    for x, y in ((a, b), (b, a)):
        if type(x) is int:
            return y if x else 0
    return _node("land", a, b)


def clip(a: Any, lo: int, hi: Any) -> Any:
    """``min(max(a, lo), hi)`` (elementwise on vectors)."""
    if type(hi) is not int:
        return minimum(maximum(a, lo), hi)
    return INTS.clip(a, lo, hi) if _const(a) else _node("clip", a, lo, hi, size=a.size)


def ceil_align(value: Any, multiple: int) -> Any:
    """Smallest multiple of ``multiple`` that is >= ``value`` (elementwise on vectors)."""
    return INTS.ceil_align(value, multiple) if multiple == 1 or _const(value) else \
        mul(floordiv(add(value, multiple - 1), multiple), multiple)


def ceil_div(value: Any, divisor: int) -> Any:
    return INTS.ceil_div(value, divisor) if _const(value) else \
        floordiv(add(value, divisor - 1), divisor)


def repeat(s: Any, n: int) -> Any:
    """The vector of ``n`` copies of scalar ``s``."""
    return INTS.repeat(s, n) if _const(s) else _node("repeat", s, n, size=n)


def exclusive_cumsum(v: Any) -> Any:
    """``[0, v0, v0+v1, ...]`` (same length as ``v``)."""
    return INTS.exclusive_cumsum(v) if _const(v) else _node("cumsum_excl", v)


def group_sum(v: Any, k: int) -> Any:
    """Sums of consecutive groups of ``k`` entries: the per-replica totals of a ``[dp,
    cp]`` table stored row by row."""
    return INTS.group_sum(v, k) if k == 1 or _const(v) else \
        _node("group_sum", v, k, size=v.size // k)


def group_cumsum_excl(v: Any, k: int) -> Any:
    """Exclusive cumulative sums within consecutive groups of ``k`` entries: where each CP
    shard starts inside its replica's slot."""
    if k == 1:
        return (0,) * size_of(v)
    return INTS.group_cumsum_excl(v, k) if _const(v) else _node("group_cumsum_excl", v, k)


def gather(v: Any, indices: Sequence[int]) -> Any:
    """``v[indices]`` for a static tuple of indices."""
    idx = tuple(indices)
    if _const(v):
        return INTS.gather(v, idx)
    if idx == tuple(range(v.size)):
        return v
    if v.op == "repeat":
        return repeat(v.args[0], len(idx))
    return _node("gather", v, idx, size=len(idx))


def index(v: Any, i: Any) -> Any:
    """Element ``i`` (an int or a scalar expression) of vector ``v``."""
    if type(v) is tuple and v and all(x == v[0] for x in v):
        return v[0]  # every entry is the same: the index does not matter
    if _const(v, i):
        return v[i]
    if isinstance(v, Expr) and v.op == "repeat":
        return v.args[0]
    if isinstance(v, Expr) and type(i) is int:  # push a constant index inwards
        op, args = v.op, v.args
        if op == "cumsum_excl" and i == 0:
            return 0
        if op == "gather":
            return index(args[0], args[1][i])
        if op in OPS and OPS[op].elementwise:
            return OPS[op].make(*(index(a, i) if size_of(a) is not None else a for a in args))
    return _node("index", v, i, size=None)


# ---------------------------------------------------------------- the op table
class OpSpec(NamedTuple):
    """An op: its constructor, operand positions passed as they are, whether an index
    pushes through it, how it renders, its generated code (``None``: from ``text``)."""

    make: Callable[..., Any]
    static: tuple[int, ...]
    elementwise: bool
    text: str
    code: str | None


def _infix(sym: str) -> tuple[str, None]:
    return "({0} %s {1})" % sym, None


OPS: dict[str, OpSpec] = {
    "add": OpSpec(add, (), True, *_infix("+")),
    "sub": OpSpec(sub, (), True, *_infix("-")),
    "mul": OpSpec(mul, (), True, *_infix("*")),
    "floordiv": OpSpec(floordiv, (1,), True, *_infix("//")),
    "minimum": OpSpec(minimum, (), True, "min({0}, {1})", None),
    "maximum": OpSpec(maximum, (), True, "max({0}, {1})", None),
    "eq": OpSpec(eq, (), True, *_infix("==")),
    "land": OpSpec(land, (), True, *_infix("and")),
    "clip": OpSpec(clip, (1, 2), True, "clip({0}, {1}, {2})", "I.clip({0}, {1}, {2})"),
    "vmax": OpSpec(vmax, (), False, "vmax({0})", "max({0}, default=0)"),
    "vsum": OpSpec(vsum, (), False, "vsum({0})", "sum({0})"),
    "vall": OpSpec(vall, (), False, "vall({0})", "int(all({0}))"),
    "repeat": OpSpec(repeat, (1,), False, "[{0}] * {1}", "({0},) * {1}"),
    "cumsum_excl": OpSpec(exclusive_cumsum, (), False, "cumsum_excl({0})",
                          "I.exclusive_cumsum({0})"),
    "group_sum": OpSpec(group_sum, (1,), False, "group_sum({0}, {1})", "I.group_sum({0}, {1})"),
    "group_cumsum_excl": OpSpec(group_cumsum_excl, (1,), False, "group_cumsum_excl({0}, {1})",
                                "I.group_cumsum_excl({0}, {1})"),
    "gather": OpSpec(gather, (1,), False, "{0}[{1}]", "I.gather({0}, {1})"),
    "index": OpSpec(index, (1,), False, "{0}[{1}]", "{0}[{1}]"),
}

#: The elementwise ops of two operands, evaluated by :meth:`ArrayOps.binary`.
BINARY = ("add", "sub", "mul", "floordiv", "minimum", "maximum", "eq", "land")

#: The ops a frontend's :class:`ArrayOps` evaluates on device arrays (the rest -- the
#: reductions and ``repeat`` -- only ever read host counts, and are folded on the host).
DEVICE_OPS = ("add", "sub", "mul", "floordiv", "minimum", "maximum", "eq", "land", "clip",
              "cumsum_excl", "group_sum", "group_cumsum_excl", "gather", "index")


# ---------------------------------------------------------------- rendering
def render(value: Any) -> str:
    """A short human-readable form of a value (``n`` names the counts)."""
    if not isinstance(value, Expr):
        return str(list(value)) if isinstance(value, tuple) else str(value)
    op, a = value.op, value.args
    if op == "counts":
        return "n"
    if op in ("coord", "param"):
        return a[0]
    div = a[0] if op == "mul" and isinstance(a[0], Expr) and a[0].op == "floordiv" else None
    inner = div.args[0] if div is not None else None
    if (isinstance(inner, Expr) and inner.op == "add" and type(a[1]) is int
            and div.args[1] == a[1] and inner.args[1] == a[1] - 1):
        return f"align({render(inner.args[0])}, {a[1]})"  # ceil_align(x, m)
    return OPS[op].text.format(*map(render, a))
