"""Copies folded away. On a world of one rank every collective is a copy between two
buffers (:meth:`dpx.steps.Step.alone`), and the passes around it can take its place:

- a pass writing the first rows of a buffer (a move or a quantize, zeros after its
  rows), then the zeroing of that buffer's rows after them, is one pass writing both (its
  own zeros reach further); a copy whose tail the zeroing clears is one take of the rows
  the zeroing keeps;
- a copy whose source is a scratch buffer that one earlier pass writes, and nothing else
  uses, is that pass writing the copy's destination instead;
- a copy whose destination is a scratch buffer that one later pass reads, and nothing else
  uses, is that pass reading the copy's source instead.

What each pass computes is unchanged, with one pass over the rows less. A *copy* is a
:class:`~dpx.steps.Move` of ``rows`` rows from row 0 of a buffer to row 0 of another; the
rows a pass writes and reads are :func:`written` and :func:`read`; every condition on them
is asked of the emitter (``known``: a condition true for this call and host-known, kept
as the template's guard) -- a row number only the device knows folds nothing.

What the emitters guarantee and the folds rely on: a copy moves rows between buffers of
one kind (both wire rows, both wide, or both the input's dtype); a pass writing a buffer
from row 0 writes every row of it up to its :func:`written` rows; and the passes read and
write different buffers (a pass made to read the copy's source never writes it).
"""

from __future__ import annotations

from typing import Any, Callable

from dpx import expr as X
from dpx.steps import (Dequantize, DequantizeSum, JoinColumns, Move, Pack, Quantize,
                       Ref, SplitColumns, Step, Unpack, Zero)

__all__ = ["fold_copies", "read", "written"]


def written(s: Step) -> Any:
    """The rows ``k``: ``s`` writes ``s.dst[:k]``, every row of it (None: not such a pass)."""
    kind = type(s)
    if kind in (Move, Quantize, Dequantize, DequantizeSum, Unpack, JoinColumns):
        return s.rows  # type: ignore[attr-defined]
    if kind in (Pack, SplitColumns):
        n = X.size_of(s.lens) if kind is Pack else s.parts  # type: ignore[attr-defined]
        return X.mul(n, s.block)  # type: ignore[attr-defined]
    return None


def read(s: Step) -> Any:
    """The rows ``k``: ``s`` reads nothing of ``s.src`` past ``s.src[:k]`` (None: not
    known)."""
    kind = type(s)
    if kind in (Move, Quantize):   # rows from its start
        return X.add(s.src_start if kind is Move else s.start, s.count)
    if kind is Dequantize:
        return s.rows
    if kind in (DequantizeSum, JoinColumns):
        return X.mul(s.parts, s.rows if kind is DequantizeSum else s.block)
    if kind is Unpack:
        return X.mul(X.size_of(s.lens), s.block)
    if kind is SplitColumns:
        return s.count
    return None


def _bufs(s: Step) -> set[str]:
    return {v.buf for v in s.fields().values() if isinstance(v, Ref)}


def _writes(s: Step) -> set[str]:
    f = s.fields()
    return {f[k].buf for k in ("dst", "buf") if k in f}


def _with(s: Step, **fields: Any) -> Step:
    return type(s)(**{**s.fields(), **fields})


def fold_copies(steps: list[Step], scratch: dict[str, Any], known: Callable[[Any], bool]
                ) -> list[Step]:
    """``steps`` with every copy that can be folded folded (see the module docstring); a
    scratch buffer no step uses any more leaves ``scratch``. ``known(cond)``: whether a
    condition holds for every call of the schedule. (An in-place gather's schedule is not
    folded: its input lies inside ``out``, which buffer names do not show.)"""
    def same(a: Any, b: Any) -> bool:
        return a is not None and b is not None and known(X.eq(a, b))

    def le(a: Any, b: Any) -> bool:
        return a is not None and b is not None and known(X.eq(X.minimum(a, b), a))

    def first(ref: Any) -> bool:   # a buffer's first rows (a view from row 0, or the whole)
        return isinstance(ref, Ref) and same(ref.first, 0)

    def copy(s: Any) -> bool:   # a Move of its rows from row 0 to row 0
        return first(s.src) and first(s.dst) and same(s.src_start, 0) \
            and same(s.dst_start, 0) and same(s.count, s.rows)

    def only_user(buf: str, i: int) -> int | None:   # the one other step using buf
        users = [j for j, t in enumerate(steps) if j != i and buf in _bufs(t)]
        return users[0] if len(users) == 1 and buf in scratch else None

    # (the structure first, the row numbers last: each row condition asked is a guard)
    steps = list(steps)
    i = 0
    while i < len(steps):
        s = steps[i]
        z = steps[i + 1] if i + 1 < len(steps) else None
        if type(s) in (Move, Quantize) and type(z) is Zero and s.src.buf != s.dst.buf \
                and z.buf == Ref(s.dst.buf) and first(s.dst) and same(z.keep_start, 0) \
                and le(s.rows, z.rows):
            if same(z.keep_count, s.rows):   # its own zeros reach on to z's rows
                steps[i:i + 2] = [_with(s, dst=z.buf, rows=z.rows)]
                continue
            if type(s) is Move and copy(s) and le(z.keep_count, s.rows):   # then a take
                steps[i:i + 2] = [Move(s.src, z.buf, z.rows, 0, 0, z.keep_count)]
                continue
        if type(s) is not Move or s.src.buf == s.dst.buf:
            i += 1
            continue
        src, dst = s.src.buf, s.dst.buf
        j = only_user(src, i)
        w = steps[j] if j is not None and j < i else None
        if w is not None and isinstance(getattr(w, "dst", None), Ref) and w.dst.buf == src \
                and _bufs(w) & {src, dst} == {src} \
                and not any(dst in _bufs(t) for t in steps[j + 1:i]) \
                and copy(s) and first(w.dst) and same(written(w), s.rows):
            steps[j] = _with(w, dst=s.dst)
            del steps[i]
            scratch.pop(src)
            continue
        j = only_user(dst, i)
        r = steps[j] if j is not None and j > i else None
        view = getattr(r, "src", None)
        if r is not None and isinstance(view, Ref) and view.buf == dst \
                and not _writes(r) & {src, dst} \
                and not any(src in _writes(t) for t in steps[i + 1:j]) \
                and copy(s) and first(view) and le(read(r), s.rows) \
                and (view.rows is None or le(view.rows, s.rows)):
            steps[j] = _with(r, src=s.src if view.rows is None else Ref(src, 0, view.rows))
            del steps[i]
            scratch.pop(dst)
            continue
        i += 1
    return steps
