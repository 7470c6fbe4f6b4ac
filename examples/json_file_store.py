"""A cooldown store of your own, with the core alone: a JSON file shared by the
processes of one host, written under an exclusive file lock. A ``Store`` with ``get``
and ``extend`` and no capability mixin, it shares cooldowns (a 429 seen by one worker
holds back every other; a ``Quota`` needs ``QuotaLogs``) and passes the conformance kit. Run it to see
two workers share a cooldown: ``python3 examples/json_file_store.py``.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import threading
from datetime import datetime, timezone
from pathlib import Path

from retry_after_adapter.cooldown import Store, check_scope, check_until
from retry_after_adapter.errors import CooldownStoreError


class JSONFileStore(Store):
    """Cooldowns in one JSON file (``{scope: epoch microseconds}``), later wins. Every
    operation holds an exclusive ``flock`` on a lock file beside it; a write replaces
    the file atomically, so a reader never sees half of one."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock_path = self.path.with_name(self.path.name + ".lock")
        self._threads = threading.Lock()  # flock is per open file: one holder per process

    def get(self, scope: str) -> datetime | None:
        with self._locked():
            micros = self._read().get(check_scope(scope))
        return None if micros is None else _time(micros)

    def extend(self, scope: str, until: datetime) -> datetime:
        asked = (check_until(until) - _EPOCH) // datetime.resolution  # whole microseconds
        with self._locked():
            cooldowns = self._read()
            kept = max(cooldowns.get(check_scope(scope), asked), asked)  # the later time wins
            if kept != cooldowns.get(scope):
                cooldowns[scope] = kept
                self._write(cooldowns)
        return _time(kept)

    # -- the file --------------------------------------------------------------------
    def _locked(self) -> _FileLock:
        return _FileLock(self._lock_path, self._threads)

    def _read(self) -> dict[str, int]:
        try:
            return {str(k): int(v) for k, v in json.loads(self.path.read_text("utf-8")).items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, AttributeError) as exc:
            raise CooldownStoreError(f"cannot read {self.path.name}: {type(exc).__name__}") from exc

    def _write(self, cooldowns: dict[str, int]) -> None:
        temporary = self.path.with_name(f"{self.path.name}.{os.getpid()}.new")  # lock held: ours
        try:
            with open(temporary, "w", encoding="utf-8") as file:
                json.dump(cooldowns, file)
                file.flush(), os.fsync(file.fileno())  # on disk before it replaces the file
            os.replace(temporary, self.path)
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            raise CooldownStoreError(f"cannot write {self.path.name}: {type(exc).__name__}") from exc


class _FileLock:
    def __init__(self, path: Path, threads: threading.Lock) -> None:
        self.path, self.threads = path, threads

    def __enter__(self) -> None:
        self.threads.acquire()
        self.file = open(self.path, "a")  # closed in __exit__
        fcntl.flock(self.file, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        self.file.close()  # closing it lets go of the lock
        self.threads.release()


def _time(micros: int) -> datetime:
    return _EPOCH + micros * datetime.resolution


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

if __name__ == "__main__":
    import requests

    from retry_after_adapter import RetryAfterAdapter, RetryAfterRetry, deferral_of
    from retry_after_adapter.testing import QuotaServer

    with QuotaServer(quota=1, window=3600, align="first") as server, tempfile.TemporaryDirectory() as tmp:
        workers = []
        for _ in range(2):  # each as another process would open it: its own handle on the file
            session, retry = requests.Session(), RetryAfterRetry(total=0, raise_on_status=False)
            store = JSONFileStore(Path(tmp) / "cooldowns.json")
            session.mount("http://", RetryAfterAdapter(retry, cooldown=store))
            workers.append(session)
        print("worker 1:", workers[0].get(server.url).status_code, workers[0].get(server.url).status_code)
        held = workers[1].get(server.url)
        print("worker 2:", held.status_code, "local" if held.local else "sent", deferral_of(held).reason)
        print("requests the server saw:", server.stats().requests)
