"""Launching the ``dpx.kernels`` from torch: Triton's compiled kernel, called directly.

``kernel[grid](*args)`` costs ~20 µs of host time per launch on a serving host: Triton binds
and specialises every argument, hashes the specialisation and looks the kernel up, on every
call. A :class:`Launcher` does that once per *specialisation* -- the kernel, its constexpr
values, its warps, the device, and for each pointer argument its dtype and whether it is
16-byte aligned (what Triton specialises a pointer on) -- keeps the compiled kernel's
handle, and later calls its launcher directly with the call's pointers (ints or tensors),
integers, grid and the current stream: the same compiled kernel, the same PTX, none of the
per-call binding. Launch hooks (a profiler's ``knobs.runtime.launch_enter_hook``) get the
ordinary launch, which computes their metadata.

The handle API (``CompiledKernel.run(grid0, grid1, grid2, stream, function,
packed_metadata, launch_metadata, enter_hook, exit_hook, *args)``, with every argument of
the kernel's signature in order, constexprs included) is the one Triton's own ``JITFunction``
uses, unchanged from Triton 3.6 to 3.9. A launcher holds at most ``max_entries`` handles
(least recently used first out; the dpx kernels have a few dozen specialisations in use).

:data:`JIT` launches through ``kernel[grid]`` every time (the path of calls outside a
communicator, and of Triton's interpreter on CPU tensors in the kernel tests).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Sequence

import torch

__all__ = ["JIT", "JitLauncher", "Launcher", "kernel_for"]


def kernel_for(kernel, device: torch.device):
    """``kernel`` (a ``dpx.kernels`` JIT function) for ``device``: compiled on CUDA,
    interpreted on CPU (Triton's interpreter; what the kernel tests run)."""
    if device.type == "cuda":
        return kernel
    if device.type == "cpu":
        return _interpreted(kernel)
    from dpx.errors import DpxValueError

    raise DpxValueError(f"device {device} is not supported: dpx kernels run on cuda or cpu")


def _interpreted(kernel):
    fn = getattr(kernel, "_dpx_interpreted", None)
    if fn is None:
        from triton.runtime.interpreter import InterpretedFunction

        fn = InterpretedFunction(kernel.fn)
        kernel._dpx_interpreted = fn  # one per kernel: a fixed set
    return fn


class JitLauncher:
    """``kernel[grid](*args, **constexprs, num_warps=...)``: Triton's ordinary launch (CUDA),
    or its interpreter (CPU tensors). Stateless."""

    @staticmethod
    def launch(kernel, grid: tuple, device: torch.device, args: Sequence[Any],
               consts: dict[str, Any], num_warps: int) -> None:
        kernel_for(kernel, device)[grid](*args, **consts, num_warps=num_warps)


JIT = JitLauncher()


def _hook_active(hook) -> bool:
    return hook is not None and bool(getattr(hook, "calls", True))


class _Spec:
    """One specialisation's compiled kernel: its launcher, function and metadata."""

    __slots__ = ("run", "function", "metadata", "consts")

    def __init__(self, compiled, consts: tuple) -> None:
        self.run = compiled.run
        self.function = compiled.function
        self.metadata = compiled.packed_metadata
        self.consts = consts


class Launcher:
    """Direct launches of compiled ``dpx.kernels`` (see the module docstring): one per
    communicator, at most ``max_entries`` kernel handles."""

    def __init__(self, *, max_entries: int = 128) -> None:
        self.max_entries = max_entries
        self._specs: OrderedDict[tuple, _Spec | None] = OrderedDict()
        import triton

        self._knobs = getattr(triton, "knobs", None)
        self._raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)

    def __len__(self) -> int:
        return len(self._specs)

    def clear(self) -> None:
        self._specs.clear()

    def _hooks(self) -> bool:
        k = self._knobs
        if k is None:
            return True
        rt = k.runtime
        return _hook_active(rt.launch_enter_hook) or _hook_active(rt.launch_exit_hook)

    def launch(self, kernel, grid: tuple, device: torch.device, args: Sequence[Any],
               consts: dict[str, Any], num_warps: int, *, key: tuple | None = None) -> None:
        """Launch ``kernel`` on ``grid`` with ``args`` (its runtime arguments in signature
        order: tensors, ints, or ints standing for pointers when ``key`` is given) and
        ``consts`` (its constexprs, in signature order after them). ``key`` is the
        specialisation of the pointer arguments (:meth:`pointer_key`); without it, it is
        read from the tensors in ``args``."""
        if device.type != "cuda":
            JIT.launch(kernel, grid, device, args, consts, num_warps)
            return
        if key is None:
            key = self.pointer_key(args)
        full = (kernel, key, tuple(consts.values()), num_warps, device.index)
        spec = self._specs.get(full)
        if spec is None or self._hooks():
            if spec is None and full not in self._specs:
                spec = self._compile(kernel, grid, device, args, consts, num_warps, full)
            if spec is None or self._hooks():
                JIT.launch(kernel, grid, device, _as_tensors(args, key, device), consts,
                           num_warps)
                return
        g = grid + (1, 1)
        spec.run(g[0], g[1], g[2], self._raw_stream(device.index), spec.function,
                 spec.metadata, None, None, None, *args, *spec.consts)

    @staticmethod
    def pointer_key(args: Sequence[Any]) -> tuple:
        """For each tensor argument, its dtype and 16-byte alignment (None for the rest)."""
        return tuple((a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor)
                     else None for a in args)

    def _compile(self, kernel, grid, device, args, consts, num_warps, full) -> _Spec | None:
        """The specialisation's compiled kernel (compiled or found by Triton's own cache
        without launching); None where this Triton has no handle API (then every launch
        of it takes the ordinary path)."""
        try:
            with torch.cuda.device(device):
                compiled = kernel.run(*_as_tensors(args, full[1], device), grid=grid,
                                      warmup=True, **consts, num_warps=num_warps)
            spec = _Spec(compiled, tuple(consts.values()))
        except (AttributeError, TypeError):
            spec = None
        self._specs[full] = spec
        if len(self._specs) > self.max_entries:
            self._specs.popitem(last=False)
        return spec


class _Pointer:
    """An int address that Triton's binder specialises like a tensor of ``dtype``."""

    __slots__ = ("_ptr", "dtype")

    def __init__(self, ptr: int, dtype: torch.dtype) -> None:
        self._ptr, self.dtype = ptr, dtype

    def data_ptr(self) -> int:
        return self._ptr


def _as_tensors(args: Sequence[Any], key: tuple, device: torch.device) -> list:
    """``args`` with int pointers (``key`` names them) made into objects Triton binds as
    pointers of their dtype and alignment."""
    out = []
    for a, k in zip(args, key):
        if k is not None and not isinstance(a, torch.Tensor):
            a = _Pointer(int(a), k[0])
        out.append(a)
    return out
