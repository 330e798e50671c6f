"""Prepared communicator calls: decide once, then run straight-line code.

A :class:`PreparedOp` is one ``DpComm`` call (gather, scatter, reduce_scatter, with its
plan and flags) whose checks have passed and whose program is bound
(:class:`~dpx_torch.program.PreparedCall`). A later call guards only what can change
between calls of the same structure -- the input's contiguity and autograd state, the
``out`` and ``counts`` tensors' shapes, dtypes, devices and contiguity, and where ``out``
lies against the input (an in-place gather's input must be its slot of ``out``; any other
overlap is refused) -- and runs the bound steps. A call the guards do not admit takes the
communicator's full path instead: its checks raise every error they raise on a first call,
and a valid new structure is prepared anew.

``DpComm`` keeps the prepared op of each plan and call it has run (the implicit form:
every ``gather`` / ``scatter`` / ``reduce_scatter`` after the first of its kind takes it),
and returns one from ``prepare_gather`` / ``prepare_scatter`` / ``prepare_reduce_scatter``
(the explicit form, for code that owns its tensors: a call then skips the lookup too).
With ``validate=True`` every call takes the full path (its host exchange is per call).

A :class:`PreparedClass` is what the calls of one *structure* share -- the plan's
structure (layout, mode, capacity, CP shards or not), the op and its flags, the input's
trailing shape, dtype and device: every check that depends on nothing else has passed for
it. A plan of a known structure with new counts (a serving step's first call of each op)
is prepared through it -- the rows checked, the schedule template evaluated for the
counts, the program bound -- without the full path.
"""

from __future__ import annotations

from typing import Any

import torch

from dpx.extents import op_rows
from dpx.modes import Op
from dpx.schedule import TemplateKey
from dpx_torch.program import CallShape, Host, PreparedCall
from dpx_torch.wire import split_wire

__all__ = ["PreparedClass", "PreparedOp"]

_compiling = torch.compiler.is_compiling
_grad = torch.is_grad_enabled


class PreparedOp:
    """A prepared call (see the module docstring). ``op(x, counts=..., out=...)`` runs it,
    or the communicator's full call when the guards do not admit the tensors."""

    __slots__ = ("prep", "full", "shape", "dtype", "device", "counts_shape", "out_shape",
                 "in_place", "split", "out_rows", "_xbytes", "_obytes")

    def __init__(self, prep: PreparedCall, full: tuple, x: torch.Tensor, *,
                 counts: torch.Tensor | None, out: torch.Tensor | None, in_place: bool,
                 split: bool) -> None:
        #: ``(method, plan, keywords)``: the communicator's full call of this op
        self.prep, self.full = prep, full
        self.shape, self.dtype, self.device = x.shape, x.dtype, x.device
        self.counts_shape = None if counts is None else counts.shape
        self.out_shape = None if out is None else out.shape
        self.out_rows = prep.out_rows
        self._xbytes = x.nbytes
        self._obytes = 0 if out is None else out.nbytes
        # an in-place gather's input lies this many bytes into ``out``
        self.in_place = (x.data_ptr() - out.data_ptr()) if in_place else None
        self.split = split

    def admits(self, x: torch.Tensor, counts: torch.Tensor | None,
               out: torch.Tensor | None) -> bool:
        """Whether a call with these tensors (``x`` of the prepared shape, dtype and
        device: the caller's key says so) runs the prepared steps."""
        if not x.is_contiguous() or (x.requires_grad and _grad()):
            return False
        if counts is not None:
            if counts.dtype is not torch.int32 or counts.shape != self.counts_shape \
                    or counts.device != self.device or not counts.is_contiguous():
                return False
        elif self.counts_shape is not None:
            return False
        if out is None:
            return self.out_shape is None
        if out.shape != self.out_shape or out.dtype is not self.dtype \
                or out.device != self.device or not out.is_contiguous():
            return False
        xp, op = x.data_ptr(), out.data_ptr()
        if self.in_place is not None:
            return xp - op == self.in_place
        # no overlap (two live allocations never share an address)
        return not (self._xbytes and self._obytes and xp < op + self._obytes
                    and op < xp + self._xbytes)

    def run(self, x: torch.Tensor, counts: torch.Tensor | None,
            out: torch.Tensor | None) -> Any:
        """The bound steps (the caller checked :meth:`admits`)."""
        prep = self.prep
        if out is None:
            out = (x.new_empty((self.out_rows, prep.shape.out_width), dtype=torch.uint8)
                   if prep.out_wire else x.new_empty((self.out_rows, *prep.shape.out_rest)))
        if counts is not None and counts.dim() == 2:
            counts = counts.reshape(-1)
        res = prep.run(x, out, counts)
        return split_wire(res, prep.shape.wire) if self.split else res

    def __call__(self, x: torch.Tensor, *, counts: torch.Tensor | None = None,
                 out: torch.Tensor | None = None) -> Any:
        if type(x) is torch.Tensor and not _compiling() and x.shape == self.shape \
                and x.dtype is self.dtype and x.device == self.device \
                and self.admits(x, counts, out):
            return self.run(x, counts, out)
        method, plan, kw = self.full
        return method(x, plan, counts=counts, out=out, **kw)


class PreparedClass:
    """The calls of one structure (see the module docstring): :meth:`prepare` makes the
    :class:`PreparedOp` of a plan of that structure, or None where the tensors need the
    full path (its checks say why)."""

    __slots__ = ("runner", "op", "tkey", "shape", "scratch_key", "device_counts", "full",
                 "split")

    def __init__(self, runner: Host, op: Op, tkey: TemplateKey, shape: CallShape,
                 full: tuple, *, split: bool) -> None:
        self.runner, self.op, self.tkey, self.shape = runner, op, tkey, shape
        self.device_counts, self.full, self.split = tkey.device_counts, full, split
        self.scratch_key = "caller"

    def prepare(self, plan, x: torch.Tensor, counts: torch.Tensor | None,
                out: torch.Tensor | None, in_place: bool) -> PreparedOp | None:
        runner = self.runner
        rows = op_rows(plan, self.op, runner.rank, device_counts=self.device_counts)
        in_rows = x.shape[0]
        if in_rows != rows.need if rows.exact else in_rows < rows.need:
            return None
        variant, hv = runner.schedules.variant(self.tkey, plan.leaf_counts, in_rows,
                                               rows.out)
        prep = runner.program(variant).prepare(hv, (in_rows, rows.out), self.shape,
                                               self.scratch_key, rows.need, rows.exact)
        method, _, kw = self.full
        op = PreparedOp(prep, (method, plan, kw), x, counts=counts, out=out,
                        in_place=in_place, split=self.split)
        return op if op.admits(x, counts, out) else None
