"""dpx beside the libraries a serving process imports, run from the source root as the
README's commands are: the root's ``kernels/`` folder (dpx's Triton kernels, installed as
``dpx.kernels``) does not shadow the installed ``kernels`` package that transformers
imports."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(code: str, **env) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, **env})


def test_transformers_imports_from_the_source_root():
    """The exact import sglang's model code makes, from the root; dpx.kernels still works
    beside it, and ``kernels`` is the installed package, not the root's folder."""
    res = _run("import transformers.models.deepseek_v3.modeling_deepseek_v3\n"
               "import kernels, dpx.kernels\n"
               "from kernels import CUDAProperties\n"
               "assert dpx.kernels.move_rows_kernel is not None\n"
               f"assert not kernels.__file__.startswith({str(ROOT / 'kernels')!r}), "
               "kernels.__file__\n")
    assert res.returncode == 0, res.stderr[-2000:]


def test_any_package_named_kernels_wins_over_the_folder(tmp_path):
    """Whatever ``kernels`` is installed (here one on PYTHONPATH) is what ``import
    kernels`` gives from the root, submodules included; without one, the error says
    where dpx's kernels are."""
    pkg = tmp_path / "kernels"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("MARK = 'installed'\n")
    (pkg / "sub.py").write_text("VALUE = 7\n")
    res = _run("import kernels.sub, dpx.kernels\n"
               "assert kernels.MARK == 'installed' and kernels.sub.VALUE == 7\n"
               "assert dpx.kernels.grid is not None\n", PYTHONPATH=str(tmp_path))
    assert res.returncode == 0, res.stderr[-2000:]
    res = _run("import sys\n"  # no installed packages: the root alone
               "sys.path[:] = [p for p in sys.path if 'packages' not in p]\n"
               "import kernels")
    assert res.returncode != 0 and "import dpx.kernels" in res.stderr, res.stderr[-2000:]


def test_planner_modules_import_only_the_ones_before_them():
    """docs/semantics.md's "Where things live" table orders dpx's modules: each imports
    only modules listed before it (an earlier row, or earlier in its row), every module
    is listed, and none imports torch, jax or triton."""
    import ast

    text = (ROOT / "docs" / "semantics.md").read_text()
    table = text[text.index("## Where things live"):text.index("Each rule is defined once")]
    order = [name for line in table.splitlines() if line.startswith("| `")
             for name in re.findall(r"`(\w+)`", line.split("|")[1])]
    modules = {p.stem for p in (ROOT / "dpx").glob("*.py")} - {"__init__", "__main__"}
    assert set(order) == modules, set(order) ^ modules
    position = {name: i for i, name in enumerate(order)}
    late = []
    for name in order:
        tree = ast.parse((ROOT / "dpx" / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                parts = node.module.split(".")
                deps = ([a.name for a in node.names] if node.module == "dpx"
                        else parts[1:2] if parts[0] == "dpx" else [])
                late += [(name, d) for d in deps if position.get(d, -1) >= position[name]]
                assert parts[0] not in ("torch", "jax", "triton"), (name, node.module)
            elif isinstance(node, ast.Import):
                assert all(a.name.split(".")[0] not in ("torch", "jax", "triton")
                           for a in node.names), name
    assert not late, late


def test_frontend_modules_import_only_their_layer_or_below():
    """docs/semantics.md's layers of dpx_torch: every module is listed once, imports only
    modules of lower layers or before it in its own row (function-level and TYPE_CHECKING
    imports included), and names its layer in its docstring."""
    import ast

    text = (ROOT / "docs" / "semantics.md").read_text()
    table = text[text.index("The torch frontend (`dpx_torch/`) is six layers"):
                 text.index("Each rule is defined once")]
    rows = [line.split("|") for line in table.splitlines()
            if line.startswith("| ") and "`" in line.split("|")[2]]
    order, layer_of = [], {}
    for row in rows:
        for name in re.findall(r"`([\w.]+)`", row[2]):
            order.append(name)
            layer_of[name] = row[1].strip()
    assert len(set(layer_of.values())) == 6, layer_of
    pkg = ROOT / "dpx_torch"
    files = {("__init__" if p.parent == pkg and p.stem == "__init__" else
              "shims" if p.stem == "__init__" else
              f"shims.{p.stem}" if p.parent.name == "shims" else p.stem): p
             for p in pkg.rglob("*.py")}
    assert sorted(order) == sorted(files) and len(order) == len(set(order)), \
        set(order) ^ set(files)
    position = {name: i for i, name in enumerate(order)}

    def target(module: str, names: list[str]) -> list[str]:
        parts = module.split(".")
        if parts[0] != "dpx_torch":
            return []
        if len(parts) == 1:                          # from dpx_torch import x
            return [n for n in names if n in position]
        if parts[1] == "shims":
            if len(parts) == 2:                      # from dpx_torch.shims import x
                return [f"shims.{n}" if f"shims.{n}" in position else "shims" for n in names]
            return [f"shims.{parts[2]}"]
        return [parts[1]]

    late, unnamed = [], []
    for name in order:
        tree = ast.parse(files[name].read_text())
        doc = ast.get_docstring(tree) or ""
        if f"Layer: {layer_of[name]}." not in " ".join(doc.split()):
            unnamed.append(name)
        for node in ast.walk(tree):
            deps: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps = target(node.module, [a.name for a in node.names])
            elif isinstance(node, ast.Import):
                deps = [d for a in node.names for d in target(a.name, [])]
            late += [(name, d) for d in deps
                     if d != name and position.get(d, -1) >= position[name]
                     and not (name == "shims" and d.startswith("shims."))]
    assert not late, late
    assert not unnamed, f"no 'Layer: <layer>.' line in the docstrings of {unnamed}"


def _longest_chain(package: str, folder: Path) -> list[str]:
    """The longest chain of imports among ``package``'s own modules (every import:
    function-level and TYPE_CHECKING ones too; the package's ``__init__`` left out)."""
    import ast
    from functools import lru_cache

    def name(p: Path) -> str:
        parts = [package, *p.relative_to(folder).with_suffix("").parts]
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    files = {name(p): p for p in folder.rglob("*.py")}
    deps: dict[str, set[str]] = {}
    for mod, path in files.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    found.add(full if full in files else node.module)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
        deps[mod] = {d for d in found if d in files and d not in (mod, package)}

    @lru_cache(maxsize=None)
    def chain(mod: str) -> tuple[str, ...]:
        return (mod,) + max((chain(d) for d in deps[mod]), key=len, default=())

    return list(max((chain(m) for m in files if m != package), key=len))


def test_import_chains_stay_short():
    """The longest import chain of each package is at most what docs/semantics.md's
    "Where things live" says (a newcomer reads one layer a module)."""
    text = " ".join((ROOT / "docs" / "semantics.md").read_text().split())
    for package, folder in (("dpx", "dpx"), ("dpx_torch", "dpx_torch"), ("dpx_jax", "dpx_jax")):
        limit = int(re.search(rf"in `{package}/` (?:it )?is (\d+) modules", text).group(1))
        longest = _longest_chain(package, ROOT / folder)
        assert len(longest) <= limit, (package, len(longest), " -> ".join(longest))
