"""One digest of everything the planner decides, over a fixed sweep of the fuzz space.

    python tests/schedule_digest.py [--quick]

Run it before and after a change to the planner that should not change what any rank does:
the two digests are equal exactly when every plan, reason, row extent, real-row range,
rank's own rows, schedule (its steps as they print, scratch buffers, notes, route, wire and
wide buffers, collective signature) and every error message of the sweep are equal. The
sweep: layouts of worlds 1-8 with every dp and cp that divides them, six count vectors
each (idle replicas, CP shard tables), every mode, with and without a capacity (host and
device counts), and every op x transport x rank (and the symbolic rank) x partial x wire
(native, fp8, nvfp4; kept or dequantized) x in-place x known input rows. Not a test: it
takes about 10 minutes on the 2-core CPU machine (``--quick``: worlds up to 4, about 2
minutes).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import random
from typing import Any, Iterator

import dpx
from dpx import DpLayout, Op, ScheduleCache, Transport, Wire, build_schedule, plan_step
from dpx.expr import render
from dpx.extents import local_rows, op_rows, real_ranges


def _text(s: dpx.Schedule) -> tuple:
    return (tuple(map(str, s.steps)), tuple((k, render(v)) for k, v in s.scratch), s.notes,
            s.route.value, sorted(s.wire_bufs), sorted(s.wide_bufs), s.in_rows, s.out_rows,
            s.collective_signature())


def _layouts(max_world: int) -> list[DpLayout]:
    return [DpLayout(w, dp, cp) for w in (1, 2, 3, 4, 6, 8) if w <= max_world
            for dp in range(1, w + 1) if w % dp == 0
            for cp in (1, 2, 3) if (w // dp) % cp == 0]


def _shards(rng: random.Random, counts: list[int], cp: int) -> list[list[int]]:
    out = []
    for c in counts:
        cuts = sorted(rng.randint(0, c) for _ in range(cp - 1))
        out.append([b - a for a, b in zip([0, *cuts], [*cuts, c])])
    return out


def digest(max_world: int) -> tuple[int, str]:
    """``(records, sha256)`` of the sweep up to worlds of ``max_world`` ranks."""
    rng = random.Random(1234)
    cache = ScheduleCache(max_templates=100000, max_variants=64)
    h, n = hashlib.sha256(), 0

    def rec(*parts: Any) -> None:
        nonlocal n
        n += 1
        h.update(repr(parts).encode())

    for lay in _layouts(max_world):
        for _ in range(6):
            dp, cp, m = lay.dp_size, lay.cp_size, lay.replica_size
            counts = [rng.choice([0, 0, 1, 2, 3, 5, 7, 8, 12]) for _ in range(dp)]
            shards = _shards(rng, counts, cp) if cp > 1 and rng.random() < 0.5 else None
            for mode in ("max_len", "sum_len", "gatherv"):
                for with_cap in (False, True):
                    try:
                        cap = None
                        if with_cap:
                            cap = (max(counts) if mode == "max_len" else
                                   sum(-(-c // m) * m for c in counts)) + rng.randint(0, 6)
                        plan = plan_step(counts, lay, mode=mode, capacity=cap and max(cap, 1),
                                         cp_shards=shards)
                    except dpx.DpxError as e:
                        rec("plan error", str(e))
                        continue
                    rec("plan", plan.key(), plan.reason)
                    for dc in (False, True) if plan.is_static else (False,):
                        _plan_records(plan, dc, rng, cache, rec)
    return n, h.hexdigest()


def _plan_records(plan: dpx.DpPlan, dc: bool, rng: random.Random, cache: ScheduleCache,
                  rec: Any) -> None:
    lay = plan.layout
    rec("real", str(real_ranges(plan, device_counts=dc)))
    for r in range(lay.world_size):
        rec("rows", *(op_rows(plan, op, r, device_counts=dc) for op in Op))
        try:
            rec("local", local_rows(plan, r, device_counts=dc))
        except dpx.DpxError as e:
            rec("local error", str(e))
    for op, rank, kw in _requests(lay.world_size):
        for known in (False, True):
            need = op_rows(plan, op, rank, device_counts=dc).need
            in_rows = need + rng.choice([0, 0, 1]) if known else None
            try:
                s = build_schedule(plan, op, rank=rank, device_counts=dc, in_rows=in_rows,
                                   cache=cache, **kw)
                rec("schedule", _text(s))
            except dpx.DpxError as e:
                rec("schedule error", str(e))


def _requests(world: int) -> Iterator[tuple[Op, int | None, dict]]:
    """Every op x transport x rank (and the symbolic one) x partial x wire x dequantize x
    in-place a schedule can be asked for, in a fixed order."""
    for op in Op:
        gather = op is Op.GATHER
        for transport, rank, partial, wire in itertools.product(
                Transport, (None, *range(world)), (True, False) if gather else (True,),
                (Wire.NATIVE, Wire.FP8, Wire.NVFP4) if gather else (Wire.NATIVE,)):
            native = wire is Wire.NATIVE
            for deq, in_place in itertools.product(
                    (True,) if native else (True, False),
                    (False, True) if gather and native and rank is not None else (False,)):
                yield op, rank, dict(partial=partial, transport=transport, wire=wire,
                                     dequantize=deq, in_place=in_place)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="worlds up to 4")
    n, hexdigest = digest(4 if ap.parse_args().quick else 8)
    print(f"{n} records, sha256 {hexdigest}")


if __name__ == "__main__":
    main()
