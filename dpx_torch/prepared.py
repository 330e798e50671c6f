"""Prepared communicator calls: decide once, then run straight-line code.

Layer: call paths. Imports dpx, the shims, passes, transports and runner layers and the
modules before it in its own row (docs/semantics.md, "Where things live").

A :class:`PreparedOp` is one ``DpComm`` call (gather, scatter, reduce_scatter,
scatter_columns, with its plan and flags) whose checks have passed and whose program is
bound (:class:`~dpx_torch.program.PreparedCall`). A later call of the same
:class:`CallKey` -- or one repeating the last call of its op, matched by its arguments'
identity before any key is built (:attr:`PreparedOps.last`) -- is guarded by
:meth:`PreparedOp.admits`, the one guard of every call form: the input's type, shape,
dtype, device, contiguity and autograd state, the ``out`` and ``counts`` tensors' shapes,
dtypes, devices and contiguity, and where ``out`` lies against the input (an in-place
gather's input must be its slot of ``out``; any other overlap is refused); then the bound
steps run. A call the guards do not admit
takes the communicator's full path instead (:mod:`dpx_torch.fullpath`): its checks raise
every error they raise on a first call, and a valid new structure is prepared anew.

Every promise of the full path holds for a prepared op: while the communicator validates
(``validate=True``) or after it was destroyed, every call -- implicit, or of an op held
from ``prepare_*`` -- takes the full path, which exchanges and checks, or raises that the
communicator was destroyed (:class:`~dpx_torch.lifecycle.Lifecycle`). ``destroy()`` also
drops every held op's program (and so every reference it kept to a process group).

:class:`PreparedOps` is a communicator's one cache of prepared ops (least recently used
first out, ``CacheLimits.calls`` entries), keyed by :class:`CallKey`: every call form
looks its program up there -- the implicit fast path, the full path, autograd (forward and
backward), ``*_async`` and several-tensor gathers. It hands out the explicit ops of
``prepare_*`` and keeps track of them for ``destroy()``. With each op of the default form
it keeps its :class:`PreparedClass`: what the ops of one plan *structure* share, from
which a plan of that structure with new counts (a serving step's first call of each op) is
prepared without the full path -- its rows, ``out=`` and device counts checked against the
structure, the schedule template evaluated for the counts, the program bound.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, NamedTuple

import torch

from dpx.extents import op_rows
from dpx.geometry import Structure
from dpx.modes import Op
from dpx.plan import DpPlan
from dpx.routes import TemplateKey
from dpx_torch.lifecycle import Lifecycle
from dpx.lru import LRU
from dpx_torch.binders import CallContext, RunnerView
from dpx_torch.program import PreparedCall, flat_counts
from dpx_torch.tensors import inside
from dpx_torch.wire import split_wire

__all__ = ["call_key", "CallKey", "ClassKey", "plain", "PreparedClass", "PreparedOp",
           "PreparedOps"]

_compiling = torch.compiler.is_compiling
_grad = torch.is_grad_enabled
_new = tuple.__new__
_Tensor = torch.Tensor


class CallKey(NamedTuple):
    """What decides a call's prepared program: the key of :class:`PreparedOps`."""

    #: the :class:`dpx.Op`'s value (``"gather"``, ``"scatter"``, ...)
    op: str
    plan: DpPlan
    partial: bool
    #: the ``wire=`` argument as given; with nvfp4's ``wire_scale``: ``(wire, scale)``
    wire: Any
    dequantize: bool
    #: the input's shape, dtype and device
    shape: torch.Size
    dtype: torch.dtype
    device: torch.device
    #: whether device counts / ``out=`` are given, and whether the input lies inside
    #: ``out`` (an in-place gather: its own program)
    counts: bool
    out: bool
    in_place: bool
    #: which form runs it where the forms' programs differ: ``""`` (a call on the caller's
    #: stream), ``"comm"`` (``*_async``), ``"caller#i"`` (tensor ``i`` of a several-tensor
    #: gather), ``("adjoint", rows)`` (a backward into ``rows`` rows)
    form: Any = ""


def call_key(op: str, plan: DpPlan, partial: bool, wire: Any, wire_scale: Any,
             dequantize: Any, x: torch.Tensor, counts: Any, out: Any, in_place: bool,
             form: Any = "") -> CallKey:
    """The :class:`CallKey` of a call, the one place keys are made (every call form looks
    up the keys the full path stores): ``wire`` as given, beside nvfp4's ``wire_scale``
    when one is given; ``counts`` and ``out`` count only as given or not. Made without
    NamedTuple's Python-level constructor (a quarter of a microsecond a call)."""
    return _new(CallKey, (op, plan, partial, wire if wire_scale is None else (wire, wire_scale),
                          dequantize, x.shape, x.dtype, x.device, counts is not None,
                          out is not None, in_place, form))


