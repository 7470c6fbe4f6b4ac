"""The conformance kit fails broken stores, on every run, saying what is broken: the
kit (``retry_after_adapter.testing.conformance``) runs against each store of
``kit_broken_stores.py`` in a pytest of its own, and its failures are read from that
run's JUnit XML report.

The package's own stores and the example stores pass the same kit
(``test_conformance.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

BROKEN = Path(__file__).with_name("kit_broken_stores.py")
ROOT = BROKEN.parents[2]


@pytest.fixture(scope="module")
def failures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    """For each broken store's contract class: each failed test and its message."""
    report = tmp_path_factory.mktemp("kit") / "report.xml"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", str(BROKEN)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert report.exists(), done.stdout[-2000:] + done.stderr[-2000:]
    found: dict[str, dict[str, str]] = {}
    for case in ET.parse(report).iter("testcase"):
        cls = case.get("classname", "").rpartition(".")[2]
        found.setdefault(cls, {})
        failure = case.find("failure")
        error = case.find("error")
        assert error is None, f"{cls}::{case.get('name')} errored: {error.get('message')}"
        if failure is not None:
            found[cls][case.get("name", "")] = failure.get("message", "")
    return found


ATOMIC = {
    "test_a_quota_permit_is_atomic_in_every_order",
    "test_a_slot_is_atomic_in_every_order",
    "test_an_announced_allowance_is_atomic_in_every_order",
    "test_a_token_quota_is_atomic_in_every_order",
}
#: The kit's racing threads: they may catch a store that is not atomic, or not.
RACES = {"test_admission_is_atomic_under_threads", "test_tokens_are_weighed_exactly_under_threads"}


def test_a_store_whose_holds_list_nothing_fails(failures: dict[str, dict[str, str]]) -> None:
    failed = failures["TestKitOnHoldsNothing"]
    assert set(failed) == {"test_holds_names_what_holds_each_scope_back", "test_token_holds_are_listed"}
    assert "HoldsNothing.holds() does not list the 'cooldown'" in failed["test_holds_names_what_holds_each_scope_back"]
    # A store without Weights had only the entries and delete test: it failed nothing.
    failed = failures["TestKitOnListsNoHolds"]
    assert set(failed) == {"test_holds_names_what_holds_each_scope_back"}
    assert "ListsNoHolds.holds() does not list the 'cooldown'" in failed["test_holds_names_what_holds_each_scope_back"]


def test_a_feed_fresh_without_delivering_fails(failures: dict[str, dict[str, str]]) -> None:
    failed = failures["TestKitOnDeafFeed"]
    through = "test_a_worker_that_asked_before_is_held_by_a_cooldown_learned_elsewhere"
    assert set(failed) == {"test_a_fresh_feed_delivers_every_change", through}
    message = failed["test_a_fresh_feed_delivers_every_change"]
    assert "DeafFeed's feed still says it is fresh" in message and "never delivered it" in message
    # Through the adapter: a worker that had sent before sends into the cooldown.
    assert "a worker on DeafFeed that had sent before sent into a cooldown" in failed[through]


@pytest.mark.parametrize(
    ("cls", "store", "checks"),
    [
        ("TestKitOnUnlockedMemoryStore", "UnlockedMemoryStore", ATOMIC),
        (
            "TestKitOnReadThenWriteStore",
            "ReadThenWriteStore",
            {"test_a_quota_permit_is_atomic_in_every_order", "test_a_slot_is_atomic_in_every_order"},
        ),
    ],
)
def test_an_admit_that_is_not_atomic_fails_every_time(
    failures: dict[str, dict[str, str]], cls: str, store: str, checks: set[str]
) -> None:
    failed = failures[cls]
    assert checks <= set(failed), sorted(failed)
    for check in checks:
        assert f"{store}.admit is not atomic: two admissions of" in failed[check]
        assert "were both granted when the first was paused at" in failed[check]
    if cls == "TestKitOnUnlockedMemoryStore":  # the memory store's every other behaviour is kept
        assert set(failed) <= ATOMIC | RACES, sorted(failed)


@pytest.mark.parametrize(
    ("cls", "operations", "bound"),
    [
        # A locked file: the first of these that writes waits out its 1.5 s (a read may not).
        ("TestKitOnUnderstatesItsBound", ("get", "extend", "admit"), "0.1 s"),
        # Every operation but answer keeps the bound.
        ("TestKitOnRetriesPastItsBound", ("answer",), "0.2 s"),
    ],
)
def test_a_store_that_breaks_its_declared_bound_fails(
    failures: dict[str, dict[str, str]], cls: str, operations: tuple[str, ...], bound: str
) -> None:
    failed = failures[cls]
    assert set(failed) == {"test_a_declared_bound_holds_when_the_backend_hangs"}
    message = failed["test_a_declared_bound_holds_when_the_backend_hangs"]
    said = f"() declares a bound of {bound} (operation_timeout()) but did not end within"
    assert any(f".{operation}{said}" in message for operation in operations), message
