"""The main job: one DP-attention MoE layer, several steps, on simulated ranks.

Every step: random per-replica token counts (some replica idle), a plan, then on every rank
``gather(partial) -> tensor-parallel MLP (weights sharded over all ranks) ->
reduce_scatter``, checked against a dense single-process reference; the same inputs run
through ``dpx_torch`` (gloo processes) and ``dpx_jax`` (shard_map on simulated CPU
devices) and the two are compared.

This module holds the framework-neutral problem (NumPy) and the report; the frontends'
runners live in ``dpx_torch.demo`` and ``dpx_jax.demo`` and are loaded only when asked for.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass

from dpx.cost import CostModel
from dpx.layout import DpLayout
from dpx.plan import DpPlan, estimate_mode, plan_step


@dataclass(frozen=True)
class DemoProblem:
    """Inputs, weights and reference of the demo, identical wherever they are built."""

    world: int
    dp: int
    hidden: int
    steps: int
    seed: int
    max_tokens: int = 24

    @property
    def layout(self) -> DpLayout:
        return DpLayout(self.world, self.dp)

    @property
    def ffn(self) -> int:
        return 2 * self.world

    def _rng(self, *key: int):
        import numpy as np

        return np.random.default_rng([self.seed, *key])

    def plan(self, step: int) -> DpPlan:
        rng = self._rng(1, step)
        counts = [int(c) for c in rng.integers(1, self.max_tokens + 1, self.dp)]
        if self.dp > 1:
            counts[step % self.dp] = 0  # an idle replica every step
        if self.dp > 2 and step % 4 == 3:
            counts = [0] * self.dp
            counts[0] = self.max_tokens * 2  # one replica holds everything
        kind = step % 3
        if kind == 0:
            return plan_step(counts, self.layout, is_extend=step == 0)
        if kind == 1:
            return plan_step(counts, self.layout, policy="cost", row_bytes=self.hidden * 4)
        return plan_step(counts, self.layout, mode="gatherv")

    def hidden_states(self, step: int, d: int, n: int):
        """Replica d's attention output ``[n, hidden]`` (small integers: exact sums)."""
        return self._rng(2, step, d).integers(-3, 4, (n, self.hidden)).astype("float32")

    def partial_states(self, step: int, rank: int, n: int):
        """Rank ``rank``'s partial sum: its replica's attn-tp ranks add up to
        ``hidden_states`` (as after a row-parallel attention output projection)."""
        lay = self.layout
        c = lay.coords(rank)
        tp = lay.attn_tp_size
        parts = [self._rng(3, step, c.attn_dp_rank, t).integers(-2, 3, (n, self.hidden))
                 .astype("float32") for t in range(1, tp)]
        if c.attn_tp_rank > 0:
            return parts[c.attn_tp_rank - 1]
        return self.hidden_states(step, c.attn_dp_rank, n) - sum(parts, start=0 * parts[0]) \
            if parts else self.hidden_states(step, c.attn_dp_rank, n)

    def weights(self):
        """``W1 [hidden, ffn]``, ``W2 [ffn, hidden]``; rank r holds ffn columns
        ``[r*ffn/world, (r+1)*ffn/world)`` of W1 and the same rows of W2."""
        rng = self._rng(4)
        w1 = (rng.standard_normal((self.hidden, self.ffn)) / self.hidden ** 0.5).astype("float32")
        w2 = (rng.standard_normal((self.ffn, self.hidden)) / self.ffn ** 0.5).astype("float32")
        return w1, w2

    def shard(self, rank: int):
        w1, w2 = self.weights()
        k = self.ffn // self.world
        return w1[:, rank * k:(rank + 1) * k], w2[rank * k:(rank + 1) * k]

    def reference(self, step: int, d: int):
        """Dense single-process MLP output of replica d's tokens ``[n_d, hidden]``."""
        import numpy as np

        n = self.plan(step).num_tokens[d]
        w1, w2 = self.weights()
        x = self.hidden_states(step, d, n).astype(np.float64)
        return np.maximum(x @ w1, 0) @ w2


def run_demo(*, world: int, dp: int, hidden: int, steps: int, frontend: str, seed: int) -> int:
    import numpy as np

    problem = DemoProblem(world, dp, hidden, steps, seed)
    lay = problem.layout
    print(f"dpx demo: one DP-attention MoE layer, {lay.describe()}, hidden={hidden}, "
          f"{steps} steps, frontend={frontend}")
    names = ["torch", "jax"] if frontend == "both" else [frontend]
    results = {}
    for name in names:
        runner = importlib.import_module(f"dpx_{name}.demo")
        print(f"[{name}] starting {world} simulated ranks ...", flush=True)
        t0 = time.perf_counter()
        results[name] = runner.run(problem)
        print(f"[{name}] done in {time.perf_counter() - t0:.1f} s", flush=True)

    model = CostModel()
    header = (f"{'frontend':<8} {'step':>4}  {'counts':<22} {'mode':<8} {'global':>6} "
              f"{'sends/rank':>10} {'time ms':>8} {'max err':>9}  check")
    print(header)
    print("-" * len(header))
    ok = True
    for name in names:
        for step in range(steps):
            plan = problem.plan(step)
            res = results[name][step]
            err = 0.0
            for r in range(world):
                d = lay.coords(r).attn_dp_rank
                n = plan.num_tokens[d]
                want = problem.reference(step, d)
                got = res["out"][r]
                err = max(err, float(np.abs(got[:n] - want).max()) if n else 0.0)
                if got[n:].any():
                    err = float("inf")
            good = err < 1e-4 and res["gather_ok"]
            ok &= good
            est = estimate_mode(plan.mode, plan.aligned_tokens, lay, row_bytes=hidden * 4,
                                cost_model=model)
            print(f"{name:<8} {step:>4}  {str(list(plan.num_tokens)):<22} {plan.mode.name:<8} "
                  f"{plan.global_rows:>6} {est.moved:>10} {res['ms']:>8.2f} {err:>9.2e}  "
                  f"{'ok' if good else 'FAIL'}")
    if len(names) == 2:
        same_gather = all(np.array_equal(a, b) for s in range(steps) for a, b in
                          zip(results["torch"][s]["gathered"], results["jax"][s]["gathered"]))
        diff = max(float(np.abs(a - b).max()) if a.size else 0.0 for s in range(steps)
                   for a, b in zip(results["torch"][s]["out"], results["jax"][s]["out"]))
        print(f"parity torch vs jax: gathered buffers bitwise equal: {same_gather}; "
              f"outputs max |diff| = {diff:.2e}")
        ok &= same_gather and diff < 1e-4
    print("RESULT:", "all steps match the dense reference" if ok else "MISMATCH")
    return 0 if ok else 1