def plain(x: Any, counts: Any, out: Any) -> bool:
    """Whether a call's tensors can make its key: ``x`` a plain tensor (not a subclass,
    not several), ``counts`` and ``out`` plain tensors or not given, and no torch.compile
    trace running (a traced call takes the full path and its traceable steps).
    :meth:`PreparedOp.admits` holds the same rule."""
    return type(x) is _Tensor and (out is None or type(out) is _Tensor) \
        and (counts is None or type(counts) is _Tensor) and not _compiling()


class PreparedOp:
    """A prepared call (see the module docstring). ``op(x, counts=..., out=...)`` runs it,
    or the communicator's full call when the guards do not admit the tensors, the
    communicator validates, or it was destroyed."""

    __slots__ = ("prep", "full", "life", "shape", "dtype", "device", "counts_shape",
                 "out_shape", "in_place", "split", "out_rows", "_xbytes", "_obytes", "_index",
                 "_cuda", "_one", "__weakref__")

    def __init__(self, prep: PreparedCall, full: tuple, life: Lifecycle, x: torch.Tensor, *,
                 counts: torch.Tensor | None, out: torch.Tensor | None, in_place: bool,
                 split: bool) -> None:
        #: ``(method, plan, keywords)``: the communicator's full call of this op
        self.prep: PreparedCall | None = prep
        self.full, self.life = full, life
        self.shape, self.dtype, self.device = x.shape, x.dtype, x.device
        #: a CUDA device's index, cheaper to compare than the device (CUDA tensors only)
        self._index = x.get_device()
        self._cuda = x.is_cuda
        self.counts_shape = None if counts is None else counts.shape
        self.out_shape = None if out is None else out.shape
        self.out_rows = prep.out_rows
        self._xbytes = x.nbytes
        self._obytes = 0 if out is None else out.nbytes
        #: an in-place gather's input lies this many bytes into ``out`` (None: not one)
        self.in_place = (x.data_ptr() - out.data_ptr()) if in_place else None
        self.split = split
        #: the one step that is the whole run of an ``out=`` call on host counts (the
        #: output needs no making, no splitting; see :meth:`PreparedCall.one_step`)
        self._one = prep.one_step() if out is not None and counts is None and not split \
            else None

    def admits(self, x: Any, counts: Any, out: Any) -> bool:
        """Whether a call with these arguments runs the prepared steps: the guard of every
        call form (:func:`plain`'s rule, ``x``'s shape, dtype and device, contiguity,
        autograd state, ``counts`` and ``out``, and where ``out`` lies against ``x``)."""
        cuda, index = self._cuda, self._index
        if type(x) is not _Tensor or x.shape != self.shape or x.dtype is not self.dtype \
                or not (x.is_cuda and x.get_device() == index if cuda
                        else x.device == self.device) \
                or not x.is_contiguous() or (x.requires_grad and _grad()) or _compiling():
            return False
        if counts is not None:
            if type(counts) is not _Tensor or counts.dtype is not torch.int32 \
                    or counts.shape != self.counts_shape or counts.device != self.device \
                    or not counts.is_contiguous():
                return False
        elif self.counts_shape is not None:
            return False
        if out is None:
            return self.out_shape is None
        if type(out) is not _Tensor or out.shape != self.out_shape \
                or out.dtype is not self.dtype \
                or not (out.is_cuda and out.get_device() == index if cuda
                        else out.device == self.device) or not out.is_contiguous():
            return False
        xp, op = x.data_ptr(), out.data_ptr()
        if self.in_place is not None:
            return xp - op == self.in_place
        # no overlap (two live allocations never share an address)
        return not (self._xbytes and self._obytes and xp < op + self._obytes
                    and op < xp + self._xbytes)

    def run(self, x: torch.Tensor, counts: torch.Tensor | None,
            out: torch.Tensor | None) -> Any:
        """The bound steps (the caller checked :meth:`admits` and the lifecycle)."""
        one = self._one
        if one is not None:
            one(x, out, None)
            return out
        prep = self.prep
        res = prep.run(x, prep.new_out(x) if out is None else out,
                       counts if counts is None else flat_counts(counts))
        return split_wire(res, prep.context.wire) if self.split else res

    def __call__(self, x: torch.Tensor, *, counts: torch.Tensor | None = None,
                 out: torch.Tensor | None = None) -> Any:
        if self.life.fast and self.admits(x, counts, out):
            return self.run(x, counts, out)
        method, plan, kw = self.full
        return method(x, plan, counts=counts, out=out, **kw)


