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


def _shards(text: str) -> list[list[int]]:
    try:
        return [[int(t) for t in part.split(",")] for part in text.split(";") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--shards {text!r}: {exc}") from None


def _ranks(text: str) -> str | int:
    if text == "all":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--rank {text!r}: an int or 'all'") from None


def _cmd_plan(args: argparse.Namespace) -> int:
    layout = DpLayout(args.world, args.dp, args.cp)
    args.tokens_given = args.tokens is not None
    if args.tokens is None:
        args.tokens = [3, 0, 7, 5]
    tokens = [sum(s) for s in args.shards] if args.shards and not args.tokens_given \
        else args.tokens
    plan = plan_step(tokens, layout, is_extend=args.extend, mode=args.mode,
                     policy=args.policy, max_len_with_idle=args.max_len_with_idle,
                     capacity=args.capacity, row_bytes=args.hidden * _ITEMSIZE[args.dtype],
                     transport=args.transport, cp_shards=args.shards)
    if args.rank != "all":
        layout.coords(args.rank)  # a rank outside the world is a clear error
    print(plan.explain(hidden=args.hidden, itemsize=_ITEMSIZE[args.dtype],
                       ranks=None if args.rank == "all" else (args.rank,),
                       transport=args.transport, device_counts=args.device_counts))
    print(f"fingerprint: {plan.fingerprint()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dpx", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="explain the plan for one step")
    p.add_argument("--world", type=int, default=8)
    p.add_argument("--dp", type=int, default=4)
    p.add_argument("--cp", type=int, default=1)
    p.add_argument("--tokens", type=_ints, default=None,
                   help="comma-separated real token count per DP replica (default 3,0,7,5)")
    p.add_argument("--shards", type=_shards, default=None,
                   help="CP shards per replica, e.g. '2,1;0,0;4,3;3,2' (each replica's rows "
                        "split over its CP ranks; --tokens defaults to their sums)")
    p.add_argument("--extend", action="store_true", help="the batch is an extend (prefill)")
    p.add_argument("--mode", default=None, help="force max_len | sum_len | gatherv")
    p.add_argument("--policy", default="sglang", help="sglang | cost")
    p.add_argument("--max-len-with-idle", action="store_true",
                   help="sglang policy: an extend batch with an idle replica takes MAX_LEN")
    p.add_argument("--capacity", type=int, default=None)
    p.add_argument("--rank", type=_ranks, default=0,
                   help="whose schedules to print: a rank or 'all' (default 0)")
    p.add_argument("--transport", default="per_root",
                   help="per_root (torch.distributed) | ragged (JAX GPU) | equal (JAX CPU)")
    p.add_argument("--device-counts", action="store_true",
                   help="capacity plans: the schedules for counts passed as device data")
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--dtype", default="bfloat16", choices=sorted(_ITEMSIZE))
    p.set_defaults(func=_cmd_plan)

    # `demo ARGS...` is handed to examples/dp_moe_demo.py as is (see main)
    sub.add_parser("demo", help="a DP-attention MoE layer step on simulated ranks "
                                "(examples/dp_moe_demo.py; `demo --help` lists its options)")
    return parser


def _run_demo(demo_args: list[str]) -> int:
    """Runs ``examples/dp_moe_demo.py`` of the source checkout dpx is imported from (the
    demo drives both frontends, so it lives outside the dpx package)."""
    import importlib
    import sys
    from pathlib import Path

    examples = Path(__file__).resolve().parent.parent / "examples"
    if not (examples / "dp_moe_demo.py").is_file():
        print("dpx: the demo ships with the source tree (examples/dp_moe_demo.py); this dpx "
              "is installed without it", file=sys.stderr)
        return 2
    sys.path.insert(0, str(examples))  # spawned ranks import the demo module by name
    demo = importlib.import_module("dp_moe_demo")
    return demo.main(demo_args)


def main(argv: Sequence[str] | None = None) -> int:
    import sys

    from dpx.errors import DpxError

    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["demo"]:
        return _run_demo(args_list[1:])
    parser = build_parser()
    args = parser.parse_args(args_list)
    try:
        return args.func(args)
    except DpxError as exc:
        parser.exit(2, f"dpx: error: {exc}\n")
        return 2
