"""Enums naming the padding modes and the planner's policies."""

from __future__ import annotations

import enum

from dpx.errors import DpxTypeError, DpxValueError

__all__ = ["Group", "Op", "PaddingMode", "Policy", "Transport", "Wire"]


class _ParsableEnum(enum.Enum):
    #: members are singletons: hashed by identity in C, not by Enum's Python-level hash of
    #: their name (an enum keys every per-call cache lookup)
    __hash__ = object.__hash__

    @classmethod
    def parse(cls, value: "str | _ParsableEnum") -> "_ParsableEnum":
        """Accept a member or its (case-insensitive) name or value; reject anything else."""
        if isinstance(value, cls):
            return value
        hit = cls._value2member_map_.get(value) if isinstance(value, str) else None
        if hit is not None:  # the common case: the member's value, as written
            return hit
        if not isinstance(value, str):
            raise DpxTypeError(f"{cls.__name__} must be a {cls.__name__} or a str, got {value!r}")
        key = value.strip().lower()
        for member in cls:
            if key in (member.value, member.name.lower()):
                return member
        choices = ", ".join(repr(m.value) for m in cls)
        raise DpxValueError(f"unknown {cls.__name__} {value!r}: expected one of {choices}")


class PaddingMode(_ParsableEnum):
    """How the slots lie in the global buffer: ``MAX_LEN`` padded to the largest (an
    all-gather); ``SUM_LEN`` packed, summed (an all-reduce); ``GATHERV`` packed, gathered."""

    MAX_LEN = "max_len"
    SUM_LEN = "sum_len"
    GATHERV = "gatherv"


class Policy(_ParsableEnum):
    """How :func:`dpx.plan_step` picks a mode: sglang's rule, or the cheapest estimate."""

    SGLANG = "sglang"
    COST = "cost"


class Op(_ParsableEnum):
    """The ops a schedule describes. ``SCATTER_ADJOINT`` (``[slot rows] -> [global_rows]``,
    zeros elsewhere) is scatter's backward; ``GATHER_SUM`` a partial gather summing over
    every rank of a replica (CP ranks too), reduce_scatter's adjoint. ``SCATTER_COLUMNS``
    (``[global_rows, C] -> [slot rows, world * C]``): scatter of the rows whose columns
    are spread over the world's ranks (docs/semantics.md, "The LM-head scatter")."""

    GATHER = "gather"
    SCATTER = "scatter"
    REDUCE_SCATTER = "reduce_scatter"
    SCATTER_ADJOINT = "scatter_adjoint"
    SCATTER_COLUMNS = "scatter_columns"
    SCATTER_COLUMNS_ADJOINT = "scatter_columns_adjoint"
    GATHER_SUM = "gather_sum"

    @property
    def adjoint(self) -> "Op":
        """The op whose schedule computes this op's backward."""
        return _ADJOINT[self]


_ADJOINT = {Op.GATHER: Op.REDUCE_SCATTER, Op.REDUCE_SCATTER: Op.GATHER_SUM,
            Op.GATHER_SUM: Op.REDUCE_SCATTER, Op.SCATTER: Op.SCATTER_ADJOINT,
            Op.SCATTER_ADJOINT: Op.SCATTER, Op.SCATTER_COLUMNS: Op.SCATTER_COLUMNS_ADJOINT,
            Op.SCATTER_COLUMNS_ADJOINT: Op.SCATTER_COLUMNS}


class Group(_ParsableEnum):
    """A collective's group: every rank, this rank's attn-tp group, or its replica."""

    WORLD = "world"
    ATTN_TP = "attn_tp"
    REPLICA = "replica"


class Transport(_ParsableEnum):
    """What a frontend's collectives can do (docs/semantics.md, "Transports and routes"):
    ``PER_ROOT`` per-root collectives of host sizes (torch.distributed), ``RAGGED`` a ragged
    all-to-all (JAX on GPU), ``EQUAL`` equal-size collectives only (JAX on CPU), ``PEER``
    one-sided puts into and pulls from the ranks' shared memory (torch, the ranks of one
    node; docs/semantics.md, "The peer transport")."""

    PER_ROOT = "per_root"
    RAGGED = "ragged"
    EQUAL = "equal"
    PEER = "peer"


class Wire(_ParsableEnum):
    """The format a gather's rows travel in: the input's dtype, or a quantized format
    (:mod:`dpx.wire`): fp8, NVFP4 or MXFP4."""

    NATIVE = "native"
    FP8 = "fp8"
    NVFP4 = "nvfp4"
    MXFP4 = "mxfp4"
