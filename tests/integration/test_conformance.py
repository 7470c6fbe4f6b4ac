"""The conformance kit (``retry_after_adapter.testing.conformance``) run against every
store of the package and against the example third-party store, which has the core
alone (``get`` and ``extend``): the same contract tests a user's store runs."""

from __future__ import annotations

import importlib.util
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from retry_after_adapter import MemoryCooldownStore, RedisCooldownStore, SQLiteCooldownStore
from retry_after_adapter.testing.conformance import StoreContract

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "json_file_store.py"
QUOTA_EXAMPLE = EXAMPLE.with_name("locked_dict_store.py")


def example_module(path: Path = EXAMPLE) -> Any:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TestMemoryStore(StoreContract):
    @pytest.fixture
    def store(self) -> MemoryCooldownStore:
        return MemoryCooldownStore()


class TestSQLiteStore(StoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[SQLiteCooldownStore]:
        with SQLiteCooldownStore(tmp_path / "cooldown.db") as store:
            yield store

    @pytest.fixture
    def other_store(self, store: SQLiteCooldownStore, tmp_path: Path) -> Iterator[SQLiteCooldownStore]:
        with SQLiteCooldownStore(tmp_path / "cooldown.db") as other:
            yield other

    @pytest.fixture
    def hung_store(self, store: SQLiteCooldownStore, tmp_path: Path) -> Iterator[SQLiteCooldownStore]:
        """A handle on the file while another connection holds its write lock."""
        with SQLiteCooldownStore(tmp_path / "cooldown.db", timeout=0.2) as hung:
            holder = sqlite3.connect(tmp_path / "cooldown.db", isolation_level=None)
            holder.execute("BEGIN EXCLUSIVE")
            try:
                yield hung
            finally:
                holder.execute("ROLLBACK")
                holder.close()


@pytest.mark.redis
class TestRedisStore(StoreContract):
    @pytest.fixture
    def store(self, redis_client: Any) -> Iterator[RedisCooldownStore]:
        store = RedisCooldownStore(redis_client, prefix="contract:")
        yield store
        store.close()

    @pytest.fixture
    def other_store(self, store: RedisCooldownStore, redis_client: Any) -> Iterator[RedisCooldownStore]:
        other = RedisCooldownStore(redis_client, prefix="contract:")
        yield other
        other.close()

    @pytest.fixture
    def hung_store(self, black_hole: int) -> Iterator[RedisCooldownStore]:
        """A store on a server that accepts connections and never answers."""
        hung = RedisCooldownStore.from_url(f"redis://127.0.0.1:{black_hole}/0", prefix="contract:")
        yield hung
        hung.close()


class TestAThirdPartyStoreWithTheCoreAlone(StoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> Any:
        return example_module().JSONFileStore(tmp_path / "cooldowns.json")

    @pytest.fixture
    def other_store(self, store: Any, tmp_path: Path) -> Any:
        return example_module().JSONFileStore(tmp_path / "cooldowns.json")


class TestAThirdPartyStoreWithQuotasAndLeases(StoreContract):
    """The worked example of docs/stores.md: ``QuotaLogs`` and ``Leases`` on a dict."""

    @pytest.fixture
    def store(self) -> Any:
        return example_module(QUOTA_EXAMPLE).LockedDictStore()


class TestTheDocsStore(StoreContract):
    """The store written in the docs' "A store of your own" section, as it stands there."""

    @pytest.fixture
    def store(self) -> Any:
        page = (EXAMPLE.parents[1] / "docs" / "stores.md").read_text(encoding="utf-8")
        block = next(b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "class DictStore" in b)
        names: dict[str, Any] = {}
        exec(compile(block, "stores.md", "exec"), names)
        return names["DictStore"]()


def test_the_third_party_store_is_small() -> None:
    lines = EXAMPLE.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 120, len(lines)


def test_the_third_party_store_shares_a_cooldown_between_processes(tmp_path: Path) -> None:
    """Two processes, each its own handle on the file: what one learns holds the other."""
    path = tmp_path / "cooldowns.json"
    write = (
        "import sys, datetime as d; sys.path.insert(0, sys.argv[1]); from json_file_store import JSONFileStore;"
        "s = JSONFileStore(sys.argv[2]); print(s.extend('https://api.example:443',"
        " d.datetime(2100, 1, 1, tzinfo=d.timezone.utc)).isoformat())"
    )
    read = (
        "import sys; sys.path.insert(0, sys.argv[1]); from json_file_store import JSONFileStore;"
        "print(JSONFileStore(sys.argv[2]).get('https://api.example:443').isoformat())"
    )
    for code in (write, read):
        done = subprocess.run(
            [sys.executable, "-c", code, str(EXAMPLE.parent), str(path)],
            capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "2100-01-01T00:00:00+00:00"


def test_the_example_runs_as_its_docstring_says() -> None:
    done = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "worker 1: 200 429" in done.stdout
    assert "worker 2: 429 local cooldown" in done.stdout
    assert "requests the server saw: 2" in done.stdout
