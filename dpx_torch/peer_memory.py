"""The peer transport's shared memory: one workspace per rank (:class:`dpx.workspace.PeerLayout`),
each mapped into every peer's process, and this rank's error word.

Layer: transports. Imports dpx, the shims and passes layers and the modules before it in
its own row (docs/semantics.md, "Where things live").

Two kinds, one interface (:class:`PeerMemory`):

- CUDA (:class:`CudaMemory`): device memory exported and opened through CUDA IPC
  (:mod:`dpx_torch.shims.ipc`, ``"driver"`` or ``"torch"``); the kernels find every
  workspace through :attr:`PeerMemory.table` (int64 addresses on the device, the error
  word's last), and the error word lives in pinned host memory the device writes and the
  host reads without a sync;
- host (:class:`HostMemory`): files in ``/dev/shm`` mapped by every rank of the host,
  named by a token every rank shares and the rank (:func:`host_path`): removed from the
  file system as soon as every peer has opened them, and every rank's by any rank whose
  opening fails (:func:`remove_host_files`: a rank killed while the files are open leaves
  none behind); the torch ops of :mod:`dpx_torch.peer_passes` work on
  :attr:`PeerMemory.views`.

Opening is collective: :func:`open_memory` allocates this rank's workspace, exchanges the
handles through ``exchange`` (an all-gather of Python objects over the host group), maps
every peer's, and reports this rank's failure (or ""), which the caller exchanges again
(:func:`dpx.transport.confirm_peer`). Closing unmaps the peers' workspaces; freeing this
rank's waits until every peer has closed it (:meth:`PeerMemory.release` after a host
barrier), or is left to the process's end.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import socket
import tempfile
from typing import Any, Callable

import numpy as np
import torch

from dpx.transport import RankFacts
from dpx.workspace import ALIGN, PeerLayout
from dpx_torch.shims import ipc as _ipc

__all__ = ["CudaMemory", "host_path", "HostMemory", "open_memory", "PeerMemory",
           "rank_facts", "remove_host_files", "TableMemory"]

Exchange = Callable[[Any], list]


def _host_id() -> str:
    """This host's identity: its name and boot (ranks that share both share memory)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def _shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def host_path(token: str, rank: int) -> str:
    """The file of rank ``rank``'s host workspace in the opening ``token`` names."""
    return os.path.join(_shm_dir(), f"dpx-peer-{token}-{rank}")


def remove_host_files(token: str, world: int) -> None:
    """Every rank's host workspace file of the opening ``token`` names, removed (those
    that exist): what a rank whose opening failed does, since a peer may have died with
    its file still in the file system."""
    for p in range(world):
        try:
            os.unlink(host_path(token, p))
        except FileNotFoundError:
            pass


def rank_facts(device: torch.device, options: tuple = ()) -> RankFacts:
    """This rank's :class:`dpx.transport.RankFacts` for a workspace on ``device`` (and the
    ``options`` every rank must share). Never raises: what this rank cannot do is
    reported to every rank."""
    host = _host_id()
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return RankFacts(host, "cuda", (), "no CUDA device here (torch.cuda.is_available() "
                             "is False)", options)
        try:
            with torch.cuda.device(device):
                kinds = _ipc.kinds()
            return RankFacts(host, "cuda", kinds, options=options)
        except Exception as exc:  # noqa: BLE001 - reported to every rank
            return RankFacts(host, "cuda", (), f"{type(exc).__name__}: {exc}", options)
    if device.type == "cpu":
        return RankFacts(host, "cpu", ("host",) if os.access(_shm_dir(), os.W_OK)
                         else (), f"{_shm_dir()} is not writable", options)
    return RankFacts(host, device.type, (), f"no shared memory on {device.type}", options)


class PeerMemory:
    """One rank's view of every rank's workspace (see the module docstring)."""

    layout: PeerLayout
    rank: int
    device: torch.device
    #: int64 [W + 1] on the workspaces' device: every workspace's address, then the error
    #: word's (:class:`TableMemory` rebuilds a view of the memory from it)
    table: torch.Tensor | None = None
    #: uint8 views of every rank's workspace (host memory only)
    views: list[torch.Tensor] | None = None
    #: this rank's error word (int64 [1], host readable): the bits of the ranks a barrier
    #: did not see arrive; and its address (the table's last entry)
    error: np.ndarray
    error_address: int
    _closed = False

    def close(self) -> None:
        """Unmap the peers' workspaces (idempotent)."""

    def release(self) -> None:
        """Unmap the peers' workspaces and free this rank's."""


def unaligned(addrs: list[int]) -> str:
    """Why these workspace addresses cannot be used ("" if they can): the kernels address
    every workspace as a multiple of :data:`dpx.workspace.ALIGN` bytes
    (:func:`dpx.kernels.peer.row_starts`)."""
    bad = [p for p, a in enumerate(addrs) if a % ALIGN]
    return (f"the workspaces of ranks {bad} are not {ALIGN}-byte aligned "
            f"({[hex(addrs[p]) for p in bad]})" if bad else "")


