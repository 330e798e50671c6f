"""The peer transport of one communicator (docs/semantics.md, "The peer transport"): the
world steps of its schedules carried out by one-sided puts into, and pulls from, the ranks'
shared workspaces (:mod:`dpx_torch.peer_memory`), with the passes of
:mod:`dpx_torch.peer_passes`.

Layer: transports. Imports dpx, the shims and passes layers and the modules before it in
its own row (docs/semantics.md, "Where things live").

Each world step is its passes before a barrier, the barrier, and its passes after it:

- ``all_gather_v`` (a gather's variable all-gather of every chunk's real rows): this rank's
  chunk put into every rank's workspace at its rows; after the barrier the chunks taken
  into the output, zeros elsewhere;
- ``reduce_scatter_v`` (the combine: native rows, or wire rows): this rank's input chunks
  staged in its own workspace at their rows; after the barrier this rank's chunk pulled
  from every rank and summed in float32 in rank order (integers in their dtype);
- ``all_gather`` / ``all_to_all`` over the world (counts that ride a gather, the LM-head
  scatter): blocks put into every rank's workspace at this rank's block, then taken --
  with every rank's report for the counts.

The attn-tp and replica steps stay the groups' backend collectives. Every world step's
function carries ``peer = True`` (a several-tensor batch runs them one by one, outside a
backend's coalescing). :meth:`PeerTransport.enter` starts every world step: it raises the
communicator's :class:`dpx.DpxPeerError` when a barrier found a peer missing (and the
communicator then refuses every call), and keeps the steps of every stream in issue order
(a step on another stream than the last waits for it).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from dpx.errors import DpxCapacityError, DpxPeerError, DpxTypeError, DpxValueError, check_int
from dpx.explain import explain
from dpx.kernels import launch as L
from dpx.layout import DpLayout
from dpx.modes import Transport, Wire
from dpx.plan import DpPlan
from dpx.transport import TransportChoice, check_requested, choose_transport, confirm_peer
from dpx.workspace import PeerLayout, peer_phase_bytes
from dpx_torch.lifecycle import end_groups
from dpx_torch.peer_memory import (PeerMemory, TableMemory, open_memory, rank_facts,
                                   remove_host_files)
from dpx_torch.peer_passes import CudaPeerPasses, HostPeerPasses, PeerPasses
from dpx_torch.shims.triton_launch import JIT, Launcher

__all__ = ["PeerOptions", "PeerTransport", "TransportMethods", "open_transport",
           "peer_step_"]

_compiling = torch.compiler.is_compiling

StepFn = Callable[[torch.Tensor, torch.Tensor, Any], None]
Buffer = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Table = Callable[[Any], torch.Tensor]


@dataclass(frozen=True)
class PeerOptions:
    """The peer transport's settings (``DpComm(..., transport="peer", peer=...)``):
    ``phase_bytes``: the bytes of rows one buffer phase holds (the workspace is two phases
    and a few KiB of flags: :attr:`dpx.workspace.PeerLayout.total_bytes`); a call that moves
    more -- a ``[rows, H]`` buffer needs ``dpx.peer_phase_bytes(rows, row_bytes)`` -- raises
    a :class:`dpx.DpxCapacityError` before any step runs. ``timeout``: seconds a barrier
    waits for a peer before naming it (:class:`dpx.DpxPeerError`): whatever keeps a rank
    from its next world step counts -- the first call of a new shape compiles kernels on
    each rank while its peers wait -- so the default leaves room for that; a server that
    wants a dead peer named sooner sets less. ``device``: where the workspace lives
    (default: the current CUDA device where CUDA is available, else the CPU)."""

    phase_bytes: int = 64 * 2**20
    timeout: float = 30.0
    device: torch.device | str | None = None

    def __post_init__(self) -> None:
        check_int("PeerOptions(phase_bytes)", self.phase_bytes, minimum=0)
        t = self.timeout
        if isinstance(t, bool) or not isinstance(t, (int, float)):
            raise DpxTypeError(f"PeerOptions(timeout={t!r}) must be a number of seconds "
                               f"(got {type(t).__name__})")
        if not 0 < t < 1e6:
            raise DpxValueError(f"PeerOptions(timeout={t!r}) must be a number of seconds in "
                                f"(0, 1e6)")

    def workspace_device(self) -> torch.device:
        """:attr:`device` with a CUDA device's index (the current one when unnamed). Never
        raises: a device this rank cannot use is reported to every rank by the transport's
        choice (:func:`dpx_torch.peer_memory.rank_facts`), not raised by one."""
        dev = torch.device(self.device) if self.device is not None else \
            torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        if dev.type == "cuda" and dev.index is None and torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return dev


class PeerTransport:
    """The world steps of one communicator on its peer memory (see the module
    docstring). ``on_failure(err)`` marks the communicator failed."""

    def __init__(self, mem: PeerMemory, passes: PeerPasses, options: PeerOptions,
                 on_failure: Callable[[DpxPeerError], None]) -> None:
        self.mem, self.passes, self.options = mem, passes, options
        self.on_failure = on_failure
        self.device = mem.device
        self._last: torch.cuda.Stream | None = None
        self._event: torch.cuda.Event | None = None

    @property
    def phase_bytes(self) -> int:
        return self.mem.layout.phase_bytes

    # ------------------------------------------------------------ every step
    def failure(self, bits: int) -> DpxPeerError:
        ranks = [p for p in range(self.mem.layout.world_size) if bits >> p & 1]
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"
        return DpxPeerError(
            f"peer transport: {who} did not arrive at a barrier of rank {self.mem.rank} "
            f"within {self.options.timeout} s (the process died, left with destroy(), or "
            f"stopped calling this communicator's collectives); this communicator runs no "
            f"more calls: destroy() it", ranks=tuple(ranks))

    def check(self) -> None:
        """Raise (and mark the communicator failed) when a barrier found a peer missing:
        the error word, read on the host without a sync."""
        bits = int(self.mem.error[0])
        if bits:
            err = self.failure(bits)
            self.on_failure(err)
            raise err

    def enter(self, device: torch.device) -> None:
        """The start of every world step (on the workspace's device: ``Runner.transport_for``
        routes other devices to the backend): the failure check, then issue order across
        streams (a step on another CUDA stream than the last waits for the last; inside a
        CUDA graph capture the graph orders them)."""
        if self.mem.error[0]:
            self.check()
        if device.type != "cuda":
            return
        cur = torch.cuda.current_stream(device)
        last = self._last
        if last is not None and cur != last and not torch.cuda.is_current_stream_capturing():
            if self._event is None:
                self._event = torch.cuda.Event()
            self._event.record(last)
            cur.wait_event(self._event)
        self._last = cur

    def barrier(self) -> None:
        """The step's barrier, then the failure check: on the host the barrier has run (a
        call whose barrier gave up raises instead of returning stale rows); on a GPU it
        runs after the call returns, and a later call raises."""
        self.passes.barrier()
        if self.mem.error[0]:
            self.check()

    def _fits(self, what: str, rows: int, width: int, itemsize: int) -> None:
        """The capacity error of a step whose ``rows`` rows of ``width`` elements of
        ``itemsize`` bytes do not fit a phase (raised when bound: before any step)."""
        need = peer_phase_bytes(rows, width * itemsize)
        if need > self.phase_bytes:
            raise DpxCapacityError(
                f"peer transport: {what} moves a {rows} x {width * itemsize}-byte buffer "
                f"({need} bytes a phase); this communicator's workspace holds "
                f"{self.phase_bytes} (DpComm(peer=PeerOptions(phase_bytes=...)); "
                f"dpx.peer_phase_bytes(rows, row_bytes))")

    # ------------------------------------------------------------ the world steps
    def gather_v(self, src: Buffer, src_rows: int, dst: Buffer, rows: int, firsts: Table,
                 lens: Table, block: int, width: int, dtype: torch.dtype) -> StepFn:
        """``dst [rows, width]``: every rank's ``src[:lens[r]]`` at ``firsts[r]``, zeros
        elsewhere."""
        self._fits("all_gather_v", rows, width, dtype.itemsize)
        if _compiling():
            return self._traced("gather_v", src, dst, firsts, lens,
                                [src_rows, rows, block, width])
        p = self.passes
        put = p.bind_put(L.PEER_CHUNK, src_rows, block, width, dtype)
        take = p.bind_take(L.PEER_CHUNK, rows, block, width, dtype)
        return self._step(src, dst, firsts, lens, lambda s, f, n: put(s, f, n, None),
                          lambda d, f, n: take(d, f, n, None))

    def reduce_scatter_v(self, src: Buffer, src_rows: int, dst: Buffer, block: int,
                         firsts: Table, lens: Table, width: int, dtype: torch.dtype,
                         hidden: int, out_dtype: torch.dtype, wire: Wire,
                         g: float | None) -> StepFn:
        """``dst [block, hidden]`` of ``out_dtype``: row ``j < lens[me]`` the sum over ranks
        in order of their ``src[firsts[me] + j]`` (rows of ``width`` elements of ``dtype``:
        the input's, or wire bytes summed dequantized in float32), zeros after."""
        self._fits("reduce_scatter_v", src_rows, width, dtype.itemsize)
        if _compiling():
            return self._traced("reduce_scatter_v", src, dst, firsts, lens,
                                [src_rows, block, width, hidden], wire, g)
        p = self.passes
        stage = p.bind_put(L.PEER_STAGE, src_rows, block, width, dtype)
        return self._step(src, dst, firsts, lens, lambda s, f, n: stage(s, f, n, None),
                          p.bind_sum(block, hidden, out_dtype, wire, g))

    def _step(self, src: Buffer, dst: Buffer, firsts: Table, lens: Table,
              before: Callable[..., None], after: Callable[..., None]) -> StepFn:
        """A world step on a chunk table: ``before(src, firsts, lens)``, the barrier,
        ``after(dst, firsts, lens)``."""
        enter, barrier = self.enter, self.barrier

        def run(x, out, dv):
            s = src(x, out)
            enter(s.device)
            f, n = firsts(dv), lens(dv)
            before(s, f, n)
            barrier()
            after(dst(x, out), f, n)
        run.peer = True  # type: ignore[attr-defined]
        return run

    def blocks(self, src: Buffer, dst: Buffer, block: int, width: int, dtype: torch.dtype,
               *, all_to_all: bool,
               report: Callable[[Any], torch.Tensor] | None = None,
               reports: Callable[[Any, torch.Tensor], None] | None = None) -> StepFn:
        """A world all-gather (``src`` one ``block``-row block) or all-to-all (``src``
        ``W`` blocks, block ``k`` to rank ``k``) into ``dst [W * block, width]``; with
        ``report`` (this call's int32 ``[1]`` count) every rank's report handed to
        ``reports(dv, [W] int32)``."""
        W = self.mem.layout.world_size
        self._fits("all_to_all" if all_to_all else "all_gather", W * block, width,
                   dtype.itemsize)
        if _compiling():
            if report is not None:
                raise DpxValueError("counts ride a gather outside torch.compile (the peer "
                                    "transport's reports are read back on the host)")
            return self._traced("all_to_all" if all_to_all else "all_gather", src, dst,
                                None, None, [block, width])
        p = self.passes
        src_rows = W * block if all_to_all else block
        put = p.bind_put(L.PEER_BLOCKS, src_rows, block, width, dtype,
                         src_step=block if all_to_all else 0, report=report is not None)
        take = p.bind_take(L.PEER_BLOCKS, W * block, block, width, dtype,
                           report=report is not None)
        enter, barrier = self.enter, self.barrier

        def run(x, out, dv):
            s = src(x, out)
            enter(s.device)
            got = None
            if report is not None:
                got = torch.empty(W, dtype=torch.int32, device=s.device)
            put(s, None, None, None if report is None else report(dv))
            barrier()
            take(dst(x, out), None, None, got)
            if reports is not None:
                reports(dv, got)
        run.peer = True  # type: ignore[attr-defined]
        return run

    def _traced(self, kind: str, src: Buffer, dst: Buffer, firsts: Table | None,
                lens: Table | None, sizes: list[int], wire: Wire = Wire.NATIVE,
                g: float | None = None) -> StepFn:
        """A world step as one ``dpx::peer_step_`` custom op (a call traced by
        torch.compile): the op carries the table and sizes, and runs the same step."""
        mem, opts = self.mem, self.options
        ints = [mem.rank, mem.layout.world_size, mem.layout.phase_bytes,
                int(opts.timeout * 1e9), mem.error_address, *sizes]
        table, scale = mem.table, 0.0 if g is None else g

        def run(x, out, dv):
            peer_step_(kind, src(x, out), dst(x, out),
                       None if firsts is None else firsts(dv),
                       None if lens is None else lens(dv), table, ints, wire.value, scale)
        run.peer = True  # type: ignore[attr-defined]
        return run

    # ------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Unmap the peers' workspaces (this rank's reads and writes of them end here; at
        interpreter exit)."""
        self.passes.close()
        self.mem.close()

    def shutdown(self) -> bool:
        """``destroy()``'s end, bounded: this rank's steps finished, then its leaving
        (:meth:`PeerPasses.leave`: a peer still waiting in a step's barrier for it is
        told at once; once every rank left, no step still reads or writes a peer's
        memory) and the peers' workspaces unmapped. This rank's own is freed once every
        rank left; after a failure a peer may still write its leaving into it, so it
        stays until the process ends (as at interpreter exit). Returns whether every rank
        left in time (False: a failure, found now or before)."""
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda d: None)
        sync(self.device)
        self.passes.leave()
        sync(self.device)
        ok = not self.mem.error[0]
        self.passes.close()
        if ok:
            self.mem.release()
        else:
            self.mem.close()
        return ok


class TransportMethods:
    """A communicator's methods on its transport (:attr:`transport_choice`, made by
    ``Runner.open_peer``; ``self.runner.peer`` on the peer transport)."""

    runner: Any
    layout: DpLayout
    groups: Any
    agreement: Any
    #: the transport every rank agreed on, and why (:func:`dpx.choose_transport`)
    transport_choice: TransportChoice
    _life: Any

    def _end(self, *, at_exit: bool) -> None:
        """The end of the communicator's groups: drained with barriers and destroyed
        (``destroy()``); on the peer transport its bounded leaving is the drain
        (:meth:`PeerTransport.shutdown`: a dead or failed peer never makes it wait past
        the timeout, and no backend barrier waits after it); at interpreter exit the
        peers' workspaces are unmapped and nothing waits. The groups end even when the
        transport's end raises."""
        peer = self.runner.peer
        try:
            if peer is not None:
                if at_exit:
                    peer.close()
                else:
                    peer.shutdown()
        finally:
            end_groups(self.groups.owned, self.groups.world,
                       drain=not at_exit and peer is None)

    def _exchange(self, obj: object) -> list:
        """Every rank's ``obj`` (an all-gather of Python objects over the host group)."""
        out: list = [None] * self.layout.world_size
        dist.all_gather_object(out, obj, group=self.agreement._cpu("transport='peer'"))
        return out

    @property
    def transport(self) -> Transport:
        """The transport this communicator's world steps run on (see
        :attr:`transport_choice` for why)."""
        return self.runner.transport

    def check_peers(self) -> None:
        """On the peer transport, raise :class:`dpx.DpxPeerError` when a barrier found a
        peer missing -- the error word, read on the host without a sync: the check for
        after a CUDA graph's replays, whose barriers cannot raise (every eager call checks
        it too). Nothing to check on the per_root transport."""
        self._life.check()
        if self.runner.peer is not None:
            self.runner.peer.check()

    def explain(self, plan: DpPlan, **kw) -> str:
        """:func:`dpx.explain` of ``plan`` on this communicator: its transport and why, and
        on the peer transport its workspace and each rank's puts and pulls (``kw``:
        ``explain``'s options)."""
        return explain(plan, choice=self.transport_choice, **kw)


