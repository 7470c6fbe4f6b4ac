"""Every Python block of the README runs as written, in order, in a fresh interpreter
(they talk to the testing QuotaServer on 127.0.0.1, nothing else)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), re.S | re.M)


def test_the_readme_has_python_blocks_for_each_entry_point():
    text = "\n".join(python_blocks())
    for name in ("RetryAfterAdapter", "RetryAfterPoolManager", "deferral_of", "budget(resume=", "responses"):
        assert name in text, name


def test_every_python_block_of_the_readme_runs(tmp_path):
    script = tmp_path / "readme_blocks.py"
    script.write_text("\n\n".join(python_blocks()), encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "eligible again at" in proc.stdout and "deferred until" in proc.stdout
