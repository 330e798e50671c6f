"""``DpComm``: DP-attention gather / scatter / reduce_scatter over torch.distributed.

Per-rank shape algebra (``d`` = this rank's attn-dp rank, ``n_d`` its real count,
``H...`` the trailing dims)::

    gather(local [>= n_d, H...], plan, partial)  -> [plan.global_rows, H...]
    scatter(global_ [global_rows, H...], plan)   -> [plan.slot_rows[d], H...]   (no collective)
    reduce_scatter(global_ [global_rows, H...])  -> [plan.slot_rows[d], H...]

Every output row that is not a real token row is zero. Streams: every call enqueues its
kernels and collectives on the current CUDA stream (NCCL) and returns without a host sync.
"""

from __future__ import annotations

import hashlib
import math
from typing import Sequence

import torch
import torch.distributed as dist

from dpx.errors import DpxError, DpxMismatchError, DpxTypeError, DpxValueError
from dpx.layout import DpLayout
from dpx.modes import PaddingMode
from dpx.plan import DpPlan
from dpx_torch.groups import DpGroups, build_groups
from dpx_torch.pool import BufferPool
from dpx_torch.rows import _overlaps, place_into, take_into, zero_rows_

# torch >= 2.12 renamed the single-tensor collectives; older releases have only the old names
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64)


class _Counts:
    """Where this call's counts and offsets come from: the plan (host ints) or a device
    int32 tensor of counts (capacity plans; graph-replayable, no host sync)."""

    def __init__(self, plan: DpPlan, counts: torch.Tensor | None, d: int) -> None:
        self.plan, self.tensor, self.d = plan, counts, d
        self._offsets: torch.Tensor | None = None

    @property
    def dynamic(self) -> bool:
        return self.tensor is not None

    def count(self):
        """This replica's count: an int, or a one-element view of the device counts."""
        d = self.d
        return self.plan.num_tokens[d] if self.tensor is None else self.tensor[d:d + 1]

    def offset(self):
        """This replica's first global row: static, or derived on the device from counts."""
        d = self.d
        if self.tensor is None or not self.plan.dynamic_offsets:
            return self.plan.offsets[d]
        if self._offsets is None:
            tp = self.plan.layout.attn_tp_size
            aligned = (self.tensor + (tp - 1)) // tp * tp
            self._offsets = (torch.cumsum(aligned, 0) - aligned).to(torch.int32)
        return self._offsets[d:d + 1]

    def clipped(self, start: int, length: int):
        """``clamp(count - start, 0, length)``: real rows of the chunk ``[start, start+length)``."""
        if self.tensor is None:
            return max(0, min(self.plan.num_tokens[self.d] - start, length))
        return torch.clamp(self.tensor[self.d:self.d + 1] - start, 0, length).to(torch.int32)


