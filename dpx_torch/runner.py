"""What a :class:`dpx_torch.DpComm` runs its calls with: the schedules, compiled programs,
device tables, scratch pool, overflow flags and the comm stream -- every piece of state
below the prepared ops (:mod:`dpx_torch.prepared`), with one bound each
(:class:`CacheLimits`) and one ``clear()``.

Layer: runner. Imports dpx, the shims, passes and transports layers and the modules before
it in its own row (docs/semantics.md, "Where things live").

:meth:`Runner.prepare` binds one call: the plan's *structure*
(:attr:`dpx.DpPlan.structure`) selects a schedule template in the
:class:`dpx.ScheduleCache`; the template's generated function computes the call's host
values from the counts (and picks the variant whose guards they meet); the variant's
compiled :class:`~dpx_torch.program.Program` binds them into a new prepared call. New
counts of a known structure therefore cost one generated function call and one binding,
never a new schedule. The prepared calls themselves are kept by the communicator's
:class:`~dpx_torch.prepared.PreparedOps`.

Every cache is least recently used first out (:class:`~dpx.lru.LRU`). The bounds
are entries; the host bytes they hold were measured (benchmarks/soak.py; docs/semantics.md,
"In a server"), and :meth:`Runner.host_bytes` estimates them at run time.
"""

from __future__ import annotations

import contextlib
import sys
import types
from dataclasses import dataclass, fields
from typing import Any, Callable, NamedTuple

import torch

from dpx.errors import DpxPeerError, DpxValueError, check_int
from dpx.extents import OpRows, op_rows
from dpx.layout import DpLayout
from dpx.modes import Group, Op, Transport, Wire
from dpx.transport import TransportChoice
from dpx.plan import DpPlan
from dpx.routes import TemplateKey
from dpx.schedule import ScheduleCache, Variant
from dpx.steps import OUT
from dpx.wire import dequantized, in_place_schedule
from dpx_torch.flags import OverflowFlags
from dpx_torch.groups import DpGroups
from dpx_torch.shims.triton_launch import Launcher
from dpx.lru import LRU
from dpx_torch.ops import OpPasses
from dpx_torch.overlap import Overlap
from dpx_torch.passes import Passes, TorchPasses, TritonPasses
from dpx_torch.peer import PeerOptions, PeerTransport, open_transport
from dpx_torch.pool import BufferPool
from dpx_torch.shims.coalescing import Coalescing
from dpx_torch.binders import CallContext
from dpx_torch.program import BatchProgram, DeviceTables, FreshTables, PreparedCall, Program

__all__ = ["CacheLimits", "CacheMethods", "Call", "Runner"]


@dataclass(frozen=True)
class CacheLimits:
    """The bounds of a communicator's caches, in entries (each least recently used first
    out). ``calls``: prepared ops by :class:`~dpx_torch.prepared.CallKey` (plan, op,
    flags, input shape/dtype/device, call form), and as many classes of them (plan
    structures; :mod:`dpx_torch.prepared`);
    ``templates`` / ``variants``: schedule templates by plan structure, and variants per
    template; ``programs``: compiled programs (one per variant in use); ``batches``:
    lockstep programs of several-tensor gathers; ``tables``: device copies of host index
    tables; ``kernels``: compiled Triton kernels launched directly (one per kernel
    specialisation in use). The CUDA passes also keep their 256 most recent bound launches
    (``launches`` in ``cache_sizes()``; a fixed bound)."""

    calls: int = 64
    templates: int = 64
    variants: int = 4
    programs: int = 128
    batches: int = 32
    tables: int = 256
    kernels: int = 128

    def __post_init__(self) -> None:
        for f in fields(self):   # every bound a count; a schedule cache holds at least one
            check_int(f"CacheLimits({f.name})", getattr(self, f.name),
                      minimum=1 if f.name in ("templates", "variants") else 0)


class Call(NamedTuple):
    """One differentiable call: its plan, op, device counts (or None), the input's rows
    (the rows of the gradient the backward returns), the output's rows, and its prepared
    call (None in what an autograd graph keeps: the graph holds no program, so no process
    group)."""

    plan: DpPlan
    op: Op
    counts: torch.Tensor | None
    in_rows: int
    out_rows: int
    prep: PreparedCall | None