class ClassKey(NamedTuple):
    """What the prepared ops of one *structure* share (the key of a
    :class:`PreparedClass`): a :class:`CallKey` of the default form with the plan's
    structure for the plan and the input's trailing shape for its shape."""

    op: str
    structure: Structure
    partial: bool
    wire: Any
    dequantize: bool
    rest: torch.Size
    dtype: torch.dtype
    device: torch.device
    counts: bool
    out: bool
    in_place: bool

    @staticmethod
    def of(key: CallKey) -> "ClassKey":
        """The class key of a call (built without NamedTuple's Python-level constructor:
        a new plan of a known structure builds one per call)."""
        return _new(ClassKey, (key.op, key.plan.structure, key.partial, key.wire,
                               key.dequantize, key.shape[1:], key.dtype, key.device,
                               key.counts, key.out, key.in_place))


class PreparedClass:
    """The calls of one structure: every check that depends on nothing but the structure
    has passed for them. :meth:`prepare` makes the :class:`PreparedOp` of a plan of that
    structure with new counts -- its rows checked, the schedule template evaluated for
    the counts, the program bound -- or None where the tensors need the full path (its
    checks say why)."""

    __slots__ = ("runner", "life", "op", "tkey", "context", "method", "keywords", "_rest",
                 "_counts_shape")

    def __init__(self, runner: RunnerView, life: Lifecycle, op: Op, tkey: TemplateKey,
                 context: CallContext, method: Callable[..., Any], keywords: dict,
                 counts_shape: torch.Size | None) -> None:
        self.runner, self.life, self.op, self.tkey = runner, life, op, tkey
        self.context, self.method, self.keywords = context, method, keywords
        self._rest = torch.Size(context.out_rest)   # an output row's shape
        #: the device counts' shape (the structure's: [dp], or [dp, cp] shards)
        self._counts_shape = counts_shape

    def prepare(self, plan: DpPlan, x: torch.Tensor, counts: torch.Tensor | None,
                out: torch.Tensor | None, in_place: bool) -> PreparedOp | None:
        runner = self.runner
        rows = op_rows(plan, self.op, runner.rank, device_counts=self.tkey.device_counts)
        in_rows = x.shape[0]
        if in_rows != rows.need if rows.exact else in_rows < rows.need:
            return None
        if out is not None and (out.shape[0] != rows.out or out.shape[1:] != self._rest):
            return None
        if counts is not None and counts.shape != self._counts_shape:
            return None
        variant, hv = runner.schedules.variant(self.tkey, plan.leaf_counts, in_rows,
                                               rows.out)
        prep = runner.program(variant).prepare(hv, (in_rows, rows.out), self.context,
                                               "caller", rows.need, rows.exact)
        op = PreparedOp(prep, (self.method, plan, self.keywords), self.life, x,
                        counts=counts, out=out, in_place=in_place, split=prep.out_wire)
        return op if op.admits(x, counts, out) else None


_OPS = tuple(op.value for op in Op)
#: an entry of :attr:`PreparedOps.last` no call's arguments match
_NO_CALL = (object(),) * 5 + (None, None)


