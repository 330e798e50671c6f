"""Integer expressions over the per-replica counts and the rank's coordinates.

Every row number a schedule needs (a slot's first row, how many real rows a chunk holds)
is written once, in :mod:`dpx.geometry`, with the operators of this module. When the
counts are host ints and the rank is known, every operator folds at once and the result
is a plain ``int`` (or a ``tuple`` of ints for a vector). When the counts live on the
device (capacity plans: ``counts=``) or the rank is only known inside the program (JAX
``shard_map``: one program for every device), the result is an :class:`Expr` tree that a
frontend evaluates on its own arrays with :func:`evaluate` and a small table of array
operations (:class:`ArrayOps`). The arithmetic is therefore never written twice.

Leaves: :data:`COUNTS` (the int32 ``[dp_size]`` device counts) and :class:`Coord` (this
rank's ``dp`` / ``cp`` / ``tp`` coordinate or its world ``rank``). Vectors have a static
length; scalars are ints or scalar expressions. Integer semantics throughout: ``//`` is
floor division by a positive int constant.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable, Sequence, Union

#: A scalar: a host int, or an expression a frontend evaluates.
Scalar = Union[int, "Expr"]
#: A vector: a tuple of host ints, or a vector expression.
Vector = Union[tuple, "Expr"]


@dataclass(frozen=True, eq=False)
class Expr:
    """A node of an integer expression. ``size`` is the vector length (``None``: scalar).

    Nodes compare by identity (schedules are cached, so the same node objects are reused);
    :meth:`key` gives a structural key where one is needed.
    """

    op: str
    args: tuple
    size: int | None = None

    def key(self) -> tuple:
        return (self.op, self.size) + tuple(a.key() if isinstance(a, Expr) else a
                                            for a in self.args)

    # arithmetic builds (and folds) new nodes
    def __add__(self, other: Scalar) -> Scalar:
        return add(self, other)

    def __radd__(self, other: Scalar) -> Scalar:
        return add(other, self)

    def __sub__(self, other: Scalar) -> Scalar:
        return sub(self, other)

    def __rsub__(self, other: Scalar) -> Scalar:
        return sub(other, self)

    def __mul__(self, other: Scalar) -> Scalar:
        return mul(self, other)

    def __rmul__(self, other: Scalar) -> Scalar:
        return mul(other, self)

    def __floordiv__(self, other: int) -> Scalar:
        return floordiv(self, other)

    def __getitem__(self, i: Scalar) -> Scalar:
        return index(self, i)

    def __str__(self) -> str:
        return _render(self)


class Coord:
    """Names of the rank-coordinate leaves."""

    DP = "dp"
    CP = "cp"
    TP = "tp"
    RANK = "rank"


#: The device counts vector (its length is fixed by :func:`counts_leaf`).
def counts_leaf(dp_size: int) -> Expr:
    return Expr("counts", (), dp_size)


def coord(name: str) -> Expr:
    """This rank's coordinate ``name`` (one of :class:`Coord`) as a scalar leaf."""
    return Expr("coord", (name,), None)


def is_const(v: object) -> bool:
    return not isinstance(v, Expr)


def _size(v: object) -> int | None:
    if isinstance(v, Expr):
        return v.size
    if isinstance(v, tuple):
        return len(v)
    return None


def _vec_size(a: object, b: object) -> int | None:
    sa, sb = _size(a), _size(b)
    if sa is not None and sb is not None and sa != sb:
        raise ValueError(f"vector lengths differ: {sa} and {sb}")
    return sa if sa is not None else sb


def _fold(fn: Callable[[int, int], int], a: object, b: object) -> object:
    if isinstance(a, tuple) or isinstance(b, tuple):
        n = _vec_size(a, b)
        aa = a if isinstance(a, tuple) else (a,) * n
        bb = b if isinstance(b, tuple) else (b,) * n
        return tuple(fn(x, y) for x, y in zip(aa, bb))
    return fn(a, b)


