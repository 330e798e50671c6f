"""Expressions (:mod:`dpx.expr`) evaluated from the one op table: on a frontend's arrays
(:func:`evaluate`, :class:`ArrayOps`), on host values (:class:`HostOps`,
:func:`substitute`), and by the one code generator (:func:`compile_host`).
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Sequence

from dpx.expr import BINARY, COORD, OPS, PARAMS, Expr, render, size_of
from dpx.ints import INTS

__all__ = ["ArrayOps", "compile_host", "evaluate", "host_value", "HostOps", "substitute"]


class ArrayOps:
    """What a frontend provides to evaluate expressions on its arrays (int32): the leaves
    (``counts``, ``coord``, ``param``), ``const`` and a method per name in
    :data:`DEVICE_OPS` (``+ - * //`` default to the arrays' operators, ``land`` to ``*``)."""

    def binary(self, op: str, a: Any, b: Any) -> Any:
        f = _OPERATORS.get(op)
        return f(a, b) if f is not None else getattr(self, op)(a, b)


_OPERATORS = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
              "land": operator.mul, "floordiv": operator.floordiv}


def evaluate(value: Any, ops: ArrayOps, memo: dict[int, Any] | None = None) -> Any:
    """Evaluate ``value`` (an int, a tuple or an :class:`Expr`) with ``ops``. Constants
    become ``ops.const`` arrays; ``memo`` (keyed by node identity) shares common
    subexpressions within one call."""
    if not isinstance(value, Expr):
        return ops.const(value)
    return _eval(value, ops, {} if memo is None else memo)


def _eval(e: Expr, ops: Any, memo: dict) -> Any:
    hit = memo.get(id(e))
    if hit is not None:
        return hit[1]
    op, args = e.op, e.args
    if op in ("counts", "coord", "param"):  # a leaf; HostOps keeps one it has no value of
        out = ops.counts() if op == "counts" else getattr(ops, op)(args[0])
        if out is None:
            out = e
    else:
        static = OPS[op].static
        vals = [_eval(a, ops, memo) if isinstance(a, Expr)
                else a if i in static else ops.const(a) for i, a in enumerate(args)]
        out = ops.binary(op, *vals) if op in BINARY else getattr(ops, op)(*vals)
    memo[id(e)] = (e, out)  # keep e alive so its id is not reused within the call
    return out


class HostOps(ArrayOps):
    """Evaluates on host values by the constructors (which fold). A leaf whose value is
    not given (``counts=None``, a coordinate or parameter not in the dicts) stays an
    expression: that is :func:`substitute`."""

    def __init__(self, counts: Sequence[int] | None = (), coords: dict | None = None,
                 params: dict | None = None) -> None:
        self._counts = None if counts is None else tuple(int(c) for c in counts)
        self._coords, self._params = coords or {}, params or {}

    def counts(self) -> Any:
        return self._counts

    def coord(self, name: str) -> Any:
        return self._coords.get(name)

    def param(self, name: str) -> Any:
        return self._params.get(name)

    def const(self, value: Any) -> Any:
        return value

    def binary(self, op: str, a: Any, b: Any) -> Any:
        return OPS[op].make(a, b)


for _name, _spec in OPS.items():  # every op of the table, by its constructor
    setattr(HostOps, _name, staticmethod(_spec.make))
del _name, _spec


def host_value(value: Any, counts: Sequence[int], coords: dict[str, int] | None = None,
               params: dict[str, int] | None = None) -> Any:
    """``value`` evaluated for host ``counts`` (and coordinates / parameters it uses)."""
    return evaluate(value, HostOps(counts, coords, params))


def substitute(value: Any, *, counts: tuple | None = None, coords: dict[str, int] | None = None,
               params: dict[str, int] | None = None, memo: dict[int, Any] | None = None) -> Any:
    """``value`` with the given leaves replaced by host values and folded; the leaves not
    given stay (a partially evaluated expression, or an int when nothing is left)."""
    if not isinstance(value, Expr):
        return value
    return _eval(value, HostOps(counts, coords, params), {} if memo is None else memo)


# ---------------------------------------------------------------- host code generation
def _code(v: Expr, names: list[str]) -> str:
    """Python source of node ``v`` whose operands are named ``names``."""
    spec = OPS[v.op]
    if spec.code is not None:
        return spec.code.format(*names)
    vec = [size_of(a) is not None and i not in spec.static for i, a in enumerate(v.args)]
    xs = [f"x{i}" if is_vec else n for i, (is_vec, n) in enumerate(zip(vec, names))]
    inner = spec.text.format(*xs)
    inner = f"int{inner}" if v.op in ("eq", "land") else inner
    if not any(vec):
        return inner
    loop = ", ".join(f"x{i}" for i, is_vec in enumerate(vec) if is_vec)
    seqs = [n for is_vec, n in zip(vec, names) if is_vec]
    source = seqs[0] if len(seqs) == 1 else f"zip({', '.join(seqs)})"
    return f"tuple({inner} for {loop} in {source})"


def compile_host(outputs: Sequence[Any], guards: Sequence[tuple[Any, int]] = ()
                 ) -> Callable[[tuple, tuple], "tuple | None"]:
    """One Python function ``f(counts, params)`` computing every value of ``outputs``
    (host-known values: ints, tuples or expressions over the counts and :data:`PARAMS`)
    as a tuple, after checking ``guards`` (``(value, expected)``): ``None`` when a guard
    differs. Common subexpressions are computed once."""
    lines: list[str] = []
    names: dict[tuple, str] = {}
    env: dict[str, Any] = {"I": INTS}

    def name_of(v: Any) -> str:
        if type(v) is int:
            return repr(v)
        if not isinstance(v, Expr):
            k = ("const", v)
            if k not in names:
                names[k] = env_name = f"c{len(names)}"
                env[env_name] = v
            return names[k]
        if v.deps & COORD:
            raise ValueError(f"{render(v)} reads a rank coordinate: not host-known")
        k = v.key()
        if k not in names:
            if v.op == "counts":
                code = "n"
            elif v.op == "param":
                code = f"p[{PARAMS.index(v.args[0])}]"
            else:
                code = _code(v, [name_of(a) if isinstance(a, Expr) or i not in
                                 OPS[v.op].static else repr(a) for i, a in enumerate(v.args)])
            names[k] = f"t{len(names)}"
            lines.append(f"    {names[k]} = {code}")
        return names[k]

    checks = [f"{name_of(g)} != {int(want)}" for g, want in guards]
    if checks:  # after the guards' values, before the outputs' (name_of appends them)
        lines.append(f"    if {' or '.join(checks)}:\n        return None")
    tail = "".join(f"{name_of(v)}, " for v in outputs)
    src = "def _f(n, p):\n" + "\n".join(lines) + f"\n    return ({tail})\n"
    exec(compile(src, "<dpx host values>", "exec"), env)  # noqa: S102 - generated above
    return env.pop("_f")
