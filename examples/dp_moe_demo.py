"""The main job: one DP-attention MoE layer, several steps, on simulated ranks.

    python examples/dp_moe_demo.py [--world 4] [--cp 2] [--steps 4] [--frontend both]
    python -m dpx demo ...            (the same, from a source checkout)

Every step: random per-replica token counts (some replica idle), a plan, then on every rank
``gather(partial) -> tensor-parallel MLP (weights sharded over all ranks) ->
reduce_scatter``, checked against a dense single-process reference; the same inputs run
through ``dpx_torch`` (one gloo process per rank) and ``dpx_jax`` (``shard_map`` on
simulated CPU devices) and the two are compared. A second run does the same with attention
context-parallel inside each replica.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from dpx import (CostModel, DpLayout, DpPlan, DpxError, DpxValueError, Transport, estimate,
                 plan_step)


@dataclass(frozen=True)
class DemoProblem:
    """Inputs, weights and reference of the demo, identical wherever they are built.

    With ``cp > 1`` attention runs context-parallel inside each replica: on even steps
    every CP rank holds all of its replica's rows, on odd steps each holds a shard of
    them (``cp_shards``), and gets back only its shard's rows."""

    world: int
    dp: int
    hidden: int
    steps: int
    seed: int
    cp: int = 1
    max_tokens: int = 24

    @property
    def layout(self) -> DpLayout:
        return DpLayout(self.world, self.dp, self.cp)

    @property
    def ffn(self) -> int:
        return 2 * self.world

    def _rng(self, *key: int):
        return np.random.default_rng([self.seed, *key])

    def plan(self, step: int) -> DpPlan:
        rng = self._rng(1, step)
        counts = [int(c) for c in rng.integers(1, self.max_tokens + 1, self.dp)]
        if self.dp > 1:
            counts[step % self.dp] = 0  # an idle replica every step
        if self.dp > 2 and step % 4 == 3:
            counts = [0] * self.dp
            counts[0] = self.max_tokens * 2  # one replica holds everything
        shards = None
        if self.cp > 1 and step % 2:
            cuts = [sorted(int(x) for x in rng.integers(0, n + 1, self.cp - 1)) for n in counts]
            shards = [tuple(b - a for a, b in zip([0, *c], [*c, n])) for c, n in zip(cuts, counts)]
        kind = step % 3
        if kind == 0:
            return plan_step(counts, self.layout, is_extend=step == 0, cp_shards=shards)
        if kind == 1:
            return plan_step(counts, self.layout, policy="cost", row_bytes=self.hidden * 4,
                             cp_shards=shards)
        return plan_step(counts, self.layout, mode="gatherv", cp_shards=shards)

    def rows_of(self, step: int, rank: int) -> tuple[int, int]:
        """``(first, count)``: the rows of its replica's tokens that ``rank`` holds (all of
        them, or its CP shard)."""
        plan = self.plan(step)
        c = self.layout.coords(rank)
        if not plan.sharded:
            return 0, plan.num_tokens[c.attn_dp_rank]
        row = plan.cp_shards[c.attn_dp_rank]
        return sum(row[:c.attn_cp_rank]), row[c.attn_cp_rank]

    def hidden_states(self, step: int, d: int, n: int):
        """Replica d's attention output ``[n, hidden]`` (small integers: exact sums)."""
        return self._rng(2, step, d).integers(-3, 4, (n, self.hidden)).astype("float32")

    def partial_states(self, step: int, rank: int):
        """Rank ``rank``'s input rows: partial sums that its attn-tp group adds up to its
        rows of ``hidden_states`` (as after a row-parallel attention output projection)."""
        lay = self.layout
        c = lay.coords(rank)
        tp = lay.attn_tp_size
        n = self.plan(step).num_tokens[c.attn_dp_rank]
        first, count = self.rows_of(step, rank)
        parts = [self._rng(3, step, c.attn_dp_rank, t).integers(-2, 3, (n, self.hidden))
                 .astype("float32") for t in range(1, tp)]
        if c.attn_tp_rank > 0:
            full = parts[c.attn_tp_rank - 1]
        else:
            full = self.hidden_states(step, c.attn_dp_rank, n) - sum(parts, start=0 * parts[0]) \
                if parts else self.hidden_states(step, c.attn_dp_rank, n)
        return full[first:first + count]

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

    def reference(self, step: int, rank: int):
        """Dense single-process MLP output of the rows ``rank`` holds ``[count, hidden]``."""
        d = self.layout.coords(rank).attn_dp_rank
        n = self.plan(step).num_tokens[d]
        first, count = self.rows_of(step, rank)
        w1, w2 = self.weights()
        x = self.hidden_states(step, d, n).astype(np.float64)[first:first + count]
        return np.maximum(x @ w1, 0) @ w2


