"""Users' code type-checks under ``mypy --strict``: the typed ways to read a deferral."""

from __future__ import annotations

import pytest

USERS_CODE = """
from __future__ import annotations

from datetime import datetime

import requests
import urllib3

from retry_after_adapter import (
    Deferral, Reason, RetryAfterAdapter, RetryAfterPoolManager, RetryAfterResponse, RetryAfterRetry,
    RetryDeferred, deferral_of,
)

session = requests.Session()
session.mount("https://", RetryAfterAdapter(max_retries=RetryAfterRetry(total=3, deadline=10)))


def when(url: str) -> datetime | None:
    try:
        response = session.get(url)
    except RetryDeferred as deferred:           # transport errors, raise_on_defer=True
        return deferred.deferral.eligible_at
    deferral: Deferral | None = deferral_of(response)
    if deferral is not None and deferral.reason is Reason.MAX_WAIT:
        return deferral.eligible_at
    if isinstance(response, RetryAfterResponse) and response.deferral is not None:
        local: bool = response.local
        return response.deferral.eligible_at if local else None
    return None


def plain(url: str) -> float | None:
    http = RetryAfterPoolManager(retries=RetryAfterRetry(total=2))
    response = http.request("GET", url)
    found = deferral_of(response)
    return None if found is None else found.delay


def reason_text(error: urllib3.exceptions.MaxRetryError) -> str | None:
    found = deferral_of(error)
    return None if found is None else str(found.reason)
"""


def test_users_code_passes_mypy_strict(tmp_path):
    api = pytest.importorskip("mypy.api", reason="mypy is a dev dependency: pip install -e '.[dev]'")
    (tmp_path / "users_code.py").write_text(USERS_CODE, encoding="utf-8")
    stdout, stderr, status = api.run(
        [
            "--strict",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / ".mypy"),
            str(tmp_path / "users_code.py"),
        ]
    )
    assert status == 0, stdout + stderr


def test_a_plain_response_has_no_deferral_attribute_for_mypy(tmp_path):
    # The reason for deferral_of and RetryAfterResponse: session.get() is a Response.
    api = pytest.importorskip("mypy.api", reason="mypy is a dev dependency: pip install -e '.[dev]'")
    code = "import requests\nr = requests.get('https://x.test')\nprint(r.deferral)\n"
    (tmp_path / "bad.py").write_text(code, encoding="utf-8")
    stdout, _, status = api.run(
        ["--strict", "--no-incremental", "--cache-dir", str(tmp_path / ".mypy"), str(tmp_path / "bad.py")]
    )
    assert status == 1 and 'has no attribute "deferral"' in stdout
