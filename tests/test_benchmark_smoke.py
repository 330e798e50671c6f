"""The multi-GPU collectives benchmark runs end to end on gloo (tiny sizes), so it is ready
for a machine with several GPUs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiproc


def test_collectives_benchmark_smoke(tmp_path):
    bench = Path(__file__).resolve().parent.parent / "benchmarks"
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "2", "collectives.py", "--backend", "gloo",
                          "--quick"], cwd=bench, capture_output=True, text=True, timeout=600,
                         env={**__import__("os").environ, "OUT": str(tmp_path)})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "planner within 5% of the fastest mode" in res.stdout
    assert (tmp_path / "collectives.csv").read_text().count("\n") == 1 + 2 * 4 * 3
