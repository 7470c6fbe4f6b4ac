"""``docs/store-format.md`` says what the SQLite and Redis stores keep: these tests keep
it honest. Every table, column, index and trigger of a freshly opened SQLite file is
documented and every table the page documents exists; on a real Redis, after a scope
has been through every operation, every key matches a documented key form (by the
page's own rule for hash tags) and has the documented type and an expiry, every hash
field is documented, every message on the change channel has a documented form, and
the page's scan patterns find every key. The page's format number is the package's."""

from __future__ import annotations

import re
import sqlite3
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from retry_after_adapter import RedisCooldownStore, SQLiteCooldownStore
from retry_after_adapter.cooldown import STORE_FORMAT, Ask, Learn, Lease, Weigh, Weighed, token_scope
from retry_after_adapter.cooldown.redis.feed import CANARY

PAGE = Path(__file__).resolve().parents[2] / "docs" / "store-format.md"
TEXT = PAGE.read_text(encoding="utf-8")

#: Scopes of the three companion forms the page describes: a plain key, a key with a
#: hash tag of its own, and a key with a "}" that is no hash tag.
SCOPES = ("https://api.example.com:443", "tenant-{7}", "odd}scope")


# ------------------------------------------------------------------ reading the page
def part(title: str) -> str:
    """The text of the page's ``## title`` section."""
    found = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", TEXT, re.S | re.M)
    assert found, f"the page has no section {title!r}"
    return found.group(1)


def documented(section: str) -> dict[str, str]:
    """The ``### `name``` subsections of a section: name -> its text."""
    pieces = re.split(r"^### (.*)\n", section, flags=re.M)
    found = {}
    for heading, body in zip(pieces[1::2], pieces[2::2]):
        named = re.fullmatch(r"`([^`]+)`", heading.strip())
        if named:
            found[named.group(1)] = body
    return found


def subsection(section: str, heading: str) -> str:
    found = re.search(rf"^### {re.escape(heading)}\n(.*?)(?=^### |\Z)", section, re.S | re.M)
    assert found, f"no subsection {heading!r}"
    return found.group(1)


def table_cells(text: str, column: str) -> set[str]:
    """The backticked names in the cells of every Markdown table of ``text`` under a
    header cell named ``column``."""
    names: set[str] = set()
    header: list[str] | None = None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not set("".join(cells)) <= set("-: "):
            for at, name in enumerate(header):
                if name == column and at < len(cells):
                    names.update(re.findall(r"`([^`]+)`", cells[at]))
    return names


def named(text: str) -> set[str]:
    """Every backticked piece of ``text``."""
    return set(re.findall(r"`([^`]+)`", text))


def test_the_page_states_the_store_format() -> None:
    first = TEXT.split("\n\n", 2)[1]  # the paragraph under the title
    stated = re.search(r"\*\*Store format (\d+)\*\* \(`retry_after_adapter\.cooldown\.STORE_FORMAT`\)", first)
    assert stated and int(stated.group(1)) == STORE_FORMAT


# ------------------------------------------------------------------------- SQLite
def schema(path: Path) -> tuple[dict[str, list[str]], set[str]]:
    """The file's tables (with their columns), and its other objects (indexes but
    SQLite's automatic ones, triggers)."""
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT type, name FROM sqlite_master").fetchall()
        tables = {
            name: [column[1] for column in conn.execute(f"PRAGMA table_info({name})")]
            for kind, name in rows
            if kind == "table"
        }
    finally:
        conn.close()
    others = {name for kind, name in rows if kind != "table" and not name.startswith("sqlite_autoindex_")}
    return tables, others


def test_every_sqlite_table_and_column_is_documented_and_every_documented_table_exists(
    tmp_path: Path,
) -> None:
    path = tmp_path / "fresh.db"
    store = SQLiteCooldownStore(path)
    store.get("https://api.example.com:443")  # opened: the schema is made
    store.close()
    tables, others = schema(path)
    section = part("SQLite")
    pages = documented(section)
    assert set(pages) == set(tables), "documented tables differ from the file's"
    for table, columns in tables.items():
        missing = [column for column in columns if column not in named(pages[table])]
        assert not missing, f"columns of {table} not documented under it: {missing}"
    objects = subsection(section, "Indexes and triggers")
    listed = table_cells(objects, "index") | table_cells(objects, "trigger")
    assert listed == others, "documented indexes and triggers differ from the file's"
    legacy = re.search(r"\*\*Left by older versions\.\*\*(.*?)(?:\n\n|\Z)", section, re.S)
    assert legacy
    old = {re.match(r"\w+", name).group(0) for name in named(legacy.group(1))}  # type: ignore[union-attr]
    assert old and not old & (set(tables) | others), "a table said to be an older version's is made today"


