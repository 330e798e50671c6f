"""dpx_torch.DpComm on gloo process groups, against the NumPy reference."""

from __future__ import annotations

import itertools
import random

import pytest

pytestmark = pytest.mark.multiproc

MODES = ["max_len", "sum_len", "gatherv"]
LAYOUTS = [(1, 1), (2, 2), (2, 1), (3, 3), (4, 4), (4, 2), (4, 1)]


def _count_sets(dp: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    sets = [[0] * dp, [rng.randint(1, 9) for _ in range(dp)],
            [0 if i % 2 else rng.randint(1, 12) for i in range(dp)],  # idle replicas
            [17] + [0] * (dp - 1),                                    # one holds everything
            [rng.randint(0, 6) for _ in range(dp)]]
    return sets


def _same_error_on_every_rank(res: list[dict], expect: dict[str, str]) -> None:
    """Each scenario ``key`` raised one message on every rank, and it holds ``text``."""
    for key, text in expect.items():
        msgs = {r[key] for r in res}
        assert len(msgs) == 1, f"{key}: ranks raised different errors: {msgs}"
        assert text in msgs.pop(), f"{key}: {res[0][key]}"


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: f"w{l[0]}dp{l[1]}")
def test_every_mode_partial_and_replicated(gloo_worlds, layout):
    world, dp = layout
    cases = [dict(counts=c, mode=m, partial=p, seed=i)
             for i, (c, m, p) in enumerate(itertools.product(_count_sets(dp, world * 10 + dp),
                                                             MODES, (True, False)))]
    done = gloo_worlds(world).run("torch_jobs:check_cases", layout, cases)
    assert done == [4 * len(cases)] * world


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "int32", "int64"])
def test_dtypes(gloo_worlds, dtype):
    cases = [dict(counts=c, mode=m, partial=p, dtype=dtype, seed=3)
             for c in ([3, 0], [5, 2]) for m in MODES for p in (True, False)]
    gloo_worlds(4).run("torch_jobs:check_cases", (4, 2), cases)


def test_policies_choose_and_run(gloo_worlds):
    cases = [dict(counts=c, policy=pol, is_extend=ext, partial=True, seed=5)
             for c in ([9, 0, 0, 0], [3, 3, 4, 2], [0, 1, 0, 30])
             for pol in ("sglang", "cost") for ext in (False, True)]
    gloo_worlds(4).run("torch_jobs:check_cases", (4, 4), cases)


def test_trailing_dims(gloo_worlds):
    cases = [dict(counts=[3, 1], mode=m, partial=p) for m in MODES for p in (True, False)]
    gloo_worlds(4).run("torch_jobs:check_cases", (4, 2), cases, rest=(2, 3))


@pytest.mark.parametrize("mode", MODES)
def test_capacity_plans_with_device_counts(gloo_worlds, mode):
    cap = 8 if mode == "max_len" else 24
    cases = [dict(counts=[1, 1], mode=mode, capacity=cap, run_counts=rc, partial=p, seed=i)
             for i, rc in enumerate(([3, 0], [8, 5], [0, 0], [7, 1]))
             for p in (True, False)]
    gloo_worlds(4).run("torch_jobs:check_cases", (4, 2), cases)


@pytest.mark.parametrize("layout", [(2, 2), (4, 2), (4, 1)], ids=lambda l: f"w{l[0]}dp{l[1]}")
def test_capacity_plans_with_host_counts(gloo_worlds, layout):
    """A capacity plan called without counts= uses its own counts on the host. Regression:
    a GATHERV capacity plan ([3, 5], capacity 24 on gloo world 2) used to fail with a
    different error on each rank (chunks sized from the capacity, not the counts)."""
    world, dp = layout
    counts = [[3, 5], [0, 7], [6, 6]] if dp == 2 else [[3], [0], [24]]
    cases = [dict(counts=c, mode=m, capacity=24, partial=p, seed=i)
             for i, (c, m, p) in enumerate(itertools.product(counts, MODES, (True, False)))]
    gloo_worlds(world).run("torch_jobs:check_cases", layout, cases)


@pytest.mark.parametrize("layout", [(4, 2), (4, 4), (3, 3)], ids=lambda l: f"w{l[0]}dp{l[1]}")
def test_gradients_are_the_adjoints(gloo_worlds, layout):
    cases = [dict(counts=c, mode=m, seed=i) for i, (c, m) in enumerate(itertools.product(
        _count_sets(layout[1], 7)[1:4], MODES))]
    gloo_worlds(layout[0]).run("torch_jobs:check_grads", layout, cases)


