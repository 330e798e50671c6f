"""A grow-only scratch-buffer pool keyed by purpose.

Layer: runner. Imports dpx, the shims, passes and transports layers and the modules before
it in its own row (docs/semantics.md, "Where things live").

Its bound: one buffer per (purpose, dtype, device) -- the scratch buffers of the schedules
in use, per stream key (``"caller"``, ``"comm"``, and one per tensor of a batched gather)
and the outputs of the overlapped calls, one per micro-batch key -- each as large as the
largest call that used it.

``BufferPool.get(key, shape, dtype, device)`` returns a ``shape`` view of a flat buffer kept
for ``(key, dtype, device)``; the buffer is reallocated only to grow. Steady-state steps of
varying size therefore allocate nothing (no allocator churn, graph-capturable after one
warm-up call), and the number of buffers stays equal to the number of keys.

A buffer handed out while a CUDA graph is being captured is never freed when it is later
outgrown (the graph keeps pointing at it): it moves to ``retired`` and stays alive.
"""

from __future__ import annotations

import math

import torch

__all__ = ["BufferPool"]


class BufferPool:
    def __init__(self) -> None:
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._captured: set[tuple] = set()
        self.retired: list[torch.Tensor] = []
        self.allocations = 0

    def get(self, key: object, shape: tuple[int, ...], dtype: torch.dtype,
            device: torch.device) -> torch.Tensor:
        full = (key, dtype, device)
        numel = math.prod(shape)
        buf = self._buffers.get(full)
        if buf is None or buf.numel() < numel:
            if buf is not None and full in self._captured:
                self.retired.append(buf)
                self._captured.discard(full)
            grow = numel if buf is None else max(numel, buf.numel() + buf.numel() // 2)
            buf = torch.empty(grow, dtype=dtype, device=device)
            self._buffers[full] = buf
            self.allocations += 1
        if buf.is_cuda and not torch.compiler.is_compiling() and \
                torch.cuda.is_current_stream_capturing():
            self._captured.add(full)
        return buf[:numel].view(shape)

    def holds(self, key: object, dtype: torch.dtype, device: torch.device,
              view: torch.Tensor) -> bool:
        """Whether ``view`` (handed out by :meth:`get`) still lies in the buffer kept for
        ``(key, dtype, device)`` (the buffer is replaced when it grows)."""
        buf = self._buffers.get((key, dtype, device))
        return buf is not None and view.data_ptr() == buf.data_ptr()

    def capture(self, key: object, dtype: torch.dtype, device: torch.device) -> None:
        """Mark the buffer of ``(key, dtype, device)`` as read by a CUDA graph being
        captured: it is kept alive when it is later outgrown."""
        self._captured.add((key, dtype, device))

    def __len__(self) -> int:
        return len(self._buffers)

    def clear(self) -> None:
        """Drop every buffer (those a captured graph reads included: recapture after)."""
        self._buffers.clear()
        self._captured.clear()
        self.retired.clear()

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())
