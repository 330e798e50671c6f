"""The planner's small pieces, each against a plain reference: every op of the expression
engine (its constructor, the host evaluator, the generated host code, the rendering, and
each frontend's device evaluator), the count rule's host and device forms, plans that
pickle under every policy, and schedules built without a cache and without generated code.
No devices, no process groups."""

from __future__ import annotations

import itertools
import pickle
import random

import numpy as np
import pytest

import dpx
from dpx import expr as X
from dpx import values as V
from dpx.ints import INTS

#: For every op, operands to try: (args as constants, which positions become leaves).
CASES = {
    "add": [((3, 4), (0, 1)), (((1, 2, 3), 5), (0,)), (((1, 2), (3, 4)), (0, 1))],
    "sub": [((3, 7), (0, 1)), (((4, 0, 9), 2), (0,))],
    "mul": [((3, 4), (0,)), (((1, 2, 3), 6), (0,))],
    "floordiv": [((17, 4), (0,)), (((0, 5, 9), 3), (0,))],
    "minimum": [((3, 4), (0, 1)), (((1, 7, 3), 5), (0,))],
    "maximum": [((3, 4), (0, 1)), (((1, 7, 3), 5), (0,))],
    "eq": [((3, 3), (0, 1)), (((1, 5, 3), 5), (0,))],
    "land": [((1, 0), (0, 1)), ((1, 1), (0, 1))],
    "clip": [((9, 0, 4), (0,)), (((-2, 3, 8), 0, 5), (0,))],
    "vmax": [(((1, 9, 3),), (0,))],
    "vsum": [(((1, 9, 3),), (0,))],
    "vall": [(((1, 9, 3),), (0,)), (((1, 0, 3),), (0,))],
    "repeat": [((7, 3), (0,))],
    "cumsum_excl": [(((1, 9, 3),), (0,))],
    "group_sum": [(((1, 9, 3, 4),), (0,))],
    "group_cumsum_excl": [(((1, 9, 3, 4),), (0,))],
    "gather": [(((5, 6, 7), (2, 0)), (0,))],
    "index": [(((5, 6, 7), 2), (0,)), (((5, 6, 7), 1), (0, 1))],
}
STATIC_EXTRA = {"group_sum": (2,), "group_cumsum_excl": (2,)}


def _leaves(args, leafy):
    """``args`` with the positions in ``leafy`` replaced by expressions of the same value
    (a counts leaf holding every such value, read back by gather/index), and the counts
    that give them."""
    counts, out = [], []
    leaf = X.counts_leaf(sum(len(a) if type(a) is tuple else 1 for i, a in enumerate(args)
                             if i in leafy))
    for i, a in enumerate(args):
        if i not in leafy:
            out.append(a)
        elif type(a) is tuple:
            out.append(X.gather(leaf, tuple(range(len(counts), len(counts) + len(a)))))
            counts += a
        else:
            out.append(X.index(leaf, len(counts)))
            counts.append(a)
    return out, tuple(counts)