class PreparedOps:
    """The prepared ops of one communicator (see the module docstring): at most ``limit``
    of them and ``limit`` classes, each least recently used first out. ``full(op)`` is the
    communicator's public method of an op (what a prepared op falls back to);
    ``in_place(x, out, plan, counts)`` says whether a gather is in place."""

    def __init__(self, life: Lifecycle, runner: RunnerView, limit: int,
                 full: Callable[[str], Callable[..., Any]],
                 in_place: Callable[..., bool]) -> None:
        self.life, self.runner = life, runner
        self.ops = LRU(limit)
        self.classes = LRU(limit)
        self._get, self._touch = self.ops.lookups()
        self._full, self._in_place = full, in_place
        self._held: weakref.WeakSet[PreparedOp] = weakref.WeakSet()
        #: per op (its value): ``(plan, partial, wire, wire_scale, dequantize, op, entry)``
        #: of the last call the fast path ran -- a call repeating those arguments (the same
        #: objects) is matched without building its key, then guarded by
        #: :meth:`PreparedOp.admits`; ``entry`` is the op's in the cache, refreshed by
        #: :meth:`again` (one entry per op: bounded)
        self.last: dict[str, tuple] = dict.fromkeys(_OPS, _NO_CALL)

    def __len__(self) -> int:
        return len(self.ops)

    def find(self, key: CallKey, x: torch.Tensor, counts: torch.Tensor | None,
             out: torch.Tensor | None) -> PreparedOp | None:
        """The fast path's lookup: the kept op of ``key`` when it admits these tensors, or
        one made from the class of ``key``'s structure (kept), or None: the call needs
        the full path, or (an input inside ``out`` looked up under a key that is not in
        place) its in-place key."""
        e = self._get(key)            # ops.hit(key), inlined
        if e is not None:
            self._touch(e[1])
            return e[0] if e[0].admits(x, counts, out) else None
        if key.form != "" or not isinstance(key.plan, DpPlan) or x.dim() < 1 or (
                out is not None and (out.dim() < 1 or (not key.in_place and inside(x, out)))):
            # the full path's errors, an in-place gather's own key, or a form whose ops no
            # class makes
            return None
        cls = self.classes.hit(ClassKey.of(key))
        if cls is None:
            return None
        # an input inside out: exactly this rank's slot of it, or the full path's error
        in_place = key.in_place and self._in_place(x, out, key.plan, counts)
        op = cls.prepare(key.plan, x, counts, out, in_place)
        if op is not None:
            self.ops.put(key, op)
        return op

    def lookup(self, op: str, args: tuple, x: Any, counts: Any, out: Any, form: Any = ""
               ) -> PreparedOp | None:
        """The fast path's op of a call of ``op`` with ``args``, its ``(plan, partial,
        wire, wire_scale, dequantize)``, found under its key (:meth:`find`; an input inside
        ``out``: under its in-place key) and, in the default ``form``, kept as the last call
        of ``op`` (:attr:`last`); None: the full path (also for arguments no key is made
        of: not :func:`plain`, a ``partial`` not a bool, a ``wire_scale`` not a float)."""
        if not plain(x, counts, out) or type(args[1]) is not bool \
                or not (args[3] is None or type(args[3]) is float):
            return None
        key = call_key(op, *args, x, counts, out, False, form)
        found = self.find(key, x, counts, out)
        if found is None and out is not None and inside(x, out):
            key = key._replace(in_place=True)
            found = self.find(key, x, counts, out)
        if found is not None and form == "":
            self.last[op] = (*args, found, self._get(key))
        return found

    def again(self, op: str, plan: Any, partial: Any, wire: Any, wire_scale: Any,
              dequantize: Any, x: Any, counts: Any, out: Any) -> PreparedOp | None:
        """The op of a call repeating the last call of ``op`` -- the same ``plan``,
        ``partial``, ``wire``, ``wire_scale`` and ``dequantize`` objects -- when it admits
        these tensors (:attr:`last`), or None. Its cache entry is refreshed: a hot op stays
        the most recently used (one evicted since is held by the match alone)."""
        last = self.last[op]
        if last[0] is plan and last[1] is partial and last[2] is wire \
                and last[3] is wire_scale and last[4] is dequantize \
                and last[5].admits(x, counts, out):
            if last[6] is not None:
                try:
                    self._touch(last[6][1])
                except KeyError:   # evicted since: held by the match alone from now on
                    self.last[op] = last[:6] + (None,)
            return last[5]
        return None

    def get(self, key: CallKey) -> PreparedOp | None:
        """The op of ``key`` (refreshed), or None."""
        return self.ops.hit(key)

    def make(self, key: CallKey, prep: PreparedCall, x: torch.Tensor, *,
             counts: torch.Tensor | None, out: torch.Tensor | None, in_place: bool,
             keywords: dict, keep: bool = True) -> PreparedOp:
        """A new prepared op of ``key`` for tensors like these: kept unless ``keep`` is
        False (a call traced by torch.compile keeps nothing), and for a call on the
        caller's stream its class too (the next plan of its structure is prepared from
        it)."""
        method = self._full(key.op)
        op = PreparedOp(prep, (method, key.plan, keywords), self.life, x, counts=counts,
                        out=out, in_place=in_place, split=prep.out_wire)
        if keep:
            self.ops.put(key, op)
            if key.form == "":
                self.classes.put(ClassKey.of(key), PreparedClass(
                    self.runner, self.life, Op(key.op), prep.variant.key, prep.context,
                    method, keywords, op.counts_shape))
        return op

    def hold(self, op: PreparedOp) -> PreparedOp:
        """Hand ``op`` to a caller (``prepare_*``): ``destroy()`` will drop its program."""
        self._held.add(op)
        return op

    def clear(self) -> None:
        self.ops.clear()
        self.classes.clear()
        self.last = dict.fromkeys(_OPS, _NO_CALL)

    def sever(self) -> None:
        """Drop every op's program, held ones too (``destroy()``): after this, every op
        takes the full path, which raises that the communicator was destroyed."""
        for op in list(self._held):
            op.prep = op._one = None
        self._held = weakref.WeakSet()
        self.clear()
        self.runner = self._in_place = None   # type: ignore[assignment]
