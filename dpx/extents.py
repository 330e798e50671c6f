"""The rows of each op's input and output, where a rank's own rows lie in the gathered
buffer, and which of its rows are real: one definition that both frontends, the cost model
and ``explain`` use.

For rank ``r`` of replica ``d`` (CP rank ``c``), ``n_d`` real rows, ``s_dc`` its shard::

    gather, gather_sum  in  >= held rows: n_d (s_dc with shards); a capacity plan with
                            device counts: its whole slot, slot_rows[d]
                        out  = global_rows
    scatter, reduce_scatter  in = global_rows (exactly)   out = slot_rows[d]
    scatter_adjoint     in  = slot_rows[d] (exactly)       out = global_rows

For one program serving every rank (``rank=None``, JAX), the per-rank values are replaced
by their largest over the ranks.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, NamedTuple

from dpx import expr as X
from dpx.counts import own_entry
from dpx.errors import DpxTypeError, DpxValueError
from dpx.geometry import geometry
from dpx.ints import INTS
from dpx.layout import DpLayout
from dpx.modes import Op, PaddingMode
from dpx.plan import DpPlan, check_plan
from dpx.routes import RankRef, symbolic_geometry

__all__ = ["fill_bits", "first_copy", "held_rows", "local_rows", "op_rows", "OpRows",
           "real_ranges"]

#: The dtypes a pad row's fill may be stored in: an integer dtype's ``(bytes, lo, hi)``; a
#: float dtype's ``(exponent bits, mantissa bits, whether it has infinities)`` (IEEE-like;
#: float8_e4m3fn's largest exponent holds numbers, its all-ones code is its only NaN).
INT_FILLS = {"bool": (1, 0, 1), **{f"int{b}": (b // 8, -2 ** (b - 1), 2 ** (b - 1) - 1)
                                   for b in (8, 16, 32, 64)},
             **{f"uint{b}": (b // 8, 0, 2 ** b - 1) for b in (8, 16, 32, 64)}}
FLOAT_FILLS = {"float16": (5, 10, True), "bfloat16": (8, 7, True), "float32": (8, 23, True),
               "float64": (11, 52, True), "float8_e4m3fn": (4, 3, False),
               "float8_e5m2": (5, 2, True)}


class OpRows(NamedTuple):
    """``need``: rows the input must have (at least, or exactly when ``exact``);
    ``out``: rows of the output."""

    need: int
    exact: bool
    out: int


def fill_bits(fill: object, dtype: str) -> tuple[int, int]:
    """``mask_pad_rows``' ``fill`` as an element of a tensor of ``dtype`` (a name:
    ``"bfloat16"``): ``(bits, size)``, its ``size`` bytes as a signed integer, which every
    frontend stores through the tensor's integer view (the same bits on every device and
    under every trace). The rule, raised before the tensor is touched: a number (an int or
    a float, not a bool) the dtype holds -- for an integer dtype an integer in its range;
    for a float dtype NaN (its canonical quiet NaN), an infinity where it has one, or a
    value of at most its largest magnitude, rounded once to nearest even."""
    if isinstance(fill, bool) or not isinstance(fill, (int, float)):
        raise DpxTypeError(f"fill={fill!r} must be an int or a float")
    if dtype in INT_FILLS:
        size, lo, hi = INT_FILLS[dtype]
        if not ((isinstance(fill, int) or fill.is_integer()) and lo <= fill <= hi):
            raise DpxValueError(f"fill={fill!r} is not a value of {dtype}: an integer in "
                                f"[{lo}, {hi}]")
        return (int(fill) + (1 << 8 * size - 1)) % (1 << 8 * size) - (1 << 8 * size - 1), size
    if dtype not in FLOAT_FILLS:
        raise DpxTypeError(f"mask_pad_rows fills {[*INT_FILLS, *FLOAT_FILLS]} tensors, not {dtype}")
    e, m, inf = FLOAT_FILLS[dtype]
    size, bias = (1 + e + m) // 8, 2 ** (e - 1) - 1
    sign = (fill < 0 if isinstance(fill, int) else math.copysign(1.0, fill) < 0) << 8 * size - 1
    top = (2 - 2.0 ** (-m if inf else 1 - m)) * 2.0 ** (bias + (not inf))
    if fill != fill:                                  # its canonical quiet NaN
        v = (2 ** e - 1 << m) | (1 << m - 1 if inf else 2 ** m - 1)
    elif inf and abs(fill) == math.inf:
        v = (2 ** e - 1 << m) | sign
    elif abs(fill) <= top:   # rounded once to nearest even (exact arithmetic: ints too)
        ex = max(abs(fill).bit_length() - 1 if isinstance(fill, int) else math.frexp(fill)[1] - 1,
                 1 - bias) if fill else 1 - bias      # its binade, or the subnormals'
        step = (2.0 if isinstance(fill, float) else Fraction(2)) ** (ex - m)  # (exact)
        v = (ex + bias - 1 << m) + round(abs(fill) / step) | sign
    else:
        raise DpxValueError(f"fill={fill!r} is not a value of {dtype}: NaN, "
                            f"{'+-inf or ' if inf else ''}a number within +-{top:g}")
    return v - (1 << 8 * size) * (v >= 1 << (8 * size - 1)), size


def held_rows(plan: DpPlan, rank: int, counts: tuple[int, ...] | None = None) -> int:
    """Real rows of ``rank``'s input: its replica's count, or its CP rank's shard, under
    the plan's host counts or ``counts`` (a step's device counts read back: per replica,
    or the shard table row by row)."""
    c = check_plan(plan).layout.coords(rank)
    return (plan.leaf_counts if counts is None else counts)[
        own_entry(c.attn_dp_rank, c.attn_cp_rank, plan.layout.cp_size, shards=plan.sharded)]


def first_copy(layout: DpLayout, op: Op, *, partial: bool, sharded: bool, rank: RankRef) -> Any:
    """1 where ``rank``'s input rows are the copy that stands for ``op``'s value, else 0 (an
    int for a known rank, an expression over the coordinates for a symbolic one). A
    gather's input rows are copies of one value on the ranks of a replica: over attn-tp
    when not ``partial``, over CP unless the plan shards its rows over the CP ranks; the
    first copy (attn-tp rank 0, CP rank 0) stands for it. Every other op's, a partial
    gather's attn-tp ranks' and a gather_sum's every rank's rows are their own. The
    summed-slots emitter writes the first copy alone (the sum would add the copies), and
    ``dpx_jax`` gives it the value's gradient (docs/semantics.md, "Adjoints and
    gradients")."""
    keep: Any = 1
    if op is Op.GATHER and not partial and layout.attn_tp_size > 1:
        keep = X.eq(rank.tp, 0)
    if op is Op.GATHER and not sharded and layout.cp_size > 1:
        keep = X.mul(keep, X.eq(rank.cp, 0))
    return keep