def exercise(store: Any, scope: str, opened_rate: bool = False) -> None:
    """Every operation that writes a scope's records, at times ahead of the real clock
    (Redis expires keys by its own)."""
    now = datetime.now(timezone.utc).replace(microsecond=0)
    store.extend(scope, now + timedelta(seconds=30))
    after = now + timedelta(seconds=31)
    granted = store.admit(Ask(scope=scope, now=after, limit=5, per=60.0, lease=Lease(slots=2, ttl=30.0, token="slot-1"), margin=0.05, batch=3, hold=1.0))
    assert granted.not_before is None and granted.permit is not None and granted.extra == 2
    store.settle(scope, 5, 60.0, granted.permit, after + timedelta(seconds=5))
    assert store.admit(Ask(scope=scope, now=after, limit=5, per=2.0, opened=10.0)).not_before is None  # left open
    placed = Ask(scope=scope, now=after, limit=1, per=3.0, opened=10.0, reserve_by=after + timedelta(seconds=9))
    assert store.admit(placed).reserved is None
    assert store.admit(placed).reserved is not None  # waiting
    store.allow(scope, 10, after + timedelta(seconds=60), after, None, 100, 60.0)
    store.allow(token_scope(scope), 1000, after + timedelta(seconds=60), after, None, 10_000, 60.0)
    weighed = store.admit(Ask(scope=scope, now=after, weigh=Weigh(10, 500, 60.0, 0.05)))
    assert weighed.not_before is None and weighed.weighed is not None and weighed.token_seq is not None
    store.settle_weighed(scope, Weighed(10, 500, 60.0, weighed.weighed), after + timedelta(seconds=5))
    rated = scope + "|rated"
    probe = store.admit(Ask(scope=rated, now=after, learn=Learn(ttl=30.0, token="probe-1")))
    assert probe.not_before is None and probe.rate_epoch is not None
    store.rate_answer(rated, probe.rate_epoch, None, after)
    if opened_rate:  # good answers until the rate is open, then a throttle closes it
        for _ in range(1000):
            rate = store.rate_of(rated)
            assert rate is not None
            if rate.open:
                break
            store.rate_answer(rated, rate.epoch, None, after)
        assert store.rate_of(rated).open
        store.rate_answer(rated, None, after + timedelta(seconds=10), after)
        assert not store.rate_of(rated).open
    store.note(scope, "success", after)
    store.note(scope, "throttled", after)


def test_sqlite_delete_leaves_only_freshness_as_the_page_says(tmp_path: Path) -> None:
    with SQLiteCooldownStore(tmp_path / "used.db") as store:
        for scope in SCOPES:
            exercise(store, scope)
        tables, _ = schema(tmp_path / "used.db")
        conn = sqlite3.connect(tmp_path / "used.db")
        try:
            kept = {
                table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                for table in tables
                if table not in ("change", "sqlite_sequence")
            }
            assert all(kept.values()), f"a table the operations never wrote: {kept}"
            for scope in SCOPES:
                assert store.delete(scope) and store.delete(scope + "|rated")
            left = {
                table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                for table, columns in tables.items()
                if "scope" in columns and table != "change"
            }
        finally:
            conn.close()
    assert left == {**{table: 0 for table in left}, "freshness": len(SCOPES)}


# -------------------------------------------------------------------------- Redis
def companion(key: str, name: str) -> str:
    """A companion key by the page's rule (written here, not taken from the store)."""
    start = key.find("{")
    end = key.find("}", start + 1) if start >= 0 else -1
    if start >= 0 and end > start + 1:
        return "{" + key[start + 1 : end] + "}" + name + ":" + key
    if "}" in key:
        return "{" + key.replace("}", "") + "}" + name + ":" + key
    return "{" + key + "}" + name


def placeholders(text: str) -> str:
    """A documented name as a regular expression (``<limit>``, ``<per_ms>``: numbers)."""
    return re.sub(r"<(?:limit|per_ms)>", r"\\d+", re.escape(text).replace(r"\<", "<").replace(r"\>", ">"))


def key_forms(key: str, patterns: list[str]) -> dict[str, re.Pattern[str]]:
    """Each documented key pattern as a regular expression for the scope key ``key``."""
    forms = {}
    for pattern in patterns:
        if pattern == "<key>":
            forms[pattern] = re.compile(re.escape(key))
        else:
            assert pattern.startswith("{<key>}"), pattern
            before, _, after = companion(key, "\x00").partition("\x00")
            forms[pattern] = re.compile(
                re.escape(before) + placeholders(pattern[len("{<key>}") :]) + re.escape(after)
            )
    return forms