def _binary(op: str, fn: Callable[[int, int], int], a: object, b: object) -> Any:
    if is_const(a) and is_const(b):
        return _fold(fn, a, b)
    return Expr(op, (a, b), _vec_size(a, b))


def _is_int(v: object, value: int) -> bool:
    return isinstance(v, int) and v == value


def add(a: Any, b: Any) -> Any:
    if _is_int(b, 0):
        return a
    if _is_int(a, 0):
        return b
    return _binary("add", operator.add, a, b)


def sub(a: Any, b: Any) -> Any:
    if _is_int(b, 0):
        return a
    return _binary("sub", operator.sub, a, b)


def mul(a: Any, b: Any) -> Any:
    for x, y in ((a, b), (b, a)):
        if _is_int(x, 1):
            return y
        if _is_int(x, 0) and _size(y) is None:
            return 0
    return _binary("mul", operator.mul, a, b)


def floordiv(a: Any, b: int) -> Any:
    if not isinstance(b, int) or b <= 0:
        raise ValueError(f"floordiv needs a positive int divisor, got {b!r}")
    if b == 1:
        return a
    return _binary("floordiv", operator.floordiv, a, b)


def minimum(a: Any, b: Any) -> Any:
    return _binary("minimum", min, a, b)


def maximum(a: Any, b: Any) -> Any:
    return _binary("maximum", max, a, b)


def eq(a: Any, b: Any) -> Any:
    """1 where ``a == b`` else 0."""
    return _binary("eq", lambda x, y: int(x == y), a, b)


def clip(a: Any, lo: int, hi: int) -> Any:
    """``min(max(a, lo), hi)`` with int bounds."""
    if is_const(a):
        return _fold(lambda x, _: min(max(x, lo), hi), a, 0)
    return Expr("clip", (a, lo, hi), a.size)


def ceil_align(value: Any, multiple: int) -> Any:
    """Smallest multiple of ``multiple`` that is >= ``value`` (elementwise on vectors)."""
    if multiple == 1:
        return value
    return mul(floordiv(add(value, multiple - 1), multiple), multiple)


def exclusive_cumsum(v: Any) -> Any:
    """``[0, v0, v0+v1, ...]`` (same length as ``v``)."""
    if isinstance(v, tuple):
        out, acc = [], 0
        for x in v:
            out.append(acc)
            acc += x
        return tuple(out)
    return Expr("cumsum_excl", (v,), v.size)


def group_sum(v: Any, k: int) -> Any:
    """Sums of consecutive groups of ``k`` entries (a vector of ``len(v) // k``): the
    per-replica totals of a ``[dp, cp]`` table stored row by row."""
    if k == 1:
        return v
    if isinstance(v, tuple):
        return tuple(sum(v[i:i + k]) for i in range(0, len(v), k))
    return Expr("group_sum", (v, k), v.size // k)


def group_cumsum_excl(v: Any, k: int) -> Any:
    """Exclusive cumulative sums within consecutive groups of ``k`` entries (same length):
    where each CP shard starts inside its replica's slot."""
    if k == 1:
        return tuple(0 for _ in v) if isinstance(v, tuple) else (0,) * v.size
    if isinstance(v, tuple):
        return tuple(x for i in range(0, len(v), k) for x in exclusive_cumsum(v[i:i + k]))
    return Expr("group_cumsum_excl", (v, k), v.size)


def gather(v: Any, indices: Sequence[int]) -> Any:
    """``v[indices]`` for a static tuple of indices (a vector of ``len(indices)``)."""
    idx = tuple(indices)
    if isinstance(v, tuple):
        return tuple(v[i] for i in idx)
    if idx == tuple(range(v.size)):
        return v
    return Expr("gather", (v, idx), len(idx))


def index(v: Any, i: Any) -> Any:
    """Element ``i`` (an int or a scalar expression) of vector ``v``."""
    if isinstance(v, tuple) and v and all(x == v[0] for x in v):
        return v[0]  # every entry is the same: the index does not matter
    if isinstance(i, int):
        if isinstance(v, tuple):
            return v[i]
        if v.op == "cumsum_excl" and i == 0:
            return 0
        if v.op == "gather":
            return index(v.args[0], v.args[1][i])
        if v.op in ("add", "sub", "mul", "floordiv", "minimum", "maximum", "eq"):
            a, b = v.args
            return _BINARY[v.op](index(a, i) if _size(a) is not None else a,
                                 index(b, i) if _size(b) is not None else b)
        if v.op == "clip":
            return clip(index(v.args[0], i), v.args[1], v.args[2])
    return Expr("index", (v, i), None)


_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": add, "sub": sub, "mul": mul, "floordiv": floordiv, "minimum": minimum,
    "maximum": maximum, "eq": eq,
}


