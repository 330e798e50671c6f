"""The device count exchange of a capacity plan's step (:meth:`DpComm.exchange_counts`): one
tiny all-gather of every rank's count on the world group, no host sync, capturable in a
CUDA graph; whose report each entry keeps is :func:`dpx.counts.sources`.

Layer: call paths. Imports dpx, the shims, passes, transports and runner layers and the
modules before it in its own row (docs/semantics.md, "Where things live").
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import torch

from dpx import counts as C
from dpx.errors import DpxCapacityError, DpxMismatchError, DpxValueError
from dpx.layout import DpLayout
from dpx.plan import DpPlan
from dpx_torch.checks import InputChecks
from dpx_torch.collectives import all_gather_single
from dpx_torch.flags import OverflowFlags
from dpx_torch.groups import DpGroups

__all__ = ["check_reports", "CountsExchange", "ExchangeRunner"]


class ExchangeRunner(Protocol):
    """What the exchange uses of its communicator's runner
    (:class:`dpx_torch.runner.Runner`): the peer transport (None: collectives; opened
    after the exchange is made, so read per call), the overflow flags and each device's
    passes."""

    peer: Any
    flags: OverflowFlags
    passes_for: Callable[[torch.device], Any]


def check_reports(label: str, layout: DpLayout, reports: torch.Tensor, picked: torch.Tensor,
                  *, shards: bool, plan: DpPlan | None) -> None:
    """Every rank's count report (``reports``, world order; read back: a host sync) and the
    counts picked from them, checked alike on every rank (every rank holds the same
    reports): a replica's (a CP rank's) ranks that disagree, a negative count, counts
    ``plan`` cannot hold."""
    got = tuple(int(x) for x in reports.tolist())
    bad = C.disagreements(layout, got, shards=shards)
    bad += [f"rank {r} reported {x} < 0" for r, x in enumerate(got) if x < 0]
    if bad:
        raise DpxMismatchError(f"{label}: " + "; ".join(bad))
    if plan is not None:
        problems = plan.count_rule.problems(tuple(int(x) for x in picked.tolist()))
        if problems:
            raise DpxCapacityError(f"{label}: " + "; ".join(problems))


class CountsExchange:
    """The count exchange of one communicator: its source index per (shards, device), a
    fixed handful."""

    def __init__(self, layout: DpLayout, rank: int, groups: DpGroups, runner: ExchangeRunner,
                 checks: InputChecks, checked: Callable[..., Any]) -> None:
        self.layout, self.rank, self.groups = layout, rank, groups
        #: ``checked(label, plan, tensor, partial, counts, make)``: the full path's checks
        #: (under ``validate=True`` inside its exchange: every rank raises alike)
        self.runner, self.checks, self.checked = runner, checks, checked
        self._sources: dict[tuple, torch.Tensor] = {}
        #: on the peer transport: the bound all-gather of one int32 a rank
        self._peer_gather = None

    def clear(self) -> None:
        self._sources.clear()
        self._peer_gather = None

    def _all_gather(self, out: torch.Tensor, n_local: torch.Tensor) -> None:
        """Every rank's count into ``out``: on the peer transport (counts on its
        workspace's device) a world step of its own (the step's barrier names a dead
        peer), else the world group's all-gather."""
        peer = self.runner.peer
        if peer is None or n_local.device != peer.device:
            all_gather_single(out, n_local, group=self.groups.world)
            return
        fn = self._peer_gather
        if fn is None:
            fn = peer.blocks(lambda x, o: x.view(1, 1), lambda x, o: o.view(-1, 1), 1, 1,
                             torch.int32, all_to_all=False)
            if not torch.compiler.is_compiling():   # (a traced call binds afresh)
                self._peer_gather = fn
        fn(n_local, out, None)

    def check(self, n_local: torch.Tensor, *, shards: bool, plan: DpPlan | None) -> None:
        """The input checks of :meth:`dpx_torch.DpComm.exchange_counts` (before its
        collective; under ``validate=True`` inside the communicator's exchange)."""
        c = self.checks
        c.n_local(n_local)
        if plan is not None:
            c.plan(plan)
            if plan.capacity is None:
                raise DpxValueError("exchange_counts(plan=...) checks the counts of a "
                                    "capacity plan; this plan has none")
            if shards != plan.sharded:
                raise DpxValueError(f"exchange_counts(shards={shards}) with a plan whose "
                                    f"cp_shards is {'set' if plan.sharded else 'None'}")

    def __call__(self, n_local: torch.Tensor, *, shards: bool, plan: DpPlan | None,
                 validate: bool) -> torch.Tensor:
        """See :meth:`dpx_torch.DpComm.exchange_counts` (its inputs checked first:
        :meth:`check`)."""
        self.checked(f"exchange_counts{'/shards' if shards else ''}", plan, n_local, None,
                     None, lambda: self.check(n_local, shards=shards, plan=plan))
        lay = self.layout
        allv = n_local.new_empty(lay.world_size)
        self._all_gather(allv, n_local)
        key = (shards, allv.device)
        idx = self._sources.get(key)
        if idx is None:
            idx = self._sources[key] = torch.tensor(
                C.sources(lay, self.rank, shards=shards), dtype=torch.long, device=allv.device)
        picked = allv[idx]
        if validate:
            check_reports("exchange_counts", lay, allv, picked, shards=shards, plan=plan)
        elif plan is not None:
            self.runner.flags.check(picked, plan.count_rule,
                                    self.runner.passes_for(picked.device))
        return picked.view(lay.dp_size, lay.cp_size) if shards else picked
