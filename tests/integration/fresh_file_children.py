"""The processes of ``test_sqlite_fresh_file``: each is one worker of a fleet sharing a
SQLite file, driven one command at a time by the test.

Run as ``python -m tests.integration.fresh_file_children`` (from the repository). It
prints ``{"ready": true}`` once imported, then reads one command a line on stdin and
answers each with one JSON line on stdout:

- ``open PATH``: open ``SQLiteCooldownStore(PATH)`` (on the main thread, as a worker
  does when it starts);
- ``admit LIMIT THREADS EACH``: ``THREADS`` new threads (each a new connection; 0: this
  one, on the connection it opened first) ask ``EACH`` times for a permit of
  ``Quota(LIMIT, per=60)`` on one scope; the answer counts the permits granted, the
  refusals, the busy failures (locks held past the store's timeout) and lists every
  other failure;
- ``churn``: write cooldowns of other scopes until the file itself grows (the WAL was
  checkpointed into it), at most 5000;
- ``get``: one read (the store checks the file it opened first);
- ``close``: close the store (the worker leaves).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from retry_after_adapter import SQLiteCooldownStore
from retry_after_adapter.cooldown import Ask
from retry_after_adapter.errors import CooldownStoreError

SCOPE = "GET http://quota.invalid:80"


def admit(store: SQLiteCooldownStore, limit: int, threads: int, each: int) -> dict[str, Any]:
    found: dict[str, Any] = {"granted": 0, "refused": 0, "busy": 0, "errors": []}
    lock = threading.Lock()

    def run() -> None:
        for _ in range(each):
            try:
                admission = store.admit(Ask(scope=SCOPE, limit=limit, per=60.0, margin=0.0))
            except CooldownStoreError as exc:
                with lock:
                    if exc.busy:
                        found["busy"] += 1
                    else:
                        found["errors"].append(str(exc))
                continue
            with lock:
                found["granted" if admission.not_before is None else "refused"] += 1

    if not threads:
        run()
        return found
    workers = [threading.Thread(target=run) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return found


def churn(store: SQLiteCooldownStore) -> dict[str, Any]:
    size = os.path.getsize(store.path)
    until = datetime.now(UTC) + timedelta(hours=1)
    for n in range(5000):
        store.extend(f"GET http://churn.invalid:80/{n}", until)
        if os.path.getsize(store.path) > size:
            return {"writes": n + 1, "grew": True}
    return {"writes": 5000, "grew": False}


def main() -> None:
    store: SQLiteCooldownStore | None = None
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        command, *args = line.split()
        answer: dict[str, Any] = {}
        try:
            if command == "open":
                store = SQLiteCooldownStore(args[0])
            elif command == "admit":
                assert store is not None
                answer = admit(store, *(int(a) for a in args))
            elif command == "churn":
                assert store is not None
                answer = churn(store)
            elif command == "get":
                assert store is not None
                store.get(SCOPE)
            elif command == "close":
                assert store is not None
                store.close()
        except CooldownStoreError as exc:
            answer = {"error": str(exc), "busy": exc.busy}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
