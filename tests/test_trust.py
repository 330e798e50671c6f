"""A fast path keeps every promise of the full path: ``validate=True`` in every call form
and every op, a destroyed communicator refusing prepared ops too, errors of the same class
with or without validate, caches that are least recently used as documented, and a class
of prepared calls admitting only the tensors the full path admits. (Exits: test_exit.)"""

from __future__ import annotations

import gc
import itertools
import weakref

import pytest
import torch

import dpx
from dpx_torch import CacheLimits, DpComm
from dpx.lru import LRU
from dpx_torch.prepared import CallKey

L1 = dpx.DpLayout(1, 1)


# ---------------------------------------------------------------- one process
def test_lru_keeps_a_hot_entry_through_one_off_entries():
    lru = LRU(4)
    lru.put("hot", 1)
    for i in range(100):
        assert lru.hit("hot") == 1
        lru.put(i, i)
        assert len(lru) <= 4 and "hot" in lru
    assert list(lru) == [97, 98, "hot", 99]          # least recently used first
    lru.put("hot", 2)                    # a put of a kept key refreshes it too
    for i in range(3):
        lru.put(("x", i), i)
    assert lru.hit("hot") == 2 and lru.hit(97) is None


def test_cache_bounds_are_checked_and_named():
    """Every bound of CacheLimits is a count (a schedule cache holds at least one
    template and variant), refused by name before any cache is made; an LRU of limit 0
    keeps nothing and still hands back what it was given."""
    from dataclasses import fields

    for f in fields(CacheLimits):
        with pytest.raises(dpx.DpxValueError, match=rf"CacheLimits\({f.name}\)=-1 must be >= 0"
                           if f.name not in ("templates", "variants") else
                           rf"CacheLimits\({f.name}\)=-1 must be >= 1"):
            CacheLimits(**{f.name: -1})
        with pytest.raises(dpx.DpxTypeError, match=rf"CacheLimits\({f.name}\)=2.0"):
            CacheLimits(**{f.name: 2.0})
    with pytest.raises(dpx.DpxValueError, match="must be >= 1"):
        CacheLimits(variants=0)
    with pytest.raises(dpx.DpxValueError, match="limit=-1"):
        LRU(-1)
    empty = LRU(0)
    assert empty.put("k", 5) == 5 and len(empty) == 0 and empty.hit("k") is None


def test_clear_caches_empties_every_cache_and_calls_still_run(world1):
    """docs/semantics.md, "Bounded memory": after calls of every op, a capacity plan with
    device counts, a wire and an async call, ``clear_caches()`` leaves every cache
    ``cache_sizes()`` counts at 0, and the next calls give the same results."""
    comm = DpComm(L1)
    plan = dpx.plan_step([5], L1, mode="gatherv")
    cap = dpx.plan_step([0], L1, mode="max_len", capacity=8)
    counts = torch.tensor([3], dtype=torch.int32)
    x = torch.randn(8, 128)

    def calls():
        g = comm.gather(x[:5], plan, partial=True)
        return (g, comm.scatter(g, plan), comm.reduce_scatter(g, plan, wire="fp8"),
                comm.gather(x, cap, partial=True, counts=counts),
                comm.gather_async(x[:5], plan, partial=True, wire="mxfp4")[0].clone(),
                comm.mask_pad_rows(comm.gather(x, cap, partial=False, counts=counts), cap,
                                   counts=counts))

    before = calls()
    sizes = comm.cache_sizes()
    assert sizes["prepared"] > 0 and sizes["pool_buffers"] > 0, sizes
    comm.clear_caches()
    assert set(comm.cache_sizes().values()) == {0}, comm.cache_sizes()
    assert all(torch.equal(a, b) for a, b in zip(before, calls()))
    comm.destroy()


