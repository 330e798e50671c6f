"""Command line: ``python -m dpx plan ...`` and ``python -m dpx demo ...``."""

from __future__ import annotations

import argparse
from typing import Sequence

from dpx.layout import DpLayout
from dpx.plan import plan_step

_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "int32": 4, "int64": 8}


def _ints(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip() != ""]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--tokens {text!r}: {exc}") from None


def _cmd_plan(args: argparse.Namespace) -> int:
    layout = DpLayout(args.world, args.dp, args.cp)
    plan = plan_step(args.tokens, layout, is_extend=args.extend, mode=args.mode,
                     policy=args.policy, capacity=args.capacity,
                     row_bytes=args.hidden * _ITEMSIZE[args.dtype])
    print(plan.explain(hidden=args.hidden, itemsize=_ITEMSIZE[args.dtype]))
    print(f"fingerprint: {plan.fingerprint()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dpx", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="explain the plan for one step")
    p.add_argument("--world", type=int, default=8)
    p.add_argument("--dp", type=int, default=4)
    p.add_argument("--cp", type=int, default=1)
    p.add_argument("--tokens", type=_ints, default=[3, 0, 7, 5],
                   help="comma-separated real token count per DP replica")
    p.add_argument("--extend", action="store_true", help="the batch is an extend (prefill)")
    p.add_argument("--mode", default=None, help="force max_len | sum_len | gatherv")
    p.add_argument("--policy", default="sglang", help="sglang | cost")
    p.add_argument("--capacity", type=int, default=None)
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--dtype", default="bfloat16", choices=sorted(_ITEMSIZE))
    p.set_defaults(func=_cmd_plan)

    d = sub.add_parser("demo", help="a DP-attention MoE layer step on simulated ranks")
    d.add_argument("--world", type=int, default=4)
    d.add_argument("--dp", type=int, default=None, help="default: world // 2")
    d.add_argument("--hidden", type=int, default=64)
    d.add_argument("--steps", type=int, default=4)
    d.add_argument("--frontend", choices=("torch", "jax", "both"), default="both")
    d.add_argument("--seed", type=int, default=0)
    d.set_defaults(func=_cmd_demo)
    return parser


def _cmd_demo(args: argparse.Namespace) -> int:
    from dpx.demo import run_demo

    return run_demo(world=args.world, dp=args.dp if args.dp else max(args.world // 2, 1),
                    hidden=args.hidden, steps=args.steps, frontend=args.frontend,
                    seed=args.seed)


def main(argv: Sequence[str] | None = None) -> int:
    from dpx.errors import DpxError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except DpxError as exc:
        parser.exit(2, f"dpx: error: {exc}\n")
        return 2
