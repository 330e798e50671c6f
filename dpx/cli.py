"""Command line: ``python -m dpx plan ...`` explains a plan; ``python -m dpx demo ...`` runs
the main job (examples/dp_moe_demo.py)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from dpx.errors import DpxError, DpxValueError
from dpx.explain import explain
from dpx.layout import DpLayout
from dpx.modes import PaddingMode, Wire
from dpx.policy import plan_step
from dpx.wire import check_wire

__all__ = ["build_parser", "main"]

_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "int32": 4, "int64": 8}
#: The counts --tokens defaults to, cycled over --dp replicas.
DEFAULT_TOKENS = (3, 0, 7, 5)

_DESCRIPTION = """\
Explain one step's plan: the layout, the slots of the global buffer as a picture, every
padding mode's estimated cost (the chosen one marked, and why), and the schedules --
partial gather, replicated gather, reduce_scatter -- of the ranks you ask for, each step
priced. Prices use the cost model's defaults (dpx.CostModel) for rows of --hidden
elements of --dtype."""


def _ints(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip() != ""]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


def _shards(text: str) -> list[list[int]]:
    return [_ints(part) for part in text.split(";") if part.strip()]


def _rank(text: str) -> str | int:
    if text != "all" and not text.lstrip("-").isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: an int or 'all'")
    return text if text == "all" else int(text)


def _check(args: argparse.Namespace) -> None:
    """The rules of the arguments that dpx itself does not check (a dpx error if broken)."""
    if args.hidden <= 0:
        raise DpxValueError(f"--hidden {args.hidden}: must be > 0")
    if args.device_counts and args.capacity is None:
        raise DpxValueError("--device-counts prints a capacity plan's schedules for device "
                            "counts: give --capacity N too")
    wire = Wire.parse(args.wire)
    if wire is not Wire.NATIVE:
        # the frontends' rule of a quantized gather's rows: float, [rows, H], H a multiple
        # of the wire's block (a plan of another mode says so in its own line)
        check_wire(wire, PaddingMode.MAX_LEN, (1, args.hidden), args.dtype,
                   name="the rows (--dtype, --hidden)")


def _cmd_plan(args: argparse.Namespace) -> int:
    layout = DpLayout(args.world, args.dp, args.cp)
    tokens = (args.tokens if args.tokens is not None else [sum(s) for s in args.shards]
              if args.shards else [DEFAULT_TOKENS[d % len(DEFAULT_TOKENS)]
                                   for d in range(layout.dp_size)])
    if args.rank != "all":
        layout.coords(args.rank)  # a rank outside the world is a clear error
    itemsize = _ITEMSIZE[args.dtype]
    plan = plan_step(tokens, layout, is_extend=args.extend, mode=args.mode,
                     policy=args.policy, max_len_with_idle=args.max_len_with_idle,
                     capacity=args.capacity, row_bytes=args.hidden * itemsize,
                     transport=args.transport, cp_shards=args.shards)
    print(explain(plan, hidden=args.hidden, itemsize=itemsize,
                  ranks=None if args.rank == "all" else (args.rank,),
                  transport=args.transport, device_counts=args.device_counts, wire=args.wire,
                  vocab=args.vocab))
    print(f"fingerprint: {plan.fingerprint()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dpx",
                                     description="dpx: DP-attention gather/scatter planning.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="explain the plan for one step", description=_DESCRIPTION,
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--world", type=int, default=8, help="ranks in the world")
    p.add_argument("--dp", type=int, default=4, help="DP attention replicas")
    p.add_argument("--cp", type=int, default=1, help="context-parallel ranks per replica")
    p.add_argument("--tokens", type=_ints, default=None,
                   help="comma-separated real token count per DP replica (default: 3,0,7,5 "
                        "cycled over the --dp replicas, or the sums of --shards)")
    p.add_argument("--shards", type=_shards, default=None,
                   help="CP shards per replica, e.g. '2,1;0,0;4,3;3,2' (each replica's rows "
                        "split over its CP ranks)")
    p.add_argument("--extend", action="store_true", help="the batch is an extend (prefill)")
    p.add_argument("--mode", default=None, help="force max_len | sum_len | gatherv")
    p.add_argument("--policy", default="sglang", help="sglang | cost")
    p.add_argument("--max-len-with-idle", action="store_true",
                   help="sglang policy: an extend batch with an idle replica takes MAX_LEN")
    p.add_argument("--capacity", type=int, default=None,
                   help="static capacity (a MAX_LEN slot, or a SUM_LEN / GATHERV global "
                        "buffer): a plan for CUDA graphs and jax.jit")
    p.add_argument("--rank", type=_rank, default=0,
                   help="whose schedules to print: a rank or 'all'")
    p.add_argument("--transport", default="per_root",
                   help="per_root (torch.distributed) | peer (torch, puts and pulls in the "
                        "ranks' shared memory) | ragged (JAX GPU) | equal (JAX CPU)")
    p.add_argument("--device-counts", action="store_true",
                   help="with --capacity: the schedules for counts passed as device data")
    p.add_argument("--wire", default="native",
                   help="native | fp8 | nvfp4 | mxfp4: the format a gather's rows travel in")
    p.add_argument("--hidden", type=int, default=7168, help="elements of a row (pricing)")
    p.add_argument("--vocab", type=int, default=None,
                   help="also price the LM-head scatter of logits of this many columns")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(_ITEMSIZE),
                   help="element type of a row (pricing)")
    p.set_defaults(func=_cmd_plan)

    # `demo ARGS...` is handed to examples/dp_moe_demo.py as is (see main)
    sub.add_parser("demo", help="a DP-attention MoE layer step on simulated ranks "
                                "(examples/dp_moe_demo.py; `demo --help` lists its options)")
    return parser


def _run_demo(demo_args: list[str]) -> int:
    """Runs ``examples/dp_moe_demo.py`` of the source checkout dpx is imported from, in its
    own process (the demo drives both frontends, so it lives outside the dpx package)."""
    demo = Path(__file__).resolve().parent.parent / "examples" / "dp_moe_demo.py"
    if not demo.is_file():
        print("dpx: the demo ships with the source tree (examples/dp_moe_demo.py); this dpx "
              "is installed without it", file=sys.stderr)
        return 2
    return subprocess.run([sys.executable, str(demo), *demo_args]).returncode


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["demo"]:
        return _run_demo(args_list[1:])
    parser = build_parser()
    args = parser.parse_args(args_list)
    try:
        _check(args)
        return args.func(args)
    except DpxError as exc:
        parser.exit(2, f"dpx: error: {exc}\n")
