"""RetryAfterRetry inside a real library that takes a urllib3 ``retry=`` argument and
mounts it on a *stock* ``HTTPAdapter``: PyGithub (a test-only dependency)."""

from __future__ import annotations

import time

import pytest
import requests

from retry_after_adapter import MaxRetryDeferred, RetryAfterRetry, deferral_of

from ..servers import Reply

github = pytest.importorskip("github", reason="PyGithub is a test dependency: pip install -e '.[test]'")


def test_pygithub_gets_the_retry_error_stock_raises_with_the_deferral_inside(real_server):
    real_server.serve(
        [Reply(429, {"Retry-After": "120", "Content-Type": "application/json"}, b'{"message": "slow down"}')]
    )
    client = github.Github(
        base_url=real_server.url + "/api/v3", retry=RetryAfterRetry(total=3, max_wait=5), timeout=5
    )
    started = time.monotonic()
    with pytest.raises(requests.exceptions.RetryError) as raised:
        client.get_user("octocat").login  # the request is lazy: reading an attribute sends it
    assert time.monotonic() - started < 2.0  # nothing waited
    assert real_server.count() == 1  # one request sent, nothing early
    deferral = deferral_of(raised.value)
    assert deferral is not None and deferral.reason == "max_wait" and deferral.delay == 120.0
    assert isinstance(raised.value.args[0], MaxRetryDeferred)  # what requests wrapped


def test_pygithub_waits_out_a_retry_after_that_fits(real_server):
    real_server.serve(
        [
            Reply(503, {"Retry-After": "1"}),
            Reply(200, {"Content-Type": "application/json"}, b'{"login": "octocat", "id": 1}'),
        ]
    )
    client = github.Github(
        base_url=real_server.url + "/api/v3", retry=RetryAfterRetry(total=3, max_wait=5), timeout=5
    )
    assert client.get_user("octocat").login == "octocat"
    seen = real_server.seen
    assert len(seen) == 2 and (seen[1].at - seen[0].at).total_seconds() >= 1.0
