"""The local passes of a schedule (:mod:`dpx.steps`) on torch tensors, one implementation per
kind of device, with one interface:

- :class:`TritonPasses` (CUDA): the ``dpx.kernels`` Triton kernels -- one pass over each
  output, offsets and counts read from device memory where they are device data (CUDA-graph
  replayable) -- launched through a :class:`~dpx_torch.shims.triton_launch.Launcher`;
- :class:`TorchPasses` (CPU): stock torch ops (slice copies, ``zero_``, ``copy_``) on the
  same semantics, reading one-element count tensors on the host (a CPU tensor has no
  device to wait for). Triton's interpreter runs the kernels on CPU tensors too, 100-8,000x
  slower than these ops; the kernel tests use it (``TritonPasses(JIT)`` on CPU).

Every pass writes its whole output (real rows and zeros) and clips every index to the
buffers, so a wrong count can never read or write out of bounds (the kernels mask; the
torch ops clip the same way). Semantics, ``Index`` = an int or a one-element int32 tensor
on the data's device:

``move(src, ss, ds, n, out)``: ``out[ds + j] = src[ss + j]`` for ``j < n``, other rows 0.
``zero(out, ks, kn)``: rows of ``out`` outside ``[ks, ks + kn)`` become 0 (in place).
``unpack(src, firsts, lens, block, out)``: ``out[firsts[r] + j] = src[r*block + j]`` for
``j < min(lens[r], block)``; other rows 0. ``pack``: its adjoint, ``out[r*block + j] =
src[firsts[r] + j]``. ``firsts`` / ``lens``: int32 ``[n]`` tensors.
``quantize(src, start, n, out, wire, g)``: ``out[j]`` = the ``wire`` row (:mod:`dpx.wire`;
``g`` nvfp4's global scale) of ``src[start + j]`` for ``j < n``, zero bytes after.
``dequantize(src, out, wire, g)``. ``dequantize_sum(src, out, parts, wire, g)``: ``out[j]`` =
the float32 sum over ``p < parts`` in order of the dequantized ``src[p * rows + j]``,
rounded to ``out``'s dtype (the combine, :class:`dpx.steps.DequantizeSum`).
``mask(t, firsts, lens, fill)``: rows outside every range ``[firsts[k], firsts[k] +
lens[k])`` become ``fill`` (in place). ``check(counts, flag, rule)``: ``flag |=`` the bits
of the :class:`dpx.CountRule` ``rule`` that ``counts`` break.

Each pass also has a ``bind_*`` form: everything that depends only on the shapes (launch
grid, tile, compiled kernel) resolved once, a function of the buffers (and of the index
tensors that are device data) left to call -- what a prepared call runs.

Layer: passes. Imports dpx, the shims layer and the modules before it in its own row
(docs/semantics.md, "Where things live").
"""

from __future__ import annotations

from typing import Any, Callable, Union

import torch

from dpx.counts import CountRule
from dpx.kernels import launch as _tiles
from dpx.modes import Wire
from dpx_torch.shims.triton_launch import JIT, BoundKernel, JitLauncher, Launcher
from dpx.lru import LRU
from dpx_torch.wire import dequantize_rows, dequantize_sum_rows, quantize_rows

__all__ = ["DEVICE", "Index", "Passes", "passes_for", "rows_width", "TorchPasses",
           "TritonPasses"]

Index = Union[int, torch.Tensor]  # a tensor: one element, int32, on the data's device

#: Marks an index a bound pass reads from a device tensor given at each call.
DEVICE = None

def rows_width(t: torch.Tensor) -> int:
    """Elements per row of ``t`` (its trailing dims flattened)."""
    w = 1
    for s in t.shape[1:]:
        w *= s
    return w


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


