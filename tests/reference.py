"""Framework-neutral inputs and a plain NumPy reference of the dpx semantics.

Every rank builds every rank's inputs from one seed, so each rank can compute the whole
reference locally. Values are small integers, exact in every supported dtype (bfloat16
included) and exact under summation over a few ranks, so float results compare bitwise.

A rank's *rows* are its replica's ``n_d`` rows, or, when the plan shards them over CP
ranks, its CP rank's shard. ``eff`` (what the ops run with) is the plan's counts or shards,
or the device counts / shards a capacity plan is called with.
"""

from __future__ import annotations

import numpy as np

from dpx import DpLayout, DpPlan

GARBAGE = 99  # rows past a rank's real rows hold this: a result containing it read them


def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng([abs(k) for k in key])


def _values(rng: np.random.Generator, shape, floats: bool) -> np.ndarray:
    if floats:  # random float32 values (sums then depend on the reduction order)
        return rng.standard_normal(shape).astype(np.float32).astype(np.float64)
    return rng.integers(-8, 9, size=shape).astype(np.float64)


def counts_of(plan: DpPlan, eff=None) -> tuple[int, ...]:
    """Per-replica counts of ``eff`` (counts, or a shard table), default the plan's."""
    if eff is None:
        return plan.num_tokens
    eff = tuple(eff)
    if eff and isinstance(eff[0], (tuple, list)):
        return tuple(sum(s) for s in eff)
    return eff


def shards_of(plan: DpPlan, eff=None):
    """The shard table of ``eff`` for a sharded plan (default the plan's), else None."""
    if not plan.sharded:
        return None
    if eff is None:
        return plan.cp_shards
    return tuple(tuple(s) for s in eff)