def test_async_equals_sync_and_pool_stays_flat(gloo_worlds):
    """Async calls equal sync ones; once the first pass of 31 steps ran, the pool holds what
    it held: the same counts again (each step's mode and key shifted, as 31 is odd and not a
    multiple of 3) add no buffer. A scratch purpose that only some count patterns use may
    first appear late in the first pass, so the first pass is not asserted flat."""
    rng = random.Random(11)
    steps = [[40, 40]] + [[rng.randint(0, 40), rng.randint(0, 40)] for _ in range(30)]
    res = gloo_worlds(4).run("torch_jobs:check_async_matches_sync", (4, 2), steps + steps)
    for r in res:
        again = r["buffers"][len(steps) - 1:]
        assert len(set(again)) == 1, f"pool keys grew on the second pass: {r['buffers']}"


def test_validate_makes_every_rank_raise_the_same_error(gloo_worlds):
    res = gloo_worlds(4).run("torch_jobs:check_validate")
    expect = {"plan": "ranks disagree on the plan's num_tokens: [3, 2] on ranks [0, 1, 2]; "
                      "[3, 3] on ranks [3]", "dtype": "ranks disagree on dtype",
              "rows": "rank 2 rejected its input (DpxValueError: local has 1 rows",
              "width": "ranks disagree on width: 7 on ranks [0]; 6 on ranks [1, 2, 3]",
              "partial": "ranks disagree on partial",
              "op": "ranks disagree on op: 'reduce_scatter' on ranks [0]; 'gather' on ranks [1, 2, 3]",
              "replicated": "replica 0's attn-tp ranks [0, 1] hold different rows",
              "columns": "ranks disagree on width: 2 on ranks [0, 1, 3]; 3 on ranks [2]",
              "columns_op": "ranks disagree on op: 'reduce_scatter' on ranks [0, 2, 3]; "
                            "'scatter_columns' on ranks [1]",
              "wire_scale": "ranks disagree on op: 'gather/nvfp4 scale=1.0' on ranks [0, 1, "
                            "2]; 'gather/nvfp4 scale=2.0' on ranks [3]",
              "wire": "ranks disagree on op: 'gather/mxfp4' on ranks [0]; 'gather/nvfp4 "
                      "scale=1.0' on ranks [1, 2, 3]",
              "grad_many": "ranks disagree on op: 'gather of 2 tensors' on ranks [0, 2, 3]; "
                           "'gather of 2 tensors (autograd: one by one)' on ranks [1]"}
    _same_error_on_every_rank(res, expect)
    assert all(r["ok"] for r in res)
    assert {r["same_scale"] for r in res} == {"no error"}, res   # 2 and 2.0: one scale


def test_sync_counts(gloo_worlds):
    res = gloo_worlds(4).run("torch_jobs:check_sync_counts")
    for r in res:
        assert r["counts"] == (7, 0) and r["is_extend"] is True
        assert "replica 0's attn-tp ranks report different counts: rank 0=5, rank 1=6" in r["mismatch"]
    assert len({r["mismatch"] for r in res}) == 1


def test_full_slots_skip_the_place_and_pad_launches(gloo_worlds):
    """MAX_LEN, attn_tp 1: the replica whose count fills the slot launches no row kernel;
    the other places its rows and zeroes its pad (results checked against the reference)."""
    res = gloo_worlds(2).run("torch_jobs:count_row_launches", [5, 3])
    assert [r["ok"] for r in res] == [True, True]
    assert [(r["move"], r["zero"]) for r in res] == [(0, 0), (1, 1)]


@pytest.mark.parametrize("layout", [(4, 2), (4, 4), (2, 1), (4, 2, 2)],
                         ids=lambda l: f"w{l[0]}dp{l[1]}" + (f"cp{l[2]}" if len(l) > 2 else ""))
