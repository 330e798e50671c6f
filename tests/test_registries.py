"""Every interpreter of schedules handles every step kind its schedules can hold: the
torch frontend (the per-root and peer transports), the JAX frontend (the ragged and equal
transports), the cost model and the NumPy simulator (every kind). A new step kind without
a handler somewhere fails here, not at a user's first call."""

from __future__ import annotations

import pytest

from dpx.cost import PRICERS
from dpx.modes import Transport
from dpx.steps import STEP_KINDS, kinds_for


def _missing(registry, kinds) -> list[str]:
    return sorted(k.__name__ for k in kinds if k not in registry)


def test_every_kind_is_listed_once():
    from dpx import steps

    defined = {v for v in vars(steps).values() if isinstance(v, type)
               and issubclass(v, steps.Step) and v is not steps.Step
               and not v.__name__.startswith("_")}
    assert set(STEP_KINDS) == defined and len(STEP_KINDS) == len(defined)
    assert all(kinds_for(t) <= set(STEP_KINDS) for t in Transport)


def test_cost_model_prices_every_kind():
    assert not _missing(PRICERS, STEP_KINDS)


def test_simulator_runs_every_kind():
    from schedule_sim import COLLECTIVES, LOCAL

    assert not _missing({**LOCAL, **COLLECTIVES}, STEP_KINDS)
    assert all(k.collective for k in COLLECTIVES) and not any(k.collective for k in LOCAL)


def test_torch_frontend_runs_its_transports_kinds():
    pytest.importorskip("torch")
    from dpx_torch.binders import BINDERS

    assert not _missing(BINDERS, kinds_for(Transport.PER_ROOT) | kinds_for(Transport.PEER))


def test_jax_frontend_runs_its_transports_kinds():
    pytest.importorskip("jax")
    from dpx_jax.interpreter import HANDLERS

    assert not _missing(HANDLERS, kinds_for(Transport.RAGGED) | kinds_for(Transport.EQUAL))


def _modules(package: str) -> list:
    import importlib
    import pkgutil

    pkg = importlib.import_module(package)
    return [pkg] + [importlib.import_module(m.name)
                    for m in pkgutil.walk_packages(pkg.__path__, f"{package}.")
                    if not m.name.endswith("__main__")
                    and not (package == "dpx" and m.name.startswith("dpx.kernels"))]


@pytest.mark.parametrize("package", ["dpx", "dpx.kernels", "dpx_torch", "dpx_jax"])
def test_public_modules_define_all(package):
    """Every module says what it offers (``__all__``): each name exists, and a module's
    own ``__all__`` lists what it defines, not what it imports."""
    if package == "dpx_jax":
        pytest.importorskip("jax")
    for mod in _modules(package):
        names = getattr(mod, "__all__", None)
        assert isinstance(names, list) and names, f"{mod.__name__} has no __all__"
        assert len(set(names)) == len(names), mod.__name__
        for name in names:
            assert hasattr(mod, name), f"{mod.__name__}.__all__ names missing {name!r}"
            obj = getattr(mod, name)
            owner = getattr(obj, "__module__", None)
            if mod.__name__ != package and callable(obj) \
                    and isinstance(owner, str) and owner.startswith(package.split(".")[0]):
                assert owner == mod.__name__, f"{mod.__name__}.__all__ re-exports {name!r}"


def test_readme_names_only_exported_kernels():
    import re
    from pathlib import Path

    import dpx.kernels

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `dpx.kernels` |"))
    named = set(re.findall(r"`(\w+_kernel)`", row))
    assert named and named <= set(dpx.kernels.__all__), named - set(dpx.kernels.__all__)
    assert {n for n in dpx.kernels.__all__ if n.endswith("_kernel")} <= named