class Passes:
    """The interface; its ``bind_*`` forms close over the call forms (an implementation
    with nothing to resolve ahead of a call keeps them)."""

    def bind_move(self, src_rows: int, out_rows: int, width: int, dtype: torch.dtype,
                  device: torch.device, ss: int | None, ds: int | None, n: int | None,
                  tile: _tiles.Tile | None = None) -> Callable[..., None]:
        """``go(src, out, ss_t, ds_t, n_t)``: the move of ``ss``/``ds``/``n`` (ints, or
        :data:`DEVICE` for the ``*_t`` tensors given at the call)."""
        def go(src, out, ss_t=None, ds_t=None, n_t=None):
            self.move(src, ss if ss_t is None else ss_t, ds if ds_t is None else ds_t,
                      n if n_t is None else n_t, out)
        return go

    def bind_zero(self, out_rows: int, width: int, dtype: torch.dtype, device: torch.device,
                  ks: int | None, kn: int | None,
                  tile: _tiles.Tile | None = None) -> Callable[..., None]:
        """``go(out, ks_t, kn_t)``."""
        def go(out, ks_t=None, kn_t=None):
            self.zero(out, ks if ks_t is None else ks_t, kn if kn_t is None else kn_t)
        return go

    def bind_unpack(self, src_rows: int, out_rows: int, width: int, n: int,
                    dtype: torch.dtype, block: int,
                    device: torch.device | None = None) -> Callable[..., None]:
        """``go(src, firsts, lens, out)``."""
        return lambda src, firsts, lens, out: self.unpack(src, firsts, lens, block, out)

    def bind_pack(self, src_rows: int, out_rows: int, width: int, n: int,
                  dtype: torch.dtype, block: int,
                  device: torch.device | None = None) -> Callable[..., None]:
        """``go(src, firsts, lens, out)``."""
        return lambda src, firsts, lens, out: self.pack(src, firsts, lens, block, out)

    def bind_quantize(self, src_rows: int, out_rows: int, hidden: int, dtype: torch.dtype,
                      device: torch.device, start: int | None, n: int | None,
                      wire: Wire = Wire.FP8, g: float | None = None) -> Callable[..., None]:
        """``go(src, out, start_t, n_t)``."""
        def go(src, out, start_t=None, n_t=None):
            self.quantize(src, start if start_t is None else start_t,
                          n if n_t is None else n_t, out, wire, g)
        return go

    def bind_dequantize(self, rows: int, hidden: int, dtype: torch.dtype,
                        device: torch.device | None = None, wire: Wire = Wire.FP8,
                        g: float | None = None) -> Callable[..., None]:
        """``go(src, out)``."""
        return lambda src, out: self.dequantize(src, out, wire, g)

    def bind_dequantize_sum(self, rows: int, parts: int, hidden: int, dtype: torch.dtype,
                            device: torch.device | None = None, wire: Wire = Wire.FP8,
                            g: float | None = None) -> Callable[..., None]:
        """``go(src, out)``."""
        return lambda src, out: self.dequantize_sum(src, out, parts, wire, g)


