"""The passes (:mod:`dpx_torch.passes`) as ``torch.library`` custom ops, with fake (meta)
implementations: what a call traced by ``torch.compile`` runs (:class:`OpPasses`), so the
traced graph holds one opaque op per pass and no graph breaks. Each op runs the default
passes of its tensors' device (:func:`dpx_torch.passes.passes_for`).

Layer: passes. Imports dpx, the shims layer and the modules before it in its own row
(docs/semantics.md, "Where things live").

Out-variants mutate ``out``; the functional ``dpx::move_rows`` / ``unpack_rows`` /
``pack_rows`` allocate and carry autograd rules (their adjoints), for the differentiable
public functions of :mod:`dpx_torch.rows`. ``tile`` travels as ``[elems, warps,
max_block_c, stream]`` (``[]``: chosen by size; a custom op takes no dataclass).
"""

from __future__ import annotations

import torch

from dpx.counts import CountRule
from dpx.kernels.launch import Tile, fp4_scale
from dpx.modes import Wire
from dpx_torch.passes import Index, Passes, passes_for

__all__ = ["OpPasses", "move_rows", "pack_rows", "tile_list", "unpack_rows"]


def _tile(t: list[int]) -> Tile | None:
    return Tile(t[0], t[1], t[2], bool(t[3])) if t else None


def tile_list(t: Tile | None) -> list[int]:
    """A tile as a custom op takes it."""
    return [] if t is None else [t.elems, t.warps, t.max_block_c, int(t.stream)]


def _ix(t: torch.Tensor | None, v: int) -> Index:
    return v if t is None else t


def _move(src, ss_t, ds_t, n_t, ss, ds, n, out, tile) -> None:
    p = passes_for(out.device)
    if tile:
        p.move(src, _ix(ss_t, ss), _ix(ds_t, ds), _ix(n_t, n), out, tile=_tile(tile))
    else:
        p.move(src, _ix(ss_t, ss), _ix(ds_t, ds), _ix(n_t, n), out)


@torch.library.custom_op("dpx::move_rows_out", mutates_args=("out",))
def move_rows_out(src: torch.Tensor, ss_t: torch.Tensor | None, ds_t: torch.Tensor | None,
                  n_t: torch.Tensor | None, ss: int, ds: int, n: int, out: torch.Tensor,
                  tile: list[int]) -> None:
    _move(src, ss_t, ds_t, n_t, ss, ds, n, out, tile)


@move_rows_out.register_fake
def _(src, ss_t, ds_t, n_t, ss, ds, n, out, tile) -> None:
    return None


@torch.library.custom_op("dpx::move_rows", mutates_args=())
def move_rows(src: torch.Tensor, ss_t: torch.Tensor | None, ds_t: torch.Tensor | None,
              n_t: torch.Tensor | None, ss: int, ds: int, n: int, rows: int,
              tile: list[int]) -> torch.Tensor:
    out = src.new_empty((rows, *src.shape[1:]))
    _move(src, ss_t, ds_t, n_t, ss, ds, n, out, tile)
    return out


@move_rows.register_fake
def _(src, ss_t, ds_t, n_t, ss, ds, n, rows, tile):
    return src.new_empty((rows, *src.shape[1:]))


def _move_ctx(ctx, inputs, output) -> None:
    src, ss_t, ds_t, n_t, ss, ds, n, rows, tile = inputs
    ctx.src_rows, ctx.index, ctx.tile = src.shape[0], (ss_t, ds_t, n_t, ss, ds, n), tile


def _move_backward(ctx, grad):
    ss_t, ds_t, n_t, ss, ds, n = ctx.index  # the adjoint moves the rows back
    g = move_rows(grad.contiguous(), ds_t, ss_t, n_t, ds, ss, n, ctx.src_rows, ctx.tile)
    return g, None, None, None, None, None, None, None, None


torch.library.register_autograd("dpx::move_rows", _move_backward, setup_context=_move_ctx)


