"""Cross-rank agreement: one small host exchange over the CPU group so that every rank
raises the same :class:`dpx.DpxMismatchError` instead of entering a collective that would
hang or corrupt (``DpComm(validate=True)``), and the host count exchange
(:meth:`Agreement.sync_counts`)."""

from __future__ import annotations

import hashlib
import math

import torch
import torch.distributed as dist

from dpx.errors import DpxMismatchError, DpxValueError
from dpx.layout import DpLayout
from dpx.plan import DpPlan
from dpx_torch.groups import DpGroups
from dpx_torch.interpreter import all_gather_single


class Agreement:
    """Exchanges what each rank is about to do and compares it."""

    def __init__(self, layout: DpLayout, groups: DpGroups) -> None:
        self.layout = layout
        self.groups = groups
        coords = layout.coords(groups.rank)
        self.dp_rank = coords.attn_dp_rank

    def check(self, op: str, plan: object, tensor: object, partial: object,
              err: Exception | None, counts: torch.Tensor | None = None) -> None:
        """All ranks exchange (plan fingerprint, op, dtype, width, partial, device counts,
        whether their input was rejected, and for a replicated gather a digest of the real
        rows), then every rank raises the same error if anything disagrees. Copies that
        must be identical: a replica's attn-tp ranks, and its CP ranks unless the plan
        shards the rows over them."""
        lay = self.layout
        fp = plan.fingerprint() if isinstance(plan, DpPlan) else f"not a plan: {plan!r}"
        ok_tensor = isinstance(tensor, torch.Tensor)
        width = math.prod(tensor.shape[1:]) if ok_tensor and tensor.dim() else None
        host_counts = (tuple(counts.detach().cpu().reshape(-1).tolist())
                       if isinstance(counts, torch.Tensor) else None)
        digest = None
        gather = op.split("/")[0].split("#")[0] == "gather"
        if err is None and gather and partial is False and lay.replica_size > 1:
            rows = tensor[:self._held(plan, host_counts)].detach().contiguous().cpu()
            digest = hashlib.sha1(rows.view(torch.uint8).numpy().tobytes()).hexdigest() \
                if rows.numel() else "empty"
        mine = dict(plan=fp, op=op, dtype=str(tensor.dtype) if ok_tensor else None,
                    width=width, partial=partial, counts=host_counts,
                    error=None if err is None else f"{type(err).__name__}: {err}",
                    digest=digest)
        everyone: list = [None] * lay.world_size
        dist.all_gather_object(everyone, mine, group=self._cpu("validate=True"))
        problems = [f"rank {r} rejected its input ({info['error']})"
                    for r, info in enumerate(everyone) if info["error"]]
        for field in ("plan", "op", "dtype", "width", "partial", "counts"):
            seen: dict = {}
            for r, info in enumerate(everyone):
                seen.setdefault(info[field], []).append(r)
            if len(seen) > 1:
                problems.append(f"ranks disagree on {field}: " + "; ".join(
                    f"{list(v) if isinstance(v, tuple) else repr(v)} on ranks {rs}"
                    for v, rs in seen.items()))
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
            raise DpxMismatchError("validate: " + " | ".join(problems)) from err

    def _cpu(self, what: str) -> dist.ProcessGroup:
        if self.groups.cpu is None:
            raise DpxValueError(f"{what} exchanges on the host: give DpComm a gloo "
                                f"cpu_group= over the world (the {self.groups.backend} "
                                f"world cannot carry CPU tensors)")
        return self.groups.cpu

    def _held(self, plan: DpPlan, counts: tuple[int, ...] | None) -> int:
        """Real rows of this rank's input (its replica's, or its shard)."""
        c = self.layout.coords(self.groups.rank)
        if plan.sharded:
            cp = self.layout.cp_size
            table = counts if counts is not None else [x for r in plan.cp_shards for x in r]
            return table[c.attn_dp_rank * cp + c.attn_cp_rank]
        table = counts if counts is not None else plan.num_tokens
        return table[c.attn_dp_rank]

    def sync_counts(self, num_tokens: int, *,
                    is_extend: bool = False) -> tuple[tuple[int, ...], bool]:
        """Exchange this rank's real token count (one small host all-gather over the CPU
        group). Returns ``(counts per replica, any rank is_extend)``; attn-tp ranks of one
        replica that report different counts make every rank raise
        :class:`dpx.DpxMismatchError` naming the replica."""
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
            bad = DpxValueError(f"num_tokens={num_tokens!r} must be an int >= 0")
            num_tokens = -1
        else:
            bad = None
        lay = self.layout
        mine = torch.tensor([num_tokens, int(bool(is_extend))], dtype=torch.int64)
        allv = torch.empty(lay.world_size * 2, dtype=torch.int64)
        all_gather_single(allv, mine, group=self._cpu("sync_counts"))
        rows = allv.view(-1, 2).tolist()
        problems = [f"rank {r} passed an invalid count" for r, (n, _) in enumerate(rows) if n < 0]
        counts = []
        for d in range(lay.dp_size):
            ranks = lay.replica_ranks(d)
            if len({rows[r][0] for r in ranks}) > 1:
                problems.append(f"replica {d}'s attn-tp ranks report different counts: " +
                                ", ".join(f"rank {r}={rows[r][0]}" for r in ranks))
            counts.append(rows[ranks[0]][0])
        if problems:
            raise DpxMismatchError("sync_counts: " + "; ".join(problems)) from bad
        return tuple(counts), any(e for _, e in rows)
