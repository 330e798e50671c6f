"""Launching the ``dpx.kernels`` from torch: Triton's compiled kernel, called directly.

Layer: shims. Imports dpx and the modules before it in its own row (docs/semantics.md,
"Where things live").

``kernel[grid](*args)`` costs ~20 µs of host time per launch on a serving host: Triton binds
and specialises every argument, hashes the specialisation and looks the kernel up, on every
call. A :class:`Launcher` does that once per *specialisation* -- the kernel, its constexpr
values, its warps, the device, and for each pointer argument its dtype and whether it is
16-byte aligned (what Triton specialises a pointer on) -- keeps the compiled kernel's
handle, and later calls its launcher directly with the call's pointers (ints or tensors),
integers, grid and the current stream: the same compiled kernel, the same PTX, none of the
per-call binding. Launch hooks (a profiler's ``knobs.runtime.launch_enter_hook``) get the
ordinary launch, which computes their metadata.

Private: the handle API (``JITFunction.run(..., warmup=True)`` returning the compiled
kernel; its ``run(grid0, grid1, grid2, stream, function, packed_metadata,
launch_metadata, enter_hook, exit_hook, *args)``, every argument of the kernel's signature
in order, constexprs included; ``function`` and ``packed_metadata``) and the launch hooks
of ``triton.knobs.runtime``, the ones Triton's own ``JITFunction`` uses, checked on Triton
3.6 (CUDA, H200) and 3.9. Public
fallback: the ordinary launch ``kernel[grid](...)`` -- for a specialisation whose handle
cannot be made, for every launch where ``triton.knobs`` is missing (hooks cannot be
checked), and for good for a specialisation whose handle's first launch raises
``TypeError`` / ``AttributeError`` (a changed signature). A launcher holds at most
``max_entries`` handles (least recently used first out; the dpx kernels have a few dozen
specialisations in use).

The current stream, which a direct launch passes as a raw handle (an int): private
``torch._C._cuda_getCurrentRawStream(device_index)``, checked on torch 2.11 (CUDA) and
2.13; public fallback ``torch.cuda.current_stream(device_index).cuda_stream`` (the same
int, with a ``Stream`` object made per call) when the private function is missing or its
first call fails (:class:`~dpx_torch.shims.first_use.FirstUse`).

:data:`JIT` launches through ``kernel[grid]`` every time (the path of calls outside a
communicator, and of Triton's interpreter on CPU tensors in the kernel tests:
:mod:`dpx_torch.shims.interpreter`).
"""

from __future__ import annotations

import contextlib

from typing import Any, Sequence

import torch

from dpx.errors import DpxValueError
from dpx.lru import LRU
from dpx_torch.shims.first_use import FirstUse
from dpx_torch.shims.interpreter import Interpreter

__all__ = ["BoundKernel", "JIT", "JitLauncher", "Launcher", "kernel_for", "public_raw_stream",
           "raw_stream"]


def public_raw_stream(index: int) -> int:
    """The current stream of CUDA device ``index`` through the public API."""
    return torch.cuda.current_stream(index).cuda_stream


def raw_stream() -> FirstUse:
    """``raw_stream().fn(index) -> int``: the current stream's handle (one per launcher:
    the choice is made on its first call)."""
    private = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return FirstUse(private if callable(private) else None, public_raw_stream)


class JitLauncher:
    """``kernel[grid](*args, **constexprs, num_warps=...)``: Triton's ordinary launch (CUDA),
    or its interpreter (CPU tensors)."""

    def __init__(self) -> None:
        self.interpreter = Interpreter()

    def kernel_for(self, kernel, device: torch.device):
        """``kernel`` (a ``dpx.kernels`` JIT function) for ``device``: compiled on CUDA,
        interpreted on CPU (Triton's interpreter; what the kernel tests run)."""
        if device.type == "cuda":
            return kernel
        if device.type == "cpu":
            return self.interpreter.kernel(kernel)
        raise DpxValueError(f"device {device} is not supported: dpx kernels run on cuda or "
                            f"cpu")

    def launch(self, kernel, grid: tuple, device: torch.device, args: Sequence[Any],
               consts: dict[str, Any], num_warps: int) -> None:
        self.kernel_for(kernel, device)[grid](*args, **consts, num_warps=num_warps)

    def bind(self, kernel, device: torch.device, consts: dict[str, Any], num_warps: int,
             pointers: tuple) -> "_JitBound":
        return _JitBound(kernel, device, consts, num_warps)