@torch.library.custom_op("dpx::zero_rows_", mutates_args=("out",))
def zero_rows_out(out: torch.Tensor, ks_t: torch.Tensor | None, kn_t: torch.Tensor | None,
                  ks: int, kn: int) -> None:
    passes_for(out.device).zero(out, _ix(ks_t, ks), _ix(kn_t, kn))


@zero_rows_out.register_fake
def _(out, ks_t, kn_t, ks, kn) -> None:
    return None


@torch.library.custom_op("dpx::unpack_rows_out", mutates_args=("out",))
def unpack_rows_out(src: torch.Tensor, firsts: torch.Tensor, lens: torch.Tensor, block: int,
                    out: torch.Tensor) -> None:
    passes_for(out.device).unpack(src, firsts, lens, block, out)


@torch.library.custom_op("dpx::pack_rows_out", mutates_args=("out",))
def pack_rows_out(src: torch.Tensor, firsts: torch.Tensor, lens: torch.Tensor, block: int,
                  out: torch.Tensor) -> None:
    passes_for(out.device).pack(src, firsts, lens, block, out)


@unpack_rows_out.register_fake
def _(src, firsts, lens, block, out) -> None:
    return None


@pack_rows_out.register_fake
def _(src, firsts, lens, block, out) -> None:
    return None


@torch.library.custom_op("dpx::unpack_rows", mutates_args=())
def unpack_rows(src: torch.Tensor, firsts: torch.Tensor, lens: torch.Tensor, block: int,
                rows: int) -> torch.Tensor:
    out = src.new_empty((rows, *src.shape[1:]))
    passes_for(out.device).unpack(src, firsts, lens, block, out)
    return out


@torch.library.custom_op("dpx::pack_rows", mutates_args=())
def pack_rows(src: torch.Tensor, firsts: torch.Tensor, lens: torch.Tensor,
              block: int) -> torch.Tensor:
    out = src.new_empty((firsts.shape[0] * block, *src.shape[1:]))
    passes_for(out.device).pack(src, firsts, lens, block, out)
    return out


@unpack_rows.register_fake
def _(src, firsts, lens, block, rows):
    return src.new_empty((rows, *src.shape[1:]))


@pack_rows.register_fake
def _(src, firsts, lens, block):
    return src.new_empty((firsts.shape[0] * block, *src.shape[1:]))


def _chunks_ctx(ctx, inputs, output) -> None:
    src, firsts, lens, block = inputs[:4]
    ctx.table, ctx.block, ctx.src_rows = (firsts, lens), block, src.shape[0]


torch.library.register_autograd(
    "dpx::unpack_rows", lambda ctx, g: (pack_rows(g.contiguous(), *ctx.table, ctx.block),
                                        None, None, None, None), setup_context=_chunks_ctx)
torch.library.register_autograd(
    "dpx::pack_rows", lambda ctx, g: (unpack_rows(g.contiguous(), *ctx.table, ctx.block,
                                                  ctx.src_rows), None, None, None),
    setup_context=_chunks_ctx)


@torch.library.custom_op("dpx::quantize_rows_out", mutates_args=("out",))
def quantize_rows_out(src: torch.Tensor, s_t: torch.Tensor | None, n_t: torch.Tensor | None,
                      s: int, n: int, out: torch.Tensor, wire: str, g: float) -> None:
    passes_for(out.device).quantize(src, _ix(s_t, s), _ix(n_t, n), out, Wire(wire), g)


@torch.library.custom_op("dpx::dequantize_rows_out", mutates_args=("out",))
def dequantize_rows_out(src: torch.Tensor, out: torch.Tensor, wire: str, g: float) -> None:
    passes_for(out.device).dequantize(src, out, Wire(wire), g)


@torch.library.custom_op("dpx::dequantize_sum_rows_out", mutates_args=("out",))
def dequantize_sum_rows_out(src: torch.Tensor, out: torch.Tensor, parts: int, wire: str,
                            g: float) -> None:
    passes_for(out.device).dequantize_sum(src, out, parts, Wire(wire), g)