def _reference(op, args):
    """The op on plain Python values (what INTS computes, written out)."""
    a = args[0]
    el = (lambda f: tuple(f(x, y) for x, y in zip(a, args[1])) if type(a) is tuple and
          type(args[1]) is tuple else tuple(f(x, args[1]) for x in a) if type(a) is tuple
          else f(a, args[1]))
    return {
        "add": lambda: el(lambda x, y: x + y), "sub": lambda: el(lambda x, y: x - y),
        "mul": lambda: el(lambda x, y: x * y), "floordiv": lambda: el(lambda x, y: x // y),
        "minimum": lambda: el(min), "maximum": lambda: el(max),
        "eq": lambda: el(lambda x, y: int(x == y)), "land": lambda: el(lambda x, y: x & y),
        "clip": lambda: (tuple(min(max(x, args[1]), args[2]) for x in a) if type(a) is tuple
                         else min(max(a, args[1]), args[2])),
        "vmax": lambda: max(a), "vsum": lambda: sum(a), "vall": lambda: int(all(a)),
        "repeat": lambda: (a,) * args[1],
        "cumsum_excl": lambda: tuple(sum(a[:i]) for i in range(len(a))),
        "group_sum": lambda: tuple(sum(a[i:i + args[1]]) for i in range(0, len(a), args[1])),
        "group_cumsum_excl": lambda: tuple(sum(a[i - i % args[1]:i]) for i in range(len(a))),
        "gather": lambda: tuple(a[i] for i in args[1]),
        "index": lambda: a[args[1]],
    }[op]()


def test_every_op_is_in_the_table_and_has_cases():
    assert set(CASES) == set(X.OPS), "every op needs cases here"
    assert set(X.DEVICE_OPS) <= set(X.OPS) and set(X.BINARY) <= set(X.DEVICE_OPS)
    for name, spec in X.OPS.items():
        assert getattr(X, spec.make.__name__) is spec.make, name


@pytest.mark.parametrize("op", sorted(CASES))
def test_op_folds_evaluates_compiles_and_renders(op):
    make = X.OPS[op].make
    for args, leafy in CASES[op]:
        args = args + STATIC_EXTRA.get(op, ())
        want = _reference(op, args)
        assert make(*args) == want, (op, args)  # constants fold, as INTS computes them
        exprs, counts = _leaves(args, leafy)
        e = make(*exprs)
        assert isinstance(e, X.Expr), (op, args)
        assert V.host_value(e, counts) == want
        assert V.substitute(e, counts=counts) == want
        assert V.compile_host([e])(counts, (None, 0)) == (want,)
        text = X.render(e)
        assert text and "n" in text, text
        # the device evaluators: the NumPy test simulator's (the torch and JAX ones are
        # held to the same ops below)
        if op in X.DEVICE_OPS:
            from schedule_sim import NumpyValues
            got = V.evaluate(e, NumpyValues(counts, {}))
            assert np.asarray(got).tolist() == (list(want) if type(want) is tuple else want)


def test_guards_select_and_leaves_stay():
    leaf = X.counts_leaf(2)
    n0 = X.index(leaf, 0)
    f = V.compile_host([X.add(n0, X.param("out_rows"))], [(X.eq(n0, 3), 1)])
    assert f((3, 1), (None, 10)) == (13,) and f((4, 1), (None, 10)) is None
    partial = V.substitute(X.add(n0, X.coord(X.Coord.TP)), counts=(5, 6))
    assert isinstance(partial, X.Expr) and V.host_value(partial, (), {"tp": 2}) == 7
    assert X.eq(n0, n0) == 1 and X.mul(0, leaf) == (0, 0) and X.add(n0, 0) is n0


def test_frontend_device_evaluators_cover_the_device_ops():
    pytest.importorskip("torch")
    from dpx_torch.program import DeviceValues
    from schedule_sim import NumpyValues
    evaluators = [DeviceValues, NumpyValues]
    try:
        from dpx_jax.interpreter import JaxValues
        evaluators.append(JaxValues)
    except ImportError:  # jax not installed
        pass
    for cls in evaluators:
        missing = [op for op in X.DEVICE_OPS if op not in X.BINARY and not hasattr(cls, op)]
        assert not missing, (cls.__name__, missing)


# ---------------------------------------------------------------- the count rule
def _rules(rng):
    for _ in range(60):
        group = rng.choice([1, 2, 3])
        dp = rng.randint(1, 4)
        each = rng.choice([None, rng.randint(0, 12)])
        total = None if each is not None else rng.randint(0, 30)
        rule = dpx.CountRule(dp * group, group, rng.choice([1, 2, 4]), each, total)
        counts = [rng.randint(-1 if rng.random() < 0.1 else 0, 9) for _ in range(dp * group)]
        yield rule, counts


def _plain_flags(rule, counts):
    per = [sum(counts[i:i + rule.group]) for i in range(0, len(counts), rule.group)]
    bits = 1 if min(counts) < 0 else 0
    if rule.max_each is not None and max(per) > rule.max_each:
        bits |= 2
    a = rule.align
    if rule.max_sum is not None and sum(-(-max(x, 0) // a) * a for x in per) > rule.max_sum:
        bits |= 4
    return bits


def test_count_rule_host_form():
    for rule, counts in _rules(random.Random(0)):
        assert rule.flags(counts) == _plain_flags(rule, counts), (rule, counts)
        assert bool(rule.problems(counts)) == bool(_plain_flags(rule, counts))


def test_planner_applies_the_count_rule():
    lay = dpx.DpLayout(4, 2)
    plan = dpx.plan_step([3, 1], lay, capacity=4)
    assert plan.count_rule == dpx.CountRule(2, 1, 2, 4, None)
    assert dpx.plan_step([3, 1], lay, mode="sum_len", capacity=9).count_rule == \
        dpx.CountRule(2, 1, 2, None, 10)
    with pytest.raises(dpx.DpxCapacityError):
        dpx.plan_step([5, 1], lay, capacity=4)
    assert plan.count_rule.problems([5, 1]) and not plan.count_rule.problems([4, 0])


@pytest.mark.parametrize("passes_name", ["torch", "triton-interpreter", "custom-op"])
def test_count_rule_device_forms(passes_name):
    torch = pytest.importorskip("torch")
    from dpx_torch.ops import OpPasses
    from dpx_torch.passes import TorchPasses, TritonPasses
    passes = {"torch": TorchPasses, "triton-interpreter": TritonPasses,
              "custom-op": OpPasses}[passes_name]()
    for rule, counts in itertools.islice(_rules(random.Random(1)), 25):
        flag = torch.zeros(1, dtype=torch.int32)
        passes.check(torch.tensor(counts, dtype=torch.int32), flag, rule)
        assert int(flag) == rule.flags(counts), (rule, counts)


def test_count_rule_jax_form():
    pytest.importorskip("jax")
    import jax.numpy as jnp
    from jax.experimental import checkify
    from dpx.steps import CheckCounts
    from dpx_jax.interpreter import _check

    class Run:
        def __init__(self, c):
            self.ops = type("O", (), {"counts": staticmethod(lambda: c)})()

    for rule, counts in itertools.islice(_rules(random.Random(2)), 20):
        def f(c):
            _check(CheckCounts(rule), Run(c))
            return c
        err, _ = checkify.checkify(f)(jnp.asarray(counts, jnp.int32))
        assert (err.get() is not None) == bool(rule.problems(counts)), (rule, counts)


# ---------------------------------------------------------------- plans and schedules
@pytest.mark.parametrize("policy", list(dpx.Policy))
def test_plans_pickle_under_every_policy(policy):
    for lay, shards in ((dpx.DpLayout(8, 4), None), (dpx.DpLayout(8, 2, 2), [[1, 2], [0, 3]])):
        counts = [3, 0, 7, 5][:lay.dp_size] if shards is None else [sum(s) for s in shards]
        plan = dpx.plan_step(counts, lay, policy=policy, cp_shards=shards)
        _ = plan.structure, hash(plan)  # derived values are not part of the pickle
        back = pickle.loads(pickle.dumps(plan))
        assert back == plan and back.reason == plan.reason and hash(back) == hash(plan)
        assert back.structure == plan.structure and back.fingerprint() == plan.fingerprint()
    with pytest.raises(AttributeError):
        plan.mode = dpx.PaddingMode.SUM_LEN  # frozen


def test_build_without_cache_generates_no_code(monkeypatch):
    """A one-off schedule evaluates its values directly; a cached variant generates one
    host function (and reuses it for new counts of its structure)."""
    generated = []
    real = V.compile_host
    monkeypatch.setattr(V, "compile_host", lambda *a: generated.append(1) or real(*a))
    lay = dpx.DpLayout(8, 4)
    cache = dpx.ScheduleCache()
    for mode in dpx.PaddingMode:
        for counts in ([3, 0, 7, 5], [9, 3, 6, 5]):  # the second: new counts, same variants
            builds = cache.builds
            plan = dpx.plan_step(counts, lay, mode=mode)
            for op in dpx.Op:
                cold = dpx.build_schedule(plan, op, rank=3)
                assert not generated, (mode, op)
                warm = dpx.build_schedule(plan, op, rank=3, cache=cache)
                assert [str(s) for s in warm.steps] == [str(s) for s in cold.steps]
                assert len(generated) == cache.builds - builds, (mode, op)
                generated.clear()
                builds = cache.builds
        assert len(cache) == len(dpx.Op) * (list(dpx.PaddingMode).index(mode) + 1)


def test_geometry_on_ints_is_the_plan():
    rng = random.Random(4)
    for _ in range(50):
        lay = dpx.DpLayout(*rng.choice([(8, 4), (8, 8), (8, 2, 2), (6, 3), (4, 1, 4)]))
        counts = [rng.randint(0, 20) for _ in range(lay.dp_size)]
        mode = rng.choice(list(dpx.PaddingMode))
        plan = dpx.plan_step(counts, lay, mode=mode)
        a = [-(-n // lay.replica_size) * lay.replica_size for n in counts]
        slots = [max(a)] * lay.dp_size if mode is dpx.PaddingMode.MAX_LEN else a
        assert plan.slot_rows == tuple(slots) and plan.global_rows == sum(slots)
        assert plan.offsets == tuple(sum(slots[:d]) for d in range(lay.dp_size))
        assert INTS.ceil_align(tuple(counts), lay.replica_size) == tuple(a)
