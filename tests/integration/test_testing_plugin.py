"""The pytest plugin, run as a user's own test suite under ``responses`` (pytester runs
it in a fresh pytest session, with the plugin loaded by its entry point)."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

USERS_TESTS = """
import requests
import responses

from retry_after_adapter import RetryAfterAdapter, RetryAfterRetry, deferral_of

URL = "https://api.example.test/items"


def session(clock=None):
    s = requests.Session()
    # No cooldown= given: the process-wide default store, as most users have it.
    s.mount("https://", RetryAfterAdapter(RetryAfterRetry(total=2, max_wait=10, clock=clock)))
    return s


@responses.activate
def test_a_throttled_call_defers():
    responses.add(responses.GET, URL, status=429, headers={"Retry-After": "120"})
    assert deferral_of(session().get(URL)).reason == "max_wait"


@responses.activate
def test_the_next_test_reaches_its_mock():
    responses.add(responses.GET, URL, status=200, body="fresh")
    assert session().get(URL).text == "fresh"
    assert len(responses.calls) == 1


@responses.activate
def test_waits_run_on_the_fake_clock(fake_clock):
    responses.add(responses.GET, URL, status=503, headers={"Retry-After": "7"})
    responses.add(responses.GET, URL, status=200, body="later")
    assert session(fake_clock).get(URL).text == "later"
    assert fake_clock.sleeps == [7.0] and len(responses.calls) == 2


def test_fake_retry_is_on_the_fake_clock(fake_retry, fake_clock):
    assert fake_retry(total=1).clock is fake_clock
"""


def test_the_plugin_gives_each_test_a_fresh_default_store(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_users=USERS_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)


def test_without_the_plugin_the_cooldown_leaks_into_the_next_test(pytester: pytest.Pytester) -> None:
    # The leak the plugin exists for: the second test defers without reaching its mock.
    pytester.makepyfile(test_users=USERS_TESTS.split("@responses.activate\ndef test_waits_run")[0])
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:retry_after_adapter")
    result.assert_outcomes(passed=1, failed=1)


def python_prints(code: str) -> list[str]:
    """The lines ``code`` prints, run in a fresh interpreter."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_the_plugin_imports_nothing_of_the_package_at_start_up():
    # pytest loads the plugin in every test run of a project that has the package
    # installed: that must not import requests, urllib3 or the engine (it did: 0.3 s).
    code = (
        "import sys, retry_after_adapter.testing.plugin\n"
        "heavy = [m for m in ('requests', 'urllib3', 'http_sf', 'retry_after_adapter.engine',\n"
        "         'retry_after_adapter.cooldown.memory') if m in sys.modules]\n"
        "print(heavy)\n"
        "from retry_after_adapter import RetryAfterAdapter, FakeClock  # still there on use\n"
        "print(RetryAfterAdapter.__name__, FakeClock.__name__)\n"
    )
    assert python_prints(code) == ["[]", "RetryAfterAdapter FakeClock"]


def test_the_testing_package_imports_its_names_on_first_use():
    # ``import retry_after_adapter.testing`` costs nothing, not even pytest: QuotaServer
    # and reset_default_store work outside a test run too.
    code = (
        "import sys, retry_after_adapter.testing as testing\n"
        "print([m for m in ('pytest', 'requests', 'urllib3', 'retry_after_adapter.clock') if m in sys.modules])\n"
        "from retry_after_adapter.testing import reset_default_store\n"
        "reset_default_store()\n"
        "print([m for m in ('pytest', 'requests') if m in sys.modules])\n"
        "from retry_after_adapter import FakeClock\n"
        "print(testing.QuotaServer.__name__, testing.FakeClock is FakeClock)\n"
    )
    assert python_prints(code) == ["[]", "[]", "QuotaServer True"]


def test_the_old_plugin_module_name_still_loads_the_plugin(pytester: pytest.Pytester) -> None:
    # Before the plugin had a module of its own, its entry point (and any ``-p``) named
    # the package: loaded under that name, the package loads the plugin.
    pytester.makepyfile(
        test_users="def test_the_fixtures_are_there(fake_clock, fake_retry):\n"
        "    assert fake_retry(total=1).clock is fake_clock\n"
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:retry_after_adapter", "-p", "retry_after_adapter.testing"
    )
    result.assert_outcomes(passed=1)
