"""The rules on a call's tensors that every check and guard shares: an ``out=``'s shape,
dtype and device, and where two tensors' memory lies against each other.

Layer: passes. Imports dpx, the shims layer and the modules before it in its own row
(docs/semantics.md, "Where things live").
"""

from __future__ import annotations

import torch

from dpx.errors import DpxTypeError, DpxValueError

__all__ = ["check_out", "inside", "overlaps", "span"]


def inside(x: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether ``x``'s first byte lies inside ``out``: an in-place gather's input does (its
    prepared op has a key of its own; :func:`dpx_torch.fullpath.in_place` checks that it
    is exactly this rank's slot)."""
    o = out.data_ptr()
    return o <= x.data_ptr() < o + out.nbytes


def span(t: torch.Tensor) -> int:
    """The bytes from ``t``'s first element to the end of its last (its ``nbytes`` when
    contiguous; a strided view's elements lie farther apart)."""
    if t.is_contiguous() or not t.numel():
        return t.nbytes
    return (sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if s > 0) + 1) \
        * t.element_size()


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors' memory ranges overlap (two live allocations never share an
    address, so comparing the byte ranges is enough). Call it outside torch.compile
    tracing only: data pointers do not exist there."""
    a0, b0, na, nb = a.data_ptr(), b.data_ptr(), span(a), span(b)
    return bool(na and nb) and a0 < b0 + nb and b0 < a0 + na


def check_out(out: object, shape: tuple[int, ...], dtype: torch.dtype,
              device: torch.device, *, name: str = "") -> None:
    """The rule of every ``out=``: a tensor of ``dtype`` (else a :class:`dpx.DpxTypeError`
    naming the dtype) and of ``shape`` on ``device`` (else a :class:`dpx.DpxValueError`);
    ``name`` prefixes the message."""
    if not isinstance(out, torch.Tensor):
        raise DpxTypeError(f"{name}out must be a torch.Tensor, got {type(out).__name__}")
    if out.dtype != dtype:
        raise DpxTypeError(f"{name}out has dtype {out.dtype}; it must be {dtype} (the "
                           f"input's)")
    if tuple(out.shape) != tuple(shape) or out.device != device:
        raise DpxValueError(f"{name}out has shape {tuple(out.shape)} {out.dtype} on "
                            f"{out.device}; it must be {tuple(shape)} {dtype} on {device}")
