"""Two JAX processes on this CPU form one mesh (jax.distributed + gloo collectives) and run
gather / reduce_scatter in every mode against the reference."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")
pytestmark = pytest.mark.multiproc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_one_mesh():
    here = Path(__file__).resolve().parent
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, str(here / "jax_multiprocess_worker.py"),
                               str(port), str(i)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env)
             for i in range(2)]
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("JAX processes hung")
        outs.append(out)
    for i, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"process {i}: OK" in out, out[-3000:]
