"""CUDA inter-process memory: a rank allocates device memory, exports a handle, and its
peers on the node map that memory into their processes (the peer transport's workspace,
:mod:`dpx_torch.peer_memory`).

Layer: shims. Imports dpx and the modules before it in its own row (docs/semantics.md,
"Where things live").

Two implementations with one interface (:class:`Ipc`):

- ``"driver"`` (first choice): the CUDA driver's public API through ``ctypes``
  (``libcuda.so.1``: ``cuMemAlloc``, ``cuIpcGetMemHandle``, ``cuIpcOpenMemHandle`` with
  lazy peer access, ``cuIpcCloseMemHandle``, ``cuMemFree``), checked with driver 580
  (CUDA 13) on an H100, torch 2.11, with and without MPS. The memory is dpx's own
  allocation, outside torch's caching allocator (so an allocator configuration such as
  ``expandable_segments`` does not matter), and closing and freeing are explicit: no
  reference counting that outlives the process.
- ``"torch"`` (fallback, private): torch's own CUDA tensor sharing
  (``torch.multiprocessing.reductions.reduce_tensor`` and its rebuild function), written
  against torch 2.11 and 2.13 (``tests/test_peer_gpu.py`` forces it: passed on an H100
  with torch 2.11). Used where the driver library cannot be loaded or its first
  allocation or export fails; it needs an allocator whose blocks are plain ``cudaMalloc``
  blocks (torch's default).

Which one a communicator uses is agreed by every rank (:func:`dpx.transport.choose_transport`
over what each rank reports, :func:`kinds`): a handle of one kind cannot be opened by the
other. ``tests/test_peer_gpu.py`` runs both.
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable

import torch

__all__ = ["DriverIpc", "Ipc", "ipc_for", "kinds", "TorchIpc"]


class Ipc:
    """The interface: ``alloc(nbytes)`` -> (address, keep) of zeroed device memory on the
    current device; ``export(keep)`` -> a picklable handle; ``open(handle)`` -> (address,
    keep) of a peer's memory mapped here; ``close(keep)`` unmaps it; ``free(keep)`` frees
    this rank's memory (after every peer closed it)."""

    kind = ""

    def alloc(self, nbytes: int) -> tuple[int, Any]:
        raise NotImplementedError

    def export(self, keep: Any) -> Any:
        raise NotImplementedError

    def open(self, handle: Any) -> tuple[int, Any]:
        raise NotImplementedError

    def close(self, keep: Any) -> None:
        raise NotImplementedError

    def free(self, keep: Any) -> None:
        raise NotImplementedError


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


#: cuIpcOpenMemHandle's CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
_LAZY_PEER_ACCESS = 1


class DriverIpc(Ipc):
    """The CUDA driver API through ``ctypes`` (see the module docstring). Raises
    ``OSError`` when ``libcuda.so.1`` cannot be loaded, ``RuntimeError`` naming the call
    when a driver call fails."""

    kind = "driver"

    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        u64, size = ctypes.c_uint64, ctypes.c_size_t

        def fn(name: str, *args: Any) -> Callable[..., int]:
            f = getattr(lib, name + "_v2", None) or getattr(lib, name)
            f.argtypes, f.restype = list(args), ctypes.c_int
            return f

        self._alloc = fn("cuMemAlloc", ctypes.POINTER(u64), size)
        self._free = fn("cuMemFree", u64)
        self._memset = fn("cuMemsetD8", u64, ctypes.c_ubyte, size)
        self._get = fn("cuIpcGetMemHandle", ctypes.POINTER(_Handle), u64)
        self._open = fn("cuIpcOpenMemHandle", ctypes.POINTER(u64), _Handle, ctypes.c_uint)
        self._close = fn("cuIpcCloseMemHandle", u64)
        self._error = lib.cuGetErrorString
        self._error.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]

    def _check(self, rc: int, what: str) -> None:
        if rc:
            msg = ctypes.c_char_p()
            self._error(rc, ctypes.byref(msg))
            text = msg.value.decode() if msg.value else "unknown error"
            raise RuntimeError(f"{what} failed: CUDA driver error {rc} ({text})")

    def alloc(self, nbytes: int) -> tuple[int, Any]:
        torch.cuda.current_device()  # the primary context, current on this thread
        torch.cuda.synchronize()
        ptr = ctypes.c_uint64()
        self._check(self._alloc(ctypes.byref(ptr), max(nbytes, 1)), "cuMemAlloc")
        self._check(self._memset(ptr.value, 0, max(nbytes, 1)), "cuMemsetD8")
        return ptr.value, ptr.value

    def export(self, keep: Any) -> bytes:
        h = _Handle()
        self._check(self._get(ctypes.byref(h), keep), "cuIpcGetMemHandle")
        return ctypes.string_at(ctypes.addressof(h), 64)

    def open(self, handle: bytes) -> tuple[int, Any]:
        ptr = ctypes.c_uint64()
        self._check(self._open(ctypes.byref(ptr), _Handle.from_buffer_copy(handle),
                               _LAZY_PEER_ACCESS), "cuIpcOpenMemHandle")
        return ptr.value, ptr.value

    def close(self, keep: Any) -> None:
        self._check(self._close(keep), "cuIpcCloseMemHandle")

    def free(self, keep: Any) -> None:
        self._check(self._free(keep), "cuMemFree")


class TorchIpc(Ipc):
    """torch's CUDA tensor sharing (see the module docstring)."""

    kind = "torch"

    def __init__(self) -> None:
        from torch.multiprocessing.reductions import reduce_tensor

        self._reduce = reduce_tensor

    def alloc(self, nbytes: int) -> tuple[int, Any]:
        t = torch.zeros(max(nbytes, 1), dtype=torch.uint8, device=torch.cuda.current_device())
        return t.data_ptr(), t

    def export(self, keep: Any) -> Any:
        return self._reduce(keep)

    def open(self, handle: Any) -> tuple[int, Any]:
        rebuild, args = handle
        t = rebuild(*args)
        return t.data_ptr(), [t]

    def close(self, keep: Any) -> None:
        keep.clear()          # the rebuilt tensor's last reference
        torch.cuda.ipc_collect()

    def free(self, keep: Any) -> None:
        torch.cuda.synchronize()


_KINDS: dict[str, type[Ipc]] = {"driver": DriverIpc, "torch": TorchIpc}


def kinds() -> tuple[str, ...]:
    """The kinds this process can use, first choice first: ``"driver"`` when the driver
    library loads and a first allocation exports (tried once, on a few bytes), then
    ``"torch"``."""
    out = []
    try:
        d = DriverIpc()
        addr, keep = d.alloc(256)
        try:
            d.export(keep)
        finally:
            d.free(keep)
        out.append("driver")
    except (OSError, RuntimeError, AttributeError):
        pass
    out.append("torch")
    return tuple(out)


def ipc_for(kind: str) -> Ipc:
    """The implementation of ``kind`` (one of :func:`kinds`)."""
    return _KINDS[kind]()