@quantize_rows_out.register_fake
def _(src, s_t, n_t, s, n, out, wire, g) -> None:
    return None


@dequantize_sum_rows_out.register_fake
def _(src, out, parts, wire, g) -> None:
    return None


@dequantize_rows_out.register_fake
def _(src, out, wire, g) -> None:
    return None


@torch.library.custom_op("dpx::mask_rows_", mutates_args=("t",))
def mask_rows_out(t: torch.Tensor, firsts: torch.Tensor, lens: torch.Tensor,
                  fill_float: float, fill_int: int, is_float: bool) -> None:
    passes_for(t.device).mask(t, firsts, lens, fill_float if is_float else fill_int)


@mask_rows_out.register_fake
def _(t, firsts, lens, fill_float, fill_int, is_float) -> None:
    return None


@torch.library.custom_op("dpx::check_counts_", mutates_args=("flag",))
def check_counts_out(counts: torch.Tensor, flag: torch.Tensor, entries: int, group: int,
                     align: int, max_each: int, max_sum: int, has_each: bool,
                     has_sum: bool) -> None:
    rule = CountRule(entries, group, align, max_each if has_each else None,
                     max_sum if has_sum else None)
    passes_for(counts.device).check(counts, flag, rule)


@check_counts_out.register_fake
def _(counts, flag, entries, group, align, max_each, max_sum, has_each, has_sum) -> None:
    return None


def _tensor_or_int(v: Index) -> tuple[torch.Tensor | None, int]:
    """A custom op's two arguments of an index: ``(tensor, 0)`` or ``(None, int)``."""
    return (v, 0) if isinstance(v, torch.Tensor) else (None, v)


class OpPasses(Passes):
    """The passes through the custom ops above (calls traced by torch.compile)."""

    @staticmethod
    def move(src, ss: Index, ds: Index, n: Index, out, tile: Tile | None = None) -> None:
        (ss_t, ss), (ds_t, ds), (n_t, n) = _tensor_or_int(ss), _tensor_or_int(ds), _tensor_or_int(n)
        move_rows_out(src, ss_t, ds_t, n_t, ss, ds, n, out, tile_list(tile))

    @staticmethod
    def zero(out, ks: Index, kn: Index) -> None:
        (ks_t, ks), (kn_t, kn) = _tensor_or_int(ks), _tensor_or_int(kn)
        zero_rows_out(out, ks_t, kn_t, ks, kn)

    @staticmethod
    def unpack(src, firsts, lens, block: int, out) -> None:
        unpack_rows_out(src, firsts, lens, block, out)

    @staticmethod
    def pack(src, firsts, lens, block: int, out) -> None:
        pack_rows_out(src, firsts, lens, block, out)

    @staticmethod
    def quantize(src, start: Index, n: Index, out, wire: Wire = Wire.FP8,
                 g: float | None = None) -> None:
        (s_t, s), (n_t, n) = _tensor_or_int(start), _tensor_or_int(n)
        quantize_rows_out(src, s_t, n_t, s, n, out, wire.value, fp4_scale(g))

    @staticmethod
    def dequantize(src, out, wire: Wire = Wire.FP8, g: float | None = None) -> None:
        dequantize_rows_out(src, out, wire.value, fp4_scale(g))

    @staticmethod
    def dequantize_sum(src, out, parts: int, wire: Wire = Wire.FP8,
                       g: float | None = None) -> None:
        dequantize_sum_rows_out(src, out, parts, wire.value, fp4_scale(g))

    @staticmethod
    def mask(t, firsts, lens, fill) -> None:
        whole = float(fill).is_integer()
        mask_rows_out(t, firsts, lens, float(fill), int(fill) if whole else 0,
                      t.dtype.is_floating_point)

    @staticmethod
    def check(counts, flag, rule: CountRule) -> None:
        check_counts_out(counts, flag, rule.entries, rule.group, rule.align,
                         rule.max_each or 0, rule.max_sum or 0, rule.max_each is not None,
                         rule.max_sum is not None)