def test_a_hot_prepared_op_survives_a_stream_of_one_off_calls(world1):
    """At the cache's limit, one-off calls (a new count each, new plans of a known
    structure too) evict the least recently used ops, never the op called between them:
    the same prepared op serves every hot call."""
    comm = DpComm(L1, limits=CacheLimits(calls=4))
    hot_plan = dpx.plan_step([5], L1, mode="sum_len")
    x, out = torch.ones(5, 8), torch.empty(5, 8)
    key = CallKey("gather", hot_plan, True, dpx.Wire.NATIVE, True, x.shape, x.dtype,
                  x.device, counts=False, out=True, in_place=False)
    comm.gather(x, hot_plan, partial=True, out=out)
    hot = comm.prepared.ops.hit(key)
    assert hot is not None
    for n in range(6, 60):
        comm.gather(x, hot_plan, partial=True, out=out)
        plan = dpx.plan_step([n], L1, mode="sum_len")
        y = torch.ones(n, 8)
        assert torch.equal(comm.gather(y, plan, partial=True), y)
        comm.scatter(torch.ones(n, 8), plan)
        assert comm.prepared.ops.hit(key) is hot
        assert len(comm.prepared.ops) <= 4 and len(comm.prepared.classes) <= 4
    # the hot call repeated with one-off calls of another op between: matched by its
    # arguments (no key built, PreparedOps.last), it keeps its entry the most recent
    for n in range(60, 80):
        comm.gather(x, hot_plan, partial=True, out=out)
        comm.scatter(torch.ones(n, 8), dpx.plan_step([n], L1, mode="sum_len"))
        assert key in comm.prepared.ops and comm.prepared.last["gather"][5] is hot
    sizes = comm.cache_sizes()
    assert sizes["prepared"] == 4 and sizes["programs"] <= CacheLimits().programs
    comm.destroy()


def test_every_cache_refreshes_its_hits():
    """The communicator's other caches follow the same policy: a hit keeps an entry."""
    from dpx_torch.shims.triton_launch import Launcher
    from dpx_torch.program import DeviceTables

    tables = DeviceTables(max_entries=3)
    hot = tables.get((1, 2), torch.device("cpu"))
    for i in range(20):
        assert tables.get((1, 2), torch.device("cpu")) is hot
        tables.get((i, 100), torch.device("cpu"))
    launcher = Launcher(max_entries=2)
    k = object()
    b = launcher.bind(k, torch.device("cuda", 0), {"A": 1}, 4, ())
    for i in range(10):
        assert launcher.bind(k, torch.device("cuda", 0), {"A": 1}, 4, ()) is b
        launcher.bind(k, torch.device("cuda", 0), {"A": 2 + i}, 4, ())


def test_a_class_of_calls_admits_only_what_the_full_path_admits(world1):
    """A new plan of a known structure is prepared from its class; an ``out=`` whose rows
    are not the new plan's, or on another device (``meta``, whose device index a CPU
    tensor's equals), is refused there too (the full path's error, not a torch error,
    rows written past the plan or a result that holds no rows)."""
    comm = DpComm(L1)
    for n in (5, 6):
        p = dpx.plan_step([n], L1, mode="sum_len")
        comm.gather(torch.ones(n, 4), p, partial=True, out=torch.empty(p.global_rows, 4))
    p = dpx.plan_step([7], L1, mode="sum_len")
    for rows, width, device in ((9, 4, "cpu"), (6, 4, "cpu"), (7, 5, "cpu"), (7, 4, "meta")):
        with pytest.raises(dpx.DpxValueError, match=r"out has shape .*; it must be \(7, 4\)"):
            comm.gather(torch.ones(7, 4), p, partial=True,
                        out=torch.empty(rows, width, device=device))
    assert torch.equal(comm.gather(torch.ones(7, 4), p, partial=True,
                                   out=torch.empty(7, 4)), torch.ones(7, 4))
    comm.destroy()


