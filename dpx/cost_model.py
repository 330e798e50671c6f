"""A bandwidth/latency cost model: what a collective and a local pass take.

A collective of data size ``S`` on ``g`` ranks takes ``latency + S * factor /
bus_bandwidth`` as nccl-tests reports it (``factor`` ``(g-1)/g`` for all-gather and
reduce-scatter, ``2(g-1)/g`` for all-reduce), plus ``per_root_latency`` per non-empty chunk
of a variable-size one; a local pass costs its bytes read + written over
``memory_bandwidth``. :mod:`dpx.cost` prices schedules with it, :mod:`dpx.pricing` a
mode's rows in closed form.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dpx.errors import DpxValueError

__all__ = ["CostModel", "StepCost"]


@dataclass(frozen=True)
class StepCost:
    """One step's estimate: ``what`` (the step), ``size`` (a collective's data size S, a
    pass's bytes read + written), ``moved`` (bytes each rank sends) and ``seconds``."""

    what: Any = field(compare=False)  # estimates compare by their numbers
    ranks: int
    size: int
    moved: int
    seconds: float
    collective: bool = False

    @property
    def name(self) -> str:
        """The step as it prints (made when read: pricing a schedule formats nothing)."""
        return str(self.what)


@dataclass(frozen=True)
class CostModel:
    """Bandwidths in bytes per second, latencies in seconds. The defaults are
    order-of-magnitude figures for NVLink Hopper GPUs; fit them to a machine with
    ``benchmarks/collectives.py``."""

    bus_bandwidth: float = 350e9
    latency: float = 15e-6
    per_root_latency: float = 4e-6
    memory_bandwidth: float = 4.0e12
    #: a world step of the peer transport: one barrier (flags written and read in peers'
    #: memory) in place of a collective's launch and per-root latencies
    peer_latency: float = 5e-6

    def __post_init__(self) -> None:
        for name in ("bus_bandwidth", "memory_bandwidth"):
            if not getattr(self, name) > 0:
                raise DpxValueError(f"CostModel.{name}={getattr(self, name)} must be > 0")
        for name in ("latency", "per_root_latency", "peer_latency"):
            if not getattr(self, name) >= 0:
                raise DpxValueError(f"CostModel.{name}={getattr(self, name)} must be >= 0")

    def collective_seconds(self, size: int, ranks: int, factor: float,
                           roots: int = 0, *, peer: bool = False) -> tuple[int, float]:
        """``(moved bytes, seconds)`` of one collective (0 and 0.0 on one rank); ``peer``:
        a world step of the peer transport (:attr:`peer_latency`, no roots)."""
        if ranks <= 1:
            return 0, 0.0
        moved = round(size * factor)
        if peer:
            return moved, self.peer_latency + moved / self.bus_bandwidth
        return moved, self.latency + roots * self.per_root_latency + moved / self.bus_bandwidth

    def collective(self, what: Any, size: int, ranks: int, factor: float,
                   roots: int = 0, *, peer: bool = False) -> StepCost:
        moved, seconds = self.collective_seconds(size, ranks, factor, roots, peer=peer)
        return StepCost(what, ranks, size, moved, seconds, True)

    def local_pass(self, what: Any, nbytes: int) -> StepCost:
        """A kernel pass that reads and writes ``nbytes`` in total."""
        return StepCost(what, 1, nbytes, 0, nbytes / self.memory_bandwidth)
