"""Integer expressions over the counts, the rank's coordinates and a call's sizes.

Every row number a schedule needs (a slot's first row, the rows a chunk holds, the size of
the global buffer) is written once, in :mod:`dpx.geometry`, with the operators of this
module. Operands are host ints (scalars), tuples of host ints (vectors) or :class:`Expr`
nodes; an operator folds at once when its operands are host values, so code that is given
ints gets ints.

Leaves:

- :func:`counts_leaf`: the per-replica counts (or the ``[dp, cp]`` shard table, row by
  row). A schedule is built once per *structure* with the counts as this leaf; the counts
  of a step are then either host ints (the plan's) or a device int32 vector (a capacity
  plan's ``counts=``).
- :func:`coord`: this rank's ``dp`` / ``cp`` / ``tp`` coordinate or its world ``rank``,
  when one program serves every rank (JAX ``shard_map``).
- :func:`param`: a host int of the call (``in_rows``: the input's rows; ``out_rows``).

Each node records which kinds of leaves it depends on (:attr:`Expr.deps`): a node without
device or coordinate leaves is *host-known* for a call, and a frontend evaluates every
host-known value of a schedule with one generated Python function
(:func:`compile_host`). Values that read device counts or coordinates are evaluated on the
frontend's own arrays with :func:`evaluate` and a small table of array operations
(:class:`ArrayOps`). The arithmetic is therefore never written twice.

Integer semantics throughout: ``//`` is floor division by a positive int constant;
comparisons give 0 or 1.
"""

from __future__ import annotations

import itertools
import operator
from typing import Any, Callable, Sequence, Union

__all__ = [
    "add", "ArrayOps", "ceil_align", "ceil_div", "clip", "compile_host", "Coord", "coord",
    "counts_leaf", "deps_of", "eq", "evaluate", "exclusive_cumsum", "Expr", "floordiv",
    "gather", "group_cumsum_excl", "group_sum", "host_value", "HostFunction", "HostOps",
    "index", "is_const", "land", "le", "lt", "maximum", "minimum", "mul", "ne", "param",
    "PARAMS", "render", "repeat", "Scalar", "size_of", "sub", "substitute", "vall", "Value",
    "vmax", "vsum"
]

#: Leaf kinds a node depends on (:attr:`Expr.deps`, a bit set).
COUNTS, COORD, PARAM = 1, 2, 4

#: Parameters of a call, in the order :func:`compile_host` functions take them.
PARAMS: tuple[str, ...] = ("in_rows", "out_rows")


class Expr:
    """A node of an integer expression. ``size`` is the vector length (``None``: scalar);
    ``deps`` the leaf kinds it depends on. Nodes compare by identity; :meth:`key` gives a
    structural key (what :func:`compile_host` shares common subexpressions by)."""

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

    def __add__(self, other: Any) -> Any:
        return add(self, other)

    def __radd__(self, other: Any) -> Any:
        return add(other, self)

    def __sub__(self, other: Any) -> Any:
        return sub(self, other)

    def __rsub__(self, other: Any) -> Any:
        return sub(other, self)

    def __mul__(self, other: Any) -> Any:
        return mul(self, other)

    def __rmul__(self, other: Any) -> Any:
        return mul(other, self)

    def __floordiv__(self, other: int) -> Any:
        return floordiv(self, other)

    def __getitem__(self, i: Any) -> Any:
        return index(self, i)

    def __repr__(self) -> str:
        return f"Expr({render(self)})"

    def __str__(self) -> str:
        return render(self)


#: A scalar: a host int or a scalar expression. A vector: a tuple of ints or an Expr.
Scalar = Union[int, Expr]
Value = Union[int, tuple, Expr]


class Coord:
    """Names of the rank-coordinate leaves."""

    DP = "dp"
    CP = "cp"
    TP = "tp"
    RANK = "rank"


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


def is_const(v: object) -> bool:
    return not isinstance(v, Expr)