def test_a_class_of_calls_admits_only_counts_of_its_shape(world1):
    """Device counts of the wrong shape on a new plan of a known structure take the full
    path's error, as on a first call."""
    comm = DpComm(L1)
    for n in (3, 4):
        p = dpx.plan_step([n], L1, capacity=8)
        comm.gather(torch.ones(8, 4), p, partial=True,
                    counts=torch.tensor([n], dtype=torch.int32))
    p = dpx.plan_step([5], L1, capacity=8)
    with pytest.raises(dpx.DpxTypeError, match="counts must be a contiguous int32 tensor"):
        comm.gather(torch.ones(8, 4), p, partial=True,
                    counts=torch.tensor([5, 0, 0], dtype=torch.int32))
    comm.destroy()


def test_in_place_and_separate_gathers_keep_their_own_ops(world1):
    """An in-place gather and a gather from a separate input of the same shape are two
    programs: both stay prepared when they alternate (no rebinding every call)."""
    comm = DpComm(L1)
    plan = dpx.plan_step([5], L1, mode="max_len")
    out, other = torch.empty(5, 8), torch.ones(5, 8)
    slot = comm.local_slot(out, plan)
    slot.fill_(2.0)
    ops = set()
    for _ in range(3):
        assert torch.equal(comm.gather(slot, plan, partial=True, out=out), torch.full((5, 8), 2.0))
        assert torch.equal(comm.gather(other, plan, partial=True, out=torch.empty(5, 8)), other)
        ops.add(tuple(id(op) for op in comm.prepared.ops.values()))
    assert len(ops) == 1 and len(comm.prepared.ops) == 2
    comm.destroy()


def _result(call):
    try:
        return call()
    except dpx.DpxError as exc:
        return exc


@pytest.mark.parametrize("op", ["gather", "scatter", "reduce_scatter", "gather_async",
                                "reduce_scatter_async"])
def test_a_repeated_call_admits_only_what_the_full_path_admits(world1, op):
    """A call repeating the last fast call's plan and flags (the same objects) is matched
    without its key, then its tensors are guarded: after a hot call, every other input --
    another dtype, shape or layout, a tensor subclass, several tensors, an ``out`` of
    other rows or on another device, an ``out`` the input overlaps, an input that
    requires grad -- gets what a first call on a fresh communicator gets (its result,
    its error, its autograd graph); the async calls too (their pooled output when no
    ``out`` is given)."""
    comm = DpComm(L1)
    plan = dpx.plan_step([5], L1, mode="max_len")
    x = torch.arange(40.0).view(5, 8)
    out = torch.empty(5, 8)

    def call(c, xi, oi):
        if op.startswith("gather"):
            got = getattr(c, op)(xi, plan, partial=True, out=oi)
        else:
            got = getattr(c, op)(xi, plan, out=oi)
        return got[0].clone() if op.endswith("_async") else got   # (out, work)

    class Sub(torch.Tensor):
        pass

    def overlap():
        big = torch.zeros(12, 8)
        return big[:5], big[3:8]

    cases = {   # name -> a new (input, out) each time
        "dtype": lambda: (x.double(), torch.empty(5, 8, dtype=torch.float64)),
        "dtype, no out": lambda: (x.half(), None),
        "wider": lambda: (torch.ones(5, 16), torch.empty(5, 16)),
        "strided": lambda: (x.t().contiguous().t(), torch.empty(5, 8)),
        "out strided": lambda: (x, torch.empty(8, 5).t()),
        "out rows": lambda: (x, torch.empty(6, 8)),
        "out dtype": lambda: (x, torch.empty(5, 8, dtype=torch.float64)),
        "out meta": lambda: (x, torch.empty(5, 8, device="meta")),
        "overlap": overlap,
        "subclass": lambda: (x.as_subclass(Sub), torch.empty(5, 8)),
        "several": lambda: ([x], None),
        "grad": lambda: (x.clone().requires_grad_(), None),
        "no out": lambda: (x, None),
        "meta": lambda: (x.to("meta"), None),
    }
    for (name, make), hot_out in itertools.product(cases.items(), (out, None)):
        fresh = DpComm(L1)
        want = _result(lambda: call(fresh, *make()))
        fresh.destroy()
        for _ in range(2):   # hot: the next call is matched by its arguments
            call(comm, x, hot_out)
        hot = comm.prepared.last[op.removesuffix("_async")]
        xi, oi = make()
        same = oi is None and hot_out is None and xi is x   # the hot call itself
        assert hot[0] is plan, name
        if not op.endswith("_async"):   # (an async call's op has the pooled output's out)
            assert hot[5].admits(xi, None, oi) is same, name
        got = _result(lambda: call(comm, *make()))
        if isinstance(want, Exception):
            assert type(got) is type(want) and str(got) == str(want), name
            continue
        for g, w in zip(got if isinstance(got, tuple) else (got,),
                        want if isinstance(want, tuple) else (want,)):
            assert isinstance(g, torch.Tensor), (name, g)
            assert torch.equal(g, w) and g.requires_grad == w.requires_grad, name
            assert g.dtype == w.dtype and g.shape == w.shape, name
    comm.destroy()