class TritonPasses(Passes):
    """The passes as ``dpx.kernels`` launches through ``launcher`` (a
    :class:`~dpx_torch.shims.triton_launch.Launcher`, or
    :data:`~dpx_torch.shims.triton_launch.JIT`)."""

    def __init__(self, launcher: Launcher | JitLauncher = JIT, *,
                 max_launches: int = 256) -> None:
        self.launcher = launcher
        #: (kind, sizes, flags) -> (grid, bound kernel): the launches of recent binds (at
        #: most ``max_launches``; 0 keeps none)
        self._launches = LRU(max_launches)
        self.max_launches = max_launches

    def _launch_of(self, key: tuple, make: Callable[[], tuple]) -> tuple:
        if not self.max_launches:
            return make()
        hit = self._launches.hit(key)
        return hit if hit is not None else self._launches.put(key, make())

    def __len__(self) -> int:
        return len(self._launches)

    def __bool__(self) -> bool:   # (an empty cache is still passes: ``passes or default``)
        return True

    def clear(self) -> None:
        self._launches.clear()

    # ---------------------------------------------------------------- binders
    def _bind(self, lt: _tiles.Launch, device: torch.device,
              dtypes: tuple[torch.dtype, ...]) -> Any:
        """``lt`` bound on ``device``, its pointers (:attr:`Launch.pointers`) of
        ``dtypes``."""
        return self.launcher.bind(lt.kernel, device, lt.consts, lt.warps,
                                  tuple(zip(lt.pointers, dtypes)))

    def bind_move(self, src_rows, out_rows, width, dtype, device, ss, ds, n, tile=None):
        if out_rows * width == 0:
            return _nothing

        def make():
            lt = _tiles.move_launch(src_rows, out_rows, width, dtype.itemsize,
                                    src_start_ptr=ss is None, dst_start_ptr=ds is None,
                                    count_ptr=n is None, tile=tile)
            i32 = torch.int32   # a host index's pointer slot repeats the source's
            return lt.grid, self._bind(lt, device, (
                dtype, dtype if ss is not None else i32, dtype if ds is not None else i32,
                dtype if n is not None else i32, dtype))
        grid, k = self._launch_of((0, src_rows, out_rows, width, dtype, device, ss is None,
                                   ds is None, n is None, tile), make)
        ssv, dsv, nv = ss or 0, ds or 0, n or 0
        if ss is not None and ds is not None and n is not None and isinstance(k, BoundKernel):
            # every index a host int: the pointers are the two buffers' (the index slots
            # repeat the source's, never read)
            def go(src, out, ss_t=None, ds_t=None, n_t=None):
                sp, op = src.data_ptr(), out.data_ptr()
                a = sp % 16 == 0
                k(grid, (a, a, a, a, op % 16 == 0),
                  (sp, sp, sp, sp, ssv, dsv, nv, src_rows, out_rows, op))
            return go
        go_t = k.tensors

        def go(src, out, ss_t=None, ds_t=None, n_t=None):
            go_t(grid, (src, src if ss_t is None else ss_t, src if ds_t is None else ds_t,
                        src if n_t is None else n_t, ssv, dsv, nv, src_rows, out_rows, out))
        return go

    def bind_zero(self, out_rows, width, dtype, device, ks, kn, tile=None):
        if out_rows * width == 0:
            return _nothing
        lt = _tiles.zero_launch(out_rows, width, dtype.itemsize, start_ptr=ks is None,
                                count_ptr=kn is None, tile=tile)
        i32 = torch.int32
        k = self._bind(lt, device, (dtype if ks is not None else i32,
                                    dtype if kn is not None else i32, dtype))
        grid, ksv, knv = lt.grid, ks or 0, kn or 0
        go_t = k.tensors

        def go(out, ks_t=None, kn_t=None):
            anchor = out if ks_t is None else ks_t
            go_t(grid, (anchor, anchor if kn_t is None else kn_t, ksv, knv, out_rows, out))
        return go

    def _bind_chunks(self, pack: bool, src_rows: int, out_rows: int, width: int, n: int,
                     dtype: torch.dtype, block: int, device: torch.device) -> Callable[..., None]:
        if out_rows * width == 0:
            return _nothing
        lt = _tiles.chunks_launch(pack, out_rows, width, dtype.itemsize)
        i32 = torch.int32
        go_t, grid = self._bind(lt, device, (dtype, i32, i32, dtype)).tensors, lt.grid

        def go(src, firsts, lens, out):
            go_t(grid, (src, firsts, lens, src_rows, out_rows, n, block, out))
        return go

    def bind_unpack(self, src_rows, out_rows, width, n, dtype, block, device=None):
        return self._bind_chunks(False, src_rows, out_rows, width, n, dtype, block, device)

    def bind_pack(self, src_rows, out_rows, width, n, dtype, block, device=None):
        return self._bind_chunks(True, src_rows, out_rows, width, n, dtype, block, device)

    def bind_quantize(self, src_rows, out_rows, hidden, dtype, device, start, n,
                      wire=Wire.FP8, g=None):
        if out_rows == 0:
            return _nothing
        lt = _tiles.quantize_launch(wire, src_rows, out_rows, hidden, dtype.itemsize,
                                    start_ptr=start is None, count_ptr=n is None,
                                    compiled=device.type == "cuda")
        i32 = torch.int32
        k = self._bind(lt, device, (dtype, dtype if start is not None else i32,
                                    dtype if n is not None else i32, torch.uint8))
        sv, nv, grid, go_t = start or 0, n or 0, lt.grid, k.tensors
        if wire is Wire.FP8:
            def go(src, out, start_t=None, n_t=None):
                go_t(grid, (src, src if start_t is None else start_t,
                            src if n_t is None else n_t, sv, nv, src_rows, out_rows, out))
            return go
        gv = _tiles.fp4_scale(g)

        def go_fp4(src, out, start_t=None, n_t=None):
            go_t(grid, (src, src if start_t is None else start_t, src if n_t is None else n_t,
                        sv, nv, src_rows, out_rows, gv, out))
        return go_fp4

    def bind_dequantize(self, rows, hidden, dtype, device=None, wire=Wire.FP8, g=None):
        if rows == 0:
            return _nothing
        lt = _tiles.dequantize_launch(wire, rows, hidden, _dtype_name(dtype),
                                      compiled=device.type == "cuda")
        go_t, grid = self._bind(lt, device, (torch.uint8, dtype)).tensors, lt.grid
        if wire is Wire.FP8:
            return lambda src, out: go_t(grid, (src, rows, out))
        gv = _tiles.fp4_scale(g)
        return lambda src, out: go_t(grid, (src, rows, gv, out))

    def bind_dequantize_sum(self, rows, parts, hidden, dtype, device=None, wire=Wire.FP8,
                            g=None):
        if rows == 0:
            return _nothing
        lt = _tiles.dequantize_sum_launch(wire, rows, parts, hidden, _dtype_name(dtype),
                                          compiled=device.type == "cuda")
        go_t, grid, gv = self._bind(lt, device, (torch.uint8, dtype)).tensors, lt.grid, \
            _tiles.fp4_scale(g)
        return lambda src, out: go_t(grid, (src, rows, gv, out))

    # ---------------------------------------------------------------- calls
    def move(self, src, ss: Index, ds: Index, n: Index, out,
             tile: _tiles.Tile | None = None) -> None:
        ss, ss_t = _host_or_device(ss)
        ds, ds_t = _host_or_device(ds)
        n, n_t = _host_or_device(n)
        self.bind_move(src.shape[0], out.shape[0], rows_width(out), out.dtype, out.device,
                       ss, ds, n, tile)(src, out, ss_t, ds_t, n_t)

    def zero(self, out, ks: Index, kn: Index, tile: _tiles.Tile | None = None) -> None:
        ks, ks_t = _host_or_device(ks)
        kn, kn_t = _host_or_device(kn)
        self.bind_zero(out.shape[0], rows_width(out), out.dtype, out.device, ks, kn, tile)(
            out, ks_t, kn_t)

    def unpack(self, src, firsts, lens, block: int, out) -> None:
        self.bind_unpack(src.shape[0], out.shape[0], rows_width(out), firsts.shape[0],
                         out.dtype, block, out.device)(src, firsts, lens, out)

    def pack(self, src, firsts, lens, block: int, out) -> None:
        self.bind_pack(src.shape[0], out.shape[0], rows_width(out), firsts.shape[0],
                       out.dtype, block, out.device)(src, firsts, lens, out)

    def quantize(self, src, start: Index, n: Index, out, wire: Wire = Wire.FP8,
                 g: float | None = None) -> None:
        start, s_t = _host_or_device(start)
        n, n_t = _host_or_device(n)
        self.bind_quantize(src.shape[0], out.shape[0], src.shape[1], src.dtype, out.device,
                           start, n, wire, g)(src, out, s_t, n_t)

    def dequantize(self, src, out, wire: Wire = Wire.FP8, g: float | None = None) -> None:
        self.bind_dequantize(out.shape[0], out.shape[1], out.dtype, out.device, wire,
                             g)(src, out)

    def dequantize_sum(self, src, out, parts: int, wire: Wire = Wire.FP8,
                       g: float | None = None) -> None:
        self.bind_dequantize_sum(out.shape[0], parts, out.shape[1], out.dtype, out.device,
                                 wire, g)(src, out)

    def mask(self, t, firsts, lens, fill) -> None:
        if t.numel() == 0:
            return
        lt = _tiles.mask_launch(t.shape[0], rows_width(t))
        self.launcher.launch(lt.kernel, lt.grid, t.device,
                             (firsts, lens, firsts.shape[0], fill, t.shape[0], t), lt.consts,
                             lt.warps)

    def check(self, counts, flag, rule: CountRule) -> None:
        lt = _tiles.check_launch(*rule)
        self.launcher.launch(lt.kernel, lt.grid, counts.device, (counts, flag), lt.consts,
                             lt.warps)