def deps_of(v: object) -> int:
    return v.deps if isinstance(v, Expr) else 0


def size_of(v: object) -> int | None:
    if isinstance(v, Expr):
        return v.size
    if isinstance(v, tuple):
        return len(v)
    return None


def _vec_size(a: object, b: object) -> int | None:
    sa, sb = size_of(a), size_of(b)
    if sa is not None and sb is not None and sa != sb:
        raise ValueError(f"vector lengths differ: {sa} and {sb}")
    return sa if sa is not None else sb


# ---------------------------------------------------------------- elementwise operators
_SCALAR: dict[str, Callable[[int, int], int]] = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul,
    "floordiv": operator.floordiv, "minimum": min, "maximum": max,
    "eq": lambda x, y: int(x == y), "ne": lambda x, y: int(x != y),
    "lt": lambda x, y: int(x < y), "le": lambda x, y: int(x <= y),
    "land": lambda x, y: int(bool(x) and bool(y)),
}


def _fold(op: str, a: Any, b: Any) -> Any:
    fn = _SCALAR[op]
    ta, tb = type(a) is tuple, type(b) is tuple
    if not ta and not tb:
        return fn(a, b)
    n = _vec_size(a, b)
    aa = a if ta else (a,) * n
    bb = b if tb else (b,) * n
    return tuple(fn(x, y) for x, y in zip(aa, bb))


_SAME = {"eq": 1, "le": 1, "ne": 0, "lt": 0}


def _binary(op: str, a: Any, b: Any) -> Any:
    if type(a) is int and type(b) is int:
        return _SCALAR[op](a, b)
    if not isinstance(a, Expr) and not isinstance(b, Expr):
        return _fold(op, a, b)
    if (op in _SAME and isinstance(a, Expr) and isinstance(b, Expr) and a.size is None
            and b.size is None and (a is b or a.key() == b.key())):
        return _SAME[op]  # a value compared with itself
    return Expr(op, (a, b), _vec_size(a, b), deps_of(a) | deps_of(b))


def _zero_like(v: Any) -> Any:
    n = size_of(v)
    return 0 if n is None else (0,) * n


def add(a: Any, b: Any) -> Any:
    if type(a) is int and type(b) is int:
        return a + b
    if type(b) is int and b == 0:
        return a
    if type(a) is int and a == 0:
        return b
    return _binary("add", a, b)


def sub(a: Any, b: Any) -> Any:
    if type(a) is int and type(b) is int:
        return a - b
    if type(b) is int and b == 0:
        return a
    return _binary("sub", a, b)


def mul(a: Any, b: Any) -> Any:
    if type(a) is int and type(b) is int:
        return a * b
    for x, y in ((a, b), (b, a)):
        if type(x) is int:
            if x == 1:
                return y
            if x == 0:
                return _zero_like(y)
    return _binary("mul", a, b)


def floordiv(a: Any, b: int) -> Any:
    if type(b) is not int or b <= 0:
        raise ValueError(f"floordiv needs a positive int divisor, got {b!r}")
    if b == 1:
        return a
    return _binary("floordiv", a, b)


def minimum(a: Any, b: Any) -> Any:
    return _binary("minimum", a, b)


def maximum(a: Any, b: Any) -> Any:
    return _binary("maximum", a, b)


def eq(a: Any, b: Any) -> Any:
    """1 where ``a == b`` else 0."""
    return _binary("eq", a, b)


def ne(a: Any, b: Any) -> Any:
    return _binary("ne", a, b)


def lt(a: Any, b: Any) -> Any:
    return _binary("lt", a, b)


def le(a: Any, b: Any) -> Any:
    return _binary("le", a, b)


def land(a: Any, b: Any) -> Any:
    """Logical and of two 0/1 values."""
    if type(a) is int and type(b) is int:
        return int(bool(a) and bool(b))
    for x, y in ((a, b), (b, a)):
        if type(x) is int:
            return y if x else 0
    return _binary("land", a, b)