def test_a_scalar_gets_the_row_rule_on_every_path(world1):
    """A 0-d input after calls of 1-d inputs (whose class has the same trailing shape)
    raises the row-dimension rule, not an IndexError."""
    comm = DpComm(L1)
    plan = dpx.plan_step([3], L1)
    for _ in range(2):
        comm.gather(torch.ones(3), plan, partial=False)
    for p in (plan, dpx.plan_step([2], L1)):
        with pytest.raises(dpx.DpxValueError, match="local must have a row dimension"):
            comm.gather(torch.tensor(1.0), p, partial=False)
    comm.gather(torch.ones(3), plan, partial=False, out=torch.empty(3))
    for bad in ([1, 2], "out"):
        with pytest.raises(dpx.DpxTypeError, match="out must be a torch.Tensor"):
            comm.gather(torch.ones(3), plan, partial=False, out=bad)
    comm.destroy()


@pytest.mark.parametrize("with_out", [False, True])
@pytest.mark.parametrize("form", ["gather", "scatter", "reduce_scatter", "scatter_columns"])
def test_prepared_ops_refuse_work_after_destroy(world1, form, with_out):
    """An op from ``prepare_*`` runs until ``destroy()``; then it raises what every call
    of a destroyed communicator raises, and holds no program (no process group): no
    bound step of it stays alive, that of an ``out=`` op (which it calls directly)
    included."""
    comm = DpComm(L1)
    plan = dpx.plan_step([3], L1)
    x = torch.ones(3, 4)
    kw = {"partial": True} if form == "gather" else {}
    out = torch.empty_like(getattr(comm, form)(x, plan, **kw)) if with_out else None
    op = getattr(comm, f"prepare_{form}")(x, plan, out=out, **kw)
    want = op(x, out=out).clone()
    assert torch.equal(op(x, out=out), want)
    steps = [weakref.ref(step) for step in op.prep.steps]
    comm.destroy()
    gc.collect()
    assert op.prep is None and all(step() is None for step in steps)
    with pytest.raises(dpx.DpxValueError, match="this DpComm was destroyed"):
        op(x, out=out)
    with pytest.raises(dpx.DpxValueError, match="this DpComm was destroyed"):
        getattr(comm, form)(x, plan, **kw)


def test_every_call_form_refuses_work_after_destroy(world1):
    """After ``destroy()``: the overlapped calls, the count exchanges, the pad masks and
    the sglang drop-in raise what every call raises, before touching a group."""
    from types import SimpleNamespace

    import dpx_torch.sglang as sg

    comm = DpComm(L1)
    plan = dpx.plan_step([3], L1)
    x = torch.ones(3, 4)
    att = sg.setup(comm, hidden_size=4, dtype=torch.float32, device="cpu")
    att.set_dp_buffer_len(3, 3, True, [3])
    batch = SimpleNamespace(global_num_tokens_cpu=[3], global_num_tokens_gpu=None,
                            dp_padding_mode=sg.DpPaddingMode.MAX_LEN,
                            dp_local_start_pos=None, dp_local_num_tokens=None)
    sg.dp_gather_partial(torch.empty(3, 4), x, batch)          # prepared, then destroyed
    comm.destroy()
    calls = [lambda: comm.gather_async(x, plan, partial=True),
             lambda: comm.reduce_scatter_async(x, plan),
             lambda: comm.exchange_counts(torch.tensor([3], dtype=torch.int32)),
             lambda: comm.sync_counts(3), lambda: comm.mask_pad_rows(x, plan),
             lambda: comm.pad_row_mask(plan),
             lambda: sg.dp_gather_partial(torch.empty(3, 4), x, batch),
             lambda: sg.dp_scatter(torch.empty(3, 4), x, batch),
             lambda: sg.dp_reduce_scatter_tensor(torch.empty(3, 4), x)]
    try:
        for call in calls:
            with pytest.raises(dpx.DpxValueError, match="this DpComm was destroyed"):
                call()
    finally:
        sg.teardown()