class _JitBound:
    """:meth:`BoundKernel.tensors` by the ordinary launch."""

    __slots__ = ("kernel", "device", "consts", "warps")

    def __init__(self, kernel, device, consts, warps) -> None:
        self.kernel, self.device, self.consts, self.warps = kernel, device, consts, warps

    def tensors(self, grid: tuple, args: Sequence[Any]) -> None:
        JIT.launch(self.kernel, grid, self.device, args, self.consts, self.warps)


JIT = JitLauncher()


def kernel_for(kernel, device: torch.device):
    """:meth:`JitLauncher.kernel_for` of :data:`JIT`."""
    return JIT.kernel_for(kernel, device)


class Launcher:
    """Direct launches of compiled ``dpx.kernels`` (see the module docstring): one per
    communicator, at most ``max_entries`` kernel handles. ``direct``: the device types
    launched through handles (others take :data:`JIT`)."""

    direct = ("cuda",)

    def __init__(self, *, max_entries: int = 128) -> None:
        self.max_entries = max_entries
        #: whether a handle's first launch failed (its specialisation launches ordinarily)
        self.fell_back = False
        self._specs = LRU(max_entries)   # specialisation -> _Spec, or _NO_HANDLE
        self._bound = LRU(max_entries)
        import triton

        knobs = getattr(triton, "knobs", None)
        #: the launch hooks' home; None: hooks cannot be checked (every launch ordinary)
        self._runtime = getattr(knobs, "runtime", None)
        #: ``stream.fn(device_index) -> int`` (:func:`raw_stream`)
        self.stream = raw_stream()

    def __len__(self) -> int:
        return len(self._specs)

    def clear(self) -> None:
        self._specs.clear()
        self._bound.clear()

    def hooks(self) -> bool:
        """Whether a launch hook is set (a profiler's): launches then take the ordinary
        path, which gives the hooks their metadata."""
        rt = self._runtime
        if rt is None:
            return True
        # read inline (every launch asks): a hook set and not empty (a chain of no calls)
        enter, leave = rt.launch_enter_hook, rt.launch_exit_hook
        return (enter is not None and bool(getattr(enter, "calls", True))) \
            or (leave is not None and bool(getattr(leave, "calls", True)))

    def bind(self, kernel, device: torch.device, consts: dict[str, Any], num_warps: int,
             pointers: tuple[tuple[int, torch.dtype], ...]):
        """``kernel`` with ``consts`` and ``num_warps`` on ``device``; ``pointers``: the
        positions of its pointer arguments among the runtime ones and their dtypes. Its
        ``tensors(grid, args)`` launches it. Kept (as many as ``max_entries``)."""
        if device.type not in self.direct:
            return JIT.bind(kernel, device, consts, num_warps, pointers)
        key = (kernel, tuple(consts.items()), num_warps, device, pointers)
        b = self._bound.hit(key)
        if b is None:
            b = self._bound.put(key, BoundKernel(self, kernel, device, consts, num_warps,
                                                 pointers))
        return b

    def launch(self, kernel, grid: tuple, device: torch.device, args: Sequence[Any],
               consts: dict[str, Any], num_warps: int) -> None:
        """One launch of ``kernel`` with ``args`` (its runtime arguments in signature
        order, tensors for the pointers) and ``consts`` (its constexprs, in signature
        order after them)."""
        pointers = tuple((i, a.dtype) for i, a in enumerate(args) if isinstance(a, torch.Tensor))
        self.bind(kernel, device, consts, num_warps, pointers).tensors(grid, args)

    def spec(self, bound: "BoundKernel", grid: tuple, align: tuple,
             args: Sequence[Any]) -> "_Spec | None":
        """The compiled kernel of ``bound`` for pointers of alignment ``align`` (compiled or
        found by Triton's own cache without launching); None where this Triton has no
        handle API (then every launch of it takes the ordinary path)."""
        full = (bound.kernel, bound.cvals, bound.warps, bound.device.index, bound.pointers,
                align)
        found = self._specs.hit(full)
        if found is not None:
            return None if found is _NO_HANDLE else found
        on = (torch.cuda.device(bound.device) if bound.device.type == "cuda"
              else contextlib.nullcontext())
        try:
            with on:
                compiled = bound.kernel.run(*bound.as_tensors(args, align), grid=grid,
                                            warmup=True, **bound.consts,
                                            num_warps=bound.warps)
            spec = _Spec(compiled)
        except (AttributeError, TypeError):
            spec = None
        self._specs.put(full, _NO_HANDLE if spec is None else spec)
        return spec


