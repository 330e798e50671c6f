"""Framework-neutral inputs and a plain NumPy reference of the dpx semantics.

Every rank builds every rank's inputs from one seed, so each rank can compute the whole
reference locally. Values are small integers, exact in every supported dtype (bfloat16
included) and exact under summation over a few ranks, so float results compare bitwise.
"""

from __future__ import annotations

import numpy as np

from dpx import DpLayout, DpPlan

GARBAGE = 99  # rows past a replica's count hold this: a result containing it read them


def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng([abs(k) for k in key])


def _values(rng: np.random.Generator, shape, floats: bool) -> np.ndarray:
    if floats:  # random float32 values (sums then depend on the reduction order)
        return rng.standard_normal(shape).astype(np.float32).astype(np.float64)
    return rng.integers(-8, 9, size=shape).astype(np.float64)


def local_inputs(seed: int, plan: DpPlan, rest: tuple[int, ...], *, partial: bool,
                 extra_rows: int = 2, rows: int | None = None,
                 floats: bool = False) -> list[np.ndarray]:
    """``local`` of every rank, float64 holding small ints (or float32 values with
    ``floats``). Replica d's ranks get ``n_d`` real rows (identical across attn-tp ranks
    unless ``partial``) then garbage rows."""
    lay = plan.layout
    out = []
    for r in range(lay.world_size):
        c = lay.coords(r)
        n = plan.num_tokens[c.attn_dp_rank]
        total = rows if rows is not None else n + extra_rows
        key = (seed, c.attn_dp_rank, c.attn_tp_rank if partial else 0)
        x = np.full((total, *rest), GARBAGE, dtype=np.float64)
        x[:n] = _values(_rng(*key), (n, *rest), floats)
        out.append(x)
    return out


def global_inputs(seed: int, plan: DpPlan, rest: tuple[int, ...], *,
                  floats: bool = False) -> list[np.ndarray]:
    """A different ``[global_rows, *rest]`` buffer per rank (for reduce_scatter)."""
    return [_values(_rng(seed, 7777, r), (plan.global_rows, *rest), floats)
            for r in range(plan.layout.world_size)]


def offsets_of(plan: DpPlan, counts: tuple[int, ...]) -> tuple[int, ...]:
    """Slot offsets for ``counts`` (a capacity plan's dynamic offsets, else the plan's)."""
    if not plan.dynamic_offsets:
        return plan.offsets
    tp, acc, offs = plan.layout.attn_tp_size, 0, []
    for n in counts:
        offs.append(acc)
        acc += -(-n // tp) * tp
    return tuple(offs)


def ref_gather(locals_: list[np.ndarray], plan: DpPlan, *, partial: bool,
               counts: tuple[int, ...] | None = None) -> np.ndarray:
    counts = plan.num_tokens if counts is None else counts
    lay: DpLayout = plan.layout
    offs = offsets_of(plan, counts)
    out = np.zeros((plan.global_rows, *locals_[0].shape[1:]), dtype=np.float64)
    for d in range(lay.dp_size):
        n, ranks = counts[d], lay.replica_ranks(d)
        val = sum(locals_[r][:n] for r in ranks) if partial else locals_[ranks[0]][:n]
        out[offs[d]:offs[d] + n] = val
    return out


def ref_scatter(global_: np.ndarray, plan: DpPlan, d: int,
                counts: tuple[int, ...] | None = None) -> np.ndarray:
    counts = plan.num_tokens if counts is None else counts
    off, n = offsets_of(plan, counts)[d], counts[d]
    out = np.zeros((plan.slot_rows[d], *global_.shape[1:]), dtype=np.float64)
    out[:n] = global_[off:off + n]
    return out


def ref_reduce_scatter(globals_: list[np.ndarray], plan: DpPlan, d: int,
                       counts: tuple[int, ...] | None = None) -> np.ndarray:
    return ref_scatter(sum(globals_), plan, d, counts)
