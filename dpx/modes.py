"""Enums naming the padding modes and the planner's policies."""

from __future__ import annotations

import enum

from dpx.errors import DpxTypeError, DpxValueError

__all__ = ["Group", "Op", "PaddingMode", "Policy", "Transport", "Wire"]


class _ParsableEnum(enum.Enum):
    @classmethod
    def parse(cls, value: "str | _ParsableEnum") -> "_ParsableEnum":
        """Accept a member or its (case-insensitive) name or value; reject anything else."""
        if isinstance(value, cls):
            return value
        hit = cls._value2member_map_.get(value) if isinstance(value, str) else None
        if hit is not None:  # the common case: the member's value, as written
            return hit
        if not isinstance(value, str):
            raise DpxTypeError(
                f"{cls.__name__} must be a {cls.__name__} or a str, got {value!r}")
        key = value.strip().lower()
        for member in cls:
            if key in (member.value, member.name.lower()):
                return member
        choices = ", ".join(repr(m.value) for m in cls)
        raise DpxValueError(f"unknown {cls.__name__} {value!r}: expected one of {choices}")


class PaddingMode(_ParsableEnum):
    """How the per-replica slots are laid out in the global buffer, and moved.

    ``MAX_LEN``: every slot padded to the largest aligned count; world all-gather.
    ``SUM_LEN``: slots packed at their cumulative offsets in a zero buffer; world all-reduce.
    ``GATHERV``: packed slots, variable-length all-gather moving exactly the real rows.
    """

    MAX_LEN = "max_len"
    SUM_LEN = "sum_len"
    GATHERV = "gatherv"


class Policy(_ParsableEnum):
    """How :func:`dpx.plan_step` picks a mode when none is forced.

    ``SGLANG``: sglang's rule. ``COST``: the cheapest mode under a :class:`dpx.CostModel`.
    """

    SGLANG = "sglang"
    COST = "cost"


class Op(_ParsableEnum):
    """The operations a schedule describes (see :mod:`dpx.schedule`).

    ``SCATTER_ADJOINT`` (``[slot rows] -> [global_rows]``: a rank's rows placed back at
    their offset, zeros elsewhere) is scatter's adjoint, the backward of ``scatter``.
    ``GATHER_SUM`` is a partial gather whose partial sums span every rank of a replica
    (CP ranks too): reduce_scatter's adjoint. It is ``gather(partial=True)`` when
    ``cp_size == 1`` or when the plan shards the rows over the CP ranks.
    """

    GATHER = "gather"
    SCATTER = "scatter"
    REDUCE_SCATTER = "reduce_scatter"
    SCATTER_ADJOINT = "scatter_adjoint"
    GATHER_SUM = "gather_sum"

    @property
    def adjoint(self) -> "Op":
        """The op whose schedule computes this op's backward: gather (partial or
        replicated; copies each receive the whole gradient) -> reduce_scatter ->
        gather_sum -> reduce_scatter; scatter <-> scatter_adjoint."""
        return _ADJOINT[self]


_ADJOINT = {Op.GATHER: Op.REDUCE_SCATTER, Op.REDUCE_SCATTER: Op.GATHER_SUM,
            Op.GATHER_SUM: Op.REDUCE_SCATTER, Op.SCATTER: Op.SCATTER_ADJOINT,
            Op.SCATTER_ADJOINT: Op.SCATTER}


class Group(_ParsableEnum):
    """The process group a collective step runs on: every rank; this rank's attn-tp group
    (the ``attn_tp_size`` consecutive ranks sharing its replica and CP rank); or its
    replica (the ``cp_size * attn_tp_size`` consecutive ranks of its DP replica, the same
    ranks as the attn-tp group when ``cp_size == 1``)."""

    WORLD = "world"
    ATTN_TP = "attn_tp"
    REPLICA = "replica"


class Transport(_ParsableEnum):
    """What a frontend's collectives can do, which decides how a GATHERV plan moves rows.

    ``PER_ROOT``: grouped per-root broadcasts / reduces whose sizes must be host ints
    (``torch.distributed``: NCCL, gloo). ``RAGGED``: a ragged all-to-all whose sizes may be
    device data (``lax.ragged_all_to_all``: JAX on GPU). ``EQUAL``: equal-size collectives
    only (JAX on CPU). Where a GATHERV plan cannot move variable sizes, its schedule moves
    every rank's block in an equal all-gather and one pass unpacks the chunks to their
    rows (reduce_scatter: a pack pass, then an equal reduce-scatter): the same result.
    """

    PER_ROOT = "per_root"
    RAGGED = "ragged"
    EQUAL = "equal"


class Wire(_ParsableEnum):
    """The format a gather's rows travel in.

    ``NATIVE``: the input's dtype. ``FP8``: per-token-group float8 (:mod:`dpx.wire`): each
    row's groups of 128 elements as float8_e4m3fn payload plus one float32 scale per group,
    one byte row per token; the gathered buffer is dequantized to the input's dtype unless
    the caller asks for the payload and scales.
    """

    NATIVE = "native"
    FP8 = "fp8"
