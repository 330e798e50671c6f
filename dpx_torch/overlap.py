"""Two-batch overlap: one communication stream, persistent events per (op, micro-batch key).

Layer: runner. Imports dpx, the shims, passes and transports layers and the modules before
it in its own row (docs/semantics.md, "Where things live").

Every overlapped call of a communicator runs on its one comm stream, so the collectives of
all micro-batches stay in one order on every rank. Events are created once per key and
re-recorded each step; outputs come from the communicator's grow-only pool keyed by
``(op, key)``, so neither events nor memory grow with the number of steps.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch

from dpx_torch.pool import BufferPool

__all__ = ["DpWork", "Overlap"]


class DpWork:
    """Handle of an overlapped call: ``wait()`` makes the current stream wait for the
    communication (a persistent event, re-recorded each step; no host sync)."""

    def __init__(self, event: torch.cuda.Event | None) -> None:
        self.event = event

    def wait(self) -> None:
        if self.event is not None:
            torch.cuda.current_stream().wait_event(self.event)


class Overlap:
    """The comm stream and events of one communicator (an overlapped call's scratch
    buffers are keyed apart from the caller's when it prepares: ``scratch_key="comm"``)."""

    def __init__(self, pool: BufferPool) -> None:
        self.pool = pool
        self._stream: torch.cuda.Stream | None = None
        self.events: dict[tuple[str, object], torch.cuda.Event] = {}

    @property
    def stream(self) -> torch.cuda.Stream:
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        return self._stream

    def _event(self, kind: str, key: object) -> torch.cuda.Event:
        ev = self.events.get((kind, key))
        if ev is None:
            ev = self.events[(kind, key)] = torch.cuda.Event()
        return ev

    def launch(self, kind: str, key: object, inp: torch.Tensor, out: torch.Tensor | None,
               rows: int | None, prepare: Callable[[torch.Tensor | None],
                                                   Callable[[torch.Tensor], object]]
               ) -> tuple[torch.Tensor, DpWork]:
        """An overlapped call: ``run = prepare(out)`` (the call's checks and its prepared
        steps) then ``run(out)``, into ``out`` or, when ``out`` is None and the call's
        output has ``rows`` rows, a pooled ``[rows, *inp.shape[1:]]`` output keyed by
        ``(kind, key)`` -- chosen before the checks, so they hold it to the rules of any
        ``out=`` (it must not overlap the input). On CUDA all of it runs on the comm stream
        after the current stream's work (its scratch buffers belong to the stream that
        uses them); returns the output and its :class:`DpWork`. On CPU nothing overlaps:
        the call runs now and the handle's ``wait()`` does nothing."""
        shape = (rows, *inp.shape[1:]) if rows is not None and isinstance(
            inp, torch.Tensor) and inp.dim() else None   # (else the checks name the input)
        cuda = isinstance(inp, torch.Tensor) and inp.is_cuda
        if cuda:
            compute, comm = torch.cuda.current_stream(inp.device), self.stream
            comm.wait_stream(compute)  # the input was produced on the compute stream
        with torch.cuda.stream(comm) if cuda else contextlib.nullcontext():
            if out is None and shape is not None:
                out = self.pool.get((f"{kind}-out", key), shape, inp.dtype, inp.device)
            prepare(out)(out)
            if not cuda:   # nothing overlaps: done
                return out, DpWork(None)
            ev = self._event(kind, key)
            ev.record(comm)
        inp.record_stream(comm)      # freed only after the comm stream is done with it
        out.record_stream(compute)   # read on the compute stream after wait()
        return out, DpWork(ev)