#: The mark ``delete`` leaves on the scopes it lifts.
LIFTED = "{<key>}lifted"


def text(raw: Any) -> str:
    return raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)


@pytest.mark.redis
def test_every_redis_key_field_and_message_is_documented(redis_client: Any) -> None:
    section = part("Redis")
    pages = documented(section)
    store = RedisCooldownStore(redis_client)  # the default prefix, as the page's examples
    prefix = store.prefix
    channel_part = subsection(section, "The change channel")
    channel_form = next(
        name for name in named(channel_part) if name.startswith("retry-after-adapter:changes:")
    )
    channel = channel_form.replace("<db>", "0").replace("<prefix>", prefix)
    pubsub = redis_client.pubsub()
    pubsub.subscribe(channel)
    try:
        scopes = [*SCOPES, *(scope + "|rated" for scope in SCOPES)]
        for at, scope in enumerate(SCOPES):
            exercise(store, scope, opened_rate=at == 0)
        keys = sorted(text(key) for key in redis_client.scan_iter(count=1000))
        patterns = list(pages)
        seen: set[str] = set()
        for key in keys:
            matched = [
                pattern
                for scope in scopes
                for pattern, form in key_forms(store.key(scope), patterns).items()
                if form.fullmatch(key)
            ]
            assert len(set(matched)) == 1, f"{key!r} matches no documented key form, or several: {matched}"
            pattern = matched[0]
            seen.add(pattern)
            kind = re.search(r"^Type: (\w+)\.$", pages[pattern], re.M)
            assert kind and text(redis_client.type(key)) == kind.group(1), (key, kind)
            assert redis_client.pttl(key) > 0, f"{key!r} does not expire"
            if kind.group(1) == "hash":
                fields = {text(field) for field in redis_client.hkeys(key)}
                missing = fields - named(pages[pattern])
                assert not missing, f"fields of {key!r} not documented under {pattern}: {missing}"
                listed = table_cells(pages[pattern], "field")
                assert listed <= fields, f"{pattern} documents fields never written: {listed - fields}"
        # The mark ``delete`` leaves is made below.
        assert seen == set(patterns) - {LIFTED}, f"documented key forms no operation made: {set(patterns) - seen}"
        scans = re.findall(r"redis-cli --scan --pattern '([^']+)'", section)
        found = {text(key) for scan in scans for key in redis_client.scan_iter(match=scan, count=1000)}
        assert found == set(keys), f"keys the page's scans miss: {set(keys) - found}"
        for scope in scopes:
            assert store.delete(scope)
        left = [text(key) for key in redis_client.scan_iter(count=1000)]
        fresh = {companion(store.key(scope), "fresh") for scope in SCOPES}
        lifted = {key for key in left if key not in fresh}
        assert set(left) - lifted == fresh, "delete leaves only a scope's freshness and its mark, as the page says"
        for key in lifted:
            forms = [key_forms(store.key(scope), [LIFTED])[LIFTED] for scope in scopes]
            assert any(form.fullmatch(key) for form in forms), f"{key!r} is not the documented {LIFTED}"
            kind = re.search(r"^Type: (\w+)\.$", pages[LIFTED], re.M)
            assert kind and text(redis_client.type(key)) == kind.group(1), (key, kind)
            assert redis_client.pttl(key) > 0, f"{key!r} does not expire"
        assert len(lifted) == len(scopes), f"delete marked {len(lifted)} of {len(scopes)} scopes lifted"
        messages = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            message = pubsub.get_message(timeout=0.2)
            if message is None:
                break
            if message["type"] == "message":
                messages.append(text(message["data"]))
    finally:
        pubsub.close()
    forms = {
        form: re.compile(re.escape(form).replace("<ms>", r"\d+").replace("<scope>", ".+"))
        for form in table_cells(channel_part, "message")
    }
    told = {*scopes, *(token_scope(scope) for scope in SCOPES)}
    heard: set[str] = set()
    for message in [*messages, CANARY]:
        matched = [form for form, pattern in forms.items() if pattern.fullmatch(message)]
        assert len(matched) == 1, f"message {message!r} has no documented form: {sorted(forms)}"
        heard.add(matched[0])
        if "<scope>" in matched[0]:
            assert message.split(" ", 2)[2] in told, message
    assert heard == set(forms), f"documented messages never sent: {set(forms) - heard}"
