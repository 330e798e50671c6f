"""The peer transport's kernels (docs/semantics.md, "The peer transport"): rows put into
peers' workspaces, a bounded barrier, rows taken from this rank's workspace, and the pull
and sum of a combine.

Every kernel finds the ranks' workspaces through a *table* (int64, in device memory):
``table[p]`` for ``p < W`` is rank ``p``'s workspace base address (its own, mapped into
this process), ``table[W]`` the address of this rank's error word (int64, in host memory
the device maps: the host reads it without a sync). Offsets inside a workspace are
:class:`dpx.workspace.PeerLayout`'s: ``EPOCH`` (constexpr), ``data`` and ``stride`` (the
first row byte of phase 0, and the bytes from one phase to the next). A kernel before its
step's barrier writes phase ``(epoch + 1) & 1``, one after it reads phase ``epoch & 1``
(:func:`phase_offset`). Workspace bases and phases are multiples of
``dpx.workspace.ALIGN`` bytes (the host refuses a mapping that is not), which the kernels
tell the compiler (:func:`row_starts`), so a row moves as whole vectors.

Rows are ``WIDTH`` elements of the pointer type of the caller's tensor (its dtype, or
bytes for wire rows); every access is masked against its buffer (``src_rows``, the phase's
``ws_rows``, ``out_rows``), so a wrong count can never read or write out of bounds. Counts
and chunk tables are int32 in device memory (CUDA-graph replayable with new counts).

- :func:`peer_put_kernel` (before the barrier), ``MODE`` 0 *chunk*: this rank's chunk
  ``src[:lens[me]]`` into every rank's rows ``[firsts[me], +lens[me])``; 1 *stage*: every
  chunk ``r`` of ``src`` (rows ``[firsts[r], +lens[r])``) into this rank's own rows at the
  same place; 2 *blocks*: rows ``[k * src_step, +block)`` of ``src`` into rank ``k``'s rows
  ``[me * block, +block)`` (``src_step`` 0: an all-gather, ``block``: an all-to-all), and
  this rank's report (``count_ptr``, when ``REPORT``) into every rank's header.
- :func:`peer_barrier_kernel`: one program; the epoch plus one, written into every peer's
  flag for this rank (release, system scope), then this rank's flags read (acquire) until
  every peer's reaches the epoch -- or until ``timeout_ns`` pass on the GPU's global
  clock, when the bits of the ranks that did not arrive are ORed into the error word; a
  peer whose flag says it left (``LEFT + e``, :mod:`dpx.workspace`) before this epoch is
  named at once. A barrier that finds the error word set signals and returns at once:
  after a dead peer no spin waits again. With ``leave`` (``destroy()``): ``LEFT +
  epoch`` written instead, and the wait is for every peer to have left.
- :func:`peer_take_kernel` (after the barrier), ``MODE`` 0: ``out[i]`` is this rank's row
  ``i`` where ``i`` lies in a chunk of the table, else 0; 2: rows ``[0, out_rows)``
  copied; ``REPORT``: the header's reports into ``reports_ptr``.
- :func:`peer_sum_kernel` / :func:`peer_wire_sum_kernel` (after the barrier): ``out[j]``,
  ``j < lens[me]``, is the sum over ranks ``p = 0 .. W-1`` in that order of rank ``p``'s
  row ``firsts[me] + j`` -- float32 from +0.0 rounded once (the combine's
  :func:`~dpx.kernels.blocks.add_rn` and :func:`~dpx.kernels.combine.store_sum`; wire
  rows dequantized and added by :func:`~dpx.kernels.combine.add_wire_block`), integers in their
  dtype -- and 0 from ``lens[me]`` to ``out_rows``.

Grids: put ``(E * cdiv(block, BLOCK_R), cdiv(WIDTH, BLOCK_C))``, ``E`` entries (``W``, or 1
where every rank receives the same rows, ``FAN``); take and sum
``(cdiv(out_rows, BLOCK_R), cdiv(WIDTH, BLOCK_C))``; the wire sum ``(cdiv(out_rows * H /
GS, BLOCK_B),)``; the barrier ``(1,)``.
"""

