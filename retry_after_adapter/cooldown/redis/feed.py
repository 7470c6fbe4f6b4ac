"""The change feed of a Redis store in one process: a thread subscribed to the store's
channel, on which the store's scripts publish every cooldown that moved (``extend``),
every scope first announced an allowance (``allow``), every learned rate that stopped
being open (``rate_answer``) and every scope an operator lifted (``delete``), each
before it is written, so a writer that may not PUBLISH writes nothing.

A message only says *which* scope changed: the near copy drops what it knew of it and
the next attempt reads the store, so a message nobody should have sent (a forged
``PUBLISH`` of a cooldown that ends in 9999) costs a round trip, never a wait. The
channel is one per database and key prefix.

The feed is fresh while its subscription is confirmed and a message came through the
channel within :data:`STALE_AFTER` seconds: a canary that this process publishes
on it when nothing came for :data:`PING_EVERY` seconds (a little more, at random: in a
fleet, one process's canary serves every subscriber), or any change. A subscription
that answers but carries nothing (a proxy, a channel no writer reaches) is stale
within that bound, like one that breaks or hangs: every attempt then goes to the store,
and this is logged once (at INFO: nothing is lost, only speed; a store that is down has
its own warning). A canary this process may not publish (Redis answers NOPERM) is
logged once, by name, at WARNING (its own writes fail the same way); a canary that
fails otherwise (a timeout, a refused or lost connection) is named as what it was, at
INFO, at most once per :data:`QUIET` seconds. The thread subscribes again with a
backoff; once confirmed, the near copy starts over (messages published meanwhile were
missed).
"""

from __future__ import annotations

import logging
import random
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from ... import _forksafe
from ..base import Changed, Feed

__all__ = ["CHANNEL", "PING_EVERY", "STALE_AFTER", "RedisFeed"]

log = logging.getLogger("retry_after_adapter")

#: The channel's name: this, then the store's key prefix.
CHANNEL = "retry-after-adapter:changes:"
#: Seconds without a message on the channel after which this process publishes a
#: canary on it (plus up to half as much again, at random).
PING_EVERY = 0.5
#: Seconds without a message on the channel after which the feed is stale.
STALE_AFTER = 1.5
#: The canary's message: no scope changed (an older reader drops the scope "-").
CANARY = "k 0 -"
#: Seconds without an attempt asking after which the thread unsubscribes and ends (the
#: next attempt starts it again: a store nobody uses holds no connection).
UNUSED_FOR = 30.0
#: Seconds to wait before subscribing again, at first and at most.
RETRY_FIRST = 0.05
RETRY_MAX = 1.0
#: Seconds between two lines about canaries that failed other than by permission.
QUIET = 30.0


class RedisFeed(Feed):
    """See the module. The thread starts with the first :meth:`fresh` (a store that is
    never used opens no subscription), and again in a forked child."""

    def __init__(
        self, client: Any, channel: str, changed: Changed, failure: Callable[[str, BaseException], Exception]
    ) -> None:
        self._client = client
        self._channel = channel
        self._changed = changed
        self._failure = failure
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        #: Fresh until this time.monotonic() (0: not subscribed).
        self._until = 0.0
        self._warned = False
        self._canary_refused = False
        #: When (time.monotonic()) a canary's failure other than NOPERM was last logged.
        self._canary_failed = -QUIET
        #: When (time.monotonic()) an attempt last asked.
        self._asked = 0.0
        #: Times the subscription was confirmed (the first one included).
        self.subscriptions = 0
        _forksafe.register(self)

    def fresh(self) -> bool:
        now = time.monotonic()
        self._asked = now
        if self._until > now:
            return True
        if self._thread is None and not self._closed:
            self._start()
        return False

    def _start(self) -> None:
        with self._lock:
            if self._thread is None and not self._closed:
                # The thread holds the feed weakly: a store dropped ends its thread.
                self._thread = threading.Thread(
                    target=_follow, args=(weakref.ref(self),), name="retry-after-feed", daemon=True
                )
                self._thread.start()

    def close(self) -> None:
        self._closed = True
        self._until = 0.0

    def _done(self) -> bool:
        """Whether the thread should end: the feed closed, or unused for a while."""
        if self._closed or time.monotonic() - self._asked > UNUSED_FOR:
            self._until = 0.0
            self._thread = None
            return True
        return False

    def _subscribe(self) -> Any:
        pubsub = self._client.pubsub()
        try:
            pubsub.subscribe(self._channel)
        except BaseException:
            _close(pubsub)
            raise
        _no_silent_reconnect(pubsub)
        return pubsub

    def _broke(self, exc: BaseException | None, operation: str = "subscribe") -> None:
        """The channel broke during ``operation`` (``exc``), or carried nothing for
        :data:`STALE_AFTER` seconds (``exc`` None): stale, and said once."""
        self._until = 0.0
        if not self._warned and not self._closed:
            self._warned = True
            why = (
                f"no message came through it for {STALE_AFTER:g} s"
                if exc is None
                else str(self._failure(operation, exc))
            )
            log.info(
                "the cooldown store's change channel is unavailable (%s); every attempt "
                "reads the store until it is back",
                why,
            )

    def _heard(self, message: dict[str, Any], confirmed: bool) -> tuple[bool, bool]:
        """Handle one message: ``(confirmed, carried)``, whether the subscription is
        confirmed and whether the message came through the channel."""
        kind = message.get("type")
        if kind in ("subscribe", b"subscribe"):
            # Every confirmation, the first or one after a client's own reconnect: what
            # was published before it may have been missed, so the copy starts over.
            self.subscriptions += 1
            self._changed(None, None)  # what was published before is unknown: start over
            if self._warned:
                self._warned = False
                log.info("the cooldown store's change channel is back")
            return True, False
        if kind in ("message", b"message"):
            self._deliver(message.get("data"))
            return confirmed, True
        return confirmed, False

    def _canary(self) -> None:
        """Publish a canary on the channel (see the module): a refusal (NOPERM) is
        logged once at WARNING, any other failure named as what it was, at INFO."""
        try:
            self._client.publish(self._channel, CANARY)
        except Exception as exc:
            if no_permission(exc):
                if not self._canary_refused:
                    self._canary_refused = True
                    log.warning(
                        "this process may not publish on the cooldown store's change channel (%s): "
                        "it relies on other processes' messages to trust its near copy, and "
                        "every cooldown it learns fails to be written",
                        self._failure("publish", exc),
                    )
                return
            now = time.monotonic()
            if now - self._canary_failed >= QUIET:
                self._canary_failed = now
                log.info(
                    "a canary on the cooldown store's change channel was not published (%s): "
                    "the near copy is trusted only while messages come through",
                    self._failure("publish", exc),
                )
    def _deliver(self, data: object) -> None:
        """``"<kind> <value> <scope>"``: ``scope`` changed (``c``: a cooldown moved, ``a``:
        an allowance announced, ``r``: a rate closed, ``d``: lifted): read again, the
        value never trusted. ``"k 0 -"``: a canary, nothing changed. Anything else:
        start over."""
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
        if text == CANARY:
            return
        parts = text.split(" ", 2)
        if len(parts) != 3 or not parts[2]:
            self._changed(None, None)
            return
        self._changed(parts[2], None)

    def _after_fork(self) -> None:
        """In a forked child: the parent's thread and connection are not this process's."""
        self._lock = threading.Lock()
        self._thread = None
        self._until = 0.0


