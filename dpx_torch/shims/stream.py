"""The current CUDA stream of a device as a raw handle (an int), which a direct kernel
launch passes to the compiled kernel's launcher.

Layer: shims. Imports dpx and the modules before it in its own row (docs/semantics.md,
"Where things live").

Private: ``torch._C._cuda_getCurrentRawStream(device_index)``, checked on torch 2.11 (CUDA)
and 2.13. Public fallback: ``torch.cuda.current_stream(device_index).cuda_stream`` (the
same int, with a ``Stream`` object made per call), when the private function is missing or
its first call fails (:class:`~dpx_torch.shims.first_use.FirstUse`).
"""

from __future__ import annotations

import torch

from dpx_torch.shims.first_use import FirstUse

__all__ = ["public_raw_stream", "raw_stream"]


def public_raw_stream(index: int) -> int:
    """The current stream of CUDA device ``index`` through the public API."""
    return torch.cuda.current_stream(index).cuda_stream


def raw_stream() -> FirstUse:
    """``raw_stream().fn(index) -> int``: the current stream's handle (one per launcher:
    the choice is made on its first call)."""
    private = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return FirstUse(private if callable(private) else None, public_raw_stream)
