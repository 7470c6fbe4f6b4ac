"""Every Python block of the README and of each page in ``docs/`` runs as written, in
order, one interpreter per page (they talk to the testing QuotaServer on 127.0.0.1,
nothing else). The two job-queue recipes of ``docs/resume.md`` need an RQ or Celery
deployment: they are compiled, and the names they use are checked to exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
#: Blocks that need a job-queue deployment: compiled, not run (see the module's docstring).
NEEDS_A_QUEUE = ("from rq import Queue", "@app.task")


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(encoding="utf-8"), re.S | re.M)


def run_blocks(blocks: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "blocks.py"
    script.write_text("\n\n".join(blocks), encoding="utf-8")
    return subprocess.run(
        [sys.executable, "-W", "error::ResourceWarning", str(script)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )


def test_the_readme_has_python_blocks_for_each_entry_point() -> None:
    text = "\n".join(python_blocks(README))
    for name in ("RetryAfterAdapter", "RetryAfterPoolManager", "RetryAfterTransport", "deferral_of", "budget("):
        assert name in text, name


def test_the_readme_reads_in_ten_minutes() -> None:
    """At most 250 lines: the rest belongs in ``docs/``."""
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 250


def test_every_python_block_of_the_readme_runs(tmp_path: Path) -> None:
    proc = run_blocks(python_blocks(README), tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "eligible again at" in proc.stdout and "deferred until" in proc.stdout
    assert "ResourceWarning" not in proc.stderr


@pytest.mark.parametrize("page", [p for p in PAGES if python_blocks(p)], ids=lambda p: p.name)
def test_every_python_block_of_a_docs_page_runs(page: Path, tmp_path: Path) -> None:
    blocks = python_blocks(page)
    runnable = [b for b in blocks if not any(mark in b for mark in NEEDS_A_QUEUE)]
    for block in blocks:
        compile(block, f"{page.name} block", "exec")  # the queue recipes too
    proc = run_blocks(runnable, tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "ResourceWarning" not in proc.stderr


def test_only_the_queue_recipes_are_left_unrun() -> None:
    unrun = [b for p in PAGES for b in python_blocks(p) if any(mark in b for mark in NEEDS_A_QUEUE)]
    assert len(unrun) == 2
    assert all("attempt(url, stored)" in b and "value.eligible_at" in b for b in unrun)


def test_the_pages_are_in_the_site_and_the_site_builds_strictly(tmp_path: Path) -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert all(page.name in nav for page in PAGES), "a page of docs/ is missing from mkdocs.yml's nav"
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8").count("RetryAfterRetry") > 5


def test_every_name_the_design_page_gives_exists() -> None:
    """docs/design.md follows one GET through the code by name (``engine.loop.steps``):
    each name must still be there, or the page has gone stale."""
    import importlib

    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    names = set(re.findall(r"`([a-z_]+(?:\.[A-Za-z_][A-Za-z_0-9]*)+)`", text))
    package = {p.stem for p in (ROOT / "retry_after_adapter").iterdir()} | {"retry_after_adapter"}
    gone = object()
    missing = []
    for name in sorted(names):
        parts = name.removeprefix("retry_after_adapter.").split(".")
        if parts[0] not in package or name.endswith((".py", ".lua")):
            continue  # another library's name (Session.get), or a file
        for cut in range(len(parts), 0, -1):
            try:
                found: object = importlib.import_module("retry_after_adapter." + ".".join(parts[:cut]))
            except ImportError:
                continue
            for part in parts[cut:]:
                found = getattr(found, part, gone)
            if found is gone:
                missing.append(name)
            break
        else:
            missing.append(name)
    assert len(names) > 100 and missing == [], missing