def op_rows(plan: DpPlan, op: Op, rank: int | None, *, device_counts: bool) -> OpRows:
    """The input and output rows of ``op`` on ``rank`` (``None``: the largest over the
    ranks, for one program serving them all)."""
    gather, plan = op in (Op.GATHER, Op.GATHER_SUM), check_plan(plan)
    if gather and rank is not None and not device_counts:
        return OpRows(held_rows(plan, rank), False, plan.global_rows)
    if gather and rank is None and plan.capacity is None:  # the most rows a rank holds
        return OpRows(max(plan.leaf_counts, default=0), False, plan.global_rows)
    slot = (plan.max_slot_rows if rank is None
            else plan.slot_rows[plan.layout.coords(rank).attn_dp_rank])
    # a slot: at least a gather's input (its counts unknown), exactly an adjoint's
    if gather or op in (Op.SCATTER_ADJOINT, Op.SCATTER_COLUMNS_ADJOINT):
        return OpRows(slot, not gather, plan.global_rows)
    return OpRows(plan.global_rows, True, slot)


def local_rows(plan: DpPlan, rank: int, *, device_counts: bool) -> tuple[int, int]:
    """``(first, rows)``: where rank ``rank``'s own rows lie in the gathered buffer -- its
    replica's slot (real and pad rows), or its CP shard -- the view an in-place gather
    reads. A dpx error when that place is device data (a SUM_LEN / GATHERV capacity plan,
    or CP shards, with device counts)."""
    c = check_plan(plan).layout.coords(rank)
    d = c.attn_dp_rank
    if device_counts and (plan.mode is not PaddingMode.MAX_LEN or plan.cp_shards is not None):
        raise DpxValueError(
            f"local_slot: under a {plan.mode.name} capacity plan with device counts"
            + (" and CP shards" if plan.cp_shards is not None else "")
            + " this rank's rows lie at a place the device counts decide; gather from a "
              "separate input (in-place gathers need MAX_LEN, or host counts)")
    first = plan.offsets[d]  # of the plan's host counts (static for MAX_LEN)
    if plan.cp_shards is None:
        return first, (plan.slot_rows[d] if plan.mode is PaddingMode.MAX_LEN
                       else plan.aligned_tokens[d])
    shards = plan.cp_shards[d]
    return first + sum(shards[:c.attn_cp_rank]), shards[c.attn_cp_rank]


def real_ranges(plan: DpPlan, *, device_counts: bool) -> tuple[Any, Any]:
    """``(firsts, lens)``, one entry per replica: the global rows ``[firsts[d], firsts[d] +
    lens[d])`` are replica d's real rows; every other row of ``[0, global_rows)`` is a pad
    row (``mask_pad_rows`` in both frontends). Tuples of ints for the plan's host counts;
    :mod:`dpx.expr` vectors over the device counts (a ``[dp]`` vector, or a ``[dp, cp]``
    shard table row by row) when ``device_counts`` (capacity plans)."""
    g = (symbolic_geometry(plan.structure) if device_counts
         else geometry(plan.structure, INTS, plan.leaf_counts))
    return g.offsets, g.n
