"""Cross-rank agreement: one small host exchange over the CPU group so that every rank
raises the same error instead of entering a collective that would hang or corrupt
(``DpComm(validate=True)``), and the host count exchange (:meth:`Agreement.sync_counts`).

Layer: call paths. Imports dpx, the shims, passes, transports and runner layers and the
modules before it in its own row (docs/semantics.md, "Where things live").

Every message names what differs -- the plans' counts or mode, the dtypes, which rank
rejected its input and why, the device counts a capacity plan cannot hold -- never an
opaque digest."""

from __future__ import annotations

import hashlib
import math
from typing import Any

import torch
import torch.distributed as dist

from dpx.errors import (DpxCapacityError, DpxError, DpxMismatchError, DpxValueError,
                        check_int, error_kind, mismatch_error)
from dpx.extents import held_rows
from dpx.layout import DpLayout
from dpx.plan import DpPlan
from dpx_torch.groups import DpGroups
from dpx_torch.collectives import all_gather_single

__all__ = ["Agreement"]

#: A host int an exchange carries as it is (int64, with room for the markers below): a
#: count sent is below it, and a cp_shard_counts entry below it in magnitude (so every
#: rank's message can name it).
_HOST_INT_LIMIT = 1 << 62
#: What a rank sends for ``cp_shard_counts`` that are not such ints.
_NOT_INTS = -_HOST_INT_LIMIT
#: The plan fields a mismatch message compares, in the order it names them.
_PLAN_FIELDS = ("mode", "num_tokens", "cp_shards", "capacity", "is_extend", "layout")


def _plan_summary(plan: object) -> dict[str, Any]:
    if not isinstance(plan, DpPlan):
        return {"plan": f"not a dpx.DpPlan: {type(plan).__name__}"}
    return {"mode": plan.mode.value, "num_tokens": list(plan.num_tokens),
            "cp_shards": None if plan.cp_shards is None else [list(s) for s in plan.cp_shards],
            "capacity": plan.capacity, "is_extend": plan.is_extend,
            "layout": plan.layout.describe()}


def _groups_by(values: list, name: str) -> str:
    seen: dict = {}
    for r, v in enumerate(values):
        seen.setdefault(repr(v), []).append(r)
    return f"{name}: " + "; ".join(f"{v} on ranks {rs}" for v, rs in seen.items())


