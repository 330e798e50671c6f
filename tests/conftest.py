"""Shared fixtures: device selection and the persistent gloo worlds."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

#: Simulated CPU devices for the JAX tests (set before any JAX backend starts).
JAX_CPU_DEVICES = 8

try:
    import jax

    jax.config.update("jax_num_cpu_devices", JAX_CPU_DEVICES)
except ImportError:
    pass


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


@pytest.fixture(scope="session")
def gloo_worlds(tmp_path_factory):
    """``get(world_size)`` -> a persistent :class:`harness.GlooWorld` shared by all tests."""
    from harness import GlooWorld

    worlds: dict[int, GlooWorld] = {}
    root = tmp_path_factory.mktemp("gloo")

    def get(size: int) -> GlooWorld:
        w = worlds.get(size)
        if w is None or not w.alive:
            w = GlooWorld(size, root / f"world{size}-{len(worlds)}")
            worlds[size] = w
        return w

    yield get
    for w in worlds.values():
        w.close()
