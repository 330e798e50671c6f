"""The two client examples run end to end at small sizes and pass their own reference
checks: the torch serving loop on gloo (attn-tp 2 and 1) and the JAX training loop on 8
simulated CPU devices."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, PYTHONUNBUFFERED="1")


def test_serving_moe_forms_agree():
    """The example's MoE under graph capture (every expert on every row, gated) equals its
    eager form (experts on their routed rows), pad rows (ids -1) included."""
    import torch

    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import torch_serving as ex
    finally:
        sys.path.pop(0)
    w = ex.weights(2)
    g = torch.randn(12, ex.H)
    ids, wts = ex.route(g, w)
    ids[7:] = -1
    cols = slice(0, ex.FFN)
    eager, gated = (ex.moe(g, ids, wts, w, cols, dense=d) for d in (False, True))
    assert torch.allclose(eager, gated, rtol=1e-5, atol=1e-5) and not eager[7:].any()


@pytest.mark.multiproc
@pytest.mark.parametrize("ranks,tp", [(4, 2), (3, 1)])
def test_torch_serving_example(ranks, tp):
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", str(ranks), "examples/torch_serving.py",
                          "--attn-tp", str(tp), "--decode-steps", "3"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600, env=ENV)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "RESULT: serving steps match the dense reference" in res.stdout
    assert f"attn_tp={tp}" in res.stdout


def test_jax_training_example():
    pytest.importorskip("optax")
    res = subprocess.run([sys.executable, "examples/jax_train.py", "--steps", "5"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, env=ENV)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "compiled 1 time(s) for 5 steps" in res.stdout
    assert "RESULT: loss curve matches the dense reference" in res.stdout
