"""The plans of the sglang drop-in's steps (:mod:`dpx_torch.sglang`): a forward's buffer
lengths, padding mode and counts (``set_dp_buffer_len``), the plan of a forward batch and
its device counts, the plan of a forward's combine -- each made once and kept (at most
``limit`` plans, least recently used first out).

Layer: public. Imports dpx, the shims, passes, transports, runner and call paths layers
and the modules before it in its own row (docs/semantics.md, "Where things live").
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

import dpx
from dpx.errors import DpxValueError
from dpx.geometry import capacity_of, equal_slots
from dpx.layout import DpLayout
from dpx.modes import PaddingMode
from dpx.plan import DpPlan
from dpx.lru import LRU

__all__ = ["StepPlans"]


class StepPlans:
    """One drop-in's plans. ``mode_of(padding)``: the dpx mode of a step in sglang's
    padding mode (None: the forward's recorded one); ``sync_shards``: the communicator's
    (:meth:`dpx_torch.DpComm.sync_shards`)."""

    def __init__(self, layout: DpLayout, sync_shards: Callable[..., Any],
                 mode_of: Callable[[Any], PaddingMode], limit: int) -> None:
        self.layout, self._sync_shards, self._mode_of = layout, sync_shards, mode_of
        self.global_len = 0
        self.local_len = 0
        self.max_padding = True
        self.global_num_tokens: list[int] | None = None
        self.global_num_tokens_gpu: torch.Tensor | None = None
        self._plans = LRU(limit)
        #: (batch, its host counts, its padding mode, (plan, counts), shards) of the last
        #: plan_of
        self._last: tuple | None = None
        self._rs_plan: DpPlan | None = None

    def new_forward(self, global_len: int, local_len: int, max_padding: bool,
                    counts: list[int] | None, counts_gpu: torch.Tensor | None) -> None:
        """A new forward's buffer lengths, padding and counts: its plans are made anew."""
        self.global_len, self.local_len = global_len, local_len
        self.max_padding = max_padding
        self.global_num_tokens, self.global_num_tokens_gpu = counts, counts_gpu
        self._rs_plan = None
        self._last = None

    def cached(self, key: tuple, make: Callable[[], DpPlan]) -> DpPlan:
        """The plan of ``key`` (kept, least recently used first out), made by ``make``."""
        plan = self._plans.hit(key)
        return plan if plan is not None else self._plans.put(key, make())

    def plan_of(self, forward_batch: Any, cp_shard_counts: Sequence[int] | None = None
                ) -> tuple[DpPlan, torch.Tensor | None]:
        """The plan of a forward batch and its device counts (None with host counts). The
        layers of one forward ask with the same batch: its answer is kept while the batch,
        its padding mode and its counts stay the same. ``cp_shard_counts`` (this replica's
        rows per CP rank, sglang's argument): the plan's CP shards, exchanged over the world
        on every call that passes them (with CP ranks) -- whether a rank joins that
        exchange must not depend on what only it knows, or a replica that changed its
        shards would wait in it while the others went on."""
        last = self._last
        shards = None if cp_shard_counts is None else list(cp_shard_counts)
        exchange = shards is not None and self.layout.cp_size > 1
        if last is not None and last[0] is forward_batch and last[4] == shards \
                and not exchange:
            host = getattr(forward_batch, "global_num_tokens_cpu", None)
            if host is not None and host == last[1] and \
                    getattr(forward_batch, "dp_padding_mode", None) is last[2]:
                return last[3]
        got = self._plan_of(forward_batch, cp_shard_counts)
        host = getattr(forward_batch, "global_num_tokens_cpu", None)
        self._last = (None if host is None else forward_batch,
                      None if host is None else list(host),
                      getattr(forward_batch, "dp_padding_mode", None), got, shards)
        return got

    def _plan_of(self, forward_batch: Any, cp_shard_counts: Sequence[int] | None
                 ) -> tuple[DpPlan, torch.Tensor | None]:
        mode = self._mode_of(getattr(forward_batch, "dp_padding_mode", None))
        host = getattr(forward_batch, "global_num_tokens_cpu", None)
        if host is not None:
            counts = tuple(int(x) for x in host)
            if cp_shard_counts is None or self.layout.cp_size == 1:
                return self.cached((mode, counts), lambda: dpx.plan_step(
                    list(counts), self.layout, mode=mode)), None
            table = self._sync_shards(cp_shard_counts, counts)
            return self.cached((mode, counts, table), lambda: dpx.plan_step(
                list(counts), self.layout, mode=mode, cp_shards=table)), None
        if cp_shard_counts is not None and self.layout.cp_size > 1:
            raise DpxValueError("cp_shard_counts needs the batch's host counts "
                                "(global_num_tokens_cpu): its shards are exchanged on the host")
        dev = getattr(forward_batch, "global_num_tokens_gpu", None)
        if not isinstance(dev, torch.Tensor):
            raise DpxValueError("the forward batch has neither global_num_tokens_cpu nor a "
                                "global_num_tokens_gpu tensor: no counts for this step")
        return self.device_plan(mode, dev)

    def device_plan(self, mode: PaddingMode, dev: torch.Tensor
                     ) -> tuple[DpPlan, torch.Tensor]:
        """The capacity plan of a step with device counts only, and the counts."""
        cap = capacity_of(mode, self.local_len, self.global_len)
        plan = self.cached((mode, "capacity", cap), lambda: dpx.plan_step(
            [0] * self.layout.dp_size, self.layout, mode=mode, capacity=cap))
        counts = dev if dev.dtype == torch.int32 and dev.is_contiguous() else \
            dev.to(torch.int32).contiguous()
        return plan, counts

    def combine_plan(self, rows: int) -> tuple[DpPlan, torch.Tensor | None]:
        """The plan of this forward's combine: the one its gather used (host or device
        counts alike; without its CP shards: the combine gives every CP rank the whole
        slot, as sglang's does) when it has ``rows`` global rows; else from
        :meth:`set_dp_buffer_len`'s device counts, or its host counts."""
        last = self._last
        if last is not None and last[3][0].global_rows == rows:
            plan, counts = last[3]
            if plan.sharded:
                key = (plan.mode, plan.num_tokens)
                plan = self.cached(key, lambda: dpx.plan_step(
                    list(key[1]), self.layout, mode=key[0]))
            return plan, counts
        if self.global_num_tokens is None and self.global_num_tokens_gpu is not None:
            return self.device_plan(self._mode_of(None), self.global_num_tokens_gpu)
        return self.scatter_plan(), None

    def scatter_plan(self) -> DpPlan:
        """The plan of this forward's combine (:meth:`set_dp_buffer_len`), made once per
        forward."""
        plan = self._rs_plan
        if plan is None:
            plan = self._rs_plan = self._make_scatter_plan()
        return plan

    def _make_scatter_plan(self) -> DpPlan:
        lay = self.layout
        counts = self.global_num_tokens
        if counts is None:   # equal slots of the buffer
            counts = [equal_slots(self.global_len, lay.dp_size)[0]] * lay.dp_size
        mode = self._mode_of(None)
        key = (mode, "rs", tuple(counts))
        return self.cached(key, lambda: dpx.plan_step(list(counts), lay, mode=mode))