def test_validate_runs_the_full_path_on_one_rank(world1):
    """With validate=True, neither implicit nor prepared calls take the fast path (a
    world of one still exchanges: the full path's host exchange runs)."""
    comm = DpComm(L1, validate=True)
    plan = dpx.plan_step([3], L1)
    x = torch.ones(3, 4)
    op = comm.prepare_gather(x, plan, partial=True)
    calls = []
    real = comm.agreement.check
    comm.agreement.check = lambda *a, **k: (calls.append(a[0]), real(*a, **k))[1]
    op(x)
    comm.gather(x, plan, partial=True)
    comm.scatter(x, plan)
    y = comm.gather(x.clone().requires_grad_(), plan, partial=True)
    y.sum().backward()                      # the backward's collective is exchanged too
    assert calls == ["gather", "gather", "scatter", "gather", "reduce_scatter"]
    comm.validate = False
    op(x)
    comm.gather(x, plan, partial=True)
    assert len(calls) == 5
    comm.destroy()


# ---------------------------------------------------------------- several ranks
def test_validate_holds_for_every_call_form(gloo_worlds):
    """Four ranks disagree after prepared calls -- an implicit call, an explicit prepared
    op whose guards admit the call on some ranks only, scatter against reduce_scatter
    (implicit and prepared), an explicit scatter_columns, an async call, a count
    exchange, an async input inside its pooled output, an in-place gather from a slot of
    another dtype, the sglang drop-in's dp_scatter against dp_reduce_scatter_tensor, and
    validate switched on after ops were prepared: every rank raises the same error, none
    hangs, and the world stays usable."""
    check_validate_forms(gloo_worlds(4).run("trust_jobs:validate_forms", timeout=120))


def check_validate_forms(res: list[dict]) -> None:
    """Every rank's ``trust_jobs:validate_forms``: each scenario's one error on every rank,
    then a usable world."""
    expect = {"implicit": "ranks disagree on the plan's num_tokens",
              "explicit": "rank 2 rejected its input (DpxTypeError: local has dtype "
                          "torch.float64",
              "explicit_rows": "rank 2 rejected its input (DpxValueError: local has 1 rows",
              "scatter_vs_rs": "ranks disagree on op: 'scatter' on ranks [0]; "
                               "'reduce_scatter' on ranks [1, 2, 3]",
              "prepared_scatter_vs_rs": "ranks disagree on op: 'reduce_scatter' on ranks "
                                        "[0, 2, 3]; 'scatter' on ranks [1]",
              "prepared_columns": "ranks disagree on width: 2 on ranks [0, 1, 2]; 3 on "
                                  "ranks [3]",
              "async": "ranks disagree on the plan's num_tokens",
              "async_rs": "ranks disagree on the plan's num_tokens",
              "dropin": "ranks disagree on op: 'sglang.dp_scatter' on ranks [0]; "
                        "'sglang.dp_reduce_scatter_tensor'",
              "switched_on": "ranks disagree on the plan's num_tokens",
              "dropin_rows": "rank 2 rejected its input (DpxValueError: global_tokens has "
                             "shape (5, 6)",
              "batch_vs_one": "ranks disagree on op: 'gather of 2 tensors' on ranks [0]; "
                              "'gather' on ranks [1, 2, 3]",
              "exchange": "rank 1 rejected its input (DpxTypeError: n_local must be an "
                          "int32 tensor",
              "async_pooled": "rank 3 rejected its input (DpxValueError: local overlaps out",
              "in_place_dtype": "rank 0 rejected its input (DpxTypeError: out has dtype "
                                "torch.float16"}
    for key, text in expect.items():
        msgs = {(r[key]["cls"], r[key]["msg"]) for r in res}
        assert len(msgs) == 1, (key, msgs)
        cls, msg = msgs.pop()
        assert cls is not None and text in msg, (key, cls, msg)
    assert all(r["ok"] for r in res)