def no_permission(exc: BaseException) -> bool:
    """Whether ``exc`` (or one in its chain) is Redis's NOPERM answer: a client's
    ``NoPermissionError``, or an error reply whose text starts with NOPERM (a client
    that does not map it). A timeout, a refused or lost connection never is."""
    current: BaseException | None = exc
    for _ in range(8):
        if current is None:
            return False
        if type(current).__name__ == "NoPermissionError" or str(current).startswith("NOPERM"):
            return True
        current = current.__cause__ or current.__context__
    return False


def _no_silent_reconnect(pubsub: Any) -> None:
    """Best effort: have the subscription's connection raise on a broken socket instead
    of reconnecting inside ``get_message`` (redis-py retries with the client's
    ``Retry``), so that the feed goes stale at once rather than after a silent gap."""
    connection = getattr(pubsub, "connection", None)
    retry = getattr(connection, "retry", None)
    if connection is None or retry is None:
        return
    try:
        from redis.backoff import NoBackoff

        connection.retry = type(retry)(NoBackoff(), 0)
    except Exception as exc:  # another client library: its own reconnect; every confirmation starts over
        log.debug("the change subscription keeps its client's retries: %s", type(exc).__name__)


def _close(pubsub: Any) -> None:
    try:
        pubsub.close()
    except Exception as exc:
        log.debug("closing the change subscription failed: %s", type(exc).__name__)


def _follow(ref: weakref.ref[RedisFeed]) -> None:
    """The feed's thread: subscribe, deliver, PING; on any failure the feed is stale at
    once and subscribes again after a pause. Ends when the feed is gone, closed or
    unused (see :data:`UNUSED_FOR`)."""
    pause = RETRY_FIRST
    while True:
        feed = ref()
        if feed is None or feed._done():
            return
        try:
            pubsub = feed._subscribe()
        except Exception as exc:
            feed._broke(exc)
        else:
            del feed
            try:
                if _listen(ref, pubsub):
                    pause = RETRY_FIRST
            finally:
                _close(pubsub)
        feed = ref()
        if feed is None:
            return
        feed._until = 0.0
        del feed
        time.sleep(pause)
        pause = min(pause * 2, RETRY_MAX)


def _listen(ref: weakref.ref[RedisFeed], pubsub: Any) -> bool:
    """Deliver messages until the feed is gone or done (False), the connection fails,
    or the channel carries nothing past :data:`STALE_AFTER` (True once it was
    confirmed). The feed is fresh only once a message came through the channel after
    the subscription was confirmed (a canary goes out at once, then whenever nothing
    came for :data:`PING_EVERY` seconds and a random part of as much again)."""
    confirmed = carried = False
    heard = time.monotonic()
    quiet = 0.0  # the first canary goes out as soon as the subscription is confirmed
    published = -PING_EVERY
    while True:
        try:
            message = pubsub.get_message(timeout=PING_EVERY / 4)
        except Exception as exc:
            feed = ref()
            if feed is not None:
                feed._broke(exc, "read of the change channel")
            return confirmed
        now = time.monotonic()
        feed = ref()
        if feed is None or feed._done():
            return False
        if message is not None:
            was, (confirmed, through) = confirmed, feed._heard(message, confirmed)
            if through or confirmed != was:
                heard = now  # a message through the channel, or the subscription confirmed
            carried = carried or through
        if now - heard > STALE_AFTER:
            feed._broke(None)
            return confirmed
        if confirmed:
            if carried:
                feed._until = heard + STALE_AFTER  # trusted: messages come through
            if now - heard >= quiet and now - published >= PING_EVERY:
                published = now
                quiet = PING_EVERY * (1 + random.random() / 2)
                feed._canary()
        del feed
