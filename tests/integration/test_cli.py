"""The command line, run as a real process (``python -m retry_after_adapter``) against a
real loopback server: exit codes, stdout/stderr split, JSON shapes, no secret leaks.

The child processes use the real clock, so every scripted wait here is a deferral
(returned at once) or at most one second.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from retry_after_adapter import Deferral

from ..servers import Reply, ThrottleServer, format_http_date
from .conftest import run_cli

SECRET = "s3cr3t-t0ken-value"
QUERY_SECRET = "q-secret-4242"


run = run_cli


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


# --------------------------------------------------------------------------- get
def test_get_prints_the_body_and_exits_0(real_server: ThrottleServer) -> None:
    real_server.serve([Reply(200, body=b"hello\n")])
    result = run("get", real_server.url + "/ok")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "hello\n"
    assert result.stderr == ""
    assert real_server.count("GET") == 1


def test_get_waits_a_retry_after_that_fits(real_server: ThrottleServer) -> None:
    real_server.serve([Reply(429, {"Retry-After": "1"}, b"slow"), Reply(200, body=b"done")])
    result = run("get", real_server.url + "/r", "--deadline", "5", "--max-wait", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "done"
    seen = real_server.seen
    assert len(seen) == 2
    assert (seen[1].at - seen[0].at).total_seconds() >= 1.0


def test_get_defers_with_json_and_exit_75(real_server: ThrottleServer) -> None:
    real_server.serve([Reply(429, {"Retry-After": "120"}, b"quota"), Reply(200)])
    before = datetime.now(timezone.utc)
    result = run("get", real_server.url + "/later", "--max-wait", "5")
    assert result.returncode == 75, result.stderr
    data = json.loads(result.stdout)
    deferral = Deferral.from_dict(data)
    assert deferral.to_dict() == data
    assert deferral.reason == "max_wait"
    assert deferral.delay == 120.0
    assert deferral.status == 429 and deferral.retry_after == "120"
    assert deferral.attempts == 1
    assert before + timedelta(seconds=119) < deferral.eligible_at < before + timedelta(seconds=125)
    assert "deferred (max_wait)" in one_line(result.stderr)
    assert real_server.count() == 1


def test_get_deadline_defers_instead_of_waiting(real_server: ThrottleServer) -> None:
    real_server.serve([Reply(503, {"Retry-After": "30"}), Reply(200)])
    result = run("get", real_server.url + "/d", "--deadline", "10", "--max-wait", "none")
    assert result.returncode == 75
    assert Deferral.from_dict(json.loads(result.stdout)).reason == "deadline"
    assert real_server.count() == 1


def test_get_sqlite_cooldown_is_shared_between_processes(real_server: ThrottleServer, tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'cooldown.db'}"
    real_server.serve([Reply(429, {"Retry-After": "300"}), Reply(200)])
    first = run("get", real_server.url + "/a", "--max-wait", "5", "--cooldown", store)
    assert first.returncode == 75
    # A second process, another path on the same origin: deferred before sending anything.
    second = run("get", real_server.url + "/b", "--max-wait", "5", "--cooldown", store)
    assert second.returncode == 75, second.stderr
    deferral = Deferral.from_dict(json.loads(second.stdout))
    assert deferral.reason == "cooldown"
    assert deferral.attempts == 0
    first_eligible = Deferral.from_dict(json.loads(first.stdout)).eligible_at
    assert abs((deferral.eligible_at - first_eligible).total_seconds()) < 1
    assert real_server.count() == 1
    # Without the shared store a new process knows nothing of the cooldown and sends.
    third = run("get", real_server.url + "/c", "--max-wait", "5", "--cooldown", "memory://")
    assert third.returncode == 0 and third.stdout == "ok"
    assert real_server.count() == 2


def test_get_non_2xx_prints_body_and_exits_1(real_server: ThrottleServer) -> None:
    real_server.serve([Reply(404, body=b"no such thing")])
    result = run("get", real_server.url + "/missing")
    assert result.returncode == 1
    assert result.stdout == "no such thing"
    line = one_line(result.stderr)
    assert "HTTP 404" in line and "stop_reason" in line


def test_get_invalid_retry_after_stops_with_its_reason(real_server: ThrottleServer) -> None:
    real_server.serve([Reply(429, {"Retry-After": "soon"}, b"busy"), Reply(200)])
    result = run("get", real_server.url + "/x")
    assert result.returncode == 1
    assert result.stdout == "busy"
    assert "stop_reason: invalid_retry_after" in one_line(result.stderr)
    assert real_server.count() == 1


def test_get_retries_used_up_exits_1_with_the_last_body(real_server: ThrottleServer) -> None:
    real_server.serve([Reply(503, {"Retry-After": "0"}, b"down")])
    result = run("get", real_server.url + "/x", "--retries", "2")
    assert result.returncode == 1
    assert result.stdout == "down"
    assert "stop_reason: retries used up; eligible again at" in one_line(result.stderr)
    assert real_server.count() == 3


def test_get_connection_refused_exits_69_without_traceback(closed_port: int) -> None:
    url = f"http://127.0.0.1:{closed_port}/x?api_key={QUERY_SECRET}"
    result = run("get", url, "--retries", "0", "--header", f"Authorization: Bearer {SECRET}")
    assert result.returncode == 69
    assert result.stdout == ""
    line = one_line(result.stderr)
    assert "connection refused" in line
    assert QUERY_SECRET not in line and SECRET not in line and "api_key" not in line


def test_get_timeout_exits_69(real_server: ThrottleServer) -> None:
    real_server.serve([Reply(action="hang")])
    result = run("get", real_server.url + "/slow", "--timeout", "0.3", "--retries", "0")
    assert result.returncode == 69
    assert "timed out" in one_line(result.stderr)


def test_secrets_never_appear_in_any_output(real_server: ThrottleServer) -> None:
    real_server.serve([Reply(429, {"Retry-After": "600"}, b"throttled")])
    url = f"{real_server.url}/v1/items?api_key={QUERY_SECRET}"
    result = run(
        "get", url, "--max-wait", "1",
        "--header", f"Authorization: Bearer {SECRET}",
        "-H", f"X-Api-Key: {SECRET}",
    )  # fmt: skip
    assert result.returncode == 75
    # The header really was sent...
    assert real_server.seen[0].headers["Authorization"] == f"Bearer {SECRET}"
    # ...and neither it nor the query shows up anywhere.
    for stream in (result.stdout, result.stderr):
        assert SECRET not in stream
        assert QUERY_SECRET not in stream
    real_server.serve([Reply(404, body=b"gone")])
    result = run("get", url, "--header", f"Authorization: Bearer {SECRET}")
    assert result.returncode == 1
    assert SECRET not in result.stdout + result.stderr
    assert QUERY_SECRET not in result.stdout + result.stderr


def test_secrets_never_appear_in_argument_errors() -> None:
    # A mistyped option: argparse's "unrecognized arguments" would repeat the header.
    result = run("get", "http://127.0.0.1:1/", "--headr", f"Authorization: Bearer {SECRET}")
    assert result.returncode == 2
    assert SECRET not in one_line(result.stderr)
    result = run("get", f"ftp://user:{SECRET}@host/x?k={QUERY_SECRET}")
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert SECRET not in line and QUERY_SECRET not in line
    result = run("get", "http://127.0.0.1:1/", "--cooldown", f"redis://:{SECRET}@127.0.0.1:bad/0")
    assert result.returncode == 2
    assert SECRET not in one_line(result.stderr)


@pytest.mark.parametrize(
    "args",
    [
        ["get", "http://127.0.0.1:1/", "--deadline", "-1"],
        ["get", "http://127.0.0.1:1/", "--header", "no colon here"],
        ["get", "not a url"],
        ["get", "http://127.0.0.1:1/", "--cooldown", "bogus://x"],
        ["explain", "5", "--received-at", "2026-01-01T00:00:00"],
        ["demo", "--workers", "0"],
        ["frobnicate"],
        [],
    ],
)
def test_bad_arguments_exit_2_with_one_line(args: list[str]) -> None:
    result = run(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    line = one_line(result.stderr) if args else result.stderr.strip().splitlines()[0]
    assert "retry-after-adapter" in line


@pytest.mark.parametrize("command", ["demo", "get", "explain"])
def test_each_command_has_help_with_examples(command: str) -> None:
    result = run(command, "--help")
    assert result.returncode == 0
    assert "examples:" in result.stdout
    assert f"retry-after-adapter {command}" in result.stdout


# --------------------------------------------------------------------------- explain
def test_explain_seconds_form_and_decision() -> None:
    result = run("explain", "120", "--max-wait", "30", "--received-at", "2026-03-01T12:00:00Z")
    assert result.returncode == 0
    out = result.stdout
    assert "delay-seconds" in out and "120 s" in out
    assert "eligible at   2026-03-01T12:02:00+00:00" in out
    assert "defer (max_wait)" in out
    data = json.loads(
        run("explain", "20", "--deadline", "10", "--elapsed", "4", "--json",
            "--received-at", "2026-03-01T12:00:00Z").stdout
    )  # fmt: skip
    assert data["valid"] is True and data["form"] == "seconds" and data["delay"] == 20.0
    assert data["decision"] == {
        "action": "defer",
        "reason": "deadline",
        "wait": 20.0,
        "eligible_at": "2026-03-01T12:00:20+00:00",
    }
    fits = json.loads(run("explain", "3", "--backoff", "5", "--json").stdout)
    assert fits["decision"]["action"] == "retry" and fits["decision"]["wait"] == 5.0  # the longer wait


def test_explain_date_form_measured_against_the_server_date() -> None:
    server_date = datetime(2026, 10, 21, 7, 27, tzinfo=timezone.utc)
    value = format_http_date(server_date + timedelta(seconds=60))
    args = [
        "explain",
        value,
        "--date",
        format_http_date(server_date),
        "--received-at",
        "2026-10-21T07:27:03Z",
    ]
    text = run(*args)
    assert text.returncode == 0
    assert "HTTP-date" in text.stdout and "3 s ahead of the server" in text.stdout
    assert "retry after 60 s" in text.stdout
    data = json.loads(run(*args, "--json").stdout)
    assert data["form"] == "date"
    assert data["delay"] == 60.0
    assert data["clock_skew"] == 3.0
    assert data["eligible_at"] == "2026-10-21T07:28:03+00:00"
    assert data["decision"]["action"] == "retry"


def test_explain_invalid_value_exits_1_with_the_reason_and_the_consequence() -> None:
    result = run("explain", "soon")
    assert result.returncode == 1
    assert result.stderr == ""
    assert "malformed" in result.stdout
    assert "the adapter would stop (on_invalid='stop')" in result.stdout
    assert "use local backoff (on_invalid='backoff'" in result.stdout


@pytest.mark.parametrize(
    ("value", "reason"),
    [("-1", "malformed"), ("1, 2", "repeated"), ("Wed, 21 Oct 2026 07:28:00 CET", "zone")],
)
def test_explain_invalid_values_as_json(value: str, reason: str) -> None:
    result = run("explain", value, "--json", "--backoff", "2")
    assert result.returncode == 1
    data = json.loads(result.stdout)
    assert data["valid"] is False and data["reason"] == reason
    assert data["on_invalid"]["stop"] == {"action": "stop", "reason": "invalid_retry_after"}
    assert data["on_invalid"]["backoff"]["action"] == "retry"
    assert data["on_invalid"]["backoff"]["wait"] == 2.0


# --------------------------------------------------------------------------- demo
def test_demo_small_run_table_and_json() -> None:
    result = run(
        "demo", "--workers", "4", "--items", "12", "--quota", "4", "--window", "1", "--json",
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)  # stdout is only the JSON document
    stock, adapter = data["runs"]["stock"], data["runs"]["adapter"]
    assert stock["done"] == adapter["done"] == 12
    assert adapter["early"] == 0
    assert adapter["overran"] == 0
    assert adapter["worst_latency"] <= data["config"]["deadline"]
    for run_ in (stock, adapter):
        assert run_["requests"] >= 12
        assert run_["requests"] >= run_["throttled"]
        assert 0 < run_["wall_time"] < 30
        assert not run_["time_limit_hit"]
    # 12 items at 4 per window: every run is throttled, and stock workers ignore each
    # other's 429s, so they provoke at least as many.
    assert stock["throttled"] >= adapter["throttled"] >= 1
    assert stock["early"] > 0
    # The human report (on stderr with --json): what ran, the table, what to look at.
    report = result.stderr
    assert "A local HTTP server allows 4 requests per 1 s window" in report
    assert "items done" in report and "12/12" in report
    assert "requests sent early" in report
    assert 'Look at "requests sent early"' in report
    assert "items done" in report.split("Look at")[0]


def test_get_has_a_documented_default_deadline() -> None:
    from retry_after_adapter.cli import DEFAULT_GET_DEADLINE, build_parser

    assert build_parser().parse_args(["get", "http://127.0.0.1/x"]).deadline == DEFAULT_GET_DEADLINE == 10.0
    assert "default 10" in run("get", "--help").stdout
    assert "| `--deadline S` | 10 |" in (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()


def test_get_on_an_unreachable_host_returns_within_the_deadline(closed_port: int) -> None:
    # Without a deadline the default policy would back off 0 + 1 + 2 + 4 + 8 s.
    started = time.monotonic()
    result = run("get", f"http://127.0.0.1:{closed_port}/x", "--deadline", "0.8")
    took = time.monotonic() - started
    assert result.returncode == 69 and "connection refused" in one_line(result.stderr)
    # The interpreter's start-up and the 0.8 s deadline take 1.8 s with both cores busy;
    # the bound is three times that, well short of the 15 s of back-off.
    assert took < 0.8 + 4.8


# --------------------------------------------------------------------------- status, clear
def test_status_lists_running_cooldowns_and_clear_lifts_one(
    real_server: ThrottleServer, tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'cooldown.db'}"
    real_server.serve([Reply(429, {"Retry-After": "600"})])
    assert run("get", real_server.url + "/x", "--cooldown", db).returncode == 75
    scope = f"http://127.0.0.1:{real_server.port}"
    listed = run("status", "--cooldown", db, "--json")
    assert listed.returncode == 0, listed.stderr
    cooldowns = json.loads(listed.stdout)["cooldowns"]
    assert [c["scope"] for c in cooldowns] == [scope]
    assert 590 < cooldowns[0]["seconds_left"] <= 600
    table = run("status", "--cooldown", db)
    assert scope in table.stdout and "eligible at (UTC)" in table.stdout
    # The operator lifts it: the next get is sent (and answered) at once.
    cleared = run("clear", scope, "--cooldown", db)
    assert cleared.returncode == 0, cleared.stderr
    assert f"cleared the cooldown of {scope}" in cleared.stdout
    assert json.loads(run("status", "--cooldown", db, "--json").stdout)["cooldowns"] == []
    again = run("clear", scope, "--cooldown", db)
    assert again.returncode == 1  # nothing left to clear
    assert f"nothing is stored for {scope}" in again.stderr
    assert "like it" not in again.stderr  # the hint never names the scope it just missed
    real_server.serve([Reply(200, body=b"ok\n")])
    assert run("get", real_server.url + "/x", "--cooldown", db).returncode == 0
    assert real_server.count() == 1


@pytest.mark.redis
def test_status_and_clear_on_redis(redis_url: str, redis_client: object) -> None:
    from retry_after_adapter import RedisCooldownStore

    store = RedisCooldownStore.from_url(redis_url)
    store.extend("https://api.example.com:443", datetime.now(timezone.utc) + timedelta(seconds=60))
    listed = json.loads(run("status", "--cooldown", redis_url, "--json").stdout)["cooldowns"]
    assert [c["scope"] for c in listed] == ["https://api.example.com:443"]
    assert run("clear", "https://api.example.com:443", "--cooldown", redis_url).returncode == 0
    assert store.get("https://api.example.com:443") is None
    store.close()


#: A store of one's own, as a third party writes it from docs/stores.md: the core and
#: Listing, its cooldowns in a JSON file beside the module.
OWN_STORE = """
import json
from datetime import datetime
from pathlib import Path

