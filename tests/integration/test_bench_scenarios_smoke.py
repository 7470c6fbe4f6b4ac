"""The scripted-scenario benchmark's harness works: ``bench_scenarios.py --quick`` runs as
a subprocess, exits 0, prints a table and its JSON after the marker line, writes the
same JSON and one SVG picture per scenario, and its figures agree with what the scripts
enforce (never with how fast anything is)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = [pytest.mark.bench, pytest.mark.slow]

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
MARKER = "--- JSON ---"
FLEETS = {"stock", "defaults", "best"}


def test_scenarios_quick(tmp_path: Path) -> None:
    # This checkout's package, whichever one is installed.
    path = [str(BENCH.parent), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    proc = subprocess.run(
        [sys.executable, str(BENCH / "bench_scenarios.py"), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=BENCH.parent,
        env=env,
    )
    assert proc.returncode == 0, f"exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    tables, printed = proc.stdout.split(MARKER, 1)
    assert "| scenario " in tables
    doc = json.loads(printed)
    assert json.loads((tmp_path / "scenarios.json").read_text(encoding="utf-8")) == doc
    assert doc["benchmark"] == "scenarios" and doc["settings"]["quick"] is True
    scenarios = doc["scenarios"]
    assert set(scenarios) == {"sporadic", "deploy", "fixed"}
    for name, scenario in scenarios.items():
        assert set(scenario["fleets"]) == FLEETS
        seconds = scenario["seconds"]
        assert 0 < scenario["measured_from_s"] < seconds
        for fleet, run in scenario["fleets"].items():
            assert math.isfinite(run["goodput_per_s"]) and run["goodput_per_s"] >= 0, (name, fleet)
            assert run["requests"] >= run["2xx"] + run["429"] + run["5xx"]
            assert min(run["early"], run["overruns"], run["429"], run["5xx"]) >= 0
            assert len(run["good_per_second"]) == math.ceil(seconds)
            assert sum(run["good_per_second"]) <= run["2xx"]
            assert all("t" in change for change in run["rate_changes"])
            if run["allowed_from"] == "best run":
                assert run["allowed_per_s"] == scenario["fleets"]["best"]["goodput_per_s"]
            if fleet == "stock":
                assert run["rate_changes"] == [] and run["learned_at_end"] == "-"
                assert run["early_after_store_knew"] is None  # stock reads no store
            else:
                assert 0 <= run["early_after_store_knew"] <= run["early"]
        picture = tmp_path / f"scenario-{name}.svg"
        root = ET.parse(picture).getroot()
        text = " ".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text"))
        assert all(f"{fleet}" in text for fleet in FLEETS) and "seconds since the script started" in text
    # What the scripts enforce, in every fleet: the deploy's first second is all 503s,
    # and the fixed window never gives more than its 10 per second.
    for run in scenarios["deploy"]["fleets"].values():
        assert run["good_per_second"][0] == 0 and run["5xx"] >= 1
    for run in scenarios["fixed"]["fleets"].values():
        assert max(run["good_per_second"]) <= 10
        assert run["allowed_from"] == "script" and run["allowed_per_s"] == 10.0