import triton
import triton.language as tl

from dpx.kernels.blocks import add_rn, block_index
from dpx.kernels.combine import add_wire_block, store_sum
from dpx.kernels.constants import GROUP, LEFT, MX_BLOCK, NV_BLOCK

__all__ = ["globaltimer", "peer_barrier_kernel", "peer_put_kernel", "peer_sum_kernel",
           "peer_take_kernel", "peer_wire_sum_kernel", "phase_offset"]


@triton.jit
def globaltimer(like):
    """The GPU's global clock in nanoseconds (int64, shaped like ``like``)."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [like],
                                     dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def peer_base(table_ptr, p):
    """Rank ``p``'s workspace base address, as a byte pointer (a multiple of
    :data:`dpx.workspace.ALIGN`, which :class:`dpx_torch.peer_memory.PeerMemory` checks)."""
    return tl.load(table_ptr + p).to(tl.pointer_type(tl.uint8))


@triton.jit
def phase_offset(table_ptr, me, data, stride, EPOCH: tl.constexpr, AFTER: tl.constexpr):
    """The byte offset of this step's phase rows: ``data + q * stride``, ``q`` the epoch's
    parity after the step's barrier (``AFTER``: the barrier has run). The epoch is this
    rank's own, written only by its barrier kernel, an earlier launch in stream order, so a
    plain load sees it (a volatile, system-scope one cost every program of the moves and
    sums its latency: up to a quarter of their time at decode sizes)."""
    epoch_ptr = (peer_base(table_ptr, me) + EPOCH).to(tl.pointer_type(tl.int64))
    epoch = tl.load(epoch_ptr)
    if not AFTER:
        epoch = epoch + 1
    return data + (epoch & 1) * stride


@triton.jit
def row_starts(ptr, rows, ROW: tl.constexpr):
    """``ptr + rows * ROW`` (elements of ``ptr``'s type; ``ptr`` a workspace's phase: its
    base and the phase offset are multiples of :data:`dpx.workspace.ALIGN` bytes), with
    the compiler told what divides each row's first byte: the largest power of two
    dividing ``ROW``'s bytes, up to 16. Without it, a pointer read from the table has no
    known alignment, and every access is split into one load or store per element (a
    hint on the scalar base or offset does not reach the rows' pointers)."""
    RB: tl.constexpr = ROW * max(1, ptr.dtype.element_ty.primitive_bitwidth // 8)
    A: tl.constexpr = 16 if RB % 16 == 0 else (8 if RB % 8 == 0 else (
        4 if RB % 4 == 0 else (2 if RB % 2 == 0 else 1)))
    return tl.multiple_of(ptr + rows * ROW, A)


@triton.jit(do_not_specialize=["me", "block", "src_step", "src_rows", "ws_rows", "data",
                               "stride", "header"])
def peer_put_kernel(src_ptr, table_ptr, firsts_ptr, lens_ptr, count_ptr, me, block, src_step,
                    src_rows, ws_rows, data, stride, header, WIDTH: tl.constexpr,
                    W: tl.constexpr, MODE: tl.constexpr, REPORT: tl.constexpr,
                    FAN: tl.constexpr, EPOCH: tl.constexpr, BLOCK_R: tl.constexpr,
                    BLOCK_C: tl.constexpr):
    """Rows of ``src [src_rows, WIDTH]`` into the ranks' workspaces, before the barrier
    (``MODE``: see the module docstring). Entry ``k = program_id(0) // cdiv(block,
    BLOCK_R)``: its destination rank, first source row, rows (at most ``block``) and first
    destination row. ``FAN`` (every rank receives the same rows at the same place: the
    chunk mode, and the blocks mode with ``src_step`` 0): one entry, whose tile is read
    once and written into every rank's workspace, starting at rank ``(me + tile) % W`` (the
    ranks' and the tiles' programs spread over the destinations)."""
    tiles = tl.maximum(tl.cdiv(block, BLOCK_R), 1)
    pid = tl.program_id(0)
    k = 0 if FAN else pid // tiles
    tile = pid if FAN else pid % tiles
    j = tile.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)
    cols = block_index(1, BLOCK_C, True)
    if MODE == 0:
        dest = k
        s0 = tl.full([], 0, tl.int64)
        n = tl.load(lens_ptr + me).to(tl.int64)
        d0 = tl.load(firsts_ptr + me).to(tl.int64)
    elif MODE == 1:
        dest = me
        s0 = tl.load(firsts_ptr + k).to(tl.int64)
        n = tl.load(lens_ptr + k).to(tl.int64)
        d0 = s0
    else:
        dest = k
        s0 = k * src_step.to(tl.int64)
        n = tl.full([], 0, tl.int64) + block
        d0 = me.to(tl.int64) * block
    n = tl.minimum(n, block)
    s = s0 + j
    d = d0 + j
    ok = (j < n) & (s >= 0) & (s < src_rows) & (d >= 0) & (d < ws_rows)
    col_ok = cols < WIDTH
    mask = ok[:, None] & col_ok[None, :]
    vals = tl.load(src_ptr + s[:, None] * WIDTH + cols[None, :], mask=mask)
    off = phase_offset(table_ptr, me, data, stride, EPOCH, False)
    first = (tile == 0) & (tl.program_id(1) == 0)   # the entry's program that reports
    if REPORT:
        count = tl.load(count_ptr)
    for i in range(W if FAN else 1):
        base = peer_base(table_ptr, (me + tile + i) % W if FAN else dest) + off
        tl.store(row_starts(base.to(src_ptr.dtype), d, WIDTH)[:, None] + cols[None, :], vals,
                 mask=mask)
        if REPORT:
            if first:
                tl.store((base - header).to(tl.pointer_type(tl.int32)) + me, count)


@triton.jit
def _absent(seen, live, epoch, leaving):
    """``(missing, gone)`` of the flags ``seen``: the ranks not yet where this barrier waits
    for them -- at ``epoch`` (a step's), or gone too (``leaving``) -- and those that left
    before ``epoch`` (never to arrive: a step's barrier names them at once; none while
    this rank leaves, as it waits for every peer to leave)."""
    gone = live & (seen >= LEFT) & (seen - LEFT < epoch) & (leaving == 0)
    missing = tl.where(leaving, live & (seen < LEFT), (live & (seen < epoch)) | gone)
    return missing, gone


@triton.jit(do_not_specialize=["me", "timeout_ns", "leave"])
def peer_barrier_kernel(table_ptr, me, timeout_ns, leave, W: tl.constexpr,
                        BLOCK_W: tl.constexpr, EPOCH: tl.constexpr, CLOCK: tl.constexpr):
    """The step's barrier (see the module docstring), or with ``leave`` (1) this rank's
    leaving (``destroy()``): ``LEFT + epoch`` written into its flags, the epoch unchanged,
    then the wait until every peer left. Grid ``(1,)``. ``CLOCK``: the timeout on the
    GPU's global clock (else, for Triton's interpreter, ``timeout_ns`` counts the
    polls)."""
    p = tl.arange(0, BLOCK_W)
    live = p < W
    leaving = leave != 0
    mine = peer_base(table_ptr, me)
    epoch_ptr = (mine + EPOCH).to(tl.pointer_type(tl.int64))
    epoch = tl.load(epoch_ptr, volatile=True)
    epoch = tl.where(leaving, epoch, epoch + 1)
    tl.store(epoch_ptr, epoch, mask=leaving == 0)
    mark = tl.where(leaving, epoch + LEFT, epoch)
    err_ptr = tl.load(table_ptr + W).to(tl.pointer_type(tl.int64))
    bases = tl.load(table_ptr + p, mask=live, other=0)
    # this rank's arrival (or leaving), written into its flag in every workspace (its own
    # included)
    flags_at = (bases + me.to(tl.int64) * 8).to(tl.pointer_type(tl.int64))
    tl.atomic_xchg(flags_at, tl.full([BLOCK_W], 0, tl.int64) + mark, mask=live, sem="release",
                   scope="sys")
    own = mine.to(tl.pointer_type(tl.int64)) + p
    seen = tl.atomic_add(own, tl.full([BLOCK_W], 0, tl.int64), mask=live, sem="acquire",
                         scope="sys")
    missing, gone = _absent(seen, live, epoch, leaving)
    failed = tl.load(err_ptr, volatile=True) != 0
    if CLOCK:
        t0 = tl.max(globaltimer(p), 0)
    else:
        t0 = tl.full([], 0, tl.int64)
    polls = t0 * 0
    waiting = ((tl.max(missing.to(tl.int32), 0) > 0) & (tl.max(gone.to(tl.int32), 0) == 0)
               & (failed == 0))
    while waiting:
        seen = tl.atomic_add(own, tl.full([BLOCK_W], 0, tl.int64), mask=live, sem="acquire",
                             scope="sys")
        missing, gone = _absent(seen, live, epoch, leaving)
        polls += 1
        if CLOCK:
            elapsed = tl.max(globaltimer(p), 0) - t0
        else:
            elapsed = polls
        waiting = ((tl.max(missing.to(tl.int32), 0) > 0) & (tl.max(gone.to(tl.int32), 0) == 0)
                   & (elapsed < timeout_ns))
    # the ranks that left before this barrier if any, else those that did not arrive
    named = tl.where(tl.max(gone.to(tl.int32), 0) > 0, gone, missing)
    bits = tl.sum(tl.where(named, tl.full([BLOCK_W], 1, tl.int64) << p.to(tl.int64), 0), 0)
    tl.atomic_or(err_ptr, bits, mask=(bits != 0) & (failed == 0), sem="release", scope="sys")


@triton.jit(do_not_specialize=["me", "block", "out_rows", "ws_rows", "data", "stride",
                               "header"])
def peer_take_kernel(table_ptr, firsts_ptr, lens_ptr, reports_ptr, me, block, out_rows,
                     ws_rows, data, stride, header, out_ptr, WIDTH: tl.constexpr,
                     W: tl.constexpr, MODE: tl.constexpr, REPORT: tl.constexpr,
                     EPOCH: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                     BLOCK_W: tl.constexpr):
    """``out [out_rows, WIDTH]`` from this rank's workspace after the barrier (``MODE``:
    see the module docstring; ``BLOCK_W``: a power of two at least ``W``)."""
    rows = block_index(0, BLOCK_R, True)
    cols = block_index(1, BLOCK_C, True)
    off = phase_offset(table_ptr, me, data, stride, EPOCH, True)
    base = peer_base(table_ptr, me) + off
    if MODE == 0:
        real = tl.full([BLOCK_R], 0, tl.int1)
        for r in range(0, W):
            first = tl.load(firsts_ptr + r).to(tl.int64)
            length = tl.minimum(tl.load(lens_ptr + r).to(tl.int64), block)
            real = real | ((rows >= first) & (rows < first + length))
    else:
        real = rows >= 0
    real = real & (rows < ws_rows) & (rows < out_rows)
    col_ok = cols < WIDTH
    vals = tl.load(row_starts(base.to(out_ptr.dtype), rows, WIDTH)[:, None] + cols[None, :],
                   mask=real[:, None] & col_ok[None, :], other=0)
    tl.store(out_ptr + rows[:, None] * WIDTH + cols[None, :], vals,
             mask=(rows < out_rows)[:, None] & col_ok[None, :])
    if REPORT:
        if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
            p = tl.arange(0, BLOCK_W)
            hdr = (base - header).to(tl.pointer_type(tl.int32))
            tl.store(reports_ptr + p, tl.load(hdr + p, mask=p < W), mask=p < W)


@triton.jit(do_not_specialize=["me", "out_rows", "ws_rows", "data", "stride"])
def peer_sum_kernel(table_ptr, firsts_ptr, lens_ptr, me, out_rows, ws_rows, data, stride,
                    out_ptr, WIDTH: tl.constexpr, W: tl.constexpr, KIND: tl.constexpr,
                    EPOCH: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                    COMPILED: tl.constexpr):
    """``out[j]``: the sum over ranks in order of their row ``firsts[me] + j`` (native
    rows; ``KIND`` 0-2: float32 / bfloat16 / float16, summed in float32 and rounded once;
    3: an integer dtype, summed in it), 0 from ``lens[me]`` to ``out_rows``."""
    rows = block_index(0, BLOCK_R, True)
    cols = block_index(1, BLOCK_C, True)
    first = tl.load(firsts_ptr + me).to(tl.int64)
    n = tl.load(lens_ptr + me).to(tl.int64)
    src = first + rows
    real = (rows < n) & (rows < out_rows) & (src >= 0) & (src < ws_rows)
    col_ok = cols < WIDTH
    mask = real[:, None] & col_ok[None, :]
    off = phase_offset(table_ptr, me, data, stride, EPOCH, True)
    if KIND == 3:
        acc = tl.full([BLOCK_R, BLOCK_C], 0, out_ptr.dtype.element_ty)
    else:
        acc = tl.full([BLOCK_R, BLOCK_C], 0, tl.float32)
    for p in tl.static_range(W):
        rows_p = row_starts((peer_base(table_ptr, p) + off).to(out_ptr.dtype), src, WIDTH)
        v = tl.load(rows_p[:, None] + cols[None, :], mask=mask, other=0)
        if KIND == 3:
            acc = acc + v
        else:
            acc = add_rn(acc, v.to(tl.float32), COMPILED)
    out_offs = rows[:, None] * WIDTH + cols[None, :]
    keep = (rows < out_rows)[:, None] & col_ok[None, :]
    if KIND == 3:
        tl.store(out_ptr + out_offs, acc, mask=keep)
    else:
        store_sum(acc, out_ptr, out_offs, keep, KIND, COMPILED)


@triton.jit(do_not_specialize=["me", "out_rows", "ws_rows", "data", "stride", "g"])
def peer_wire_sum_kernel(table_ptr, firsts_ptr, lens_ptr, me, out_rows, ws_rows, data,
                         stride, g, out_ptr, H: tl.constexpr, ROW_BYTES: tl.constexpr,
                         FP4: tl.constexpr, NV: tl.constexpr, W: tl.constexpr,
                         OUT_KIND: tl.constexpr, EPOCH: tl.constexpr, BLOCK_B: tl.constexpr,
                         COMPILED: tl.constexpr, WIDE: tl.constexpr):
    """The quantized combine's pull: ``out[j]`` the float32 sum over ranks in order of the
    dequantized wire row ``firsts[me] + j`` of each (fp8 unless ``FP4``; nvfp4 with global
    scale ``g`` when ``NV``, else mxfp4), rounded to ``OUT_KIND`` (0-2: float32 /
    bfloat16 / float16); 0 from ``lens[me]`` to ``out_rows``. ``WIDE``: index math in
    int64, else int32 (the launch's choice: int32 when the output's elements and the
    phase's rows fit; a row's byte offset in a workspace is int64 either way). A row that
    is not read adds the masked loads' zero bytes: +0.0 on every wire (nvfp4's global
    scale is positive)."""
    GS: tl.constexpr = (NV_BLOCK if NV else MX_BLOCK) if FP4 else GROUP
    NB: tl.constexpr = H // GS
    f = block_index(0, BLOCK_B, WIDE)
    row = f // NB
    grp = f % NB
    src = tl.load(firsts_ptr + me) + row
    ok = row < out_rows
    real = ok & (row < tl.load(lens_ptr + me)) & (src >= 0) & (src < ws_rows)
    off = phase_offset(table_ptr, me, data, stride, EPOCH, True)
    acc = tl.full([BLOCK_B, GS], 0.0, tl.float32)
    for p in tl.static_range(W):
        base = row_starts(peer_base(table_ptr, p) + off, src.to(tl.int64), ROW_BYTES)
        acc = add_wire_block(acc, base, grp, real, g, H, ROW_BYTES, FP4, NV, BLOCK_B, COMPILED)
    offs = (f * GS)[:, None] + tl.arange(0, GS)[None, :]
    store_sum(acc, out_ptr, offs, ok[:, None], OUT_KIND, COMPILED)