def offsets_of(plan: DpPlan, counts: tuple[int, ...]) -> tuple[int, ...]:
    """Slot offsets for ``counts`` (a capacity plan's dynamic offsets, else the plan's)."""
    if not plan.dynamic_offsets:
        return plan.offsets
    m, acc, offs = plan.layout.replica_size, 0, []
    for n in counts:
        offs.append(acc)
        acc += -(-n // m) * m
    return tuple(offs)


def held(plan: DpPlan, rank: int, eff=None) -> tuple[int, int]:
    """``(first global row, rows)`` of ``rank``'s real rows."""
    c = plan.layout.coords(rank)
    counts, shards = counts_of(plan, eff), shards_of(plan, eff)
    off = offsets_of(plan, counts)[c.attn_dp_rank]
    if shards is None:
        return off, counts[c.attn_dp_rank]
    row = shards[c.attn_dp_rank]
    return off + sum(row[:c.attn_cp_rank]), row[c.attn_cp_rank]


def local_inputs(seed: int, plan: DpPlan, rest: tuple[int, ...], *, partial: bool,
                 extra_rows: int = 2, rows: int | None = None, floats: bool = False,
                 eff=None) -> list[np.ndarray]:
    """``local`` of every rank, float64 holding small ints (or float32 values with
    ``floats``). A rank gets its real rows (identical across attn-tp ranks unless
    ``partial``, and across CP ranks unless the plan shards) then garbage rows."""
    lay = plan.layout
    out = []
    for r in range(lay.world_size):
        c = lay.coords(r)
        _, n = held(plan, r, eff)
        total = rows if rows is not None else n + extra_rows
        key = (seed, c.attn_dp_rank, c.attn_cp_rank if plan.sharded else 0,
               c.attn_tp_rank if partial else 0)
        x = np.full((total, *rest), GARBAGE, dtype=np.float64)
        x[:n] = _values(_rng(*key), (n, *rest), floats)
        out.append(x)
    return out


#: (row, column, value) written into the real rows of every rank's input by
#: :func:`with_nonfinite`: NaN and infinities at the first, a middle and the last element of
#: a 128-element group, a whole group of them, and a huge finite value beside one
NONFINITE = ((0, 0, np.nan), (0, 129, 3.0e38), (1, 127, np.inf), (1, 128, -np.inf),
             (2, 64, -np.nan), (3, 255, np.nan))


def with_nonfinite(locals_: list[np.ndarray], plan: DpPlan, eff=None) -> list[np.ndarray]:
    """``locals_`` with :data:`NONFINITE` written into each rank's real rows (the same on
    every rank of a replica, so replicated copies stay identical; a whole group of row 4 is
    NaN); rows past a rank's count are left alone. Needs rows of at least 256 elements."""
    out = []
    for r, x in enumerate(locals_):
        x = x.copy()
        _, n = held(plan, r, eff)
        for row, col, v in NONFINITE:
            if row < n:
                x[row, col] = v
        if n > 4:
            x[4, 128:256] = np.nan
        out.append(x)
    return out


def global_inputs(seed: int, plan: DpPlan, rest: tuple[int, ...], *,
                  floats: bool = False) -> list[np.ndarray]:
    """A different ``[global_rows, *rest]`` buffer per rank (for reduce_scatter)."""
    return [_values(_rng(seed, 7777, r), (plan.global_rows, *rest), floats)
            for r in range(plan.layout.world_size)]


def ref_gather(locals_: list[np.ndarray], plan: DpPlan, *, partial: bool,
               counts=None) -> np.ndarray:
    """The gathered buffer: every replica's rows (CP rank 0's copy, or every CP rank's
    shard at its place), summed over attn-tp when ``partial``."""
    lay: DpLayout = plan.layout
    out = np.zeros((plan.global_rows, *locals_[0].shape[1:]), dtype=np.float64)
    for d in range(lay.dp_size):
        for cp in range(lay.cp_size if plan.sharded else 1):
            ranks = [lay.rank_of(d, cp, t) for t in range(lay.attn_tp_size)]
            first, n = held(plan, ranks[0], counts)
            val = sum(locals_[r][:n] for r in ranks) if partial else locals_[ranks[0]][:n]
            out[first:first + n] = val
    return out


def ref_scatter_rank(global_: np.ndarray, plan: DpPlan, rank: int, counts=None) -> np.ndarray:
    """``[slot_rows[d]]``: the rank's real rows of the buffer, then zeros."""
    d = plan.layout.coords(rank).attn_dp_rank
    first, n = held(plan, rank, counts)
    out = np.zeros((plan.slot_rows[d], *global_.shape[1:]), dtype=np.float64)
    out[:n] = global_[first:first + n]
    return out


def ref_scatter(global_: np.ndarray, plan: DpPlan, d: int, counts=None) -> np.ndarray:
    """:func:`ref_scatter_rank` for replica ``d`` of a plan whose CP ranks share rows."""
    assert not plan.sharded
    return ref_scatter_rank(global_, plan, plan.layout.replica_ranks(d)[0], counts)


def ref_reduce_scatter_rank(globals_: list[np.ndarray], plan: DpPlan, rank: int,
                            counts=None) -> np.ndarray:
    return ref_scatter_rank(sum(globals_), plan, rank, counts)


def ref_reduce_scatter(globals_: list[np.ndarray], plan: DpPlan, d: int,
                       counts=None) -> np.ndarray:
    return ref_scatter(sum(globals_), plan, d, counts)


def real_rows(plan: DpPlan, eff=None) -> np.ndarray:
    """Boolean ``[global_rows]``: True at every replica's real rows."""
    counts = counts_of(plan, eff)
    offs = offsets_of(plan, counts)
    out = np.zeros(plan.global_rows, dtype=bool)
    for o, n in zip(offs, counts):
        out[o:o + n] = True
    return out


def quantize_fp8(x: np.ndarray, real: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fp8 wire rows of float32 ``x [rows, H]`` (dpx/wire.py): ``(payload uint8 [rows,
    H], scales float32 [rows, H/128])``; rows where ``real`` is False are zeros. A group's
    scale comes from its finite elements; a NaN or an infinity becomes the NaN code 0x7F."""
    import ml_dtypes

    rows, h = x.shape
    g = x.astype(np.float32).reshape(rows, h // 128, 128)
    finite = np.isfinite(g)
    gf = np.where(finite, g, np.float32(0))
    amax = np.abs(gf).max(axis=-1, initial=np.float32(0))
    scale = np.maximum(amax, np.float32(1e-10)) / np.float32(448)
    q = np.clip(gf / scale[..., None], -448, 448).astype(ml_dtypes.float8_e4m3fn)
    code = q.view(np.uint8)
    payload = np.where(finite, code, np.uint8(0x7F)).reshape(rows, h).copy()
    payload[~real] = 0
    scale = scale.astype(np.float32)
    scale[~real] = 0
    return payload, scale


def dequantize_fp8(payload: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """float32 ``payload * scale`` per group; a NaN code gives the canonical quiet NaN
    (float32 0x7FC00000, which rounds to the canonical NaN of bfloat16 and float16)."""
    import ml_dtypes

    rows, h = payload.shape
    v = payload.view(ml_dtypes.float8_e4m3fn).astype(np.float32).reshape(rows, h // 128, 128)
    v = (v * scales[..., None]).reshape(rows, h).astype(np.float32)
    bits = np.where(np.isnan(v), np.uint32(0x7FC00000), v.view(np.uint32))
    return bits.astype(np.uint32).view(np.float32)


E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e2m1(q: np.ndarray) -> np.ndarray:
    """e2m1 magnitude codes (0..7) of ``q >= 0`` (float64, infinity allowed): the nearest
    magnitude, a tie to the even code, saturating at 6 -- by searching the table."""
    d = np.abs(np.minimum(q, 6.0)[..., None] - E2M1)   # distance to each magnitude
    best = d.min(axis=-1, keepdims=True)
    ties = d == best                                   # one or two nearest codes
    even = ties & (np.arange(8) % 2 == 0)
    return np.where(even.any(-1), even.argmax(-1), ties.argmax(-1))


def quantize_fp4(x: np.ndarray, real: np.ndarray, wire: str,
                 g: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The fp4 wire rows of float32 ``x [rows, H]`` (dpx/wire.py, ``wire`` "nvfp4" with
    global scale ``g``, or "mxfp4"): ``(payload uint8 [rows, H/2], scales uint8 [rows,
    H/16 or H/32])``; rows where ``real`` is False are zeros."""
    import ml_dtypes

    rows, h = x.shape
    gs = 16 if wire == "nvfp4" else 32
    blk = x.astype(np.float32).reshape(rows, h // gs, gs)
    nan_blk = np.isnan(blk).any(-1)
    amax = np.where(np.isnan(blk), np.float32(0), np.abs(blk)).max(-1)
    sign = np.signbit(blk)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if wire == "nvfp4":
            g32 = np.float32(g)
            sv = (amax * g32) / np.float32(6)                      # float32 ops, IEEE
            s = np.minimum(sv, np.float32(448)).astype(ml_dtypes.float8_e4m3fn)
            scale = s.view(np.uint8).copy()
            s32 = s.astype(np.float32)
            q = ((np.abs(blk) * g32) / np.where(s32 > 0, s32, 1)[..., None]).astype(np.float64)
            zero = (s32 == 0) | nan_blk
            scale[nan_blk] = 0x7F
        else:
            _, ex = np.frexp(amax.astype(np.float64))        # amax = m * 2**ex, m in [0.5, 1)
            e = np.where(np.isinf(amax), 127, np.clip(ex - 1 - 2, -127, 127))
            e = np.where(amax == 0, -127, e).astype(np.int64)
            q = np.abs(blk).astype(np.float64) / np.exp2(e.astype(np.float64))[..., None]
            zero = nan_blk
            scale = np.where(nan_blk, 0xFF, e + 127).astype(np.uint8)
    code = np.where(zero[..., None], 0, e2m1(np.nan_to_num(q, nan=0.0, posinf=np.inf))
                    + 8 * sign).reshape(rows, h)
    payload = (code[:, 0::2] | (code[:, 1::2] << 4)).astype(np.uint8)
    payload[~real] = 0
    scale = scale.reshape(rows, h // gs)
    scale[~real] = 0
    return payload, scale


def dequantize_fp4(payload: np.ndarray, scales: np.ndarray, wire: str,
                   g: float | None = None) -> np.ndarray:
    """float32 values of fp4 wire rows (NaN blocks: the canonical quiet NaN)."""
    import ml_dtypes

    rows = payload.shape[0]
    h = 2 * payload.shape[1]
    code = np.stack([payload & 15, payload >> 4], -1).reshape(rows, h).astype(np.int64)
    gs = 16 if wire == "nvfp4" else 32
    mag = E2M1[code & 7].reshape(rows, h // gs, gs)
    if wire == "nvfp4":
        s = (scales & 0x7F).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
        v = (mag.astype(np.float32) * s[..., None]) / np.float32(g)
        nan = (scales & 0x7F) == 0x7F
    else:
        with np.errstate(over="ignore"):
            v = (mag * np.exp2(scales.astype(np.float64) - 127)[..., None]).astype(np.float32)
        nan = scales == 0xFF
    v = np.where((code >> 3).reshape(v.shape) == 1, -v, v).astype(np.float32)
    bits = np.where(nan[..., None], np.uint32(0x7FC00000), v.view(np.uint32))
    return bits.astype(np.uint32).view(np.float32).reshape(rows, h)


def wire_round_trip(x: np.ndarray, wire: str, g: float | None = None) -> np.ndarray:
    """float32 values of every row of float32 ``x [rows, H]`` sent on ``wire``: quantized,
    then dequantized to float32 (NaN as the canonical quiet NaN)."""
    real = np.ones(x.shape[0], bool)
    x = x.astype(np.float32)
    if wire == "fp8":
        return dequantize_fp8(*quantize_fp8(x, real))
    return dequantize_fp4(*quantize_fp4(x, real, wire, g), wire, g)


def combine_sum(globals_: list[np.ndarray], wire: str, g: float | None = None) -> np.ndarray:
    """The quantized combine's float32 sum (docs/semantics.md, "The quantized combine"):
    every rank's rows through the wire, added in rank order from +0.0 in float32, NaN as
    the canonical quiet NaN. ``globals_``: each rank's buffer as float32 values."""
    acc = np.zeros(globals_[0].shape, np.float32)
    with np.errstate(all="ignore"):
        for x in globals_:
            acc = acc + wire_round_trip(x, wire, g)
    bits = np.where(np.isnan(acc), np.uint32(0x7FC00000), acc.view(np.uint32))
    return bits.astype(np.uint32).view(np.float32)


def ref_combine_rank(globals_: list[np.ndarray], plan: DpPlan, rank: int, wire: str,
                     dtype_name: str, g: float | None = None, counts=None) -> np.ndarray:
    """The rank's result of ``reduce_scatter(..., wire=wire)``: its slot of
    :func:`combine_sum` (zeros past its real rows), rounded to ``dtype_name``."""
    return as_dtype(ref_scatter_rank(combine_sum(globals_, wire, g), plan, rank, counts),
                    dtype_name)


def as_dtype(v: np.ndarray, name: str) -> np.ndarray:
    """float32 ``v`` rounded to the dtype ``name`` (float32, bfloat16, float16) to nearest
    even, NaN to that dtype's canonical quiet NaN (what dequantize writes), as a NumPy
    array of it (``ml_dtypes`` for bfloat16). Compare results bit for bit through
    :func:`bits_of`."""
    import ml_dtypes

    return v.astype(np.float32).astype({"float32": np.float32, "float16": np.float16,
                                        "bfloat16": ml_dtypes.bfloat16}[name])


def bits_of(a: np.ndarray) -> np.ndarray:
    """The bits of a float array (unsigned ints of its width)."""
    return a.view({4: np.uint32, 2: np.uint16, 1: np.uint8}[a.dtype.itemsize])