# ---------------------------------------------------------------- evaluation
class ArrayOps:
    """What a frontend provides to evaluate expressions on its arrays (int32).

    Scalars may be 0-d or 1-element arrays, as the frontend prefers; vectors are 1-d.
    ``+ - * //`` use the arrays' Python operators (both torch tensors and JAX arrays
    have them, with ints too); a frontend supplies the rest.
    """

    def counts(self) -> Any:
        raise NotImplementedError

    def coord(self, name: str) -> Any:
        raise NotImplementedError

    def const(self, value: int | tuple) -> Any:
        raise NotImplementedError

    def minimum(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def maximum(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def eq(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def clip(self, a: Any, lo: int, hi: int) -> Any:
        raise NotImplementedError

    def cumsum_excl(self, v: Any) -> Any:
        raise NotImplementedError

    def group_sum(self, v: Any, k: int) -> Any:
        raise NotImplementedError

    def group_cumsum_excl(self, v: Any, k: int) -> Any:
        raise NotImplementedError

    def gather(self, v: Any, indices: tuple[int, ...]) -> Any:
        raise NotImplementedError

    def index(self, v: Any, i: Any) -> Any:
        raise NotImplementedError

    def binary(self, op: str, a: Any, b: Any) -> Any:
        if op == "add":
            return a + b
        if op == "sub":
            return a - b
        if op == "mul":
            return a * b
        if op == "floordiv":
            return a // b
        return getattr(self, op)(a, b)


def evaluate(value: Any, ops: ArrayOps, memo: dict[int, Any] | None = None) -> Any:
    """Evaluate ``value`` (an int, a tuple or an :class:`Expr`) with ``ops``. Constants
    become ``ops.const`` arrays; ``memo`` (keyed by node identity) shares common
    subexpressions within one call."""
    if not isinstance(value, Expr):
        return ops.const(value)
    if memo is None:
        memo = {}
    return _eval(value, ops, memo)


def _arg(a: Any, ops: ArrayOps, memo: dict[int, Any]) -> Any:
    if isinstance(a, Expr):
        return _eval(a, ops, memo)
    return ops.const(a)


def _eval(e: Expr, ops: ArrayOps, memo: dict[int, Any]) -> Any:
    hit = memo.get(id(e))
    if hit is not None:
        return hit[1]
    op = e.op
    if op == "counts":
        out = ops.counts()
    elif op == "coord":
        out = ops.coord(e.args[0])
    elif op == "clip":
        out = ops.clip(_arg(e.args[0], ops, memo), e.args[1], e.args[2])
    elif op == "cumsum_excl":
        out = ops.cumsum_excl(_arg(e.args[0], ops, memo))
    elif op == "group_sum":
        out = ops.group_sum(_arg(e.args[0], ops, memo), e.args[1])
    elif op == "group_cumsum_excl":
        out = ops.group_cumsum_excl(_arg(e.args[0], ops, memo), e.args[1])
    elif op == "gather":
        out = ops.gather(_arg(e.args[0], ops, memo), e.args[1])
    elif op == "index":
        i = e.args[1]
        out = ops.index(_arg(e.args[0], ops, memo),
                        i if isinstance(i, int) else _eval(i, ops, memo))
    else:
        out = ops.binary(op, _arg(e.args[0], ops, memo), _arg(e.args[1], ops, memo))
    memo[id(e)] = (e, out)  # keep e alive so its id is not reused within the call
    return out


class HostOps(ArrayOps):
    """:class:`ArrayOps` on Python ints and tuples: evaluates an expression for given host
    counts and coordinates (what the cost model and the tests use)."""

    def __init__(self, counts: Sequence[int] = (), coords: dict[str, int] | None = None):
        self._counts = tuple(int(c) for c in counts)
        self._coords = dict(coords or {})

    def counts(self) -> tuple:
        return self._counts

    def coord(self, name: str) -> int:
        return self._coords[name]

    def const(self, value: int | tuple) -> int | tuple:
        return value

    def binary(self, op: str, a: Any, b: Any) -> Any:
        return _BINARY[op](a, b)  # folds tuples elementwise too

    def clip(self, a: Any, lo: int, hi: int) -> Any:
        return clip(a, lo, hi)

    def cumsum_excl(self, v: tuple) -> tuple:
        return exclusive_cumsum(v)

    def group_sum(self, v: tuple, k: int) -> tuple:
        return group_sum(v, k)

    def group_cumsum_excl(self, v: tuple, k: int) -> tuple:
        return group_cumsum_excl(v, k)

    def gather(self, v: tuple, indices: tuple[int, ...]) -> tuple:
        return tuple(v[i] for i in indices)

    def index(self, v: tuple, i: int) -> int:
        return v[i]


def host_value(value: Any, counts: Sequence[int], coords: dict[str, int] | None = None) -> Any:
    """``value`` evaluated for host ``counts`` (and coordinates, if it uses any)."""
    return evaluate(value, HostOps(counts, coords))


# ---------------------------------------------------------------- rendering
_SYMBOL = {"add": "+", "sub": "-", "mul": "*", "floordiv": "//", "eq": "=="}


def _aligned(v: Expr) -> tuple[Any, int] | None:
    """``(x, m)`` when ``v`` is ``ceil_align(x, m)``."""
    if v.op != "mul" or not isinstance(v.args[1], int):
        return None
    m, inner = v.args[1], v.args[0]
    if (isinstance(inner, Expr) and inner.op == "floordiv" and inner.args[1] == m
            and isinstance(inner.args[0], Expr) and inner.args[0].op == "add"
            and inner.args[0].args[1] == m - 1):
        return inner.args[0].args[0], m
    return None


def _render(v: Any) -> str:
    if not isinstance(v, Expr):
        return str(list(v)) if isinstance(v, tuple) else str(v)
    op, a = v.op, v.args
    al = _aligned(v)
    if al is not None:
        return f"align({_render(al[0])}, {al[1]})"
    if op == "counts":
        return "n"
    if op == "coord":
        return a[0]
    if op in _SYMBOL:
        return f"({_render(a[0])} {_SYMBOL[op]} {_render(a[1])})"
    if op in ("minimum", "maximum"):
        return f"{op[:3]}({_render(a[0])}, {_render(a[1])})"
    if op == "clip":
        return f"clip({_render(a[0])}, {a[1]}, {a[2]})"
    if op == "cumsum_excl":
        return f"cumsum_excl({_render(a[0])})"
    if op in ("group_sum", "group_cumsum_excl"):
        return f"{op}({_render(a[0])}, {a[1]})"
    if op == "gather":
        return f"{_render(a[0])}[{list(a[1])}]"
    if op == "index":
        return f"{_render(a[0])}[{_render(a[1])}]"
    return f"{op}{a}"


def render(value: Any) -> str:
    """A short human-readable form of a value (``n`` names the device counts)."""
    return _render(value)
