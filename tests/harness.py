"""A persistent multi-process gloo world for tests.

``GlooWorld(n, dir)`` spawns ``n`` processes that join one gloo process group through a
file rendezvous (no ports) and then wait for jobs. ``world.run("module:function", *args)``
runs ``function(ctx, *args)`` on every rank and returns the per-rank results; an exception
on any rank is re-raised here with every rank's traceback. A job that does not finish
within its timeout kills the world (it is rebuilt on next use) and fails the test: a hang
becomes an error, never a stuck suite. ``ctx`` keeps per-process state (communicators per
layout) across jobs, so process groups are built once per session.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import queue
import sys
import traceback
from pathlib import Path
from typing import Any


class WorkerContext:
    """Per-process state shared by jobs: rank, world size and cached communicators."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self._comms: dict[Any, Any] = {}
        #: keywords every communicator of :meth:`comm` gets unless a job gives its own
        #: (``torch_jobs.use_transport`` sets the peer transport's)
        self.defaults: dict[str, Any] = {}

    def comm(self, layout, **kwargs):
        from dpx_torch import DpComm

        kwargs = {**self.defaults, **kwargs}
        key = (layout, tuple(sorted(kwargs.items())))
        if key not in self._comms:
            self._comms[key] = DpComm(layout, **kwargs)
        return self._comms[key]

    def kernel_comm(self, layout):
        """A communicator whose CPU passes are the Triton kernels (in Triton's interpreter)
        instead of torch ops: its calls run every launch argument the GPU path binds."""
        from dpx_torch import DpComm
        from dpx_torch.passes import TritonPasses

        key = (layout, "kernels")
        if key not in self._comms:
            comm = self._comms[key] = DpComm(layout)
            comm.runner.passes["cpu"] = TritonPasses()
        return self._comms[key]


def _worker(rank: int, size: int, init_file: str, jobs: mp.Queue, results: mp.Queue,
            path: list[str], backend: str) -> None:
    sys.path[:0] = [p for p in path if p not in sys.path]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank,
                            world_size=size)
    ctx = WorkerContext(rank, size)
    try:
        while True:
            job = jobs.get()
            if job is None:
                break
            target, args, kwargs = job
            try:
                mod, fn = target.split(":")
                result = getattr(importlib.import_module(mod), fn)(ctx, *args, **kwargs)
                results.put((rank, True, result))
            except BaseException:  # noqa: BLE001 - reported to the parent
                results.put((rank, False, traceback.format_exc()))
    finally:
        dist.destroy_process_group()


class WorkerError(AssertionError):
    """A job failed on at least one rank."""


class GlooWorld:
    """``size`` processes in one process group (``backend``: a torch.distributed backend
    spec, ``"gloo"`` by default; ``"cpu:gloo"`` etc. as a launcher would pass it)."""

    def __init__(self, size: int, directory: Path, backend: str = "gloo") -> None:
        directory.mkdir(parents=True, exist_ok=True)
        ctx = mp.get_context("spawn")
        self.size = size
        self.results: mp.Queue = ctx.Queue()
        self.jobs = [ctx.Queue() for _ in range(size)]
        init_file = str(directory / "rendezvous")
        self.procs = [ctx.Process(target=_worker, args=(r, size, init_file, self.jobs[r],
                                                        self.results, list(sys.path),
                                                        backend),
                                  daemon=True) for r in range(size)]
        for p in self.procs:
            p.start()
        self.alive = True

    def run(self, target: str, *args: Any, timeout: float = 90.0, **kwargs: Any) -> list[Any]:
        if not self.alive:
            raise RuntimeError("this gloo world was closed after a failure")
        for q in self.jobs:
            q.put((target, args, kwargs))
        out: dict[int, Any] = {}
        errors: dict[int, str] = {}
        try:
            for _ in range(self.size):
                rank, ok, value = self.results.get(timeout=timeout)
                (out if ok else errors)[rank] = value
        except queue.Empty:
            self.kill()
            raise WorkerError(f"{target}: ranks {sorted(set(range(self.size)) - set(out) - set(errors))} "
                              f"did not finish within {timeout}s (hang); errors so far: "
                              + "".join(f"\n--- rank {r}\n{t}" for r, t in errors.items()))
        if errors:
            raise WorkerError(f"{target} failed on ranks {sorted(errors)}:" +
                              "".join(f"\n--- rank {r}\n{t}" for r, t in sorted(errors.items())))
        return [out[r] for r in range(self.size)]

    def kill(self) -> None:
        self.alive = False
        for p in self.procs:
            if p.is_alive():
                p.kill()
        for p in self.procs:
            p.join(timeout=10)

    def close(self) -> None:
        if not self.alive:
            return
        for q in self.jobs:
            q.put(None)
        for p in self.procs:
            p.join(timeout=30)
        self.kill()


def raised(fn) -> str:
    """``"<error type>: <message>"`` of the dpx error ``fn()`` raises, or ``"no error"``."""
    import dpx

    try:
        fn()
    except dpx.DpxError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"
