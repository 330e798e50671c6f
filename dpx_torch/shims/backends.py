"""What a process group's backends carry and whether they coalesce.

Layer: shims. Imports dpx and the modules before it in its own row (docs/semantics.md,
"Where things live").

Private: ``ProcessGroup._device_types`` (the device types of its backends) and
``ProcessGroup._get_backend(device).supports_coalescing``, checked on torch 2.11 (CUDA)
and 2.13 (CPU). Public fallbacks: the backend string ``dist.get_backend(pg)`` (``"nccl"``
carries CUDA, ``"gloo"`` CPU and CUDA, ``"cpu:gloo,cuda:nccl"`` what it names), and no
coalescing (collectives go out one by one: the same results), when the private names are
missing or fail.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["coalesces", "device_types", "spec_device_types"]


def spec_device_types(spec: str) -> frozenset[str]:
    """The device types a backend string carries (the public fallback)."""
    spec = spec.lower()
    if ":" in spec:
        return frozenset(part.split(":")[0] for part in spec.split(","))
    return frozenset({"cuda"} if spec == "nccl" else {"cpu", "cuda"})


def device_types(pg: dist.ProcessGroup) -> frozenset[str]:
    """The device types ``pg``'s backends carry."""
    try:
        types = pg._device_types
        if types:
            return frozenset(t.type if isinstance(t, torch.device) else str(t) for t in types)
    except (AttributeError, TypeError, RuntimeError):
        pass
    return spec_device_types(str(dist.get_backend(pg)))


def coalesces(pg: dist.ProcessGroup, device_type: str) -> bool:
    """Whether ``pg``'s backend for ``device_type`` groups collectives into one launch."""
    try:
        return bool(pg._get_backend(torch.device(device_type)).supports_coalescing)
    except (AttributeError, TypeError, RuntimeError):
        return False
