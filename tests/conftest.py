"""Shared fixtures (device selection, the world-1 process group, the persistent gloo worlds),
the collection order (cheapest first), the number of pytest-xdist workers ``-n auto``
starts, and one JAX compilation cache for the whole run."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))

#: Simulated CPU devices for the JAX tests (set before any JAX backend starts).
JAX_CPU_DEVICES = 8
#: At most this many xdist workers for ``-n auto`` (each may start gloo worlds of 4
#: processes and JAX's 8 simulated devices).
MAX_WORKERS = 4

# One JAX compilation cache for the run, shared by the xdist workers and every subprocess
# (they inherit the environment): a program another test already compiled is read back.
# The process that makes the folder (pytest's main process) removes it when it exits; a
# folder the environment names already is left alone.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _jax_cache, _owner = tempfile.mkdtemp(prefix="dpx-tests-jax-"), os.getpid()
    atexit.register(lambda: os.getpid() == _owner and shutil.rmtree(_jax_cache, True))
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _jax_cache
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

try:
    import jax

    jax.config.update("jax_num_cpu_devices", JAX_CPU_DEVICES)
except ImportError:
    pass

#: Test modules, cheapest first: planner (no devices) -> kernels (interpreter) -> torch on
#: gloo -> JAX on simulated devices -> fuzz -> GPU -> cross-frontend parity -> docs,
#: examples and benchmarks (whole programs). Every test module must be listed here
#: (``test_every_test_module_is_ordered`` checks it).
ORDER = (
    "test_planner", "test_imports", "test_expr", "test_schedules", "test_pricing", "test_registries",
    "test_kernels_torch", "test_launches", "test_shims", "test_wire", "test_fp4_wire",
    "test_errors",
    "test_torch_comm", "test_torch_autograd", "test_torch_compile", "test_faults", "test_trust",
    "test_exit",
    "test_torch_serving", "test_combine", "test_torch_groups", "test_torch_hotpath", "test_sglang",
    "test_peer",
    "test_jax", "test_jax_serving", "test_jax_axes", "test_jax_multiprocess",
    "test_fuzz",
    "test_torch_gpu", "test_peer_gpu",
    "test_parity", "test_parity_gpu",
    "test_docs", "test_examples", "test_benchmark_smoke",
)


def pytest_configure(config):
    """On a GPU machine, import jax-triton first and keep ``TRITON_CACHE_DIR``: jax-triton
    0.3.x sets it to ``""`` when imported, which breaks Triton compiles launched from
    torch later in the same process (the GPU tests launch from both)."""
    if not _cuda_available():
        return
    before = os.environ.get("TRITON_CACHE_DIR")
    try:
        import jax_triton  # noqa: F401
    except Exception:  # noqa: BLE001 - not installed, or a jaxlib without GPU support
        pass
    if before is None:
        os.environ.pop("TRITON_CACHE_DIR", None)
    else:
        os.environ["TRITON_CACHE_DIR"] = before


@pytest.hookimpl(wrapper=True, optionalhook=True)   # pytest-xdist's hook; absent without it
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: what pytest-xdist counts (the CPUs this process may use), at most
    :data:`MAX_WORKERS`."""
    return max(1, min((yield), MAX_WORKERS))


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(ORDER)}
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).stem, len(ORDER)))


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def jax_gpu_available() -> bool:
    try:
        import jax
    except ImportError:
        return False
    return jax.default_backend() == "gpu"


def device_params():
    """``cpu`` always; ``cuda`` marked ``gpu`` and skipped without a GPU."""
    return ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not _cuda_available(), reason="needs a CUDA GPU")])]


def passes_params():
    """``(device, passes)`` for each implementation of the local passes: torch ops and the
    Triton kernels in Triton's interpreter on CPU; the compiled kernels on CUDA (marked
    ``gpu``)."""
    from dpx_torch.passes import TorchPasses, TritonPasses

    gpu = [pytest.mark.gpu, pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA GPU")]
    return [pytest.param(("cpu", TorchPasses()), id="cpu-torch"),
            pytest.param(("cpu", TritonPasses()), id="cpu-triton"),
            pytest.param(("cuda", TritonPasses()), id="cuda-triton", marks=gpu)]


@pytest.fixture(scope="session")
def world1(tmp_path_factory):
    """This process as a gloo world of one rank (the default process group), shared by
    every test that needs one: ``DpComm`` at world size 1, error checks, torch.compile."""
    import torch.distributed as dist

    init = tmp_path_factory.mktemp("world1") / "rendezvous"
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.fixture(scope="session")
def comm1(world1):
    """A gloo ``DpComm`` over the world-1 group."""
    import dpx
    from dpx_torch import DpComm

    return DpComm(dpx.DpLayout(1, 1))


@pytest.fixture(scope="session")
def nccl_comm1(world1):
    """An NCCL ``DpComm`` at world size 1 (a subgroup of the world-1 group); GPU only."""
    if not _cuda_available():
        pytest.skip("needs a CUDA GPU")
    import torch
    import torch.distributed as dist

    import dpx
    from dpx_torch import DpComm

    torch.cuda.set_device(0)
    return DpComm(dpx.DpLayout(1, 1), group=dist.new_group([0], backend="nccl"))


@pytest.fixture(scope="session")
def gloo_worlds(tmp_path_factory):
    """``get(world_size, backend="gloo")`` -> a persistent :class:`harness.GlooWorld`
    shared by all tests."""
    from harness import GlooWorld

    worlds: dict[tuple, GlooWorld] = {}
    root = tmp_path_factory.mktemp("gloo")

    def get(size: int, backend: str = "gloo") -> GlooWorld:
        w = worlds.get((size, backend))
        if w is None or not w.alive:
            name = backend.replace(":", "_").replace(",", "_")
            w = GlooWorld(size, root / f"world{size}-{name}-{len(worlds)}", backend)
            worlds[(size, backend)] = w
        return w

    yield get
    for w in worlds.values():
        w.close()
