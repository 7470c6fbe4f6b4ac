"""What providers' dialects teach an adapter beyond one scope's cooldown and allowance,
kept per plan (per adapter), bounded, in memory:

- **Discord's buckets.** A response's ``X-RateLimit-Bucket`` says which limit its route
  counts against. From then on, that route (its method and path, without the query)
  of this adapter is scoped ``<scope>|bucket:<hash>``: the request's own scope refined
  by the bucket and the route's major parameter (a channel, a guild, a webhook: Discord
  counts a bucket per top-level resource). Two routes that report the same bucket
  under the same major parameter share that scope's cooldown and allowance in the
  store, for every worker that learned the route; a route not seen yet, and every
  route of an API that sends no bucket, keeps its scope as before. A response marked
  global (``X-RateLimit-Global: true``, ``X-RateLimit-Scope: global``) sets the
  cooldown of the unrefined scope: a call of a refined route reads that cooldown once,
  when it starts (one store read more, only for refined routes), and holds back for it.
- **GitHub's secondary limits** that name no wait: at least 60 s, doubled while such
  answers repeat (an answer within the last wait after the previous one ended), per
  unrefined scope; the streak is this adapter's (the cooldown itself is shared).

Bounds: :data:`MAX_ROUTES` routes and :data:`MAX_STREAKS` streaks per plan, the oldest
forgotten first (a forgotten route falls back to its unrefined scope until it answers
again).
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

from ..dialects import bucket_key, major_parameter, secondary_wait

__all__ = ["MARK", "MAX_ROUTES", "MAX_STREAKS", "Dialects", "base_scope"]

#: Routes whose bucket a plan remembers.
MAX_ROUTES = 4096
#: Scopes whose secondary-limit streak a plan remembers.
MAX_STREAKS = 1024
#: What separates a scope from its bucket in a refined scope.
MARK = "|bucket:"


def base_scope(scope: str) -> str:
    """The unrefined scope of ``scope`` (itself when it is not refined by a bucket)."""
    at = scope.find(MARK)
    return scope if at < 0 else scope[:at]


def _path(url: str) -> str:
    """The path of ``url`` (absolute or a path), without query or fragment."""
    rest = url.partition("://")[2] if "://" in url else url
    if "://" in url:
        slash = rest.find("/")
        rest = rest[slash:] if slash >= 0 else "/"
    return rest.split("?", 1)[0].split("#", 1)[0] or "/"


class Dialects:
    """Per plan: routes refined by their bucket, secondary-limit streaks (see the module)."""

    __slots__ = ("_lock", "routes", "streaks")

    def __init__(self) -> None:
        #: ``"<scope>\\0<METHOD> <path>"`` -> the refined scope of that route.
        self.routes: dict[str, str] = {}
        #: unrefined scope -> (answers in a row, when the last wait ends).
        self.streaks: dict[str, tuple[int, datetime]] = {}
        self._lock = threading.Lock()

    # -- Discord -----------------------------------------------------------------------
    def refine(self, scope: str, method: str | None, url: str | None) -> str:
        """The scope a request of this route is admitted under: refined when the route
        has reported a bucket, else ``scope``. Costs nothing until a bucket is seen."""
        if not self.routes:
            return scope
        return self.routes.get(_route(scope, method, url), scope)

    def learn(self, scope: str, method: str | None, url: str | None, bucket: str) -> str:
        """Remember that this route counts against ``bucket``; its refined scope."""
        base = base_scope(scope)
        path = _path(url or "")
        refined = f"{base}|{bucket_key(bucket, major_parameter(path))}"
        key = _route(base, method, url)
        if self.routes.get(key) != refined:
            with self._lock:
                while len(self.routes) >= MAX_ROUTES:
                    self.routes.pop(next(iter(self.routes)), None)
                self.routes[key] = refined
        return refined

    # -- GitHub ------------------------------------------------------------------------
    def streak(self, scope: str, now: datetime) -> int:
        """Count one more secondary limit of ``scope`` answered at ``now``: 1 unless
        the previous one's wait ended less than that wait ago."""
        with self._lock:
            count, ends = self.streaks.get(scope, (0, now))
            if count and now > ends + timedelta(seconds=secondary_wait(count)):
                count = 0  # no longer repeating: start again from the least wait
            count += 1
            while len(self.streaks) >= MAX_STREAKS and scope not in self.streaks:
                self.streaks.pop(next(iter(self.streaks)), None)
            self.streaks[scope] = (count, now + timedelta(seconds=secondary_wait(count)))
            return count


def _route(scope: str, method: str | None, url: str | None) -> str:
    return f"{base_scope(scope)}\0{(method or 'GET').upper()} {_path(url or '')}"
