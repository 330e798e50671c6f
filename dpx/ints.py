"""The integer operations every row computation uses on host ints: scalars and tuples of
ints (vectors). :mod:`dpx.geometry` writes where rows lie against an ops namespace --
:data:`INTS` here, or :mod:`dpx.expr`, which folds its constant operands with :data:`INTS`
so the two never differ."""

from __future__ import annotations

import operator
from itertools import accumulate, repeat
from typing import Any, Callable

__all__ = ["INTS", "Ints"]


def _each(fn: Callable[[int, int], int]) -> Callable[[Any, Any], Any]:
    """``fn`` on two ints, a vector and an int, or two vectors of one length."""
    def op(a: Any, b: Any) -> Any:
        ta, tb = type(a) is tuple, type(b) is tuple
        if not ta and not tb:
            return fn(a, b)
        if ta and tb:
            if len(a) != len(b):
                raise ValueError(f"vector lengths differ: {len(a)} and {len(b)}")
            return tuple(map(fn, a, b))
        return tuple(map(fn, a, repeat(b, len(a)))) if ta else \
            tuple(map(fn, repeat(a, len(b)), b))
    return staticmethod(op)


class Ints:
    """The geometry's operations on host ints (scalars) and tuples of ints (vectors).
    :mod:`dpx.expr` folds constant operands with these, so the two never differ."""

    add = _each(operator.add)
    sub = _each(operator.sub)
    mul = _each(operator.mul)
    floordiv = _each(operator.floordiv)
    minimum = _each(min)
    maximum = _each(max)
    eq = _each(lambda x, y: int(x == y))
    land = _each(lambda x, y: int(bool(x) and bool(y)))

    clip = staticmethod(lambda a, lo, hi: Ints.minimum(Ints.maximum(a, lo), hi))
    vmax = staticmethod(lambda v: max(v, default=0))
    vsum = staticmethod(sum)
    vall = staticmethod(lambda v: int(all(v)))
    repeat = staticmethod(lambda s, n: (s,) * n)
    gather = staticmethod(lambda v, indices: tuple(v[i] for i in indices))
    index = staticmethod(lambda v, i: v[i])
    exclusive_cumsum = staticmethod(lambda v: tuple(accumulate(v, initial=0))[:-1])

    @staticmethod
    def ceil_align(a: Any, m: int) -> Any:
        if m == 1:
            return a
        return tuple(-(-x // m) * m for x in a) if type(a) is tuple else -(-a // m) * m

    @staticmethod
    def ceil_div(a: Any, k: int) -> Any:
        return tuple(-(-x // k) for x in a) if type(a) is tuple else -(-a // k)

    @staticmethod
    def group_sum(v: tuple, k: int) -> tuple:
        return v if k == 1 else tuple(sum(v[i:i + k]) for i in range(0, len(v), k))

    @staticmethod
    def group_cumsum_excl(v: tuple, k: int) -> tuple:
        return tuple(x for i in range(0, len(v), k) for x in Ints.exclusive_cumsum(v[i:i + k]))


#: The host-int namespace of the geometry.
INTS = Ints()
