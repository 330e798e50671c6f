"""Every code block in README.md and docs/*.md runs (python blocks; `python3 -m dpx` lines
of bash blocks). A block that calls init_process_group runs under torchrun with 4 ranks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```(python|bash)\n(.*?)```", re.S)


def _blocks():
    for doc in DOCS:
        for i, m in enumerate(BLOCK.finditer(doc.read_text())):
            yield pytest.param(m.group(1), m.group(2), id=f"{doc.name}-{i}")


@pytest.mark.parametrize("lang,code", list(_blocks()))
def test_doc_block_runs(lang, code, tmp_path):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if lang == "bash":
        lines = [ln for ln in code.splitlines() if ln.startswith("python3 -m dpx ")
                 and "demo" not in ln]
        if not lines:
            pytest.skip("install/demo lines run in CI itself")
        for ln in lines:
            res = subprocess.run(ln.replace("python3", sys.executable, 1), shell=True,
                                 capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
            assert res.returncode == 0, res.stderr
        return
    script = tmp_path / "block.py"
    script.write_text(code)
    if "init_process_group" in code:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "4", str(script)]
    else:
        cmd = [sys.executable, str(script)]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env,
                         timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    if "print(\"OK" in code:  # the README's snippets say so when they succeed
        assert re.search(r"^OK: ", res.stdout, re.M), res.stdout[-3000:]


def _prose_lines(doc: Path):
    """The lines of a markdown file outside its code blocks."""
    fenced = False
    for line in doc.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            yield line


def _sections(doc: Path) -> set[str]:
    """The headings and bold paragraph labels of a markdown file (outside code blocks),
    without trailing punctuation."""
    names = set()
    for line in _prose_lines(doc):
        m = re.match(r"#+\s+(.*)", line) or re.match(r"\*\*([^*]+)\*\*", line)
        if m:
            names.add(m.group(1).strip().rstrip(".:"))
    return names


#: A reference to a section: the file, then (after a comma, a parenthesis or a comment's
#: line break) quoted names up to the closing parenthesis or full stop.
_REF = re.compile(r'(docs/\w+\.md|README\.md)[ ,(]*(?:\n\s*#?\s*)?"')


def _references():
    for folder in ("dpx", "dpx_torch", "dpx_jax", "kernels", "benchmarks", "examples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            text = path.read_text()
            for m in _REF.finditer(text):
                tail = text[m.end() - 1:m.end() + 160]
                tail = tail[:min((i for i in (tail.find(")"), tail.find("."), len(tail))
                                  if i >= 0))]
                for name in re.findall(r'"([^"]+)"', tail):
                    yield path.relative_to(ROOT), m.group(1), re.sub(r"\s*\n\s*#?\s*", " ",
                                                                     name)


def test_sections_named_in_the_code_exist():
    """Every docs section a docstring or comment names (``docs/semantics.md, "In a
    server"``) is a heading or a bold paragraph label of that file."""
    refs = list(_references())
    assert len(refs) >= 10, refs
    sections = {str(d.relative_to(ROOT)): _sections(d) for d in DOCS}
    missing = [(str(p), f, n) for p, f, n in refs if n not in sections[f]]
    assert not missing, missing


def test_readme_snippets_each_print_ok():
    """Every python block of the README ends by printing one OK line."""
    blocks = [m.group(2) for m in BLOCK.finditer((ROOT / "README.md").read_text())
              if m.group(1) == "python"]
    assert blocks and all(b.rstrip().splitlines()[-1].startswith('print("OK') for b in blocks)


def test_main_job_runs():
    """The README's first command's job: both frontends agree with the reference."""
    res = subprocess.run([sys.executable, "-m", "dpx", "demo", "--steps", "3"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    # two runs: the main layout, then attention context-parallel inside each replica
    assert res.stdout.count("RESULT: all steps match the dense reference") == 2
    assert res.stdout.count("gathered buffers bitwise equal: True") == 2
    assert "cp=2" in res.stdout and "MISMATCH" not in res.stdout


def _slug(heading: str) -> str:
    """A Markdown heading's anchor as GitHub makes it: lower case, every character but
    letters, digits, spaces, hyphens and underscores dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    """Its headings' anchors (a repeated heading's get -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for line in _prose_lines(doc):
        m = re.match(r"#+\s+(.*)", line)
        if m:
            s = _slug(m.group(1))
            out.add(s if s not in seen else f"{s}-{seen[s]}")
            seen[s] = seen.get(s, 0) + 1
    return out


def test_markdown_links_resolve():
    """Every relative link of the README, docs/ and benchmarks/README.md names a file that
    exists, and its ``#anchor`` a heading of that file."""
    docs = [*DOCS, ROOT / "benchmarks" / "README.md"]
    links, broken = 0, []
    for doc in docs:
        text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # a URL
            links += 1
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.exists():
                broken.append((doc.name, target, "no such file"))
            elif anchor and (dest.suffix != ".md" or anchor not in _anchors(dest)):
                broken.append((doc.name, target, "no such heading"))
    assert links >= 5, links
    assert not broken, broken