class CudaMemory(PeerMemory):
    def __init__(self, kind: str, layout: PeerLayout, rank: int, device: torch.device) -> None:
        self.layout, self.rank, self.device = layout, rank, device
        self.ipc = _ipc.ipc_for(kind)
        self._err = torch.zeros(1, dtype=torch.int64, pin_memory=True)
        self.error, self.error_address = self._err.numpy(), self._err.data_ptr()
        self._maps: list[Any] = []
        with torch.cuda.device(device):
            self.addr, self._own = self.ipc.alloc(layout.total_bytes)

    def handle(self) -> Any:
        return self.ipc.export(self._own)

    def map(self, handles: list[Any]) -> str:
        addrs = []
        try:
            with torch.cuda.device(self.device):
                for p, h in enumerate(handles):
                    if p == self.rank:
                        addrs.append(self.addr)
                        continue
                    a, keep = self.ipc.open(h)
                    self._maps.append(keep)
                    addrs.append(a)
        except Exception as exc:  # noqa: BLE001 - reported to every rank
            return f"{type(exc).__name__}: {exc}"
        self.table = torch.tensor(addrs + [self._err.data_ptr()], dtype=torch.int64,
                                  device=self.device)
        return unaligned(addrs)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with torch.cuda.device(self.device):
            torch.cuda.synchronize()   # no kernel of this rank still reads a peer's memory
            for keep in self._maps:
                try:
                    self.ipc.close(keep)
                except RuntimeError:   # the exporter is gone (a dead peer): nothing to unmap
                    pass
        self._maps = []
        self.table = None

    def release(self) -> None:
        self.close()
        if self._own is not None:
            with torch.cuda.device(self.device):
                self.ipc.free(self._own)
            self._own = None


class HostMemory(PeerMemory):
    def __init__(self, layout: PeerLayout, rank: int, token: str) -> None:
        self.layout, self.rank, self.device = layout, rank, torch.device("cpu")
        self.path = host_path(token, rank)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, layout.total_bytes)
            self._own = mmap.mmap(fd, layout.total_bytes)
        finally:
            os.close(fd)
        self._maps: list[mmap.mmap] = []
        self.error = np.zeros(1, np.int64)
        self.error_address = self.error.ctypes.data

    def handle(self) -> str:
        return self.path

    def map(self, handles: list[str]) -> str:
        maps = []
        try:
            for p, path in enumerate(handles):
                if p == self.rank:
                    maps.append(self._own)
                    continue
                fd = os.open(path, os.O_RDWR)
                try:
                    maps.append(mmap.mmap(fd, self.layout.total_bytes))
                finally:
                    os.close(fd)
        except Exception as exc:  # noqa: BLE001 - reported to every rank
            for m in maps:
                if m is not self._own:
                    m.close()
            return f"{type(exc).__name__}: {exc}"
        self._maps = maps
        self.views = [torch.frombuffer(m, dtype=torch.uint8) for m in maps]
        addrs = [v.data_ptr() for v in self.views]
        self.table = torch.tensor(addrs + [self.error_address], dtype=torch.int64)
        return unaligned(addrs)

    def unlink(self) -> None:
        """Remove this rank's file (every peer has it mapped, or none will)."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.views = self.table = None
        for m in self._maps:
            if m is not self._own:
                try:
                    m.close()
                except BufferError:   # a view still exported: the mapping goes with it
                    pass
        self._maps = []

    def release(self) -> None:
        self.close()
        try:
            self._own.close()
        except BufferError:   # a view still exported: the mapping goes with it
            pass
        self.unlink()


class TableMemory(PeerMemory):
    """The memory a :attr:`PeerMemory.table` points at, for a call that holds only the
    table (a torch.compile'd call's custom op): views of host workspaces made from their
    addresses, the error word read at its address (host memory in both kinds). Valid while
    the communicator that made the table holds its memory."""

    def __init__(self, table: torch.Tensor, layout: PeerLayout, rank: int,
                 error_address: int) -> None:
        self.layout, self.rank, self.device, self.table = layout, rank, table.device, table
        W, n = layout.world_size, layout.total_bytes
        self.error = np.ctypeslib.as_array((ctypes.c_int64 * 1).from_address(error_address))
        self.error_address = error_address
        if table.device.type == "cpu":
            self.views = [torch.frombuffer((ctypes.c_uint8 * n).from_address(a),
                                           dtype=torch.uint8) for a in table.tolist()[:W]]


def open_memory(kind: str, layout: PeerLayout, rank: int, device: torch.device,
                exchange: Exchange, token: str) -> tuple[PeerMemory | None, str]:
    """This rank's :class:`PeerMemory` of ``kind`` with every peer's workspace mapped, and
    "" -- or this rank's failure (its memory, if any, already released). Collective: one
    exchange of handles (and of failures to allocate). ``token``: the opening's name,
    the same on every rank (host files are named by it)."""
    mem: PeerMemory | None = None
    handle, why = None, ""
    try:
        mem = (HostMemory(layout, rank, token) if kind == "host" else
               CudaMemory(kind, layout, rank, device))
        handle = mem.handle()
    except Exception as exc:  # noqa: BLE001 - reported to every rank
        why = f"{type(exc).__name__}: {exc}"
    opened = False
    try:
        handles = exchange(handle)
        if not why:
            missing = [p for p, h in enumerate(handles) if h is None]
            why = f"ranks {missing} have no workspace" if missing else mem.map(handles)
        opened = not why
    finally:
        if not opened and mem is not None:   # nothing left behind
            mem.release()
            mem = None
    return mem, why