def _nothing(*args, **kwargs) -> None:
    return None


def _host_or_device(v: Index) -> tuple[int | None, torch.Tensor | None]:
    """``(int, None)`` for a host index, ``(DEVICE, tensor)`` for a device one."""
    return (DEVICE, v) if isinstance(v, torch.Tensor) else (v, None)


def _host(v: Index) -> int:
    return int(v) if isinstance(v, torch.Tensor) else v


def _clip(lo: int, hi: int, n: int) -> tuple[int, int]:
    lo = min(max(lo, 0), n)
    return lo, min(max(hi, lo), n)


class TorchPasses(Passes):
    """The passes as stock torch ops (CPU tensors; see the module docstring)."""

    def bind_move(self, src_rows, out_rows, width, dtype, device, ss, ds, n, tile=None):
        if ss is None or ds is None or n is None:
            return super().bind_move(src_rows, out_rows, width, dtype, device, ss, ds, n)
        lo, hi = max(0, -ss, -ds), min(n, src_rows - ss, out_rows - ds)
        if hi <= lo:
            return lambda src, out, *_: out.zero_()
        a, b, sa, sb = ds + lo, ds + hi, ss + lo, ss + hi
        if a == 0 and b == out_rows:       # a copy (of part of the source)
            if sa == 0 and sb == src_rows:
                return lambda src, out, *_: out.copy_(src)
            return lambda src, out, *_: out.copy_(src[sa:sb])

        def go(src, out, *_):
            if a:
                out[:a].zero_()
            out[a:b].copy_(src[sa:sb])
            if b < out_rows:
                out[b:].zero_()
        return go

    # ---------------------------------------------------------------- calls
    @staticmethod
    def move(src, ss: Index, ds: Index, n: Index, out, tile=None) -> None:
        ss, ds, n = _host(ss), _host(ds), _host(n)
        rows = out.shape[0]
        # j runs over [lo, hi): inside the count, the source and the output
        lo = max(0, -ss, -ds)
        hi = min(n, src.shape[0] - ss, rows - ds)
        if hi <= lo:
            out.zero_()
            return
        a, b = ds + lo, ds + hi
        if a:
            out[:a].zero_()
        if a == 0 and b == rows:
            out.copy_(src[ss + lo:ss + hi])
        else:
            out[a:b].copy_(src[ss + lo:ss + hi])
        if b < rows:
            out[b:].zero_()

    @staticmethod
    def zero(out, ks: Index, kn: Index, tile=None) -> None:
        ks, kn = _host(ks), _host(kn)
        a, b = _clip(ks, ks + kn, out.shape[0])
        if a:
            out[:a].zero_()
        if b < out.shape[0]:
            out[b:].zero_()

    @staticmethod
    def _chunks(firsts, lens, block: int, src_rows: int, out_rows: int, unpack: bool):
        """Per chunk ``(out rows, src rows)`` slices, clipped (later chunks win where
        chunks overlap, as in the kernels)."""
        for r, (f, n) in enumerate(zip(firsts.tolist(), lens.tolist())):
            n = min(n, block)
            if unpack:   # out[f + j] = src[r*block + j]
                lo = max(0, -f, 0)
                hi = min(n, out_rows - f, src_rows - r * block)
                if hi > lo:
                    yield slice(f + lo, f + hi), slice(r * block + lo, r * block + hi)
            else:        # out[r*block + j] = src[f + j]
                lo = max(0, -f)
                hi = min(n, src_rows - f, out_rows - r * block)
                if hi > lo:
                    yield slice(r * block + lo, r * block + hi), slice(f + lo, f + hi)

    @staticmethod
    def unpack(src, firsts, lens, block: int, out) -> None:
        out.zero_()
        for o, s in TorchPasses._chunks(firsts, lens, block, src.shape[0], out.shape[0], True):
            out[o].copy_(src[s])

    @staticmethod
    def pack(src, firsts, lens, block: int, out) -> None:
        out.zero_()
        for o, s in TorchPasses._chunks(firsts, lens, block, src.shape[0], out.shape[0], False):
            out[o].copy_(src[s])

    @staticmethod
    def quantize(src, start: Index, n: Index, out, wire: Wire = Wire.FP8,
                 g: float | None = None) -> None:
        start, n = _host(start), _host(n)
        lo, hi = _clip(start, start + max(n, 0), src.shape[0])
        k = min(hi - lo, out.shape[0])
        if k > 0:
            quantize_rows(src[lo:lo + k], out[:k], wire, g)
        out[max(k, 0):].zero_()

    @staticmethod
    def dequantize(src, out, wire: Wire = Wire.FP8, g: float | None = None) -> None:
        dequantize_rows(src, out, wire, g)

    @staticmethod
    def dequantize_sum(src, out, parts: int, wire: Wire = Wire.FP8,
                       g: float | None = None) -> None:
        dequantize_sum_rows(src, out, parts, wire, g)

    @staticmethod
    def mask(t, firsts, lens, fill) -> None:
        rows = t.shape[0]
        real = torch.zeros(rows, dtype=torch.bool)
        for f, n in zip(firsts.tolist(), lens.tolist()):
            a, b = _clip(f, f + n, rows)
            real[a:b] = True
        t[~real] = fill

    @staticmethod
    def check(counts, flag, rule: CountRule) -> None:
        bad = rule.flags(counts.reshape(-1).tolist()[:rule.entries])
        if bad:
            flag |= bad


#: The passes of a device type when no communicator's launcher is at hand (they keep
#: nothing: Triton's ordinary launch, torch ops).
_DEFAULT = {"cuda": TritonPasses(JIT, max_launches=0), "cpu": TorchPasses()}


def passes_for(device: torch.device) -> Passes:
    """The default passes of ``device`` (CUDA: Triton kernels by the ordinary launch; CPU:
    torch ops)."""
    p = _DEFAULT.get(device.type)
    if p is None:
        from dpx.errors import DpxValueError

        raise DpxValueError(f"device {device} is not supported: dpx runs on cuda or cpu")
    return p
