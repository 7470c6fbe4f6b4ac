"""A fleet of worker processes starting together on a SQLite file that does not exist
yet: the file is created, switched to WAL and given its schema while the others open
it, its WAL is checkpointed into it (the file changes in place, which every process
checks), a worker leaves and another joins. Real processes
(``fresh_file_children``), a real file.

Whatever the start, no process may find the file "not a database" (a brand-new or
half-made file is not a misconfiguration), and the fleet never takes more permits than
its quota. Locks held past the store's timeout at the start ("database is locked"
after 0.25 s) are contention, which the failure layer answers by asking again: they
are counted, not failed.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The quota the fleet shares: permits per 60 s, far more than one run takes in time.
LIMIT = 20
#: The longest (seconds) one command may take on a loaded 2-core machine.
ANSWER_WITHIN = 20.0


class Worker:
    """One worker process, driven one command at a time."""

    def __init__(self) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.fresh_file_children"],
            cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def answer(self) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=ANSWER_WITHIN)
        except queue.Empty:
            pytest.fail(f"a worker did not answer within {ANSWER_WITHIN} s")
        found: dict[str, Any] = json.loads(line)
        return found

    def stop(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def at_once(workers: list[Worker], command: str) -> list[dict[str, Any]]:
    """``command`` sent to every worker before any answer is read."""
    for worker in workers:
        worker.send(command)
    return [worker.answer() for worker in workers]


def started(count: int, fleet: list[Worker]) -> list[Worker]:
    new = [Worker() for _ in range(count)]
    fleet += new
    for worker in new:
        assert worker.answer() == {"ready": True}
    return new


def opened(workers: list[Worker], path: Path) -> list[dict[str, Any]]:
    """Every worker opens the store at once; one whose open met only locks held past
    the timeout (contention at the start) opens again, as a worker would."""
    answers = at_once(workers, f"open {path}")
    for worker, answer in zip(workers, answers, strict=True):
        for _ in range(3):
            if not answer.get("busy"):
                break
            worker.send(f"open {path}")
            answer = worker.answer()
    return answers


def test_a_fleet_starting_on_a_fresh_file_never_finds_it_not_a_database_nor_exceeds_its_quota(
    tmp_path: Path,
) -> None:
    path = tmp_path / "fleet.db"
    assert not path.exists()
    fleet: list[Worker] = []
    try:
        workers = started(4, fleet)
        answers: list[dict[str, Any]] = opened(workers, path)
        # Every thread a new connection, while the others still open theirs.
        answers += at_once(workers, f"admit {LIMIT} 2 1")
        # The WAL checkpointed into the file: it changes in place, and every worker's
        # next operation checks it.
        workers[0].send("churn")
        churned = workers[0].answer()
        assert churned.get("grew"), churned
        answers += at_once(workers, "get")
        # A worker leaves; the others go on with new threads, and a new worker joins.
        leaver = workers.pop()
        answers += at_once([leaver], "close")
        leaver.stop()
        wal_kept = os.path.exists(f"{path}-wal")
        joiner = started(1, fleet)
        answers += opened(joiner, path)
        answers += at_once(workers + joiner, f"admit {LIMIT} 2 3")
        # And on the connections they opened first.
        answers += at_once(workers + joiner, f"admit {LIMIT} 0 1")
    finally:
        for worker in fleet:
            worker.stop()
    failures = [a["error"] for a in answers if "error" in a and not a.get("busy")]
    failures += [e for a in answers for e in a.get("errors", ())]
    assert failures == []
    granted = sum(a.get("granted", 0) for a in answers)
    asked = sum(a.get("granted", 0) + a.get("refused", 0) + a.get("busy", 0) for a in answers)
    assert asked == 4 * 2 + 4 * 2 * 3 + 4
    assert granted <= LIMIT
    assert wal_kept, "the WAL the running workers used was deleted under them"
