"""dpx_torch autograd on gloo: every op is differentiable (scatter included), its gradient
is its adjoint op, the adjoint identity holds on random inputs, no op modifies its input,
and the overlapped entry points refuse inputs that require grad."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.multiproc

MODES = ["max_len", "sum_len", "gatherv"]


def _cases(dp: int) -> list[dict]:
    counts = [[3] + [0] * (dp - 1), [(2 * i + 5) % 7 for i in range(dp)], [4] * dp]
    out = [dict(counts=c, mode=m, seed=i) for i, (c, m) in enumerate(
        (c, m) for c in counts for m in MODES)]
    for m in MODES:  # capacity plans with device counts (GATHERV included)
        cap = 8 if m == "max_len" else 8 * dp
        out.append(dict(counts=[0] * dp, mode=m, capacity=cap,
                        run_counts=[(3 * i + 2) % 8 for i in range(dp)], seed=50))
        out.append(dict(counts=[(i + 1) % 8 for i in range(dp)], mode=m, capacity=cap,
                        seed=51))
    return out


@pytest.mark.parametrize("layout", [(4, 2), (4, 4), (3, 1), (4, 1)],
                         ids=lambda l: f"w{l[0]}dp{l[1]}")
def test_gradients_adjoints_and_inputs_untouched(gloo_worlds, layout):
    cases = _cases(layout[1])
    done = gloo_worlds(layout[0]).run("torch_jobs:check_autograd", layout, cases)
    assert done == [len(cases)] * layout[0]


@pytest.mark.parametrize("layout", [(2, 2), (4, 2)], ids=lambda l: f"w{l[0]}dp{l[1]}")
def test_several_tensors_with_one_requiring_grad(gloo_worlds, layout):
    """A several-tensor gather where one tensor requires grad: every result, and that
    tensor's gradient, equal those of the tensors gathered alone, in every mode."""
    for r in gloo_worlds(layout[0]).run("torch_jobs:check_several_with_grad", layout):
        assert r == {m: True for m in MODES}, r


def test_async_refuses_inputs_that_require_grad(gloo_worlds):
    res = gloo_worlds(2).run("torch_jobs:check_async_refuses_grad")
    for msgs in res:
        assert "gather_async records no autograd graph" in msgs[0]
        assert "reduce_scatter_async records no autograd graph" in msgs[1]
    assert res[0] == res[1]


@pytest.mark.parametrize("layout", [(4, 1, 2), (4, 2, 2)], ids=lambda l: f"w{l[0]}dp{l[1]}cp{l[2]}")
def test_context_parallel_gradients(gloo_worlds, layout):
    """With CP: CP ranks holding the same rows each receive the whole gradient (one
    replicated value), CP ranks holding shards receive their shard's; device shard tables
    too."""
    _, dp, cp = layout
    cases = []
    for i, m in enumerate(MODES):
        counts = [5 + i] + [3] * (dp - 1)
        cases.append(dict(counts=counts, mode=m, seed=i))
        cases.append(dict(counts=counts, mode=m, seed=i,
                          shards=[(n - n // cp,) + (n // cp,) * (cp - 1) if cp == 2 else
                                  (n,) + (0,) * (cp - 1) for n in counts]))
        cap = 8 if m == "max_len" else 8 * dp
        cases.append(dict(counts=[2] * dp, mode=m, capacity=cap, seed=i,
                          shards=[(2,) + (0,) * (cp - 1)] * dp,
                          run_counts=[[1] * (cp - 1) + [3]] * dp))
    done = gloo_worlds(layout[0]).run("torch_jobs:check_autograd", layout, cases)
    assert done == [len(cases)] * layout[0]