def test_destroy_leaves_no_group_behind(gloo_worlds):
    """The sglang drop-in, a prepared op and an autograd graph hold no reference to a
    destroyed communicator's groups; a backward after destroy() raises its error."""
    for r in gloo_worlds(4).run("trust_jobs:destroy_drops_the_groups"):
        assert r["owned"] == 1 and r["alive"] == 0 and r["prep"], r
        assert "this DpComm was destroyed" in r["backward"], r


def test_validate_keeps_the_error_class(gloo_worlds):
    """A rejected input raises, on every rank, a DpxMismatchError that is also a TypeError
    / ValueError as the rank's own error was: ``except ValueError`` catches with validate
    what it catches without."""
    check_validate_kinds(gloo_worlds(4).run("trust_jobs:validate_kinds"))


def test_the_mismatch_class_follows_the_rejections_kinds():
    """docs/errors.md: the class every rank raises under validate from the ranks' rejected
    inputs' kinds -- a capacity error only where every rejection was one."""
    from dpx.errors import error_kind, mismatch_error

    kinds = {"capacity": dpx.DpxCapacityError("c"), "value": dpx.DpxValueError("v"),
             "type": dpx.DpxTypeError("t")}
    assert {k: error_kind(e) for k, e in kinds.items()} == {k: k for k in kinds}
    want = {("capacity",): (dpx.DpxMismatchCapacityError, dpx.DpxCapacityError),
            ("capacity", None): (dpx.DpxMismatchCapacityError, dpx.DpxCapacityError),
            ("capacity", "value"): (dpx.DpxMismatchValueError, ValueError),
            ("capacity", "type"): (dpx.DpxMismatchInputError, TypeError),
            ("value", "type"): (dpx.DpxMismatchInputError, ValueError),
            (None, None): (dpx.DpxMismatchError, dpx.DpxMismatchError)}
    for ks, (cls, also) in want.items():
        got = mismatch_error(list(ks))
        assert got is cls and issubclass(got, dpx.DpxMismatchError) and issubclass(got, also)
    assert not issubclass(mismatch_error(["capacity", "value"]), dpx.DpxCapacityError)


def check_validate_kinds(res: list[dict]) -> None:
    """Every rank's ``trust_jobs:validate_kinds``: the same class on every rank."""
    want = {"type": ("DpxMismatchTypeError", True, False),
            "value": ("DpxMismatchValueError", False, True),
            "both": ("DpxMismatchInputError", True, True),
            "disagree": ("DpxMismatchError", False, False)}
    for key, (cls, is_type, is_value) in want.items():
        got = {(r[key]["cls"], r[key]["type"], r[key]["value"], r[key]["msg"]) for r in res}
        assert len(got) == 1, (key, got)
        assert got.pop()[:3] == (cls, is_type, is_value), key
    assert {r["scalar"] for r in res} == {
        "DpxMismatchValueError: validate: rank 0 rejected its input (DpxValueError: local "
        "must have a row dimension, got a scalar) | rank 1 rejected its input "
        "(DpxValueError: local must have a row dimension, got a scalar) | rank 2 rejected "
        "its input (DpxValueError: local must have a row dimension, got a scalar) | rank 3 "
        "rejected its input (DpxValueError: local must have a row dimension, got a scalar)"}