def _whole(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return x


def _out(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return out


@torch.library.custom_op("dpx::peer_step_", mutates_args=("out",))
def peer_step_(kind: str, src: torch.Tensor, out: torch.Tensor, firsts: torch.Tensor | None,
               lens: torch.Tensor | None, table: torch.Tensor, ints: list[int], wire: str,
               g: float) -> None:
    """One world step of the peer transport from its table and sizes (what a call traced
    by torch.compile runs: :meth:`PeerTransport._traced`); ``kind`` names the
    :class:`PeerTransport` method. A peer found missing raises :class:`dpx.DpxPeerError`."""
    me, W, phase, timeout_ns, error, *sizes = ints
    mem = TableMemory(table, PeerLayout(W, phase), me, error)
    timeout = timeout_ns / 1e9
    passes = (CudaPeerPasses(mem, timeout, JIT) if table.is_cuda
              else HostPeerPasses(mem, timeout))
    step = PeerTransport(mem, passes, PeerOptions(phase, timeout), lambda err: None)
    got = (lambda dv: firsts), (lambda dv: lens)
    if kind == "gather_v":
        src_rows, rows, block, width = sizes
        fn = step.gather_v(_whole, src_rows, _out, rows, *got, block, width, src.dtype)
    elif kind == "reduce_scatter_v":
        src_rows, block, width, hidden = sizes
        w = Wire(wire)
        fn = step.reduce_scatter_v(_whole, src_rows, _out, block, *got, width, src.dtype,
                                   hidden, out.dtype, w, g if w is Wire.NVFP4 else None)
    else:
        block, width = sizes
        fn = step.blocks(_whole, _out, block, width, src.dtype, all_to_all=kind == "all_to_all")
    fn(src, out, None)


@peer_step_.register_fake
def _(kind, src, out, firsts, lens, table, ints, wire, g) -> None:
    return None


def open_transport(layout: DpLayout, rank: int, exchange: Callable[[Any], list],
                   requested: Transport | str, options: PeerOptions | None,
                   launcher: Launcher,
                   on_failure: Callable[[DpxPeerError], None]
                   ) -> tuple[PeerTransport | None, TransportChoice]:
    """The communicator's transport, chosen alike on every rank
    (:func:`dpx.transport.choose_transport`), and its peer transport when that is the
    choice. Collective over the host group (``exchange``: an all-gather of Python
    objects): the facts, the workspaces' handles, the outcome of opening them."""
    if options is not None and not isinstance(options, PeerOptions):
        raise DpxTypeError(f"peer={options!r} must be a dpx_torch.PeerOptions")
    options = options or PeerOptions()
    req = check_requested(requested)
    if req is Transport.PER_ROOT:
        return None, choose_transport(req, [])
    device = options.workspace_device()
    facts = rank_facts(device, (options.phase_bytes, float(options.timeout)))
    gathered = exchange((facts, uuid.uuid4().hex))
    choice = choose_transport(req, [f for f, _ in gathered])
    if choice.transport is not Transport.PEER:
        return None, choice
    token = gathered[0][1]   # rank 0's: the opening's name on every rank
    lay = PeerLayout(layout.world_size, options.phase_bytes)
    kind, mem, opened = choice.memory, None, False
    try:
        mem, why = open_memory(kind, lay, rank, device, exchange, token)
        choice = confirm_peer(choice, exchange(why))
        opened = choice.transport is Transport.PEER
    finally:
        if mem is not None and hasattr(mem, "unlink"):
            mem.unlink()   # every peer has mapped it (or will not): no file stays behind
        if not opened and kind == "host":   # a peer that failed, or died, may have left
            remove_host_files(token, layout.world_size)   # its file: every rank's goes
    if not opened:
        if mem is not None:
            mem.release()
        return None, choice
    passes = (CudaPeerPasses(mem, options.timeout, launcher) if device.type == "cuda"
              else HostPeerPasses(mem, options.timeout))
    return PeerTransport(mem, passes, options, on_failure), choice