class Runner:
    """Runs schedules for one communicator's groups (see the module docstring).
    ``transport``: what its world steps can do -- ``PER_ROOT``, torch.distributed's
    collectives (per-root broadcasts / reduces with host sizes), or ``PEER``, puts and
    pulls in the ranks' shared memory (:attr:`peer`, :mod:`dpx_torch.peer`) -- which
    decides how each mode moves its rows. ``passes``: the local passes per device type (the
    Triton kernels through this runner's :class:`~dpx_torch.shims.triton_launch.Launcher`
    on CUDA, torch ops on CPU)."""

    def __init__(self, groups: DpGroups, limits: CacheLimits) -> None:
        self.groups, self.limits = groups, limits
        self.transport = Transport.PER_ROOT
        #: the peer transport (:meth:`open_peer`), or None
        self.peer: PeerTransport | None = None
        self.rank = groups.rank
        self.schedules = ScheduleCache(max_templates=limits.templates,
                                       max_variants=limits.variants)
        self.tables = DeviceTables(max_entries=limits.tables)
        self.pool = BufferPool()
        self.flags = OverflowFlags()
        self.overlap = Overlap(self.pool)
        self.launcher = Launcher(max_entries=limits.kernels)
        #: the CUDA passes (their bound launches are cached)
        self.triton = TritonPasses(self.launcher)
        self.passes: dict[str, Passes] = {"cuda": self.triton, "cpu": TorchPasses()}
        self._collectives: dict[tuple, Any] = {}
        #: grouped launches (:mod:`dpx_torch.shims.coalescing`)
        self.coalescing = Coalescing()
        self._programs = LRU(limits.programs)
        self._batches = LRU(limits.batches)

    def open_peer(self, layout: DpLayout, exchange: Callable[[Any], list],
                  requested: Transport | str, options: PeerOptions | None,
                  on_failure: Callable[[DpxPeerError], None]) -> TransportChoice:
        """Choose the transport with every rank (collective over the host group) and, for
        the peer transport, open its workspace; :attr:`transport` follows."""
        self.peer, choice = open_transport(layout, self.rank, exchange, requested, options,
                                           self.launcher, on_failure)
        self.transport = choice.transport
        return choice

    def collective(self, bind: Callable[[Any], Any], group: Any) -> Any:
        """``bind(group)`` (a :mod:`dpx_torch.collectives` binder), made once per group
        and binder (a fixed set: seven binders, three groups). Under torch.compile
        tracing, made afresh."""
        if torch.compiler.is_compiling():
            return bind(group)
        key = (bind, group)
        fn = self._collectives.get(key)
        if fn is None:
            fn = self._collectives[key] = bind(group)
        return fn

    def passes_for(self, device: torch.device) -> Passes:
        p = self.passes.get(device.type)
        if p is None:
            raise DpxValueError(f"device {device} is not supported: dpx runs on cuda or cpu")
        return p

    # ------------------------------------------------------------ preparing a call
    def prepare(self, plan: DpPlan, op: Op, x: torch.Tensor, *, partial: bool,
                device_counts: bool, wire: Wire = Wire.NATIVE, dequantize: bool = True,
                wire_scale: float | None = None, in_place: bool = False,
                out_rows: int | None = None,
                scratch_key: str = "caller", rows: OpRows | None = None,
                ride: bool = False) -> PreparedCall:
        """The call's prepared program for an input shaped like ``x`` (see the module
        docstring). ``rows``: the op's :func:`dpx.extents.op_rows`, when the caller has
        them. Under torch.compile tracing nothing is cached: the schedule is built and
        bound afresh, through the custom ops, in plain Python the tracer follows."""
        compiling = torch.compiler.is_compiling()
        if rows is None:
            rows = op_rows(plan, op, self.rank, device_counts=device_counts)
        out = rows.out if out_rows is None else out_rows
        in_rows = x.shape[0]
        tkey = self.template_key(plan, op, partial=partial, device_counts=device_counts,
                                 wire=wire, dequantize=dequantize, in_place=in_place,
                                 ride=ride, device=x.device)
        counts = plan.leaf_counts
        if compiling:
            variant, values = ScheduleCache(max_templates=1).variant(
                tkey, counts, in_rows, out, compiled=False)
            program, passes, tables = Program(variant), OpPasses(), FreshTables()
        else:
            variant, values = self.schedules.variant(tkey, counts, in_rows, out)
            program, passes, tables = self.program(variant), self.passes_for(x.device), \
                self.tables
        context = CallContext(x, OUT in variant.wire_bufs, passes, tables, self,
                              variant.wide_bufs, plan.layout.world_size, wire, wire_scale)
        return program.prepare(values, (in_rows, out), context, scratch_key, rows.need,
                               rows.exact)

    def template_key(self, plan: DpPlan, op: Op, *, partial: bool, device_counts: bool,
                     wire: Wire, dequantize: bool, in_place: bool,
                     ride: bool = False, device: torch.device | None = None) -> TemplateKey:
        """The schedule template of a call of this rank on tensors of ``device`` (plain
        values: hashed on every lookup; ``ride``: the counts ride the gather; ``in_place``:
        the input is its slot of the output, whose schedule the wire decides:
        :func:`dpx.wire.in_place_schedule`)."""
        return TemplateKey(plan.structure, op._value_, partial, self.rank, device_counts,
                           self.transport_for(device)._value_, wire._value_,
                           dequantized(wire, dequantize), in_place_schedule(wire, in_place),
                           True, ride)

    def transport_for(self, device: torch.device | None) -> Transport:
        """The transport of a call on tensors of ``device``: the peer transport for its
        workspace's device, the world group's backend (``per_root``) for any other (CPU
        counts on a GPU communicator, say); None: this communicator's transport."""
        peer = self.peer
        if peer is None or device is None or device == peer.device:
            return self.transport
        return Transport.PER_ROOT

    def program(self, variant: Variant) -> Program:
        """The compiled program of ``variant`` (cached)."""
        p = self._programs.hit(variant)
        if p is None:
            p = self._programs.put(variant, Program(variant))
        return p

    def batch(self, preps: tuple[PreparedCall, ...]) -> BatchProgram:
        """The lockstep program of several tensors' prepared calls (cached by their
        variants)."""
        variants = tuple(p.variant for p in preps)
        if torch.compiler.is_compiling():
            return BatchProgram(self, variants)
        b = self._batches.hit(variants)
        if b is None:
            b = self._batches.put(variants, BatchProgram(self, variants))
        return b

    # ------------------------------------------------------------ running
    def execute(self, call: Call, x: torch.Tensor) -> torch.Tensor:
        """Run a differentiable call (forward or backward) into a new output."""
        return call.prep.run(x, call.prep.new_out(x), call.counts)

    def coalesced(self, group: Group, device: torch.device, *, collected: bool = False):
        """One grouped launch of the collectives issued inside, on ``group``, where the
        backend for ``device`` coalesces (NCCL); a plain sequence elsewhere.
        ``collected``: every operation inside is an all-gather, a reduce-scatter or an
        all-reduce (one kind), which torch collects and issues as one ``*_coalesced``
        collective; other operations are grouped by the backend between its start and
        end of coalescing."""
        if self.groups.coalesces(device.type):
            return self.coalescing(self.groups.process_group(group),
                                   None if collected else device)
        return contextlib.nullcontext()

    # ------------------------------------------------------------ state
    def sizes(self) -> dict[str, int]:
        """Entries in each cache (and the pool's buffers)."""
        return {"templates": len(self.schedules),
                "variants": self.schedules.variants(), "programs": len(self._programs),
                "batches": len(self._batches), "tables": len(self.tables),
                "kernels": len(self.launcher), "launches": len(self.triton),
                "pool_buffers": len(self.pool),
                "events": len(self.overlap.events)}

    def host_bytes(self, *extra: Any) -> int:
        """An estimate of the host memory the caches hold (and ``extra``, the
        communicator's prepared ops): Python objects reachable from them, counted once
        (``sys.getsizeof``; code objects included; not the runner's shared parts --
        groups, passes, the compiled kernels Triton keeps). Slow: for tests and the soak
        benchmark."""
        seen: set[int] = {id(self)}
        total = 0
        stack: list = [self._programs, self._batches, self.schedules._templates,
                       self.tables._tables, *extra]
        skip = (type, torch.Tensor, torch.device, types.ModuleType, Passes, DpGroups,
                torch.distributed.ProcessGroup)
        while stack:
            obj = stack.pop()
            if id(obj) in seen or isinstance(obj, skip):
                continue
            seen.add(id(obj))
            total += sys.getsizeof(obj)
            if isinstance(obj, dict):
                stack.extend(obj.keys())
                stack.extend(obj.values())
            elif isinstance(obj, (list, tuple, set, frozenset)):
                stack.extend(obj)
            elif callable(obj) and hasattr(obj, "__code__"):
                stack.append(obj.__code__)
                stack.extend(c.cell_contents for c in (obj.__closure__ or ())
                             if _filled(c))
                if obj.__defaults__:
                    stack.extend(obj.__defaults__)
            elif hasattr(obj, "co_code"):
                stack.extend((obj.co_code, obj.co_consts))
            elif hasattr(obj, "__dict__") or hasattr(obj, "__slots__"):
                if hasattr(obj, "__dict__"):
                    stack.append(obj.__dict__)
                for cls in type(obj).__mro__:
                    for name in getattr(cls, "__slots__", ()):
                        if hasattr(obj, name):
                            stack.append(getattr(obj, name))
        return total

    def clear(self) -> None:
        """Empty every cache and the scratch pool (buffers a captured CUDA graph reads are
        freed only when the graph is: recapture graphs after this)."""
        self._collectives.clear()
        self._programs.clear()
        self._batches.clear()
        self.schedules.clear()
        self.tables.clear()
        self.launcher.clear()
        self.triton.clear()
        self.pool.clear()


class CacheMethods:
    """A communicator's methods on its caches: its prepared ops (``self.prepared``), its
    runner's and its count exchange's."""

    prepared: Any
    runner: Runner
    _counts: Any
    _life: Any

    def cache_sizes(self) -> dict[str, int]:
        """Entries in each of this communicator's caches (see :class:`CacheLimits`)."""
        self._life.check()
        return {"prepared": len(self.prepared.ops), "classes": len(self.prepared.classes),
                **self.runner.sizes()}

    def host_bytes(self) -> int:
        """An estimate of the host memory the caches hold (:meth:`Runner.host_bytes`, the
        prepared ops included). Slow: for tests and the soak benchmark."""
        self._life.check()
        return self.runner.host_bytes(self.prepared.ops, self.prepared.classes)

    def clear_caches(self) -> None:
        """Empty every cache and the scratch pool (recapture CUDA graphs after this)."""
        self._life.check()
        self.prepared.clear()
        self.runner.clear()
        self._counts.clear()


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True