def test_the_interpreter_runs_exactly_the_schedule(gloo_worlds, layout):
    """Every kernel launch, copy and torch.distributed call a DpComm call makes is one step
    of its schedule, in order (per-root steps: one call per non-empty chunk), so what
    `python -m dpx plan` prints and the cost model prices is what runs."""
    dp = layout[1]
    cases = [dict(counts=c, mode=m, extra=e) for c in ([3] + [0] * (dp - 1),
                                                       [4 + i for i in range(dp)], [4] * dp)
             for m in MODES for e in (0, 2)]
    cases += [dict(counts=[0] * dp, mode=m, capacity=16, run_counts=[1 + i for i in range(dp)])
              for m in MODES]
    if len(layout) > 2:  # CP shards: pack / unpack steps
        cases += [dict(counts=[5, 3], mode=m, shards=[(2, 3), (3, 0)]) for m in MODES]
    for rank_log in gloo_worlds(layout[0]).run("torch_jobs:record_primitives", layout, cases):
        for case, op, partial, want, ran in rank_log:
            assert want == ran, (case, op, partial, want, ran)


CP_LAYOUTS = [(4, 1, 2), (4, 2, 2), (3, 1, 3)]


def _cp_cases(layout, seed: int) -> list[dict]:
    """CP ranks holding the same rows and CP ranks holding shards (random, all on one CP
    rank, empty shards, idle replicas), every mode, partial and replicated, dtypes, and
    capacity plans with device counts / device shard tables."""
    _, dp, cp = layout
    rng = random.Random(seed)

    def split(n):
        cuts = sorted(rng.randint(0, n) for _ in range(cp - 1))
        return tuple(b - a for a, b in zip([0, *cuts], [*cuts, n]))

    counts = [[rng.randint(1, 9) for _ in range(dp)], [0] * (dp - 1) + [7],
              [11] + [0] * (dp - 1)]
    out = []
    for i, (c, m, p) in enumerate(itertools.product(counts, MODES, (True, False))):
        dtype = ("float32", "bfloat16", "int32", "int64")[i % 4]
        out.append(dict(counts=c, mode=m, partial=p, seed=i, dtype=dtype))
        shards = [split(n) if i % 3 else (0,) * (cp - 1) + (n,) for n in c]
        out.append(dict(counts=c, mode=m, partial=p, seed=i, dtype=dtype, shards=shards))
    for m in MODES:
        cap = 8 if m == "max_len" else 8 * dp
        per = min(8, cap // dp)
        run = [rng.randint(0, per) for _ in range(dp)]
        out.append(dict(counts=[0] * dp, mode=m, capacity=cap, run_counts=run, partial=True,
                        seed=40))
        out.append(dict(counts=run, mode=m, capacity=cap, shards=[split(n) for n in run],
                        run_counts=[list(split(n)) for n in run[::-1]], partial=False,
                        seed=41))
    return out


@pytest.mark.parametrize("layout", CP_LAYOUTS, ids=lambda l: f"w{l[0]}dp{l[1]}cp{l[2]}")
def test_context_parallel(gloo_worlds, layout):
    cases = _cp_cases(layout, sum(layout))
    done = gloo_worlds(layout[0]).run("torch_jobs:check_cases", layout, cases)
    assert done == [4 * len(cases)] * layout[0]


def test_validate_on_the_lm_head_variable_all_to_all(gloo_worlds):
    """The LM-head scatter's variable all-to-all keeps validate's promise: the same error on
    every rank, raised before the collective, and the world usable afterwards."""
    res = gloo_worlds(4).run("torch_jobs:check_validate_columns")
    expect = {"width": "ranks disagree on width: 2 on ranks [0, 2, 3]; 3 on ranks [1]",
              "plan": "ranks disagree on the plan's num_tokens: [3, 0, 2, 1] on ranks "
                      "[0, 1, 2]; [3, 1, 2, 1] on ranks [3]"}
    _same_error_on_every_rank(res, expect)
    assert all(r["route"] and r["ok"] for r in res)


def test_validate_with_context_parallel(gloo_worlds):
    res = gloo_worlds(4).run("torch_jobs:check_validate_cp")
    expect = {"copies": "replica 0's attn-tp and CP ranks [0, 1, 2, 3] hold different rows",
              "shards": "ranks disagree on the plan's cp_shards: [[2, 3]] on ranks [0, 1, 2]; "
                        "[[3, 2]] on ranks [3]",
              "device": "ranks disagree on device counts: (1, 4) on ranks [0]; (2, 3) on "
                        "ranks [1, 2, 3]"}
    _same_error_on_every_rank(res, expect)
    assert all(r["ok"] for r in res)