def clip(a: Any, lo: int, hi: int) -> Any:
    """``min(max(a, lo), hi)`` with int bounds (elementwise on vectors)."""
    if type(a) is int:
        return min(max(a, lo), hi)
    if type(a) is tuple:
        return tuple(min(max(x, lo), hi) for x in a)
    return Expr("clip", (a, lo, hi), a.size, a.deps)


def ceil_align(value: Any, multiple: int) -> Any:
    """Smallest multiple of ``multiple`` that is >= ``value`` (elementwise on vectors)."""
    if multiple == 1:
        return value
    if type(value) is int:
        return -(-value // multiple) * multiple
    return mul(floordiv(add(value, multiple - 1), multiple), multiple)


def ceil_div(value: Any, divisor: int) -> Any:
    if type(value) is int:
        return -(-value // divisor)
    return floordiv(add(value, divisor - 1), divisor)


# ---------------------------------------------------------------- reductions
def vmax(v: Any) -> Any:
    """The largest entry of vector ``v`` (0 for an empty vector)."""
    if type(v) is tuple:
        return max(v, default=0)
    return Expr("vmax", (v,), None, v.deps)


def vsum(v: Any) -> Any:
    if type(v) is tuple:
        return sum(v)
    return Expr("vsum", (v,), None, v.deps)


def vall(v: Any) -> Any:
    """1 when every entry of ``v`` is nonzero."""
    if type(v) is tuple:
        return int(all(v))
    return Expr("vall", (v,), None, v.deps)


# ---------------------------------------------------------------- vectors
def repeat(s: Any, n: int) -> Any:
    """The vector of ``n`` copies of scalar ``s``."""
    if not isinstance(s, Expr):
        return (s,) * n
    return Expr("repeat", (s, n), n, s.deps)


def exclusive_cumsum(v: Any) -> Any:
    """``[0, v0, v0+v1, ...]`` (same length as ``v``)."""
    if type(v) is tuple:
        return tuple(itertools.accumulate(v, initial=0))[:-1]
    return Expr("cumsum_excl", (v,), v.size, v.deps)


def group_sum(v: Any, k: int) -> Any:
    """Sums of consecutive groups of ``k`` entries (a vector of ``len(v) // k``): the
    per-replica totals of a ``[dp, cp]`` table stored row by row."""
    if k == 1:
        return v
    if type(v) is tuple:
        return tuple(sum(v[i:i + k]) for i in range(0, len(v), k))
    return Expr("group_sum", (v, k), v.size // k, v.deps)


def group_cumsum_excl(v: Any, k: int) -> Any:
    """Exclusive cumulative sums within consecutive groups of ``k`` entries (same length):
    where each CP shard starts inside its replica's slot."""
    if k == 1:
        return (0,) * size_of(v)
    if type(v) is tuple:
        return tuple(x for i in range(0, len(v), k) for x in exclusive_cumsum(v[i:i + k]))
    return Expr("group_cumsum_excl", (v, k), v.size, v.deps)


def gather(v: Any, indices: Sequence[int]) -> Any:
    """``v[indices]`` for a static tuple of indices (a vector of ``len(indices)``)."""
    idx = tuple(indices)
    if type(v) is tuple:
        return tuple(v[i] for i in idx)
    if idx == tuple(range(v.size)):
        return v
    if v.op == "repeat":
        return repeat(v.args[0], len(idx))
    return Expr("gather", (v, idx), len(idx), v.deps)


_PUSH_INDEX = frozenset(("add", "sub", "mul", "floordiv", "minimum", "maximum", "eq", "ne",
                         "lt", "le", "land"))


def index(v: Any, i: Any) -> Any:
    """Element ``i`` (an int or a scalar expression) of vector ``v``."""
    if type(v) is tuple:
        if v and all(x == v[0] for x in v):
            return v[0]  # every entry is the same: the index does not matter
        if type(i) is int:
            return v[i]
        return Expr("index", (v, i), None, deps_of(i))
    if type(i) is int:
        op = v.op
        if op == "repeat":
            return v.args[0]
        if op == "cumsum_excl" and i == 0:
            return 0
        if op == "gather":
            return index(v.args[0], v.args[1][i])
        if op in _PUSH_INDEX:
            a, b = v.args
            return _OPS[op](index(a, i) if size_of(a) is not None else a,
                            index(b, i) if size_of(b) is not None else b)
        if op == "clip":
            return clip(index(v.args[0], i), v.args[1], v.args[2])
    elif v.op == "repeat":
        return v.args[0]
    return Expr("index", (v, i), None, v.deps | deps_of(i))


_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "add": add, "sub": sub, "mul": mul, "floordiv": floordiv, "minimum": minimum,
    "maximum": maximum, "eq": eq, "ne": ne, "lt": lt, "le": le, "land": land,
}


# ---------------------------------------------------------------- evaluation on arrays
class ArrayOps:
    """What a frontend provides to evaluate expressions on its arrays (int32).

    Scalars may be 0-d or 1-element arrays, as the frontend prefers; vectors are 1-d.
    ``+ - * //`` use the arrays' Python operators (torch tensors and JAX arrays have them,
    with ints too); a frontend supplies the operations its schedules use. Schedules
    evaluated on device arrays use the elementwise operators, ``clip``, the cumulative
    sums, ``gather`` and ``index``; the reductions and ``repeat`` appear only in values of
    host counts, which :func:`compile_host` evaluates.
    """

    def counts(self) -> Any:
        raise NotImplementedError

    def coord(self, name: str) -> Any:
        raise NotImplementedError

    def param(self, name: str) -> int:
        raise NotImplementedError(f"no value for parameter {name!r}")

    def const(self, value: int | tuple) -> Any:
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

    def _missing(self, name: str) -> Any:
        raise NotImplementedError(f"{type(self).__name__} cannot evaluate {name!r}")

    def minimum(self, a: Any, b: Any) -> Any:
        return self._missing("minimum")

    def maximum(self, a: Any, b: Any) -> Any:
        return self._missing("maximum")

    def eq(self, a: Any, b: Any) -> Any:
        return self._missing("eq")

    def ne(self, a: Any, b: Any) -> Any:
        return self._missing("ne")

    def lt(self, a: Any, b: Any) -> Any:
        return self._missing("lt")

    def le(self, a: Any, b: Any) -> Any:
        return self._missing("le")

    def land(self, a: Any, b: Any) -> Any:
        return self.binary("mul", a, b)

    def clip(self, a: Any, lo: int, hi: int) -> Any:
        return self._missing("clip")

    def vmax(self, v: Any) -> Any:
        return self._missing("vmax")

    def vsum(self, v: Any) -> Any:
        return self._missing("vsum")

    def vall(self, v: Any) -> Any:
        return self._missing("vall")

    def repeat(self, s: Any, n: int) -> Any:
        return self._missing("repeat")

    def cumsum_excl(self, v: Any) -> Any:
        return self._missing("cumsum_excl")

    def group_sum(self, v: Any, k: int) -> Any:
        return self._missing("group_sum")

    def group_cumsum_excl(self, v: Any, k: int) -> Any:
        return self._missing("group_cumsum_excl")

    def gather(self, v: Any, indices: tuple[int, ...]) -> Any:
        return self._missing("gather")

    def index(self, v: Any, i: Any) -> Any:
        return self._missing("index")


def evaluate(value: Any, ops: ArrayOps, memo: dict[int, Any] | None = None) -> Any:
    """Evaluate ``value`` (an int, a tuple or an :class:`Expr`) with ``ops``. Constants
    become ``ops.const`` arrays; ``memo`` (keyed by node identity) shares common
    subexpressions within one call."""
    if not isinstance(value, Expr):
        return ops.const(value)
    return _eval(value, ops, {} if memo is None else memo)


def _arg(a: Any, ops: ArrayOps, memo: dict) -> Any:
    return _eval(a, ops, memo) if isinstance(a, Expr) else ops.const(a)


def _eval(e: Expr, ops: ArrayOps, memo: dict) -> Any:
    hit = memo.get(id(e))
    if hit is not None:
        return hit[1]
    op, args = e.op, e.args
    if op == "counts":
        out = ops.counts()
    elif op == "coord":
        out = ops.coord(args[0])
    elif op == "param":
        out = ops.param(args[0])
    elif op == "clip":
        out = ops.clip(_arg(args[0], ops, memo), args[1], args[2])
    elif op in ("vmax", "vsum", "vall", "cumsum_excl"):
        out = getattr(ops, op)(_arg(args[0], ops, memo))
    elif op == "repeat":
        out = ops.repeat(_arg(args[0], ops, memo), args[1])
    elif op in ("group_sum", "group_cumsum_excl"):
        out = getattr(ops, op)(_arg(args[0], ops, memo), args[1])
    elif op == "gather":
        out = ops.gather(_arg(args[0], ops, memo), args[1])
    elif op == "index":
        i = args[1]
        out = ops.index(_arg(args[0], ops, memo), i if type(i) is int else _eval(i, ops, memo))
    else:
        out = ops.binary(op, _arg(args[0], ops, memo), _arg(args[1], ops, memo))
    memo[id(e)] = (e, out)  # keep e alive so its id is not reused within the call
    return out


class HostOps(ArrayOps):
    """:class:`ArrayOps` on Python ints and tuples (the constructors above, which fold):
    evaluates an expression for given host counts, coordinates and parameters."""

    def __init__(self, counts: Sequence[int] = (), coords: dict[str, int] | None = None,
                 params: dict[str, int] | None = None) -> None:
        self._counts = tuple(int(c) for c in counts)
        self._coords = dict(coords or {})
        self._params = dict(params or {})

    def counts(self) -> tuple:
        return self._counts

    def coord(self, name: str) -> int:
        return self._coords[name]

    def param(self, name: str) -> int:
        return self._params[name]

    def const(self, value: int | tuple) -> int | tuple:
        return value

    def binary(self, op: str, a: Any, b: Any) -> Any:
        return _OPS[op](a, b)

    def clip(self, a: Any, lo: int, hi: int) -> Any:
        return clip(a, lo, hi)

    def vmax(self, v: tuple) -> int:
        return vmax(v)

    def vsum(self, v: tuple) -> int:
        return vsum(v)

    def vall(self, v: tuple) -> int:
        return vall(v)

    def repeat(self, s: int, n: int) -> tuple:
        return repeat(s, n)

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


def host_value(value: Any, counts: Sequence[int], coords: dict[str, int] | None = None,
               params: dict[str, int] | None = None) -> Any:
    """``value`` evaluated for host ``counts`` (and coordinates / parameters it uses)."""
    return evaluate(value, HostOps(counts, coords, params))


def substitute(value: Any, *, counts: tuple | None = None,
               coords: dict[str, int] | None = None,
               params: dict[str, int] | None = None,
               memo: dict[int, Any] | None = None) -> Any:
    """``value`` with the given leaves replaced by host values and folded; the leaves not
    given stay (a partially evaluated expression, or an int when nothing is left)."""
    if not isinstance(value, Expr):
        return value
    return _subst(value, counts, coords or {}, params or {}, {} if memo is None else memo)


def _subst(e: Expr, counts, coords, params, memo) -> Any:
    hit = memo.get(id(e))
    if hit is not None:
        return hit[1]
    op, args = e.op, e.args
    if op == "counts":
        out = e if counts is None else counts
    elif op == "coord":
        out = coords.get(args[0], e)
    elif op == "param":
        out = params.get(args[0], e)
    else:
        new = tuple(_subst(a, counts, coords, params, memo) if isinstance(a, Expr) else a
                    for a in args)
        if all(n is o for n, o in zip(new, args)):
            out = e
        elif op in _OPS:
            out = _OPS[op](*new)
        elif op == "clip":
            out = clip(*new)
        elif op in ("vmax", "vsum", "vall", "cumsum_excl"):
            out = {"vmax": vmax, "vsum": vsum, "vall": vall,
                   "cumsum_excl": exclusive_cumsum}[op](new[0])
        elif op == "repeat":
            out = repeat(*new)
        elif op == "group_sum":
            out = group_sum(*new)
        elif op == "group_cumsum_excl":
            out = group_cumsum_excl(*new)
        elif op == "gather":
            out = gather(*new)
        elif op == "index":
            out = index(*new)
        else:
            raise ValueError(f"unknown op {op!r}")
    memo[id(e)] = (e, out)
    return out


# ---------------------------------------------------------------- host code generation
HostFunction = Callable[[tuple, tuple], "tuple | None"]


def _helpers() -> dict[str, Any]:
    def cumsum_excl(v):
        return tuple(itertools.accumulate(v, initial=0))[:-1]

    def group_sum_(v, k):
        return tuple(sum(v[i:i + k]) for i in range(0, len(v), k))

    def group_cumsum_excl_(v, k):
        return tuple(x for i in range(0, len(v), k) for x in cumsum_excl(v[i:i + k]))

    return {"_cumsum_excl": cumsum_excl, "_group_sum": group_sum_,
            "_group_cumsum_excl": group_cumsum_excl_}


_INFIX = {"add": "+", "sub": "-", "mul": "*", "floordiv": "//"}
_CMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<="}


def _scalar_code(op: str, a: str, b: str) -> str:
    if op in _INFIX:
        return f"({a} {_INFIX[op]} {b})"
    if op in _CMP:
        return f"int({a} {_CMP[op]} {b})"
    if op == "minimum":
        return f"min({a}, {b})"
    if op == "maximum":
        return f"max({a}, {b})"
    if op == "land":
        return f"int(bool({a}) and bool({b}))"
    raise ValueError(op)


def compile_host(outputs: Sequence[Any], guards: Sequence[tuple[Any, int]] = ()
                 ) -> HostFunction:
    """One Python function ``f(counts, params)`` computing every value of ``outputs``
    (host-known values: ints, tuples or expressions over the counts and :data:`PARAMS`)
    as a tuple, after checking ``guards`` (``(value, expected)``): ``None`` when a guard
    differs. Common subexpressions are computed once."""
    lines: list[str] = []
    names: dict[tuple, str] = {}
    env: dict[str, Any] = _helpers()

    def name_of(v: Any) -> str:
        if type(v) is int:
            return repr(v)
        if type(v) is tuple:
            k = ("const", v)
            if k not in names:
                names[k] = f"c{len(names)}"
                env[names[k]] = v
            return names[k]
        if not isinstance(v, Expr):
            raise TypeError(f"cannot compile {v!r}")
        if v.deps & COORD:
            raise ValueError(f"{render(v)} reads a rank coordinate: not host-known")
        k = v.key()
        hit = names.get(k)
        if hit is not None:
            return hit
        code = _node_code(v, name_of)
        n = f"t{len(names)}"
        names[k] = n
        lines.append(f"    {n} = {code}")
        return n

    checks = [f"{name_of(g)} != {int(want)}" for g, want in guards]
    guard_lines = list(lines)
    lines.clear()
    outs = [name_of(v) for v in outputs]
    body = guard_lines
    if checks:
        body.append(f"    if {' or '.join(checks)}:\n        return None")
    body += lines
    tail = ", ".join(outs) + ("," if len(outs) == 1 else "")
    src = "def _f(n, p):\n" + "\n".join(body) + f"\n    return ({tail})\n"
    exec(compile(src, "<dpx host values>", "exec"), env)  # noqa: S102 - generated above
    return env.pop("_f")  # (its globals do not hold it: no reference cycle to collect)


def _node_code(v: Expr, name_of: Callable[[Any], str]) -> str:
    op, args = v.op, v.args
    if op == "counts":
        return "n"
    if op == "param":
        return f"p[{PARAMS.index(args[0])}]"
    if op in _SCALAR:
        a, b = args
        sa, sb = size_of(a), size_of(b)
        na, nb = name_of(a), name_of(b)
        if sa is None and sb is None:
            return _scalar_code(op, na, nb)
        x = "x" if sa is not None else na
        y = "y" if sb is not None else nb
        inner = _scalar_code(op, x, y)
        if sa is not None and sb is not None:
            return f"tuple({inner} for x, y in zip({na}, {nb}))"
        return f"tuple({inner} for {'x' if sa is not None else 'y'} in " \
               f"{na if sa is not None else nb})"
    if op == "clip":
        a, lo, hi = args
        if size_of(a) is None:
            return f"min(max({name_of(a)}, {lo}), {hi})"
        return f"tuple(min(max(x, {lo}), {hi}) for x in {name_of(a)})"
    if op == "vmax":
        return f"max({name_of(args[0])}, default=0)"
    if op == "vsum":
        return f"sum({name_of(args[0])})"
    if op == "vall":
        return f"int(all({name_of(args[0])}))"
    if op == "repeat":
        return f"({name_of(args[0])},) * {args[1]}"
    if op == "cumsum_excl":
        return f"_cumsum_excl({name_of(args[0])})"
    if op == "group_sum":
        return f"_group_sum({name_of(args[0])}, {args[1]})"
    if op == "group_cumsum_excl":
        return f"_group_cumsum_excl({name_of(args[0])}, {args[1]})"
    if op == "gather":
        return f"tuple({name_of(args[0])}[i] for i in {name_of(args[1])})"
    if op == "index":
        return f"{name_of(args[0])}[{name_of(args[1])}]"
    raise ValueError(f"cannot compile op {op!r}")


# ---------------------------------------------------------------- rendering
_SYMBOL = {"add": "+", "sub": "-", "mul": "*", "floordiv": "//", "eq": "==", "ne": "!=",
           "lt": "<", "le": "<=", "land": "and"}


def _aligned(v: Expr) -> tuple[Any, int] | None:
    """``(x, m)`` when ``v`` is ``ceil_align(x, m)``."""
    if v.op != "mul" or type(v.args[1]) is not int:
        return None
    m, inner = v.args[1], v.args[0]
    if (isinstance(inner, Expr) and inner.op == "floordiv" and inner.args[1] == m
            and isinstance(inner.args[0], Expr) and inner.args[0].op == "add"
            and inner.args[0].args[1] == m - 1):
        return inner.args[0].args[0], m
    return None


def render(value: Any) -> str:
    """A short human-readable form of a value (``n`` names the counts)."""
    if not isinstance(value, Expr):
        return str(list(value)) if isinstance(value, tuple) else str(value)
    op, a = value.op, value.args
    al = _aligned(value)
    if al is not None:
        return f"align({render(al[0])}, {al[1]})"
    if op == "counts":
        return "n"
    if op in ("coord", "param"):
        return a[0]
    if op in _SYMBOL:
        return f"({render(a[0])} {_SYMBOL[op]} {render(a[1])})"
    if op in ("minimum", "maximum"):
        return f"{op[:3]}({render(a[0])}, {render(a[1])})"
    if op == "clip":
        return f"clip({render(a[0])}, {a[1]}, {a[2]})"
    if op in ("vmax", "vsum", "vall", "cumsum_excl"):
        return f"{op}({render(a[0])})"
    if op == "repeat":
        return f"[{render(a[0])}] * {a[1]}"
    if op in ("group_sum", "group_cumsum_excl"):
        return f"{op}({render(a[0])}, {a[1]})"
    if op == "gather":
        return f"{render(a[0])}[{list(a[1])}]"
    if op == "index":
        return f"{render(a[0])}[{render(a[1])}]"
    return f"{op}{a}"
