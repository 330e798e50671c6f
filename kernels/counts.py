"""The device-side check of a step's counts (:class:`dpx.steps.CheckCounts`): one program
reads the counts and sets a sticky flag when any is outside what the plan holds, so a
captured CUDA graph reports a bad bucket instead of dropping rows without a word. Like
every dpx kernel it calls no other ``@triton.jit`` function and masks every access.

Grid: ``(1,)``.
"""

import triton
import triton.language as tl

__all__ = ["check_counts_kernel"]


@triton.jit
def check_counts_kernel(counts_ptr, flag_ptr, ENTRIES: tl.constexpr, GROUP: tl.constexpr,
                        ALIGN: tl.constexpr, MAX_EACH: tl.constexpr, MAX_SUM: tl.constexpr,
                        HAS_EACH: tl.constexpr, HAS_SUM: tl.constexpr,
                        BLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    """``flag[0] |= 1`` when a count is negative; ``|= 2`` when a replica's count (the sum
    of its ``GROUP`` entries) exceeds ``MAX_EACH``; ``|= 4`` when the replicas' counts,
    each aligned up to ``ALIGN``, sum past ``MAX_SUM``. ``counts``: int32 ``[ENTRIES]``
    (``ENTRIES / GROUP`` replicas of ``GROUP`` entries, row by row); ``flag``: int32
    ``[1]``, written only when a rule is broken (it is sticky until the caller resets it).
    ``BLOCK`` >= ``ENTRIES`` and ``RBLOCK`` >= ``ENTRIES / GROUP``, powers of two."""
    i = tl.arange(0, BLOCK)
    ok = i < ENTRIES
    c = tl.load(counts_ptr + i, mask=ok, other=0).to(tl.int64)
    bad = tl.max(tl.where(ok & (c < 0), 1, 0), 0)
    if HAS_EACH or HAS_SUM:
        r = tl.arange(0, RBLOCK)
        n = tl.full((RBLOCK,), 0, tl.int64)
        for g in range(GROUP):
            n += tl.load(counts_ptr + r * GROUP + g, mask=r < ENTRIES // GROUP,
                         other=0).to(tl.int64)
        if HAS_EACH:
            bad = bad | tl.max(tl.where(n > MAX_EACH, 2, 0), 0)
        if HAS_SUM:
            a = (tl.maximum(n, 0) + (ALIGN - 1)) // ALIGN * ALIGN
            total = tl.sum(a, 0)
            bad = bad | tl.where(total > MAX_SUM, 4, 0)
    old = tl.load(flag_ptr)
    tl.store(flag_ptr, old | bad.to(tl.int32), mask=bad != 0)
