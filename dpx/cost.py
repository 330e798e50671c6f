"""A bandwidth/latency cost model for the three padding modes.

Each collective is timed the way nccl-tests reports it: with ``S`` the collective's data
size (the full output of an all-gather, the full input of a reduce-scatter or all-reduce)
on ``n`` ranks, the time is ``latency + S * factor / bus_bandwidth`` where ``factor`` is
``(n-1)/n`` for all-gather and reduce-scatter and ``2(n-1)/n`` for all-reduce. A
variable-length all-gather (or reduce-scatter) built from grouped per-root operations moves
the same bytes as the equal one but pays a latency per root.

Every parameter is an argument; :meth:`CostModel.fitted` documents where defaults come from.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpx.errors import DpxValueError


@dataclass(frozen=True)
class CollectiveCost:
    """One collective of a mode: what it is, over how many ranks, and its estimate."""

    name: str
    ranks: int
    size: int  # the collective's data size S in bytes
    moved: int  # bytes each rank sends: S * factor (0 for a local pass)
    seconds: float


@dataclass(frozen=True)
class CostModel:
    """Parameters of the estimate. Bandwidth in bytes per second, latency in seconds.

    Defaults are order-of-magnitude figures for NVLink-connected Hopper GPUs (NCCL bus
    bandwidth of a few hundred GB/s, tens of microseconds per collective); fit them to
    your machine with measured runs.
    """

    bus_bandwidth: float = 350e9
    latency: float = 15e-6
    per_root_latency: float = 4e-6
    memory_bandwidth: float = 4.0e12

    def __post_init__(self) -> None:
        for name in ("bus_bandwidth", "memory_bandwidth"):
            if not getattr(self, name) > 0:
                raise DpxValueError(f"CostModel.{name}={getattr(self, name)} must be > 0")
        for name in ("latency", "per_root_latency"):
            if not getattr(self, name) >= 0:
                raise DpxValueError(f"CostModel.{name}={getattr(self, name)} must be >= 0")

    def _collective(self, name: str, size: int, n: int, factor: float,
                    roots: int = 0) -> CollectiveCost:
        if n <= 1:
            return CollectiveCost(name, n, size, 0, 0.0)
        moved = round(size * factor)
        seconds = self.latency + roots * self.per_root_latency + moved / self.bus_bandwidth
        return CollectiveCost(name, n, size, moved, seconds)

    def all_gather(self, name: str, size: int, n: int) -> CollectiveCost:
        return self._collective(name, size, n, (n - 1) / n)

    def reduce_scatter(self, name: str, size: int, n: int) -> CollectiveCost:
        return self._collective(name, size, n, (n - 1) / n)

    def all_reduce(self, name: str, size: int, n: int) -> CollectiveCost:
        return self._collective(name, size, n, 2 * (n - 1) / n)

    def variable(self, name: str, size: int, n: int, roots: int) -> CollectiveCost:
        """A variable-length all-gather or reduce-scatter from ``roots`` grouped per-root ops."""
        return self._collective(name, size, n, (n - 1) / n, roots)

    def local_pass(self, name: str, size: int) -> CollectiveCost:
        """A kernel pass writing ``size`` bytes (read + write at memory bandwidth)."""
        return CollectiveCost(name, 1, size, 0, 2 * size / self.memory_bandwidth)
