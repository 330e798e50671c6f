"""Random cases for the round-trip fuzzers (tests/test_fuzz.py and tests/fuzz_long.py)."""

from __future__ import annotations

from hypothesis import strategies as st

MODES = ["max_len", "sum_len", "gatherv", None]
DTYPES = ["float32", "bfloat16", "int32", "int64", "float16"]


@st.composite
def counts_for(draw, dp: int, cap: int = 12):
    kind = draw(st.sampled_from(["random", "idle", "one", "edge", "zeros"]))
    if kind == "random":
        return draw(st.lists(st.integers(0, cap), min_size=dp, max_size=dp))
    if kind == "idle":
        c = draw(st.lists(st.integers(1, cap), min_size=dp, max_size=dp))
        for i in draw(st.sets(st.integers(0, dp - 1), min_size=1, max_size=max(dp - 1, 1))):
            c[i] = 0
        return c
    if kind == "one":
        c = [0] * dp
        c[draw(st.integers(0, dp - 1))] = draw(st.integers(1, 3 * cap))
        return c
    if kind == "edge":
        return [draw(st.sampled_from([0, 1, cap - 1, cap])) for _ in range(dp)]
    return [0] * dp


@st.composite
def shards_for(draw, counts, cp: int):
    """A CP shard table for ``counts``: each replica's rows split over its ``cp`` CP ranks
    (empty shards included)."""
    out = []
    for n in counts:
        cuts = sorted(draw(st.lists(st.integers(0, n), min_size=cp - 1, max_size=cp - 1)))
        out.append([b - a for a, b in zip([0, *cuts], [*cuts, n])])
    return out


@st.composite
def case_for(draw, dp: int, cp: int = 1):
    """A check_cases() case: counts, mode (None: a policy picks), partial, dtype, or a
    capacity plan (every mode) with run-time counts at and below its edges; with ``cp > 1``
    half the cases shard every replica's rows over its CP ranks (device shard tables for
    capacity plans)."""
    seed = draw(st.integers(0, 2**16))
    dtype = draw(st.sampled_from(DTYPES))
    partial = draw(st.booleans())
    sharded = cp > 1 and draw(st.booleans())
    if draw(st.integers(0, 4)) == 0:
        mode = draw(st.sampled_from(["max_len", "sum_len", "gatherv"]))
        cap = draw(st.integers(1, 10))
        if mode == "max_len":
            run = draw(st.lists(st.integers(0, cap), min_size=dp, max_size=dp))
        else:
            run = draw(counts_for(dp, cap=max(cap // dp, 1)))
            cap = max(cap, sum(run) + dp * 4 * cp)
        case = dict(counts=[0] * dp, mode=mode, capacity=cap, run_counts=run,
                    partial=partial, dtype=dtype, seed=seed)
        if sharded:
            case.update(shards=[[0] * cp] * dp, run_counts=draw(shards_for(run, cp)))
        return case
    counts = draw(counts_for(dp))
    case = dict(counts=counts, mode=draw(st.sampled_from(MODES)),
                policy=draw(st.sampled_from(["sglang", "cost"])),
                is_extend=draw(st.booleans()), partial=partial, dtype=dtype, seed=seed)
    if sharded:
        case["shards"] = draw(shards_for(counts, cp))
    return case


WIRES = [("native", None), ("fp8", None), ("nvfp4", 2.0), ("mxfp4", None)]


@st.composite
def in_place_case_for(draw, dp: int, cp: int = 1):
    """A case of ``hotpath_jobs.in_place`` (rows of 128 elements): a gather from this
    rank's slot of ``out``, checked against the gather from a separate input -- counts,
    mode, partial, a float dtype, the native or a quantized wire (MAX_LEN and GATHERV), a
    capacity plan (MAX_LEN with device counts, the others with host counts), CP shards
    (native wire)."""
    seed = draw(st.integers(0, 2**16))
    wire, scale = draw(st.sampled_from(WIRES))
    modes = ["max_len", "gatherv"] if wire != "native" else ["max_len", "sum_len", "gatherv"]
    mode = draw(st.sampled_from(modes))
    case = dict(mode=mode, partial=draw(st.booleans()), seed=seed, wire=wire,
                wire_scale=scale, dtype=draw(st.sampled_from(["float32", "bfloat16"])))
    if draw(st.integers(0, 3)) == 0:
        cap = draw(st.integers(1, 8))
        run = draw(st.lists(st.integers(0, cap), min_size=dp, max_size=dp))
        if mode == "max_len":
            return dict(case, counts=[0] * dp, capacity=cap, run_counts=run)
        return dict(case, counts=run, capacity=sum(run) + dp * 4 * cp)
    counts = draw(counts_for(dp))
    if cp > 1 and wire == "native" and draw(st.booleans()):
        case["shards"] = draw(shards_for(counts, cp))
    return dict(case, counts=counts)
