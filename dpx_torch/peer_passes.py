"""The peer transport's passes on one rank's :class:`~dpx_torch.peer_memory.PeerMemory`: put
rows into the ranks' workspaces, the bounded barrier, take rows from this rank's, pull and
sum a combine's rows from every rank's -- the kernels of :mod:`dpx.kernels.peer` on CUDA
(:class:`CudaPeerPasses`), torch ops on host shared memory (:class:`HostPeerPasses`), with
one interface and one semantics (the kernels' docstrings).

Layer: transports. Imports dpx, the shims and passes layers and the modules before it in
its own row (docs/semantics.md, "Where things live").

Each ``bind_*`` resolves what depends only on the sizes once and returns the function a
prepared call runs: ``put(src, firsts, lens, count)``, ``take(out, firsts, lens,
reports)``, ``pull_sum(out, firsts, lens)`` (``firsts`` / ``lens``: int32 chunk tables on
the data's device, ``count``: an int32 ``[1]`` report, ``reports``: an int32 ``[W]``
output; None where the mode reads none). ``ws_rows``: the rows of ``width`` elements one
phase holds; every access is clipped to it. :meth:`barrier` sets the error word's bits of
the ranks that did not arrive within ``timeout`` seconds and returns.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

from dpx.kernels import launch as L
from dpx.modes import Wire
from dpx.wire import wire_row_bytes
from dpx.workspace import LEFT
from dpx_torch.peer_memory import PeerMemory
from dpx_torch.shims.triton_launch import Launcher
from dpx_torch.wire import dequantize_sum_rows, write_rounded

__all__ = ["CudaPeerPasses", "HostPeerPasses", "PeerPasses"]

Fn = Callable[..., None]
#: Seconds between two reads of the flags by the host barrier (other ranks' processes may
#: share the cores: a tight spin would take their time)
_POLL = 50e-6


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _rows_of(t: torch.Tensor, width: int) -> torch.Tensor:
    """``t`` (contiguous, trailing dims ``width`` elements a row) as ``[rows, width]``: the
    rows the kernels address by pointer."""
    return t.view(t.shape[0], width)


class PeerPasses:
    """The interface (see the module docstring)."""

    def __init__(self, mem: PeerMemory, timeout: float) -> None:
        self.mem, self.timeout = mem, timeout
        self.me, self.world = mem.rank, mem.layout.world_size

    def ws_rows(self, width: int, itemsize: int) -> int:
        rb = width * itemsize
        return self.mem.layout.phase_bytes // rb if rb else 0

    def bind_put(self, mode: int, src_rows: int, block: int, width: int, dtype: torch.dtype,
                 *, src_step: int = 0, report: bool = False) -> Fn:
        raise NotImplementedError

    def bind_take(self, mode: int, out_rows: int, block: int, width: int, dtype: torch.dtype,
                  *, report: bool = False) -> Fn:
        raise NotImplementedError

    def bind_sum(self, out_rows: int, width: int, dtype: torch.dtype, wire: Wire,
                 g: float | None) -> Fn:
        raise NotImplementedError

    def barrier(self) -> None:
        raise NotImplementedError

    def leave(self) -> None:
        """This rank's leaving (``destroy()``): ``LEFT + epoch`` in its flag of every
        workspace (a peer's later barrier names it at once), then the wait until every
        peer left -- skipped once a failure is recorded; bounded by the timeout as a
        barrier is."""
        raise NotImplementedError

    def close(self) -> None:
        """Drop every view of the workspaces (before they are unmapped)."""


def _nothing(*args: Any) -> None:
    return None


class CudaPeerPasses(PeerPasses):
    """The :mod:`dpx.kernels.peer` kernels, launched through ``launcher``."""

    def __init__(self, mem: PeerMemory, timeout: float, launcher: Launcher) -> None:
        super().__init__(mem, timeout)
        self.launcher, self.device = launcher, mem.device
        lay = mem.layout
        self.ints = (lay.data, lay.stride, lay.header)
        self.dummy = torch.zeros(1, dtype=torch.int32, device=self.device)
        lt = L.peer_barrier_launch(self.world, lay.epoch)
        self._barrier = launcher.bind(lt.kernel, self.device, lt.consts, lt.warps,
                                      ((0, torch.int64),)).tensors
        self._barrier_args = (mem.table, self.me, int(timeout * 1e9))

    def _bind(self, lt: L.Launch, dtypes: tuple[torch.dtype, ...]) -> Any:
        return self.launcher.bind(lt.kernel, self.device, lt.consts, lt.warps,
                                  tuple(zip(lt.pointers, dtypes)))

    def bind_put(self, mode, src_rows, block, width, dtype, *, src_step=0, report=False):
        if block * width == 0 and not report:
            return _nothing
        lt = L.peer_put_launch(mode, block, width, dtype.itemsize, self.world,
                               self.mem.layout.epoch, report=report, src_step=src_step)
        i32 = torch.int32
        k = self._bind(lt, (dtype, torch.int64, i32, i32, i32)).tensors
        grid, table, dummy = lt.grid, self.mem.table, self.dummy
        ints = (self.me, block, src_step, src_rows, self.ws_rows(width, dtype.itemsize),
                *self.ints)

        def put(src, firsts, lens, count):
            k(grid, (src, table, dummy if firsts is None else firsts,
                     dummy if lens is None else lens, dummy if count is None else count,
                     *ints))
        return put

    def bind_take(self, mode, out_rows, block, width, dtype, *, report=False):
        if out_rows * width == 0 and not report:
            return _nothing
        lt = L.peer_take_launch(mode, max(out_rows, 1), width, dtype.itemsize, self.world,
                                self.mem.layout.epoch, report=report)
        i32 = torch.int32
        k = self._bind(lt, (torch.int64, i32, i32, i32, dtype)).tensors
        grid, table, dummy = lt.grid, self.mem.table, self.dummy
        ints = (self.me, block, out_rows, self.ws_rows(width, dtype.itemsize), *self.ints)

        def take(out, firsts, lens, reports):
            k(grid, (table, dummy if firsts is None else firsts,
                     dummy if lens is None else lens, dummy if reports is None else reports,
                     *ints, out))
        return take

    def bind_sum(self, out_rows, width, dtype, wire, g):
        if out_rows * width == 0:
            return _nothing
        lay, i32, table = self.mem.layout, torch.int32, self.mem.table
        if wire is Wire.NATIVE:
            lt = L.peer_sum_launch(out_rows, width, _name(dtype), self.world, lay.epoch,
                                   compiled=self.device.type == "cuda")
            k = self._bind(lt, (torch.int64, i32, i32, dtype)).tensors
            ints = (self.me, out_rows, self.ws_rows(width, dtype.itemsize), lay.data,
                    lay.stride)
        else:
            ws_rows = lay.phase_bytes // wire_row_bytes(width, wire)
            lt = L.peer_wire_sum_launch(wire, out_rows, width, _name(dtype), self.world,
                                        lay.epoch, ws_rows=ws_rows,
                                        compiled=self.device.type == "cuda")
            k = self._bind(lt, (torch.int64, i32, i32, dtype)).tensors
            ints = (self.me, out_rows, ws_rows, lay.data, lay.stride, L.fp4_scale(g))
        grid = lt.grid

        def pull_sum(out, firsts, lens):
            k(grid, (table, firsts, lens, *ints, out))
        return pull_sum

    def barrier(self) -> None:
        self._barrier((1,), (*self._barrier_args, 0))

    def leave(self) -> None:
        self._barrier((1,), (*self._barrier_args, 1))


class HostPeerPasses(PeerPasses):
    """Torch ops on host shared memory (:class:`~dpx_torch.peer_memory.HostMemory`): the
    kernels' semantics, the barrier's wait a loop on the host clock."""

    def __init__(self, mem: PeerMemory, timeout: float) -> None:
        super().__init__(mem, timeout)
        lay = mem.layout
        W = self.world
        #: bytes this rank wrote into other ranks' workspaces, and read from theirs
        #: (what :func:`dpx.cost.peer_bytes` says a schedule moves)
        self.traffic = [0, 0]
        self.flags = [v[:8 * W].view(torch.int64) for v in mem.views]
        self.epoch = mem.views[self.me][lay.epoch:lay.epoch + 8].view(torch.int64)
        self.headers = [[v[lay.ctrl + q * lay.stride:lay.ctrl + q * lay.stride + 4 * W]
                         .view(torch.int32) for q in (0, 1)] for v in mem.views]

    def close(self) -> None:
        self.flags = self.epoch = self.headers = None  # type: ignore[assignment]

    def _phase(self, after: bool) -> int:
        return (int(self.epoch[0]) + (0 if after else 1)) & 1

    def _rows(self, p: int, q: int, width: int, dtype: torch.dtype) -> torch.Tensor:
        """Rank ``p``'s phase ``q`` rows as ``[ws_rows, width]`` of ``dtype``."""
        lay = self.mem.layout
        n = self.ws_rows(width, dtype.itemsize)
        start = lay.data + q * lay.stride
        return self.mem.views[p][start:start + n * width * dtype.itemsize].view(
            dtype).view(n, width)

    def bind_put(self, mode, src_rows, block, width, dtype, *, src_step=0, report=False):
        W, me = self.world, self.me

        def put(src, firsts, lens, count):
            src = _rows_of(src, width)
            q = self._phase(False)
            f = None if firsts is None else firsts.tolist()
            n = None if lens is None else lens.tolist()
            for k in range(W):
                if mode == L.PEER_CHUNK:
                    dest, s0, c, d0 = k, 0, n[me], f[me]
                elif mode == L.PEER_STAGE:
                    dest, s0, c, d0 = me, f[k], n[k], f[k]
                else:
                    dest, s0, c, d0 = k, k * src_step, block, me * block
                rows = self._rows(dest, q, width, dtype)
                c = min(c, block)
                lo, hi = max(0, -s0, -d0), min(c, src_rows - s0, rows.shape[0] - d0)
                if hi > lo:
                    rows[d0 + lo:d0 + hi].copy_(src[s0 + lo:s0 + hi])
                    if dest != me:
                        self.traffic[0] += (hi - lo) * width * dtype.itemsize
                if report:
                    self.headers[dest][q][me] = int(count[0])
        return put

    def bind_take(self, mode, out_rows, block, width, dtype, *, report=False):
        me = self.me

        def take(out, firsts, lens, reports):
            out = _rows_of(out, width)
            q = self._phase(True)
            rows = self._rows(me, q, width, dtype)
            if mode == L.PEER_CHUNK:
                out.zero_()
                for f, n in zip(firsts.tolist(), lens.tolist()):
                    lo, hi = max(f, 0), min(f + min(n, block), out_rows, rows.shape[0])
                    if hi > lo:
                        out[lo:hi].copy_(rows[lo:hi])
            else:
                k = min(out_rows, rows.shape[0])
                out[:k].copy_(rows[:k])
                out[k:].zero_()
            if report:
                reports.copy_(self.headers[me][q])
        return take

    def bind_sum(self, out_rows, width, dtype, wire, g):
        W, me = self.world, self.me
        native = wire is Wire.NATIVE
        rb = 0 if native else wire_row_bytes(width, wire)

        def pull_sum(out, firsts, lens):
            out = _rows_of(out, width)
            q = self._phase(True)
            f, n = int(firsts[me]), min(int(lens[me]), out_rows)
            ws = [self._rows(p, q, width, dtype) if native else
                  self._rows(p, q, rb, torch.uint8) for p in range(W)]
            # the rows j < n whose source row f + j lies in the phase (the kernels' mask)
            lo, hi = max(0, -f), max(0, min(n, ws[0].shape[0] - f))
            k = max(hi - lo, 0)
            self.traffic[1] += (W - 1) * k * (width * dtype.itemsize if native else rb)
            if not native:   # the combine's summing pass on the pulled wire rows
                src = torch.zeros(W * out_rows, rb, dtype=torch.uint8)
                for p, x in enumerate(ws):
                    src[p * out_rows + lo:p * out_rows + lo + k].copy_(x[f + lo:f + lo + k])
                dequantize_sum_rows(src, out, W, wire, g)
                return
            out.zero_()
            if dtype.is_floating_point:   # float32 from +0.0, in rank order, rounded once
                acc = torch.zeros(k, width, dtype=torch.float32)
                for x in ws:
                    acc += x[f + lo:f + lo + k].float()
                write_rounded(acc, out[lo:lo + k])
            else:
                acc = torch.zeros(k, width, dtype=dtype)
                for x in ws:
                    acc += x[f + lo:f + lo + k]
                out[lo:lo + k].copy_(acc)
        return pull_sum

    def barrier(self) -> None:
        epoch = int(self.epoch[0]) + 1
        self.epoch[0] = epoch
        self._wait(epoch, epoch, leave=False)

    def leave(self) -> None:
        epoch = int(self.epoch[0])
        self._wait(LEFT + epoch, epoch, leave=True)

    def _wait(self, mark: int, epoch: int, *, leave: bool) -> None:
        """``mark`` in this rank's flag of every workspace, then the wait (the kernel's:
        :func:`dpx.kernels.peer.peer_barrier_kernel`)."""
        W, me = self.world, self.me
        for p in range(W):   # this rank's arrival (or leaving), in every workspace's flag
            self.flags[p][me] = mark
        own = self.flags[me]
        if self.mem.error[0]:
            return
        deadline = time.monotonic() + self.timeout
        while True:
            seen = own.tolist()
            if leave:
                gone, missing = [], [p for p, e in enumerate(seen) if e < LEFT]
            else:
                gone = [p for p, e in enumerate(seen) if e >= LEFT and e - LEFT < epoch]
                missing = [p for p, e in enumerate(seen) if e < epoch]
            if gone or (missing and time.monotonic() >= deadline):
                self.mem.error[0] |= sum(1 << p for p in (gone or missing))
                return
            if not missing:
                return
            time.sleep(_POLL)
