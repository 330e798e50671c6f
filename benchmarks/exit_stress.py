"""Clean exits under load: tests/exit_script.py's teardowns run many times, several at once
(their processes load the machine's cores), counting the runs whose exit status is not 0
(an abort at interpreter exit: "terminate called without an active exception").

    python benchmarks/exit_stress.py [--runs 30] [--at-once 4] [--variants prepared,...]

Prints one row per (variant, dp): runs, failures, and the first failure's last line.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "exit_script.py")


def run(dp: int, variant: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         "2", SCRIPT, str(dp), variant], capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--at-once", type=int, default=4)
    ap.add_argument("--variants", default="both,pg_only,prepared,validate_error")
    ap.add_argument("--dps", default="1,2")
    args = ap.parse_args()
    cases = [(int(dp), v) for v in args.variants.split(",") for dp in args.dps.split(",")]
    jobs = [c for c in cases for _ in range(args.runs)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.at_once) as pool:
        results = list(pool.map(lambda c: run(*c), jobs))
    print(f"{len(jobs)} runs, {args.at_once} at once, {time.perf_counter() - t0:.0f} s")
    print("| variant | dp | runs | exit status not 0 | first failure |")
    print("|---|---|---|---|---|")
    failed = 0
    for case in cases:
        mine = [p for c, p in zip(jobs, results) if c == case]
        bad = [p for p in mine if p.returncode != 0 or p.stdout.count("ok") != 2]
        failed += len(bad)
        last = (bad[0].stderr.strip().splitlines() or ["?"])[-1][:80] if bad else ""
        print(f"| {case[1]} | {case[0]} | {len(mine)} | {len(bad)} | {last} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
