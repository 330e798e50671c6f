"""sglang's DP-attention state and data path as one object, :class:`DpAttention` (the
communicator, the buffer metadata, the per-forward buffer lengths, the extend flag, the
speculative ``disable_dp_size`` override, the attn-CP groups), with sglang's padding mode
enum and world arithmetic. :mod:`dpx_torch.sglang` installs one and exposes its methods as
sglang's module functions; its docstring gives the semantics (forward batches, per-step
plans, the differences from sglang's behaviour).

Layer: public. Imports dpx, the shims, passes, transports, runner and call paths layers
and the modules before it in its own row (docs/semantics.md, "Where things live").
"""

from __future__ import annotations

import contextlib
import enum
import functools
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.distributed as dist

import dpx
from dpx.errors import DpxTypeError, DpxValueError, check_int
from dpx.extents import held_rows
from dpx.geometry import equal_slots
from dpx.layout import DpLayout
from dpx.modes import Op, PaddingMode, Wire
from dpx.plan import DpPlan
from dpx.policy import fits_one_allreduce, sglang_mode, sglang_step_mode
from dpx.wire import check_wire, check_wire_scale
from dpx_torch.comm import DpComm
from dpx_torch.lifecycle import end_groups
from dpx_torch.padrows import real_rows
from dpx_torch.sglang_plans import StepPlans
from dpx_torch.collectives import all_gather_single, reduce_scatter_single

__all__ = ["compute_dp_attention_world_info", "current", "DpAttention", "DpPaddingMode",
           "Installed", "PLAN_CACHE"]


#: Plans kept per :class:`DpAttention` (least recently used out first).
PLAN_CACHE = 64


class DpPaddingMode(enum.IntEnum):
    """sglang's two padding modes (GATHERV is chosen by ``use_gatherv``, as in sglang)."""

    MAX_LEN = 1
    SUM_LEN = 2

    def is_max_len(self) -> bool:
        return self is DpPaddingMode.MAX_LEN

    def is_sum_len(self) -> bool:
        return self is DpPaddingMode.SUM_LEN

    @classmethod
    def get_dp_padding_mode(cls, is_extend_in_batch: bool,
                            global_num_tokens: Sequence[int]) -> "DpPaddingMode":
        """sglang's rule (:func:`dpx.policy.sglang_mode`) for the installed set-up's dp
        size (1 inside :func:`dpx_torch.sglang.disable_dp_size`) and ``max_len_with_idle``."""
        st = current()
        mode, _ = sglang_mode(tuple(int(x) for x in global_num_tokens),
                              st.get_attention_dp_size(), bool(is_extend_in_batch),
                              max_len_with_idle=st.max_len_with_idle,
                              allreduce_bytes=st.sum_len_allreduce_bytes,
                              row_bytes=st.row_bytes)
        return cls[mode.name]

    @classmethod
    def get_default_mode_in_cuda_graph(cls, global_num_tokens: Sequence[int] | None = None
                                       ) -> "DpPaddingMode":
        """MAX_LEN, or SUM_LEN when the installed set-up's decode rule
        (``sum_len_allreduce_bytes``) takes it for the captured ``global_num_tokens``."""
        st = Installed.state
        if global_num_tokens is not None and st is not None and fits_one_allreduce(
                [int(x) for x in global_num_tokens], st.get_attention_dp_size(),
                st.sum_len_allreduce_bytes, st.row_bytes):
            return cls.SUM_LEN
        return cls.MAX_LEN


def compute_dp_attention_world_info(enable_dp_attention: bool, tp_rank: int, tp_size: int,
                                    dp_size: int, attn_cp_size: int = 1
                                    ) -> tuple[int, int, int, int]:
    """``(attn_tp_rank, attn_tp_size, attn_dp_rank, attn_dp_size)`` of ``tp_rank``: the
    coordinates of :class:`dpx.DpLayout` ``(tp_size, dp_size, attn_cp_size)`` (one replica
    when DP attention is off)."""
    layout = DpLayout(tp_size, dp_size if enable_dp_attention else 1, attn_cp_size)
    c = layout.coords(tp_rank)
    return c.attn_tp_rank, layout.attn_tp_size, c.attn_dp_rank, layout.dp_size


