"""A deferral raised: the exceptions that carry a :class:`~retry_after_adapter.Deferral`.

:class:`RetryDeferred` (the adapter's and the transports' ``raise_on_defer``),
:class:`MaxRetryDeferred` (a deferral decided inside a stock urllib3 loop) and
:class:`DeferralLimitExceeded` (a job deferred too often). They derive from
:class:`~retry_after_adapter.errors.RetryAfterError` like every error of the package;
they live above :mod:`~retry_after_adapter.deferral` (which the plain errors are
below), so that nothing imports in a circle.
"""

from __future__ import annotations

from typing import Any

from requests.exceptions import RequestException, RetryError
from urllib3.exceptions import MaxRetryError

from .deferral import Deferral
from .errors import RetryAfterError


class RetryDeferred(RetryError, RetryAfterError):
    """The call was deferred: the server's wait does not fit the caller's budget.

    ``deferral`` says when a new attempt becomes eligible; ``response`` is the last
    :class:`requests.Response` (or urllib3 response when used without requests), or
    ``None`` when nothing was received (deferred before sending, or after a
    transport error). ``reason``: why urllib3 would have stopped (the reason of its
    ``MaxRetryError`` when retries ran out), put first in the message.
    """

    def __init__(
        self, deferral: Deferral, response: Any = None, request: Any = None, reason: object = None
    ) -> None:
        self.deferral = deferral
        message = (
            f"deferred ({deferral.reason}): retry eligible at "
            f"{deferral.eligible_at.isoformat()} (in {deferral.delay:.3f} s)"
        )
        if reason is not None:
            # urllib3's own words first ("too many 503 error responses"), as a stock
            # RetryError says them: code that matches on them keeps working.
            message = f"{reason}; {message}"
        super().__init__(message, response=response, request=request)

    def __reduce__(self) -> tuple[Any, ...]:
        # BaseException pickles as type(*args), which this __init__ does not take.
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))

    @classmethod
    def keeping(cls, error: RequestException, deferral: Deferral) -> RetryDeferred:
        """``error`` (what ``HTTPAdapter`` raised for the last attempt) as an exception
        of its own class *and* a ``RetryDeferred`` carrying ``deferral``: ``except
        requests.Timeout`` and ``except RetryDeferred`` both catch it."""
        if isinstance(error, RetryDeferred):
            error.deferral = deferral
            return error
        kind = _keeping_class(type(error))
        kept: RetryDeferred = kind.__new__(kind)
        RequestException.__init__(
            kept,
            *error.args,
            request=getattr(error, "request", None),
            response=getattr(error, "response", None),
        )
        kept.deferral = deferral
        return kept


def _rebuild(kind: type[RetryDeferred], args: tuple[Any, ...], state: dict[str, Any]) -> RetryDeferred:
    error: RetryDeferred = kind.__new__(kind)
    error.args = args
    error.__dict__.update(state)
    return error


_KEEPING: dict[type[BaseException], type[RetryDeferred]] = {}


def _keeping_class(base: type[RequestException]) -> type[RetryDeferred]:
    """The class ``Deferred<Base>(RetryDeferred, Base)``, made once per base and kept
    in this module (so instances pickle by name)."""
    kind = _KEEPING.get(base)
    if kind is None:
        name = f"Deferred{base.__name__}"
        kind = type(name, (RetryDeferred, base), {"__module__": __name__, "__qualname__": name})
        _KEEPING[base] = kind
        globals().setdefault(name, kind)
    return kind


class MaxRetryDeferred(MaxRetryError, RetryAfterError):
    """urllib3's ``MaxRetryError`` for a deferral decided inside a *stock* urllib3 loop.

    Raised by :meth:`RetryAfterRetry.increment` when the policy is handed to a plain
    ``urllib3.PoolManager`` or to a stock ``HTTPAdapter`` (as libraries that take a
    ``retry=`` argument do): there ``requests`` turns it into the ``RetryError`` it
    raises when retries end. ``deferral`` says when to try again; ``response`` is the
    last urllib3 response, or None. :func:`~retry_after_adapter.deferral_of` finds it
    in any exception chain.
    """

    def __init__(
        self, pool: Any, url: str | None, reason: Exception | None, deferral: Deferral, response: Any = None
    ) -> None:
        super().__init__(pool, url or "", reason)
        self.deferral = deferral
        self.response = response

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (None, self.url, self.reason, self.deferral, None))


class DeferralLimitExceeded(RetryAfterError):
    """A call would be deferred more often than ``max_deferrals`` (or past its lifetime).

    ``deferral`` is the deferral that went over the limit; ``chain`` is every deferral
    of the job, oldest first, that one included.
    """

    def __init__(self, deferral: Deferral, limit: str) -> None:
        self.deferral = deferral
        self.limit = limit
        self.chain = deferral.chain()
        super().__init__(
            f"gave up after {deferral.deferrals} deferrals and {deferral.attempts} attempts "
            f"({limit}); last reason {deferral.reason}"
        )