from retry_after_adapter.cooldown import Hold, Listing, Store

PATH = Path(__file__).with_name("held.json")


class FileStore(Store, Listing):
    def _read(self):
        return json.loads(PATH.read_text()) if PATH.exists() else {}

    def get(self, scope):
        value = self._read().get(scope)
        return None if value is None else datetime.fromisoformat(value)

    def extend(self, scope, until):
        held = self._read()
        kept = max(until, datetime.fromisoformat(held[scope])) if scope in held else until
        held[scope] = kept.isoformat()
        PATH.write_text(json.dumps(held))
        return kept

    def entries(self):
        return {scope: datetime.fromisoformat(v) for scope, v in self._read().items()}

    def holds(self, now=None):
        return {scope: [Hold("cooldown", until)] for scope, until in self.entries().items()}

    def delete(self, scope):
        held = self._read()
        found = held.pop(scope, None) is not None
        PATH.write_text(json.dumps(held))
        return found


class CoreOnly(Store):
    def get(self, scope):
        return None

    def extend(self, scope, until):
        return until


def make():
    return FileStore()


def core_only():
    return CoreOnly()


def leaky():
    raise ValueError("cannot reach redis://user:hunter2@db:6379/0 password=hunter2")
"""


def test_status_and_clear_work_on_a_store_of_ones_own(tmp_path: Path) -> None:
    (tmp_path / "own_store.py").write_text(OWN_STORE)
    scope = "https://api.example.com:443"
    until = datetime.now(timezone.utc) + timedelta(seconds=300)
    (tmp_path / "held.json").write_text(json.dumps({scope: until.isoformat()}))
    listed = run("status", "--cooldown", "own_store:make", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    cooldowns = json.loads(listed.stdout)["cooldowns"]
    assert [c["scope"] for c in cooldowns] == [scope]
    assert [h["kind"] for h in cooldowns[0]["held_by"]] == ["cooldown"]
    cleared = run("clear", scope, "--cooldown", "own_store:make", cwd=tmp_path)
    assert cleared.returncode == 0, cleared.stderr
    assert f"cleared the cooldown of {scope}" in cleared.stdout
    assert json.loads((tmp_path / "held.json").read_text()) == {}


def test_status_refuses_a_store_that_lists_nothing_and_a_factory_that_is_not_there(tmp_path: Path) -> None:
    (tmp_path / "own_store.py").write_text(OWN_STORE)
    core = run("status", "--cooldown", "own_store:core_only", cwd=tmp_path)
    assert core.returncode == 2
    assert "CoreOnly cannot list what it holds" in one_line(core.stderr)
    assert "Listing" in core.stderr
    missing = run("status", "--cooldown", "own_store:nothing", cwd=tmp_path)
    assert missing.returncode == 2
    assert "'own_store' has no 'nothing'" in one_line(missing.stderr)
    unknown = run("clear", "x", "--cooldown", "no_such_module:make", cwd=tmp_path)
    assert unknown.returncode == 2
    assert "cannot import 'no_such_module'" in one_line(unknown.stderr)
    # A factory's failure is told by its kind: its message may hold the store's secrets.
    leaky = run("status", "--cooldown", "own_store:leaky", cwd=tmp_path)
    assert leaky.returncode == 2
    assert "own_store:leaky failed to make the store: ValueError" in one_line(leaky.stderr)
    assert "hunter2" not in leaky.stderr and "user" not in leaky.stderr
    # A mistyped URL is a URL, not a module to import.
    typo = run("status", "--cooldown", "sqlite:cooldown.db", cwd=tmp_path)
    assert typo.returncode == 2 and "cannot import" not in typo.stderr


def test_status_refuses_the_in_process_memory_store() -> None:
    result = run("status", "--cooldown", "memory://")
    assert result.returncode == 2
    assert "lives inside one process" in one_line(result.stderr)


def test_status_of_an_unreachable_store_exits_69(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database" * 100)
    result = run("status", "--cooldown", f"sqlite:///{garbage}")
    assert result.returncode == 69, result.stderr
    assert "is not a database" in one_line(result.stderr)


def test_status_and_clear_never_create_a_store_file(tmp_path: Path) -> None:
    """A mistyped path is not an all-clear: 0.9 created an empty database there and said
    "no cooldown is running" (exit 0). Now it exits 69, says the file does not exist,
    and no file is made."""
    missing = tmp_path / "cooldwon.db"
    for args in (("status",), ("clear", "https://api.example.com:443")):
        result = run(*args, "--cooldown", f"sqlite:///{missing}")
        assert result.returncode == 69, (args, result.stdout, result.stderr)
        assert "does not exist" in one_line(result.stderr)
        assert not missing.exists()


def test_explain_rejects_an_absurd_retry_after_and_names_the_bound() -> None:
    result = run("explain", "99999999999999999999", "--json")
    assert result.returncode == 1
    doc = json.loads(result.stdout)
    assert doc["reason"] == "beyond_max"
    assert doc["on_invalid"]["stop"]["reason"] == "retry_after_too_long"
    assert run("explain", "99999999999999999999", "--max-retry-after", "none").returncode == 0