class _Spec:
    """One specialisation's compiled kernel: its launcher, function and metadata, and
    whether a launch through them worked yet."""

    __slots__ = ("run", "function", "metadata", "checked")

    def __init__(self, compiled) -> None:
        self.run = compiled.run
        self.function = compiled.function
        self.metadata = compiled.packed_metadata
        self.checked = False


class BoundKernel:
    """One kernel bound to its constexprs, warps, device and pointer dtypes
    (:meth:`Launcher.bind`). ``bound(grid, align, args)`` launches it: ``args`` are its
    runtime arguments with ints (or tensors) for the pointers, ``align`` for each pointer
    whether it is 16-byte aligned; :meth:`tensors` reads both from tensors."""

    __slots__ = ("launcher", "kernel", "device", "consts", "cvals", "warps", "pointers",
                 "_specs", "_index")

    def __init__(self, launcher: Launcher, kernel, device: torch.device,
                 consts: dict[str, Any], num_warps: int,
                 pointers: tuple[tuple[int, torch.dtype], ...]) -> None:
        self.launcher, self.kernel, self.device = launcher, kernel, device
        self.consts, self.cvals, self.warps = consts, tuple(consts.values()), num_warps
        self.pointers = pointers
        self._specs: dict[tuple, _Spec | None] = {}
        self._index = device.index if device.index is not None else 0

    def __call__(self, grid: tuple, align: tuple, args: Sequence[Any]) -> None:
        launcher = self.launcher
        spec = self._specs.get(align)
        if spec is None and align not in self._specs:
            spec = self._specs[align] = launcher.spec(self, grid, align, args)
        if spec is None or launcher.hooks():
            JIT.launch(self.kernel, grid, self.device, self.as_tensors(args, align),
                       self.consts, self.warps)
            return
        try:   # a handle's first launch: a changed API fails here, before the GPU
            spec.run(grid[0], grid[1] if len(grid) > 1 else 1, 1,
                     launcher.stream.fn(self._index), spec.function, spec.metadata, None,
                     None, None, *args, *self.cvals)
        except (AttributeError, TypeError):
            if spec.checked:
                raise
            self._specs[align] = None   # the ordinary launch, for good
            launcher.fell_back = True
            JIT.launch(self.kernel, grid, self.device, self.as_tensors(args, align),
                       self.consts, self.warps)
            return
        spec.checked = True

    def tensors(self, grid: tuple, args: Sequence[Any]) -> None:
        """Launch with tensors for the pointers (their addresses and alignment read
        here)."""
        args = list(args)
        align = []
        for i, _ in self.pointers:
            p = args[i].data_ptr()
            args[i] = p
            align.append(p % 16 == 0)
        self(grid, tuple(align), args)

    def as_tensors(self, args: Sequence[Any], align: tuple) -> list:
        """``args`` with int pointers made into objects Triton binds as pointers of their
        dtype (and alignment)."""
        out = list(args)
        for (i, dtype), _ in zip(self.pointers, align):
            if not isinstance(out[i], torch.Tensor):
                out[i] = _Pointer(int(out[i]), dtype)
        return out


_NO_HANDLE = object()   # a specialisation this Triton gives no handle for


class _Pointer:
    """An int address that Triton's binder specialises like a tensor of ``dtype``."""

    __slots__ = ("_ptr", "dtype")

    def __init__(self, ptr: int, dtype: torch.dtype) -> None:
        self._ptr, self.dtype = ptr, dtype

    def data_ptr(self) -> int:
        return self._ptr