class DpComm:
    """The communicator of one DP-attention layout over one process group.

    ``group`` (default: the default process group) must have ``layout.world_size`` ranks.
    Construction creates the attn-tp subgroups (and, on NCCL, a gloo group for host
    exchanges) with ``new_group``, so like ``new_group`` it is collective over the default
    process group: every rank builds its communicators in the same order. It holds all
    state (groups, pool, comm stream, events), so several communicators coexist.

    ``validate=True`` adds one small host exchange before every collective: all ranks
    compare plan fingerprint, op, dtype, width and ``partial`` (and, for a replicated
    gather, a checksum of each replica's rows across its attn-tp ranks), and every rank
    raises the same :class:`dpx.DpxMismatchError` when they disagree or when any rank's
    input was rejected, instead of entering a collective that would hang or corrupt.
    """

    def __init__(self, layout: DpLayout, *, group: dist.ProcessGroup | None = None,
                 validate: bool = False) -> None:
        if not isinstance(layout, DpLayout):
            raise DpxTypeError(f"layout={layout!r} must be a dpx.DpLayout")
        if layout.cp_size != 1:
            raise DpxValueError(
                f"DpComm supports cp_size=1; layout has cp_size={layout.cp_size} (gathers "
                f"across context-parallel ranks are not defined by dpx)")
        self.layout = layout
        self.groups: DpGroups = build_groups(layout, group)
        self.rank = self.groups.rank
        coords = layout.coords(self.rank)
        self.dp_rank = coords.attn_dp_rank
        self.tp_rank = coords.attn_tp_rank
        self.tp_size = layout.attn_tp_size
        self.validate = bool(validate)
        self.pool = BufferPool()

        self._comm_stream: torch.cuda.Stream | None = None
        self._events: dict[tuple[str, object], torch.cuda.Event] = {}
        self._on_comm_stream = False

    def _scratch(self, purpose: str, rows: int, like: torch.Tensor) -> torch.Tensor:
        """A pooled ``[rows, *like.shape[1:]]`` buffer, valid until the next call. Async
        calls (comm stream) and synchronous ones (the caller's stream) use separate
        buffers, so the two streams never share scratch; within one stream, stream order
        makes the reuse safe."""
        key = (purpose, "comm" if self._on_comm_stream else "caller")
        return self.pool.get(key, (rows, *like.shape[1:]), like.dtype, like.device)

    # ------------------------------------------------------------------ overlap
    @property
    def comm_stream(self) -> torch.cuda.Stream:
        """The one communication stream every async call of this communicator runs on
        (one stream: the collectives of all micro-batches stay in one order on every rank)."""
        if self._comm_stream is None:
            self._comm_stream = torch.cuda.Stream()
        return self._comm_stream

    def _event(self, kind: str, key: object) -> torch.cuda.Event:
        ev = self._events.get((kind, key))
        if ev is None:
            ev = self._events[(kind, key)] = torch.cuda.Event()
        return ev

    def _launch_async(self, kind: str, key: object, inp: torch.Tensor, rows: int,
                      run) -> tuple[torch.Tensor, "DpWork"]:
        """Run ``run(out)`` on the comm stream into a pooled output keyed by
        ``(kind, key)``; return the output and a handle whose ``wait()`` orders the current
        stream after it."""
        if not inp.is_cuda:  # gloo on CPU: nothing to overlap; same results, same API
            out = self.pool.get((f"{kind}-out", key), (rows, *inp.shape[1:]), inp.dtype,
                                inp.device)
            run(out)
            return out, DpWork(None)
        compute = torch.cuda.current_stream(inp.device)
        comm = self.comm_stream
        comm.wait_stream(compute)  # the input was produced on the compute stream
        with torch.cuda.stream(comm):
            out = self.pool.get((f"{kind}-out", key), (rows, *inp.shape[1:]), inp.dtype,
                                inp.device)
            self._on_comm_stream = True
            try:
                run(out)
            finally:
                self._on_comm_stream = False
            ev = self._event(kind, key)
            ev.record(comm)
        inp.record_stream(comm)      # freed only after the comm stream is done with it
        out.record_stream(compute)   # read on the compute stream after wait()
        return out, DpWork(ev)

    # ------------------------------------------------------------------ checks
    def _check_plan(self, plan: DpPlan) -> None:
        if not isinstance(plan, DpPlan):
            raise DpxTypeError(f"plan must be a dpx.DpPlan, got {type(plan).__name__}")
        if plan.layout != self.layout:
            raise DpxValueError(f"plan was made for layout {plan.layout.describe()}, this "
                                f"DpComm has {self.layout.describe()}")

    def _check_tensor(self, name: str, t: torch.Tensor, *, min_rows: int | None = None,
                      rows: int | None = None) -> None:
        if not isinstance(t, torch.Tensor):
            raise DpxTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise DpxTypeError(f"{name} has dtype {t.dtype}; supported: "
                               f"{', '.join(str(d) for d in SUPPORTED_DTYPES)}")
        if t.dim() < 1:
            raise DpxValueError(f"{name} must have a row dimension, got a scalar")
        if not t.is_contiguous():
            raise DpxValueError(f"{name} of shape {tuple(t.shape)} must be contiguous")
        want = "cpu" if self.groups.backend == "gloo" else "cuda"
        if t.device.type != want:
            raise DpxValueError(f"{name} is on {t.device}; backend {self.groups.backend} "
                                f"needs {want} tensors")
        if min_rows is not None and t.shape[0] < min_rows:
            raise DpxValueError(f"{name} has {t.shape[0]} rows; replica {self.dp_rank} needs "
                                f"at least {min_rows} (its token count in the plan)")
        if rows is not None and t.shape[0] != rows:
            raise DpxValueError(f"{name} has {t.shape[0]} rows; the plan needs exactly {rows}")

    def _check_out(self, out: torch.Tensor | None, ref: torch.Tensor, rows: int) -> None:
        if out is None:
            return
        self._check_tensor("out", out)
        want = (rows, *ref.shape[1:])
        if tuple(out.shape) != want or out.dtype != ref.dtype or out.device != ref.device:
            raise DpxValueError(f"out has shape {tuple(out.shape)} {out.dtype} on "
                                f"{out.device}; it must be {want} {ref.dtype} on {ref.device}")
        if out.numel() and ref.numel() and _overlaps(out, ref):
            raise DpxValueError("out overlaps the input in memory; they must not alias")

    def _counts(self, plan: DpPlan, counts: torch.Tensor | None, ref: torch.Tensor) -> _Counts:
        if counts is not None:
            if not plan.is_static:
                raise DpxValueError("counts= needs a capacity plan (plan_step(..., capacity=))")
            if plan.mode is PaddingMode.GATHERV:
                raise DpxValueError("GATHERV needs host-side counts to size its per-root "
                                    "transfers; use MAX_LEN or SUM_LEN with device counts")
            if (not isinstance(counts, torch.Tensor) or counts.dtype != torch.int32
                    or tuple(counts.shape) != (self.layout.dp_size,)):
                raise DpxTypeError(f"counts must be an int32 tensor of shape "
                                   f"({self.layout.dp_size},)")
            if counts.device != ref.device:
                raise DpxValueError(f"counts is on {counts.device}, the data on {ref.device}")
        return _Counts(plan, counts, self.dp_rank)

    # ------------------------------------------------------------------ agreement
    def _checked(self, op: str, plan, tensor, partial, checks):
        """Run this rank's input checks. Without ``validate`` a rejected input raises here,
        before any collective. With ``validate``, every rank first exchanges what it is
        about to do (and whether its input was rejected), and all raise the same error."""
        if not self.validate:
            return checks()
        try:
            result, err = checks(), None
        except DpxError as exc:
            result, err = None, exc
        self._agree(op, plan, tensor, partial, err)
        return result

    def _agree(self, op: str, plan, tensor, partial, err: Exception | None) -> None:
        fp = plan.fingerprint() if isinstance(plan, DpPlan) else f"not a plan: {plan!r}"
        ok_tensor = isinstance(tensor, torch.Tensor)
        width = math.prod(tensor.shape[1:]) if ok_tensor and tensor.dim() else None
        digest = None
        if err is None and op == "gather" and partial is False and self.tp_size > 1:
            n = plan.num_tokens[self.dp_rank]
            rows = tensor[:n].detach().contiguous().cpu()
            digest = hashlib.sha1(rows.view(torch.uint8).numpy().tobytes()).hexdigest() \
                if rows.numel() else "empty"
        mine = dict(plan=fp, op=op, dtype=str(tensor.dtype) if ok_tensor else None,
                    width=width, partial=partial,
                    error=None if err is None else f"{type(err).__name__}: {err}",
                    digest=digest)
        everyone: list = [None] * self.layout.world_size
        dist.all_gather_object(everyone, mine, group=self.groups.cpu)
        problems = [f"rank {r} rejected its input ({info['error']})"
                    for r, info in enumerate(everyone) if info["error"]]
        for field in ("plan", "op", "dtype", "width", "partial"):
            groups: dict = {}
            for r, info in enumerate(everyone):
                groups.setdefault(info[field], []).append(r)
            if len(groups) > 1:
                problems.append(f"ranks disagree on {field}: " + "; ".join(
                    f"{v!r} on ranks {rs}" for v, rs in groups.items()))
        if op == "gather" and partial is False and not problems:
            for d in range(self.layout.dp_size):
                ranks = self.layout.replica_ranks(d)
                if len({everyone[r]["digest"] for r in ranks}) > 1:
                    problems.append(f"replicated gather: replica {d}'s attn-tp ranks "
                                    f"{list(ranks)} hold different rows (use partial=True "
                                    f"for partial sums)")
        if problems:
            raise DpxMismatchError("validate: " + " | ".join(problems)) from err

    def sync_counts(self, num_tokens: int, *, is_extend: bool = False) -> tuple[tuple[int, ...], bool]:
        """Exchange this rank's real token count (one small host all-gather over the CPU
        group) so every rank plans from the same data. Returns ``(counts per replica,
        any rank is_extend)``. Attn-tp ranks of one replica that report different counts
        make every rank raise :class:`dpx.DpxMismatchError` naming the replica."""
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
            bad = DpxValueError(f"num_tokens={num_tokens!r} must be an int >= 0")
            num_tokens = -1
        else:
            bad = None
        mine = torch.tensor([num_tokens, int(bool(is_extend))], dtype=torch.int64)
        allv = torch.empty(self.layout.world_size * 2, dtype=torch.int64)
        _all_gather_single(allv, mine, group=self.groups.cpu)
        rows = allv.view(-1, 2).tolist()
        problems = [f"rank {r} passed an invalid count" for r, (n, _) in enumerate(rows) if n < 0]
        counts = []
        for d in range(self.layout.dp_size):
            ranks = self.layout.replica_ranks(d)
            seen = {rows[r][0] for r in ranks}
            if len(seen) > 1:
                problems.append(f"replica {d}'s attn-tp ranks report different counts: " +
                                ", ".join(f"rank {r}={rows[r][0]}" for r in ranks))
            counts.append(rows[ranks[0]][0])
        if problems:
            raise DpxMismatchError("sync_counts: " + "; ".join(problems)) from bad
        return tuple(counts), any(e for _, e in rows)

    # ------------------------------------------------------------------ gather
    def gather(self, local: torch.Tensor, plan: DpPlan, *, partial: bool,
               counts: torch.Tensor | None = None, out: torch.Tensor | None = None,
               async_op: bool = False, key: object = 0):
        """``local [>= n_d, H...] -> [plan.global_rows, H...]`` on every rank.

        Slot ``d`` row ``j < n_d`` holds the sum over replica d's attn-tp ranks of their
        ``local[j]`` when ``partial``, else attn-tp rank 0's ``local[j]``. Other rows are 0.

        ``async_op=True`` (two-batch overlap) runs on :attr:`comm_stream` and returns
        ``(out, work)``: ``out`` is a pooled buffer keyed by ``("gather", key)`` (use one
        ``key`` per micro-batch; it is valid until the next call with that key) and
        ``work.wait()`` makes the current stream wait for it.
        """
        def checks() -> _Counts:
            self._check_plan(plan)
            if not isinstance(partial, bool):
                raise DpxTypeError(f"partial={partial!r} must be a bool")
            n_d = plan.num_tokens[self.dp_rank]
            self._check_tensor("local", local, min_rows=0 if counts is not None else n_d)
            if counts is not None and local.shape[0] < plan.slot_rows[self.dp_rank]:
                raise DpxValueError(f"local has {local.shape[0]} rows; with device counts "
                                    f"it needs the plan's static {plan.slot_rows[self.dp_rank]}")
            self._check_out(out, local, plan.global_rows)
            if async_op and out is not None:
                raise DpxValueError("async_op=True returns a pooled output; do not pass out=")
            return self._counts(plan, counts, local)

        c = self._checked("gather", plan, local, partial, checks)
        if async_op:
            return self._launch_async("gather", key, local, plan.global_rows,
                                      lambda o: self._gather(local, plan, partial, c, o))
        if torch.is_grad_enabled() and local.requires_grad:
            if out is not None:
                raise DpxValueError("out= cannot be used when local requires grad")
            return _Gather.apply(local, self, plan, partial, c)
        return self._gather(local, plan, partial, c, out)

    def _gather(self, local, plan, partial, c, out=None) -> torch.Tensor:
        if out is None:
            out = local.new_empty((plan.global_rows, *local.shape[1:]))
        if plan.mode is PaddingMode.MAX_LEN:
            self._gather_max_len(local, plan, partial, c, out)
        elif plan.mode is PaddingMode.SUM_LEN:
            self._gather_sum_len(local, plan, partial, c, out)
        else:
            self._gather_v(local, plan, partial, c, out)
        return out

    def _slot_chunk(self, local: torch.Tensor, slot: int, partial: bool, c: _Counts,
                    out: torch.Tensor | None = None) -> torch.Tensor:
        """This rank's ``slot/tp``-row chunk of its replica's zero-padded slot: reduced over
        the attn-tp group (partial) or sliced from the local copy (replicated)."""
        chunk = slot // self.tp_size
        if out is None:
            out = self._scratch("chunk", chunk, local)
        if self.tp_size == 1:
            return place_into(local, 0, c.count(), out)
        if partial:
            padded = place_into(local, 0, c.count(), self._scratch("padded", slot, local))
            _reduce_scatter_single(out, padded, group=self.groups.attn_tp)
            return out
        start = self.tp_rank * chunk
        real = c.clipped(start, chunk)
        # with host counts an empty chunk may start past local's rows: read from row 0
        return take_into(local, start if c.dynamic or real else 0, real, out)

    def _gather_max_len(self, local, plan, partial, c, out) -> None:
        slot = plan.slot_rows[0]
        if self.tp_size == 1 and not c.dynamic and c.count() == slot == local.shape[0]:
            chunk = local  # already its own zero-padded slot: no place pass, no launch
        else:
            chunk = self._slot_chunk(local, slot, partial, c)
        _all_gather_single(out, chunk, group=self.groups.world)

    def _gather_sum_len(self, local, plan, partial, c, out) -> None:
        writer = partial or self.tp_rank == 0
        # non-writers place nothing: the kernel then only zero-fills their buffer
        place_into(local, c.offset(), c.count() if writer else 0, out)
        dist.all_reduce(out, group=self.groups.world)

    def _chunks(self, plan: DpPlan) -> list[tuple[int, int]]:
        """``(first row, rows)`` in the global buffer of every rank's GATHERV chunk."""
        tp = self.tp_size
        return [(plan.offsets[r // tp] + (r % tp) * (plan.slot_rows[r // tp] // tp),
                 plan.slot_rows[r // tp] // tp) for r in range(self.layout.world_size)]

    def _gather_v(self, local, plan, partial, c, out) -> None:
        chunks = self._chunks(plan)
        first, rows = chunks[self.rank]
        self._slot_chunk(local, plan.slot_rows[self.dp_rank], partial, c,
                         out=out[first:first + rows])
        if len({r for _, r in chunks}) == 1:
            mine = self._scratch("chunk", rows, out)
            mine.copy_(out[first:first + rows])
            _all_gather_single(out, mine, group=self.groups.world)
            return
        with self._grouped(out.device):
            for root, (f, r) in enumerate(chunks):
                if r:
                    dist.broadcast(out[f:f + r], src=self._global(root),
                                   group=self.groups.world)

    # ------------------------------------------------------------------ scatter
    def scatter(self, global_: torch.Tensor, plan: DpPlan, *,
                counts: torch.Tensor | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:
        """``global_ [global_rows, H...] -> [plan.slot_rows[d], H...]``: this replica's real
        rows of an already reduced buffer, then zeros. No collective."""
        self._check_plan(plan)
        self._check_tensor("global_", global_, rows=plan.global_rows)
        rows = plan.slot_rows[self.dp_rank]
        self._check_out(out, global_, rows)
        c = self._counts(plan, counts, global_)
        if out is None:
            out = global_.new_empty((rows, *global_.shape[1:]))
        return take_into(global_, c.offset(), c.count(), out)

    # ------------------------------------------------------------------ reduce_scatter
    def reduce_scatter(self, global_: torch.Tensor, plan: DpPlan, *,
                       counts: torch.Tensor | None = None, out: torch.Tensor | None = None,
                       async_op: bool = False, key: object = 0):
        """``global_ [global_rows, H...] -> [plan.slot_rows[d], H...]`` on every rank of
        replica d: row ``j < n_d`` is the sum over all ranks of ``global_[offsets[d] + j]``;
        other rows are 0. The adjoint of ``gather(partial=True)``. ``global_`` is not
        modified. ``async_op``/``key`` as in :meth:`gather` (pool key ``("reduce_scatter",
        key)``)."""
        def checks() -> _Counts:
            self._check_plan(plan)
            self._check_tensor("global_", global_, rows=plan.global_rows)
            self._check_out(out, global_, plan.slot_rows[self.dp_rank])
            if async_op and out is not None:
                raise DpxValueError("async_op=True returns a pooled output; do not pass out=")
            return self._counts(plan, counts, global_)

        c = self._checked("reduce_scatter", plan, global_, True, checks)
        rows = plan.slot_rows[self.dp_rank]
        if async_op:
            return self._launch_async("reduce_scatter", key, global_, rows,
                                      lambda o: self._reduce_scatter(global_, plan, c, o))
        if torch.is_grad_enabled() and global_.requires_grad:
            if out is not None:
                raise DpxValueError("out= cannot be used when global_ requires grad")
            return _ReduceScatter.apply(global_, self, plan, c)
        return self._reduce_scatter(global_, plan, c, out)

    def _reduce_scatter(self, global_, plan, c, out=None) -> torch.Tensor:
        rows = plan.slot_rows[self.dp_rank]
        if out is None:
            out = global_.new_empty((rows, *global_.shape[1:]))
        if plan.mode is PaddingMode.MAX_LEN:
            self._reduce_scatter_max_len(global_, plan, c, out)
        elif plan.mode is PaddingMode.SUM_LEN:
            reduced = self._scratch("staged", global_.shape[0], global_)
            reduced.copy_(global_)
            dist.all_reduce(reduced, group=self.groups.world)
            take_into(reduced, c.offset(), c.count(), out)
        else:
            self._reduce_scatter_v(global_, plan, c, out)
        return out

    def _reduce_scatter_max_len(self, global_, plan, c, out) -> None:
        chunk = plan.slot_rows[0] // self.tp_size
        if self.tp_size == 1:
            _reduce_scatter_single(out, global_, group=self.groups.world)
        else:
            part = self._scratch("chunk", chunk, global_)
            _reduce_scatter_single(part, global_, group=self.groups.world)
            _all_gather_single(out, part, group=self.groups.attn_tp)
        _zero_pad(out, c)

    def _reduce_scatter_v(self, global_, plan, c, out) -> None:
        chunks = self._chunks(plan)
        staged = self._scratch("staged", global_.shape[0], global_)
        staged.copy_(global_)  # reduce works in place; the input stays untouched
        with self._grouped(global_.device):
            for root, (f, r) in enumerate(chunks):
                if r:
                    dist.reduce(staged[f:f + r], dst=self._global(root),
                                group=self.groups.world)
        first, rows = chunks[self.rank]
        if self.tp_size == 1:
            take_into(staged, first, c.count(), out)
            return
        _all_gather_single(out, staged[first:first + rows], group=self.groups.attn_tp)
        _zero_pad(out, c)

    # ------------------------------------------------------------------ helpers
    def _global(self, rank: int) -> int:
        return self.groups.global_ranks[rank]

    def _grouped(self, device: torch.device):
        """Group per-root NCCL operations into one launch; a plain sequence elsewhere."""
        import contextlib

        if self.groups.backend == "nccl":
            from torch.distributed.distributed_c10d import _coalescing_manager

            return _coalescing_manager(self.groups.world, device)
        return contextlib.nullcontext()

    def destroy(self) -> None:
        """Destroy the subgroups this communicator created."""
        for g in {id(self.groups.attn_tp): self.groups.attn_tp,
                  id(self.groups.cpu): self.groups.cpu}.values():
            if g is not None and g is not self.groups.world:
                dist.destroy_process_group(g)


def _zero_pad(out: torch.Tensor, c: _Counts) -> None:
    """Zero the rows of this replica's slot ``out`` past its count (skipped, with no
    launch, when a host count fills the slot)."""
    if c.dynamic or c.count() < out.shape[0]:
        zero_rows_(out, 0, c.count())


class DpWork:
    """Handle of an async gather/reduce_scatter: ``wait()`` makes the current stream wait
    for the communication (a persistent event, re-recorded each step; no host sync)."""

    def __init__(self, event: torch.cuda.Event | None) -> None:
        self.event = event

    def wait(self) -> None:
        if self.event is not None:
            torch.cuda.current_stream().wait_event(self.event)


class _Gather(torch.autograd.Function):
    """gather with its adjoint: every attn-tp rank gets its replica's slot gradient
    (``reduce_scatter`` of the output gradient) -- the adjoint of the partial sum, and the
    gradient of the one replicated value for ``partial=False``."""

    @staticmethod
    def forward(ctx, local, comm, plan, partial, c):
        ctx.comm, ctx.plan, ctx.c, ctx.rows = comm, plan, c, local.shape[0]
        return comm._gather(local, plan, partial, c)

    @staticmethod
    def backward(ctx, grad):
        comm, c = ctx.comm, ctx.c
        slot = comm._reduce_scatter(grad.contiguous(), ctx.plan, c)
        g = slot.new_empty((ctx.rows, *slot.shape[1:]))
        return take_into(slot, 0, c.count(), g), None, None, None, None


class _ReduceScatter(torch.autograd.Function):
    """reduce_scatter with its adjoint, ``gather(partial=True)`` of the output gradient."""

    @staticmethod
    def forward(ctx, global_, comm, plan, c):
        ctx.comm, ctx.plan, ctx.c = comm, plan, c
        return comm._reduce_scatter(global_, plan, c)

    @staticmethod
    def backward(ctx, grad):
        return ctx.comm._gather(grad.contiguous(), ctx.plan, True, ctx.c), None, None, None


def counts_tensor(num_tokens: Sequence[int], device: torch.device | str) -> torch.Tensor:
    """An int32 device tensor of per-replica counts (to update in place between replays)."""
    return torch.tensor(list(num_tokens), dtype=torch.int32, device=device)