# ---------------------------------------------------------------- torch (gloo processes)
def _rank_main(rank: int, problem: DemoProblem, init_file: str, results: mp.Queue) -> None:
    import torch
    import torch.distributed as dist

    from dpx_torch import DpComm

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=problem.world)
    try:
        comm = DpComm(problem.layout)
        w1, w2 = (torch.from_numpy(a) for a in problem.shard(rank))
        for step in range(problem.steps):
            plan = problem.plan(step)
            local = torch.from_numpy(problem.partial_states(step, rank))
            dist.barrier()
            t0 = time.perf_counter()
            gathered = comm.gather(local, plan, partial=True)
            partial_out = torch.relu(gathered @ w1) @ w2
            out = comm.reduce_scatter(partial_out, plan)
            ms = (time.perf_counter() - t0) * 1e3
            results.put((rank, step, ms, gathered.numpy().copy(), out.numpy().copy()))
        comm.destroy()
    finally:
        dist.destroy_process_group()


def run_torch(problem: DemoProblem) -> list[dict]:
    """Per step: ``out`` (per rank), ``gathered`` (per rank), ``gather_ok``, ``ms``."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = str(Path(tmp) / "rendezvous")
        procs = [ctx.Process(target=_rank_main, args=(r, problem, init, results), daemon=True)
                 for r in range(problem.world)]
        for p in procs:
            p.start()
        steps = [dict(out=[None] * problem.world, gathered=[None] * problem.world, ms=0.0)
                 for _ in range(problem.steps)]
        for _ in range(problem.world * problem.steps):
            rank, step, ms, g, o = results.get(timeout=300)
            s = steps[step]
            s["out"][rank], s["gathered"][rank] = o, g
            s["ms"] = max(s["ms"], ms)
            if all(x is not None for x in s["out"]):
                print(f"  [torch] step {step} done", flush=True)
        for p in procs:
            p.join(timeout=60)
    for s in steps:
        s["gather_ok"] = all(np.array_equal(g, s["gathered"][0]) for g in s["gathered"])
    return steps


# ---------------------------------------------------------------- JAX (simulated devices)
def run_jax(problem: DemoProblem) -> list[dict]:
    """Per step: ``out`` (per rank), ``gathered`` (per rank), ``gather_ok``, ``ms``."""
    import jax

    try:  # simulated CPU devices; possible only before JAX's backends start
        jax.config.update("jax_num_cpu_devices", max(problem.world, 1))
    except RuntimeError:
        pass
    if jax.device_count() < problem.world:
        raise SystemExit(f"the JAX demo needs {problem.world} devices; JAX has "
                         f"{jax.device_count()}")
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from dpx_jax import AXES, gather, make_mesh, reduce_scatter

    lay = problem.layout
    mesh = make_mesh(lay)
    spec = NamedSharding(mesh, P(AXES))
    w1 = np.concatenate([problem.shard(r)[0] for r in range(lay.world_size)], axis=1)
    w2 = np.concatenate([problem.shard(r)[1] for r in range(lay.world_size)], axis=0)
    k = problem.ffn // lay.world_size
    w1s = jax.device_put(jnp.asarray(w1.T.reshape(lay.world_size * k, -1)), spec)  # per rank W1^T
    w2s = jax.device_put(jnp.asarray(w2), spec)
    steps = []
    for step in range(problem.steps):
        plan = problem.plan(step)
        rows = plan.max_slot_rows
        locs = []
        for r in range(lay.world_size):
            rows_r = problem.partial_states(step, r)
            x = np.zeros((rows, problem.hidden), np.float32)
            x[:rows_r.shape[0]] = rows_r
            locs.append(x)
        local = jax.device_put(jnp.asarray(np.concatenate(locs)), spec)

        def body(x, w1t, w2_):
            g = gather(x, plan, partial=True)
            h = jnp.maximum(g @ w1t.T, 0) @ w2_
            return g, reduce_scatter(h, plan)

        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(AXES),) * 3,
                                  out_specs=(P(AXES), P(AXES))))
        jax.block_until_ready(f(local, w1s, w2s))  # compile outside the timing
        t0 = time.perf_counter()
        g, out = jax.block_until_ready(f(local, w1s, w2s))
        ms = (time.perf_counter() - t0) * 1e3
        g = np.asarray(g).reshape(lay.world_size, plan.global_rows, -1)
        out = np.asarray(out).reshape(lay.world_size, rows, -1)
        outs = [out[r][:plan.slot_rows[lay.coords(r).attn_dp_rank]] for r in range(lay.world_size)]
        steps.append(dict(out=outs, gathered=list(g), ms=ms,
                          gather_ok=all(np.array_equal(x, g[0]) for x in g)))
        print(f"  [jax] step {step} done", flush=True)
    return steps


# ---------------------------------------------------------------- report
def run_demo(*, world: int, dp: int, cp: int, hidden: int, steps: int, frontend: str,
             seed: int) -> int:
    """The job on the main layout (``world`` ranks, ``dp`` replicas, attn-tp inside), then
    on a context-parallel one (``dp`` replicas of ``cp`` CP ranks, when ``world`` allows);
    0 when every step matches the dense reference and the frontends agree."""
    problems = [DemoProblem(world, dp, hidden, steps, seed)]
    if cp > 1 and world % (dp * cp) == 0:
        problems.append(DemoProblem(world, dp, hidden, steps, seed, cp=cp))
    elif cp > 1:
        print(f"(no context-parallel run: world={world} is not a multiple of dp*cp={dp * cp})")
    return 0 if all(_run_problem(p, frontend) for p in problems) else 1


def _run_problem(problem: DemoProblem, frontend: str) -> bool:
    lay, steps, hidden = problem.layout, problem.steps, problem.hidden
    print(f"dpx demo: one DP-attention MoE layer, {lay.describe()}, hidden={hidden}, "
          f"{steps} steps, frontend={frontend}"
          + (" (even steps: CP ranks hold the same rows; odd steps: CP shards)"
             if lay.cp_size > 1 else ""))
    names = ["torch", "jax"] if frontend == "both" else [frontend]
    runners = {"torch": run_torch, "jax": run_jax}
    results = {}
    for name in names:
        print(f"[{name}] starting {lay.world_size} simulated ranks ...", flush=True)
        t0 = time.perf_counter()
        results[name] = runners[name](problem)
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
            for r in range(lay.world_size):
                want = problem.reference(step, r)
                n = want.shape[0]
                got = res["out"][r]
                err = max(err, float(np.abs(got[:n] - want).max()) if n else 0.0)
                if got[n:].any():
                    err = float("inf")
            good = err < 1e-4 and res["gather_ok"]
            ok &= good
            # the schedules each frontend runs here: torch.distributed's per-root
            # collectives; JAX on CPU devices (equal-size collectives only)
            transport = Transport.PER_ROOT if name == "torch" else Transport.EQUAL
            est = estimate(plan, row_bytes=hidden * 4, cost_model=model, transport=transport)
            counts = str([list(s) for s in plan.cp_shards] if plan.sharded
                         else list(plan.num_tokens))
            print(f"{name:<8} {step:>4}  {counts:<22} {plan.mode.name:<8} "
                  f"{plan.global_rows:>6} {est.moved:>10} {res['ms']:>8.2f} {err:>9.2e}  "
                  f"{'ok' if good else 'FAIL'}")
    print("columns: global = rows of the gathered buffer; sends/rank = bytes one rank sends "
          "in the step's gather and reduce_scatter, as its frontend's schedule moves them "
          "(GATHERV: torch broadcasts each replica's real rows from its owner; JAX on CPU "
          "devices has no variable-size collective and all-gathers equal blocks, so it sends "
          "more for the same result); time ms = wall time of the step on the slowest "
          "simulated rank (torch: gloo processes; JAX: one compiled program) -- not a "
          "comparison of the frontends' speed; max err = largest difference from the dense "
          "single-process reference")
    if len(names) == 2:
        same_gather = all(np.array_equal(a, b) for s in range(steps) for a, b in
                          zip(results["torch"][s]["gathered"], results["jax"][s]["gathered"]))
        diff = max(float(np.abs(a - b).max()) if a.size else 0.0 for s in range(steps)
                   for a, b in zip(results["torch"][s]["out"], results["jax"][s]["out"]))
        print(f"parity torch vs jax: gathered buffers bitwise equal: {same_gather}; "
              f"outputs max |diff| = {diff:.2e}")
        ok &= same_gather and diff < 1e-4
    print("RESULT:", "all steps match the dense reference" if ok else "MISMATCH")
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="dp_moe_demo", description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--dp", type=int, default=None, help="default: world // 2")
    ap.add_argument("--cp", type=int, default=2,
                    help="CP ranks per replica of the second, context-parallel run (1: none)")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--frontend", choices=("torch", "jax", "both"), default="both")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    dp = args.dp if args.dp else max(args.world // 2, 1)
    try:   # the layout and sizes, checked before any rank starts
        DpLayout(args.world, dp)
        for name in ("hidden", "steps"):
            if getattr(args, name) < 1:
                raise DpxValueError(f"--{name} {getattr(args, name)}: must be >= 1")
    except DpxError as exc:
        ap.exit(2, f"dpx demo: error: {exc}\n")
    return run_demo(world=args.world, dp=dp, cp=args.cp, hidden=args.hidden,
                    steps=args.steps, frontend=args.frontend, seed=args.seed)


if __name__ == "__main__":
    raise SystemExit(main())