class DpAttention:
    """The state of sglang's DP-attention module, for one :class:`DpComm`.

    ``hidden_size``, ``dtype``, ``device``: what the dp buffers hold. ``use_gatherv``:
    sglang's ``SGLANG_DP_USE_GATHERV`` (True: SUM_LEN steps run GATHERV where attn_tp is 1
    and there is no CP). ``max_len_with_idle``: sglang's hybrid-SSM flag for
    :meth:`DpPaddingMode.get_dp_padding_mode`. ``attn_cp_group``: this rank's attn-CP
    group (ranks sharing its replica and attn-tp rank); when None and the layout has CP,
    the constructor creates every attn-CP group (a collective call, like ``new_group``).
    ``sum_len_allreduce_bytes``: sglang's decode rule (None: off, as in the reference; a
    byte limit: a decode step with no idle replica whose summed buffer of ``hidden_size``
    x ``dtype`` rows fits one all-reduce of that many bytes takes SUM_LEN).
    ``combine_wire`` (None: off, sglang's numerics) and ``combine_wire_scale``: the combine
    -- :meth:`dp_reduce_scatter_tensor`, :meth:`dp_reduce_scatterv_async` -- runs as the
    quantized combine on that wire (``DpComm.reduce_scatter(..., wire=, wire_scale=)``).
    """

    def __init__(self, comm: DpComm, *, hidden_size: int, dtype: torch.dtype,
                 device: torch.device | str, use_gatherv: bool = False,
                 max_len_with_idle: bool = False,
                 attn_cp_group: dist.ProcessGroup | None = None,
                 sum_len_allreduce_bytes: int | None = None,
                 combine_wire: Wire | str | None = None,
                 combine_wire_scale: float | None = None) -> None:
        if not isinstance(comm, DpComm):
            raise DpxTypeError(f"comm={comm!r} must be a dpx_torch.DpComm")
        if type(hidden_size) is not int or hidden_size < 1:
            raise DpxValueError(f"hidden_size={hidden_size!r} must be an int >= 1")
        if not isinstance(dtype, torch.dtype):
            raise DpxTypeError(f"dtype={dtype!r} must be a torch.dtype")
        self.comm = comm
        self.layout: DpLayout = comm.layout
        self.coords = self.layout.coords(comm.rank)
        self.hidden_size = hidden_size
        self.dtype = dtype
        self.device = torch.device(device)
        self.use_gatherv = bool(use_gatherv)
        self.max_len_with_idle = bool(max_len_with_idle)
        self.sum_len_allreduce_bytes = (None if sum_len_allreduce_bytes is None else
                                        check_int("sum_len_allreduce_bytes",
                                                  sum_len_allreduce_bytes))
        self.row_bytes = hidden_size * dtype.itemsize
        self._combine = _combine_op(comm, combine_wire, combine_wire_scale, hidden_size,
                                    dtype)
        self.attn_cp_group, self._owned = self._cp_group(attn_cp_group)
        self._dp_size_override: int | None = None
        self._is_extend = False
        #: the forward's buffer lengths, padding and counts, and its plans
        self.plans = StepPlans(self.layout, comm.sync_shards, self._mode, PLAN_CACHE)
        self._life = comm._life   # whether the communicator validates (read per call)

    def _cp_group(self, given: dist.ProcessGroup | None
                  ) -> tuple[dist.ProcessGroup | None, tuple]:
        lay = self.layout
        if lay.cp_size == 1:
            return None, ()
        ranks = self.comm.groups.global_ranks
        mine = next(g for g in lay.attn_cp_groups() if self.comm.rank in g)
        if given is not None:
            got = tuple(dist.get_process_group_ranks(given))
            want = tuple(ranks[r] for r in mine)
            if got != want:
                raise DpxValueError(f"attn_cp_group holds global ranks {list(got)}; this "
                                    f"rank's attn-CP group is {list(want)}")
            return given, ()
        made = [dist.new_group([ranks[r] for r in g]) for g in lay.attn_cp_groups()]
        return made[lay.attn_cp_groups().index(mine)], tuple(made)

    def destroy(self) -> None:
        """Destroy the attn-CP groups this object created (collective)."""
        end_groups(self._owned, None, drain=True)
        self._owned = ()
        self.attn_cp_group = None

    # ------------------------------------------------------------ world info
    def is_dp_attention_enabled(self) -> bool:
        return True

    def get_attention_dp_rank(self) -> int:
        return self.coords.attn_dp_rank

    def get_attention_dp_size(self) -> int:
        o = self._dp_size_override
        return self.layout.dp_size if o is None else o

    def get_attention_tp_rank(self) -> int:
        return self.coords.attn_tp_rank

    def get_attention_tp_size(self) -> int:
        return self.layout.attn_tp_size

    def get_attention_cp_rank(self) -> int:
        return self.coords.attn_cp_rank

    def get_attention_cp_size(self) -> int:
        return self.layout.cp_size

    @contextlib.contextmanager
    def disable_dp_size(self) -> Iterator[None]:
        """Inside, :meth:`get_attention_dp_size` is 1 (sglang's speculative-decoding
        switch for draft workers); the data path is unchanged."""
        old, self._dp_size_override = self._dp_size_override, 1
        try:
            yield
        finally:
            self._dp_size_override = old

    # ------------------------------------------------------------ per-forward state
    def set_dp_buffer_len(self, global_dp_buffer_len: int, local_dp_buffer_len: int,
                          dp_max_padding: bool,
                          global_num_tokens: Sequence[int] | None = None,
                          global_num_tokens_gpu: torch.Tensor | None = None) -> None:
        """The buffer lengths, padding mode and counts of a new forward (its combine plans
        from the counts its gather used: the batch's, else these)."""
        for name, v in (("global_dp_buffer_len", global_dp_buffer_len),
                        ("local_dp_buffer_len", local_dp_buffer_len)):
            if type(v) is not int or v < 0:
                raise DpxValueError(f"{name}={v!r} must be an int >= 0")
        self.plans.new_forward(global_dp_buffer_len, local_dp_buffer_len, bool(dp_max_padding),
                               None if global_num_tokens is None
                               else [int(x) for x in global_num_tokens], global_num_tokens_gpu)

    def set_local_dp_buffer_len(self, local_dp_buffer_len: int) -> None:
        self.plans.local_len = check_int("local_dp_buffer_len", local_dp_buffer_len)

    def get_dp_global_num_tokens_gpu(self) -> torch.Tensor | None:
        return self.plans.global_num_tokens_gpu

    def get_global_dp_buffer(self, group: Any = None) -> torch.Tensor:
        """A new ``[global_dp_buffer_len, hidden_size]`` buffer (``group`` is accepted for
        sglang's signature; dpx has no symmetric-memory allocator)."""
        return torch.empty(self.plans.global_len, self.hidden_size, dtype=self.dtype,
                           device=self.device)

    def get_local_dp_buffer(self, group: Any = None) -> torch.Tensor:
        return torch.empty(self.plans.local_len, self.hidden_size, dtype=self.dtype,
                           device=self.device)

    def get_global_dp_buffer_len(self) -> int:
        return self.plans.global_len

    def get_local_dp_buffer_len(self) -> int:
        return self.plans.local_len

    def get_dp_global_num_tokens(self) -> list[int] | None:
        return self.plans.global_num_tokens

    def get_dp_hidden_size(self) -> int:
        return self.hidden_size

    def get_dp_dtype(self) -> torch.dtype:
        return self.dtype

    def get_dp_device(self) -> torch.device:
        return self.device

    def is_dp_max_padding(self) -> bool:
        return self.plans.max_padding

    def is_allocation_symmetric(self) -> bool:
        return self.plans.max_padding

    def set_is_extend_in_batch(self, is_extend_in_batch: bool) -> None:
        self._is_extend = bool(is_extend_in_batch)

    def get_is_extend_in_batch(self) -> bool:
        return self._is_extend

    def is_dp_gatherv_active(self) -> bool:
        """sglang's condition: ``use_gatherv``, attn_tp 1, no CP, a SUM_LEN step, and the
        world as large as :meth:`get_attention_dp_size` (so not inside
        :meth:`disable_dp_size` on a world of several ranks)."""
        return self._mode(None) is PaddingMode.GATHERV \
            and self.get_attention_dp_size() == self.layout.world_size

    # ------------------------------------------------------------ plans
    def _mode(self, padding: DpPaddingMode | None) -> PaddingMode:
        """The dpx mode of a step in sglang's ``padding`` mode (None: the recorded one;
        :func:`dpx.policy.sglang_step_mode`)."""
        return sglang_step_mode(None if padding is None else DpPaddingMode(padding).name,
                                self.layout, max_padding=self.plans.max_padding,
                                use_gatherv=self.use_gatherv)

    def plan_of(self, forward_batch: Any, cp_shard_counts: Sequence[int] | None = None
                ) -> tuple[DpPlan, torch.Tensor | None]:
        """The plan of a forward batch and its device counts (:meth:`StepPlans.plan_of`)."""
        return self.plans.plan_of(forward_batch, cp_shard_counts)

    # ------------------------------------------------------------ data path
    def get_dp_local_info(self, forward_batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``(start, num_tokens)`` of this replica's rows in the global buffer as device
        tensors (the plan's real-row range, :func:`dpx_torch.padrows.real_rows`), cached on
        the batch as sglang does (``dp_local_start_pos``, ``dp_local_num_tokens``)."""
        if getattr(forward_batch, "dp_local_start_pos", None) is None:
            plan, counts = self.plan_of(forward_batch)
            firsts, lens = real_rows(plan, counts=counts,
                                     device=self._counts_device(forward_batch),
                                     tables=self.comm.runner.tables)
            d = self.coords.attn_dp_rank
            forward_batch.dp_local_start_pos = firsts[d]
            forward_batch.dp_local_num_tokens = lens[d]
        return forward_batch.dp_local_start_pos, forward_batch.dp_local_num_tokens

    def _counts_device(self, forward_batch: Any) -> torch.device:
        dev = getattr(forward_batch, "global_num_tokens_gpu", None)
        return dev.device if isinstance(dev, torch.Tensor) else self.device

    def get_dp_local_slice_cpu(self, forward_batch: Any, can_run_graph: bool,
                               cuda_graph_batch: int | None) -> tuple[int, int]:
        """``(start, num_tokens)`` as host ints: ``dp_rank * cuda_graph_batch`` when the
        step runs a graph, else the plan's slot offset; the count from
        ``global_num_tokens_cpu``."""
        host = forward_batch.global_num_tokens_cpu
        d = self.coords.attn_dp_rank
        if can_run_graph:   # the graph's equal slots of cuda_graph_batch rows
            slot = int(cuda_graph_batch)
            return equal_slots(slot * self.layout.dp_size, self.layout.dp_size)[1][d], \
                int(host[d])
        plan, _ = self.plan_of(forward_batch)
        return plan.offsets[d], int(host[d])

    def _gather(self, global_tokens: torch.Tensor, local_tokens: torch.Tensor,
                forward_batch: Any, partial: bool,
                cp_shard_counts: Sequence[int] | None = None) -> None:
        plan, counts = self.plan_of(forward_batch, cp_shard_counts)
        if self._life.validate:
            self._checked("dp_gather", plan, self._check_rows, "global_tokens", global_tokens,
                          plan.global_rows)
        else:
            self._check_rows("global_tokens", global_tokens, plan.global_rows)
        self.comm.gather(local_tokens, plan, partial=partial, counts=counts, out=global_tokens)

    def dp_gather_partial(self, global_tokens: torch.Tensor, local_tokens: torch.Tensor,
                          forward_batch: Any,
                          cp_shard_counts: Sequence[int] | None = None) -> None:
        """``global_tokens[...] =`` :meth:`DpComm.gather` ``(local_tokens, plan,
        partial=True)``: slot d holds the sum over replica d's attn-tp ranks of their
        rows, every other row 0. ``cp_shard_counts``: this replica's rows per CP rank when
        its CP ranks hold shards (each places its own, back to back from the slot's
        start); None: every CP rank holds all of them."""
        self._gather(global_tokens, local_tokens, forward_batch, True, cp_shard_counts)

    def dp_gather_replicate(self, global_tokens: torch.Tensor, local_tokens: torch.Tensor,
                            forward_batch: Any,
                            cp_shard_counts: Sequence[int] | None = None) -> None:
        """As :meth:`dp_gather_partial` with ``partial=False``: the replica's attn-tp ranks
        hold the same rows (``local_tokens`` is not modified, unlike sglang's)."""
        self._gather(global_tokens, local_tokens, forward_batch, False, cp_shard_counts)

    def dp_scatter(self, local_tokens: torch.Tensor, global_tokens: torch.Tensor,
                   forward_batch: Any, cp_shard_counts: Sequence[int] | None = None) -> None:
        """``local_tokens[:n] =`` this replica's rows of ``global_tokens`` (with
        ``cp_shard_counts``: this rank's CP shard's); its other rows are zeroed
        (``local_tokens`` may be longer, padded for a CUDA graph)."""
        plan, counts = self.plan_of(forward_batch, cp_shard_counts)
        if self._life.validate:   # (without, _into raises these on this rank)
            self._checked("dp_scatter", plan, self._check_out, local_tokens, plan, counts)
        self._into(local_tokens, plan, counts, self.comm.scatter, global_tokens)

    def dp_reduce_scatter_tensor(self, output: torch.Tensor, input: torch.Tensor) -> None:
        """``output[...] =`` :meth:`DpComm.reduce_scatter` ``(input, plan)``, with the plan
        and counts this forward's gather used (:meth:`_combine_plan`): pad rows come out
        zero, as from ``all_reduce`` + :meth:`dp_scatter` (``input`` is not modified,
        unlike sglang's with attn_tp > 1)."""
        plan, counts = self.plans.combine_plan(input.shape[0] if isinstance(input, torch.Tensor)
                                               else -1)
        if self._life.validate:
            self._checked("dp_reduce_scatter_tensor", plan, self._check_combine, input,
                          output, plan, counts)
        else:   # (the output's rows: _into raises those on this rank)
            self._check_rows("input", input, plan.global_rows)
        self._into(output, plan, counts, self._combine, input)

    def dp_gather_partial_async(self, global_tokens: torch.Tensor, local_tokens: torch.Tensor,
                                forward_batch: Any, event_key: Any = ("gather", 0)
                                ) -> torch.cuda.Event | None:
        """:meth:`dp_gather_partial` on the communicator's comm stream. Returns its
        persistent event for ``event_key`` (``torch.cuda.current_stream().wait_event(ev)``
        before reading ``global_tokens``); None on CPU, where the call has completed."""
        plan, counts = self.plan_of(forward_batch)
        self._checked("dp_gather_partial_async", plan, self._check_rows, "global_tokens",
                      global_tokens, plan.global_rows)
        _, work = self.comm.gather_async(local_tokens, plan, partial=True, counts=counts,
                                         out=global_tokens, key=event_key)
        return work.event

    def dp_reduce_scatterv_async(self, output_local: torch.Tensor,
                                 global_tokens: torch.Tensor, sizes: Sequence[int],
                                 event_key: Any = ("combine", 0)) -> torch.cuda.Event | None:
        """The reduce-scatter of a GATHERV step with per-replica ``sizes`` (the rows of
        each replica's slot) on the comm stream, into ``output_local`` (``sizes[d]``
        rows). Returns the persistent event for ``event_key`` (None on CPU)."""
        plan = self.plans.cached((PaddingMode.GATHERV, "rs", tuple(int(x) for x in sizes)),
                                 lambda: dpx.plan_step([int(x) for x in sizes], self.layout,
                                                       mode=PaddingMode.GATHERV))
        _, work = self.comm.reduce_scatter_async(global_tokens, plan, out=output_local,
                                                 key=event_key, **self._combine.keywords)
        return work.event

    def get_tbo_persistent_buffer(self, key: Any, rows: int, hidden: int,
                                  dtype: torch.dtype, device: Any) -> torch.Tensor:
        """A ``[rows, hidden]`` view of a grow-only buffer kept for ``key`` in the
        communicator's pool (scratch: overwritten by the next user of ``key``)."""
        return self.comm.runner.pool.get(("tbo", key), (rows, hidden), dtype,
                                         torch.device(device))

    # ------------------------------------------------------------ attn-tp / attn-cp
    def attn_tp_reduce_scatter_tensor(self, output: torch.Tensor, input: torch.Tensor):
        return _reduce_scatter(self.comm.groups.attn_tp, output, input)

    def attn_cp_reduce_scatter_tensor(self, output: torch.Tensor, input: torch.Tensor):
        return _reduce_scatter(self.attn_cp_group, output, input)

    def attn_tp_all_reduce(self, input: torch.Tensor) -> torch.Tensor:
        """The sum over this rank's attn-tp group, as a new tensor (``input`` unchanged)."""
        out = input.clone()
        if self.comm.groups.attn_tp is not None:
            dist.all_reduce(out, group=self.comm.groups.attn_tp)
        return out

    def attn_tp_all_gather_into_tensor(self, output: torch.Tensor, input: torch.Tensor):
        return _all_gather(self.comm.groups.attn_tp, output, input)

    def attn_cp_all_gather_into_tensor(self, output: torch.Tensor, input: torch.Tensor):
        return _all_gather(self.attn_cp_group, output, input)

    # ------------------------------------------------------------ helpers
    @staticmethod
    def _check_rows(name: str, t: torch.Tensor, rows: int) -> None:
        if not isinstance(t, torch.Tensor) or t.dim() < 1 or t.shape[0] != rows:
            raise DpxValueError(f"{name} has shape {tuple(getattr(t, 'shape', ()))}; this "
                                f"step's plan needs {rows} rows (set_dp_buffer_len and the "
                                f"forward batch's counts must describe the same step)")

    def _checked(self, label: str, plan: DpPlan, check: Callable[..., None],
                 *args: Any) -> None:
        """``check(*args)``, the drop-in's own checks of a call's buffers: under
        ``validate=True`` inside the communicator's exchange (every rank raises the same
        error, as for its calls; the hot calls test ``validate`` themselves and call their
        check directly without it)."""
        if self._life.validate and self.comm.full is not None:
            self.comm.full.checked(f"sglang.{label}", plan, None, None, None,
                                   lambda: check(*args))
        else:
            check(*args)

    def _check_combine(self, input: torch.Tensor, output: torch.Tensor, plan: DpPlan,
                       counts: torch.Tensor | None) -> None:
        self._check_rows("input", input, plan.global_rows)
        self._check_out(output, plan, counts)

    def _check_out(self, dst: torch.Tensor, plan: DpPlan, counts: torch.Tensor | None) -> None:
        """An output of this rank's rows (:meth:`_into`): any tensor of at least the rows it
        receives (its real rows -- its CP shard's with ``cp_shard_counts`` -- or its slot
        with device counts)."""
        if not isinstance(dst, torch.Tensor) or dst.dim() < 1:
            raise DpxTypeError(f"the output must be a tensor, got {type(dst).__name__}")
        d = self.coords.attn_dp_rank
        need = plan.slot_rows[d] if counts is not None else held_rows(plan, self.comm.rank)
        if dst.shape[0] < need:
            raise DpxValueError(f"the output has {dst.shape[0]} rows; rank {self.comm.rank} "
                                f"(replica {d}) has {need} rows to receive")

    def _into(self, dst: torch.Tensor, plan: DpPlan, counts: torch.Tensor | None,
              op, src: torch.Tensor) -> None:
        """``op(src, plan, counts=counts, out=...)`` writes this replica's
        ``plan.slot_rows[d]``-row result; ``dst`` gets it, longer ``dst`` its tail zeroed,
        shorter ``dst`` (at least the rows it receives: :meth:`_check_out`) the head."""
        rows = plan.slot_rows[self.coords.attn_dp_rank]
        if type(dst) is torch.Tensor and dst.shape[0] == rows:
            op(src, plan, counts=counts, out=dst)
            return
        self._check_out(dst, plan, counts)
        n = dst.shape[0]
        if n > rows:
            op(src, plan, counts=counts, out=dst[:rows])
            dst[rows:].zero_()
        else:
            dst.copy_(op(src, plan, counts=counts)[:n])


def _combine_op(comm: DpComm, wire: Wire | str | None, scale: float | None,
                hidden_size: int, dtype: torch.dtype) -> functools.partial:
    """The combine's call: ``comm.reduce_scatter`` with the wire's keywords (none when
    off), its rules checked now (a hidden size or dtype the wire cannot take, a scale)."""
    w = Wire.parse("native" if wire is None else wire)
    g = check_wire_scale(w, scale)
    if w is Wire.NATIVE:
        return functools.partial(comm.reduce_scatter)
    check_wire(w, PaddingMode.MAX_LEN, (1, hidden_size), str(dtype).replace("torch.", ""),
               "the combine's rows", Op.REDUCE_SCATTER)
    return functools.partial(comm.reduce_scatter, wire=w, wire_scale=g)


def _reduce_scatter(group, output: torch.Tensor, input: torch.Tensor) -> None:
    if group is None:
        output.copy_(input)
    else:
        reduce_scatter_single(output, input, group=group)


def _all_gather(group, output: torch.Tensor, input: torch.Tensor) -> None:
    if group is None:
        output.copy_(input)
    else:
        all_gather_single(output, input, group=group)


class Installed:
    """The one slot holding the installed :class:`DpAttention` (:func:`dpx_torch.sglang.setup`
    fills it; the module functions and :class:`DpPaddingMode` read it)."""

    state: DpAttention | None = None


def current() -> DpAttention:
    """The installed :class:`DpAttention` (a dpx error before
    :func:`dpx_torch.sglang.setup`)."""
    state = Installed.state
    if state is None:
        raise DpxValueError("dpx_torch.sglang is not set up: call dpx_torch.sglang.setup("
                            "comm, hidden_size=..., dtype=..., device=...) first")
    return state