class Agreement:
    """Exchanges what each rank is about to do and compares it."""

    def __init__(self, layout: DpLayout, groups: DpGroups) -> None:
        self.layout = layout
        self.groups = groups

    def check(self, op: str, plan: object, tensor: object, partial: object,
              err: Exception | None, counts: torch.Tensor | None = None) -> None:
        """All ranks exchange (the plan's counts and mode, op, dtype, width, partial,
        device counts, whether their input was rejected, and for a replicated gather a
        digest of the real rows), then every rank raises the same error if anything
        disagrees, or if the device counts do not fit the capacity plan. Copies that must
        be identical: a replica's attn-tp ranks, and its CP ranks unless the plan shards
        the rows over them."""
        lay = self.layout
        ok_tensor = isinstance(tensor, torch.Tensor)
        width = math.prod(tensor.shape[1:]) if ok_tensor and tensor.dim() else None
        host_counts = (tuple(int(x) for x in counts.detach().cpu().reshape(-1).tolist())
                       if isinstance(counts, torch.Tensor) else None)
        digest = None
        gather = op.split("/")[0].split("#")[0] == "gather"
        if err is None and gather and partial is False and lay.replica_size > 1:
            held = max(held_rows(plan, self.groups.rank, host_counts), 0)
            rows = tensor[:held].detach().contiguous().cpu()
            digest = hashlib.sha1(rows.view(torch.uint8).numpy().tobytes()).hexdigest() \
                if rows.numel() else "empty"
        mine = dict(plan=_plan_summary(plan), op=op,
                    dtype=str(tensor.dtype) if ok_tensor else None, width=width,
                    partial=partial, counts=host_counts,
                    error=None if err is None else f"{type(err).__name__}: {err}",
                    kind=error_kind(err), digest=digest)
        everyone: list = [None] * lay.world_size
        dist.all_gather_object(everyone, mine, group=self._cpu("validate=True"))
        problems = [f"rank {r} rejected its input ({info['error']})"
                    for r, info in enumerate(everyone) if info["error"]]
        plans = [info["plan"] for info in everyone]
        for name in _PLAN_FIELDS + ("plan",):
            values = [p.get(name) for p in plans]
            if len({repr(v) for v in values}) > 1:
                problems.append("ranks disagree on the plan's " + _groups_by(values, name))
        for name in ("op", "dtype", "width", "partial", "counts"):
            values = [info[name] for info in everyone]
            if len({repr(v) for v in values}) > 1:
                what = "device counts" if name == "counts" else name
                problems.append("ranks disagree on " + _groups_by(values, what))
        if gather and partial is False and not problems:
            copies = lay.attn_tp_groups() if plan.sharded else tuple(
                lay.replica_ranks(d) for d in range(lay.dp_size))
            for ranks in copies:
                if len({everyone[r]["digest"] for r in ranks}) > 1:
                    d = lay.coords(ranks[0]).attn_dp_rank
                    who = "attn-tp" if lay.cp_size == 1 or plan.sharded else "attn-tp and CP"
                    problems.append(f"replicated gather: replica {d}'s {who} ranks "
                                    f"{list(ranks)} hold different rows (use partial=True "
                                    f"for partial sums)")
        if problems:
            cls = mismatch_error([info["kind"] for info in everyone])
            raise cls("validate: " + " | ".join(problems)) from err
        if host_counts is not None and isinstance(plan, DpPlan):
            bad = plan.count_rule.problems(host_counts)
            if bad:
                raise DpxCapacityError(f"validate: device counts {list(host_counts)} do not "
                                       f"fit the plan: " + "; ".join(bad))

    def _cpu(self, what: str) -> dist.ProcessGroup:
        if self.groups.cpu is None:
            raise DpxValueError(f"{what} exchanges on the host: give DpComm a cpu_group= "
                                f"over the world that carries CPU tensors (a gloo group; "
                                f"the world {self.groups.describe()} does not)")
        return self.groups.cpu

    def sync_counts(self, num_tokens: int, *,
                    is_extend: bool = False) -> tuple[tuple[int, ...], bool]:
        """Exchange this rank's real token count (one small host all-gather over the CPU
        group). Returns ``(counts per replica, any rank is_extend)``. A count that is not
        an int >= 0 on any rank, or attn-tp ranks of one replica that report different
        counts, make every rank raise :class:`dpx.DpxMismatchError` naming the rank and
        the value."""
        ok = (not isinstance(num_tokens, bool) and isinstance(num_tokens, int)
              and 0 <= num_tokens < _HOST_INT_LIMIT)
        lay = self.layout
        group = self._cpu("sync_counts")
        mine = torch.tensor([num_tokens if ok else -1, int(bool(is_extend))],
                            dtype=torch.int64)
        allv = torch.empty(lay.world_size * 2, dtype=torch.int64)
        all_gather_single(allv, mine, group=group)
        rows = allv.view(-1, 2).tolist()
        problems = []
        if any(n < 0 for n, _ in rows):  # every rank sees it: one more exchange names them
            values: list = [None] * lay.world_size
            dist.all_gather_object(values, None if ok else repr(num_tokens), group=group)
            problems = [f"rank {r} passed num_tokens={v} (it must be an int >= 0)"
                        for r, v in enumerate(values) if v is not None]
        else:
            for d in range(lay.dp_size):
                ranks = lay.replica_ranks(d)
                if len({rows[r][0] for r in ranks}) > 1:
                    problems.append(f"replica {d}'s attn-tp ranks report different counts: "
                                    + ", ".join(f"rank {r}={rows[r][0]}" for r in ranks))
        if problems:
            raise DpxMismatchError("sync_counts: " + "; ".join(problems))
        counts = tuple(rows[lay.replica_ranks(d)[0]][0] for d in range(lay.dp_size))
        return counts, any(e for _, e in rows)

    def sync_shards(self, cp_shard_counts: object,
                    counts: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
        """Exchange this rank's ``cp_shard_counts`` (its replica's rows per CP rank, as
        sglang's ``dp_gather_partial`` takes them; one small host all-gather over the CPU
        group) into the plan's shard table. Every rank raises the same
        :class:`dpx.DpxMismatchError` when a rank's counts are not ``cp_size`` ints >= 0,
        when the ranks of a replica pass different counts, or when a replica's counts do
        not sum to its count in ``counts``."""
        lay = self.layout
        cp = lay.cp_size
        try:   # ints of any sign travel as they are (named below); others as _NOT_INTS
            mine = [check_int("cp_shard_counts[i]", x, minimum=_NOT_INTS + 1)
                    for x in cp_shard_counts]  # type: ignore[attr-defined]
            ok = len(mine) == cp and max(mine) < _HOST_INT_LIMIT
        except (TypeError, DpxError):
            ok = False
        row = torch.tensor(mine if ok else [_NOT_INTS] * cp, dtype=torch.int64)
        allv = torch.empty(lay.world_size * cp, dtype=torch.int64)
        all_gather_single(allv, row, group=self._cpu("cp_shard_counts"))
        rows = [tuple(r) for r in allv.view(-1, cp).tolist()]
        problems = [f"rank {r} passed cp_shard_counts "
                    + ("that are" if v[0] == _NOT_INTS else f"{list(v)}:") + f" not {cp} ints >= 0"
                    for r, v in enumerate(rows) if min(v) < 0]
        table = []
        for d in range(lay.dp_size):
            ranks = lay.replica_ranks(d)
            got = {rows[r] for r in ranks}
            if len(got) > 1:
                problems.append(f"replica {d}'s ranks pass different cp_shard_counts: "
                                + ", ".join(f"rank {r}={list(rows[r])}" for r in ranks))
            elif min(rows[ranks[0]]) >= 0 and sum(rows[ranks[0]]) != counts[d]:
                problems.append(f"replica {d}'s cp_shard_counts {list(rows[ranks[0]])} sum "
                                f"to {sum(rows[ranks[0]])}, not its count {counts[d]}")
            table.append(rows[ranks[0]])
        if problems:
            raise DpxMismatchError("cp_shard_counts: " + "; ".join(problems))
        return tuple(table)
