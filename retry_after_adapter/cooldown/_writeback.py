"""The failure layer's write-back: what the store did not take is written when it can.

- A cooldown learned while the store failed (or was busy, or the call ran out of time)
  is *pending*; when the store answers again, every pending cooldown is written to it
  (later-wins), so the other processes and hosts hold back too.
- A store that reports it was replaced under us (a SQLite file deleted or swapped: its
  ``generation`` changes) gets the whole local copy written back.
- A store that failed may come back empty (a Redis restarted without persistence, a
  failover to a replica that had not caught up): at every failure this process notices,
  every cooldown of the local copy still running and every announced allowance whose
  reset is still ahead wait to be written back, as if learned during the outage (see
  :meth:`WriteBack.suspect`). Until the store holds them they are never lowered by its
  answers, so the process never sends inside a cooldown it holds, during the outage or
  after. (A learned rate lives in the store alone: the process holds none to write.)
- A writer thread does it even if this process makes no further call, and tries again
  the slots to give back and the permits to settle that the store did not take, while
  they still matter.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from ..errors import CooldownStoreError
from ._health import BREAKER_MAX_PENDING, Breaker, OutOfTime, StoreBudget
from .allowance import Allowance
from .base import PartwiseStore, Replaceable
from .memory import MemoryCooldownStore

#: Seconds between the writer thread's looks while cooldowns wait to be written back.
WRITER_POLL = 0.1
#: At most this many writes wait for the writer thread (past it, newer ones are not
#: kept: a lease still expires by itself, a permit still counts until its stored end).
MAX_CHORES = 4096
#: Seconds the writer keeps trying to give a slot back (the default ``lease_ttl``: by
#: then the lease has expired by itself).
RELEASE_KEPT = 60.0

log = logging.getLogger("retry_after_adapter")


def stored_covers(stored: datetime | None, local: datetime | None) -> bool:
    """Whether a scope is written back: the store's answer to the write (``stored``,
    None: nothing was written) is at least the local copy's time now. Not "equal to what
    was sent": the local copy may have moved meanwhile to a time the store already holds
    (the change feed's echo of the write itself, in the store's whole milliseconds); a
    later time learned meanwhile stays pending."""
    if stored is None or local is None:
        return stored == local
    return local <= stored


class WriteBack:
    """Pending cooldowns, chores and the writer thread of one store, owned by its
    failure layer: ``inner`` the store, ``local`` the layer's local copy, ``breaker``
    the store's :class:`~._health.Breaker` (which it tells of what waits)."""

    def __init__(
        self, inner: PartwiseStore, local: MemoryCooldownStore, breaker: Breaker,
        replaceable: Replaceable | None = None,
    ) -> None:
        self.inner = inner
        #: The store as it declares its data replaceable (see ``base.Replaceable``), or None.
        self.replaceable = replaceable
        self.local = local
        self.breaker = breaker
        breaker.waiting = self
        #: Scopes learned while the store failed (or held when it failed), not yet
        #: written back.
        self._pending: set[str] = set()
        #: Announced allowances held when the store failed, not yet written back.
        self._allowances: dict[str, Allowance] = {}
        self.lock = threading.Lock()
        self._generation = replaceable.generation if replaceable is not None else None
        #: Goes up at every write (local first, then the store), when a write-back
        #: starts and ends, and when the whole local copy is marked for one: an answer
        #: read across those moments is not mirrored down.
        self.epoch = 0
        #: A write was kept locally while the store was not down (busy, or the call ran
        #: out of time): the next success writes it back.
        self._stranded = False
        #: Everything pending waits for the writer thread to write it back (after a
        #: recovery, a replaced store, a loss nobody noticed): never on a call's thread,
        #: which has its deadline (thousands of cooldowns are a round trip each).
        self._backlog = False
        self.written_back = 0
        #: Announced allowances written back after a failure.
        self.allowances_written_back = 0
        self._writer: threading.Thread | None = None
        #: Held while the writer thread writes, and once closed: ``close`` waits for a
        #: write under way (a store closed under it crashed the process).
        self._writing = threading.Lock()
        self._closed = False
        #: Writes the store did not take (busy or down) that must still land: slots to
        #: give back and permits to settle, as (operation, arguments, give up at).
        self._chores: list[tuple[str, tuple[Any, ...], datetime]] = []

    @property
    def chores_waiting(self) -> int:
        """How many writes the store did not take wait for the writer thread."""
        return len(self._chores)

    @property
    def pending(self) -> int:
        """How many cooldowns learned during an outage wait to be written back."""
        return len(self._pending)

    @property
    def idle(self) -> bool:
        """Whether nothing waits for the writer thread and it is not running."""
        with self.lock:
            return self._writer is None and not (
                self._pending or self._allowances or self._chores or self._backlog
            )

    def waits(self, scope: str) -> bool:
        """Whether ``scope``'s cooldown waits to be written back."""
        return scope in self._pending

    def confirmed(self, scope: str, stored: datetime) -> None:
        """The store holds ``stored`` for ``scope``: no longer pending, unless the local
        copy moved later meanwhile."""
        with self.lock:
            if stored_covers(stored, self.local.get(scope)):
                self._pending.discard(scope)
                # A read begun before the store held it may have read the older time:
                # not to be mirrored over the local copy (see :meth:`mirror`).
                self.epoch += 1

    def strand(self, only_if_pending: bool) -> None:
        if self._pending or not only_if_pending:
            self._stranded = True

    def keep(self, scope: str, until: datetime) -> datetime:
        """Write ``until`` into the local copy (later wins) and keep ``scope`` pending
        until the store confirms it, in one step: a store answer read before cannot be
        mirrored over it (see :meth:`mirror`). Returns the local copy's time."""
        with self.lock:
            local = self.local.extend(scope, until)
            self._pending.add(scope)
            self.epoch += 1
        if self.breaker.is_down:
            self.breaker.hurry()
        return local

    def mirror(self, scope: str, remote: datetime | None, epoch: int) -> bool:
        """Make the local copy exactly the store's answer ``remote`` (which may lower
        it: an operator's clear), when that answer was read at ``epoch`` and nothing
        was written since (no write, no write-back, ``scope`` not pending); checked and
        done under the lock every write takes. Returns whether it was mirrored."""
        with self.lock:
            if epoch != self.epoch or scope in self._pending:
                return False
            self.local._replace(scope, remote)
            return True

    def write_through(
        self, operation: Callable[..., object], args: tuple[Any, ...], budget: StoreBudget | None
    ) -> bool:
        """Write to the store what the local copy already holds; a failure counts
        against the store but is not the call's (the local copy keeps it). Returns
        whether the store took it."""
        if self.breaker.skipped(budget):
            return False
        try:
            self.breaker.bounded(operation, args, budget)
        except OutOfTime:
            self.breaker.gave_up(budget)
            return False
        except Exception as exc:
            self.breaker.failed(exc, budget)
            return False
        self.succeeded()
        return True

    def succeeded(self) -> bool:
        """The store answered an operation: end a busy run, close the breaker, write
        back what waits (an outage's cooldowns, or writes kept while it was busy), maybe
        end the outage. Returns whether anything was written back (an answer read
        before that may predate it). Cheap when the store is healthy."""
        breaker = self.breaker
        if breaker.busy_run:
            breaker.busy_run = 0
        wrote = False
        if self.breaker.is_down or self.breaker.announced or self._generation is not None:
            wrote = self._answered()
        if self._stranded:
            wrote = self._flush() or wrote
        return wrote

    def _answered(self) -> bool:
        """The store answered: close the breaker, write back, maybe end the outage.
        Returns whether cooldowns were written back (the answer may predate them)."""
        wrote = False
        if self.replaceable is not None:
            generation = self.replaceable.generation
            if generation != self._generation:
                wrote = self._replaced(generation)
        if not self.breaker.is_down and not self.breaker.announced:
            return wrote
        if self.breaker.close() and (self._pending or self._allowances):
            self.hand_to_writer()
            wrote = True  # what the store answered may predate the write-back
        self.breaker.maybe_recovered()
        return wrote

    def hand_to_writer(self) -> None:
        """Have the writer thread write back everything pending (see ``_backlog``)."""
        with self.lock:
            self._backlog = True
        self.start_writer()

    def write_back(self) -> int:
        """Write every pending cooldown to the store now, then every pending announced
        allowance; return how many cooldowns were written. Raises CooldownStoreError if
        the store fails (the rest stay pending)."""
        with self.lock:
            scopes = list(self._pending)
            self.epoch += 1
        try:
            written = self._write(scopes)
            self._write_allowances()
            return written
        finally:
            with self.lock:
                self.epoch += 1

    def _write_allowances(self) -> None:
        """Write back the announced allowances held when the store failed, those whose
        reset is still ahead: what this process last knew is left (the store keeps the
        fewer of that and what it may still hold for the same window)."""
        with self.lock:
            allowances, self._allowances = self._allowances, {}
        now = datetime.now(timezone.utc)
        for scope, record in allowances.items():
            if record.until <= now:
                continue
            try:
                self.breaker.bounded(
                    self.inner.allow,
                    (scope, max(0, record.remaining), record.until, now, None, record.limit or None,
                     record.window or None),
                    None,
                )
            except Exception as exc:
                with self.lock:
                    for rest, kept in allowances.items():
                        self._allowances.setdefault(rest, kept)
                if isinstance(exc, CooldownStoreError):
                    raise
                raise CooldownStoreError(f"writing back an allowance failed: {type(exc).__name__}") from None
            self.allowances_written_back += 1

    def _write(self, scopes: list[str]) -> int:
        written = 0
        for scope in scopes:
            until = stored = self.local.get(scope)
            if until is not None:
                written += 1
                try:
                    # Bounded as every operation is (this may run on a call's thread).
                    answer: object = self.breaker.bounded(self.inner.extend, (scope, until), None)
                except CooldownStoreError:
                    raise
                except Exception as exc:
                    raise CooldownStoreError(
                        f"writing back a cooldown failed: {type(exc).__name__}"
                    ) from None
                # The store's effective time (a store of your own may answer anything).
                if isinstance(answer, datetime) and answer.tzinfo is not None and answer > until:
                    stored = answer
            with self.lock:
                if stored_covers(stored, self.local.get(scope)):
                    self._pending.discard(scope)
        self.written_back += written
        return written

    def _flush(self) -> bool:
        """Write back what was kept locally while the store was not down."""
        self._stranded = False
        try:
            return self.write_back() > 0
        except CooldownStoreError as exc:
            self._stranded = True
            self.breaker.failed(exc, None)
            return True

    def _replaced(self, generation: int) -> bool:
        """The store lost its data under us (a SQLite file deleted or replaced): warn
        once, and write the whole local copy back."""
        with self.lock:
            if generation == self._generation:
                return False
            self._generation = generation
            self.epoch += 1
            self._pending.update(self.local.entries())
        log.warning(
            "cooldown store %s was replaced under this process (%s); writing back the %d "
            "cooldowns this process knows",
            self.breaker.name,
            self.replaceable.replaced_reason if self.replaceable is not None else "its data is gone",
            len(self._pending),
            extra={"store": self.breaker.name},
        )
        self.hand_to_writer()
        return True

    def suspect(self) -> None:
        """The store failed, or may have lost what it held: every cooldown of the local
        copy still running and every announced allowance whose reset is still ahead
        wait to be written back (later wins: a store that kept them is not changed),
        and none is lowered by a store answer until the store holds it."""
        now = datetime.now(timezone.utc)
        running = [scope for scope, until in self.local.entries().items() if until > now]
        allowances = self.local.allowances(now)
        with self.lock:
            if running:
                self._pending.update(running)
                self.epoch += 1
            for scope, record in allowances.items():
                self._allowances.setdefault(scope, record)

    def lost(self) -> None:
        """The store lost cooldowns it held, without an error between two operations (a
        restart without persistence that the client's reconnection hid): treated as a
        failure this process noticed, and written back at once by the writer thread (it
        answers), not on the call's thread."""
        self.suspect()
        log.warning(
            "cooldown store %s lost cooldowns it held without an error (restarted without "
            "persistence, or failed over?); writing back the %d cooldowns this process holds",
            self.breaker.name,
            len(self._pending),
            extra={"store": self.breaker.name},
        )
        self.hand_to_writer()

    # -- the writer thread ---------------------------------------------------------
    def failing(self) -> None:
        """The store failed: what this process holds waits to be written back (see
        :meth:`suspect`), by the writer thread if nothing else asks the store."""
        self.suspect()
        if (self._pending or self._allowances) and self._writer is None:
            self.start_writer()

    def add_chore(self, operation: str, args: tuple[Any, ...], give_up: datetime) -> None:
        with self.lock:
            if len(self._chores) >= MAX_CHORES:
                return  # past it, newer ones are not kept (each ends by itself)
            self._chores.append((operation, args, give_up))
        self.start_writer()

    def start_writer(self) -> None:
        """Start the writer thread if something waits to be written and none runs."""
        with self.lock:
            if self._writer is not None or not (
                self._pending or self._allowances or self._chores or self._backlog
            ):
                return
            self._writer = threading.Thread(
                target=self._write_back_loop, name="retry-after-write-back", daemon=True
            )
            writer = self._writer
        writer.start()

    def _write_back_loop(self) -> None:
        """While the store is down and cooldowns wait: once the breaker lets a probe
        through, write one back; the store's answer then writes every other one back
        (see :meth:`_answered`), so other processes learn them within about
        :data:`BREAKER_MAX_PENDING` seconds of the store's recovery, whether or not this
        process calls again. (A write kept only because the store was busy is written by
        the next operation of any call.) Slots to give back and permits to settle that
        the store did not take are tried again meanwhile, while they still matter."""
        while True:
            # First a pause: the failure that started this thread is still being noted.
            wait = self.breaker.open_until - self.breaker.monotonic() if self.breaker.is_down else 0.0
            time.sleep(min(max(wait, WRITER_POLL), BREAKER_MAX_PENDING))
            with self.lock:
                chores, self._chores = self._chores, []
                # A scope to probe the store with: one whose cooldown or allowance waits.
                waiting = next(iter(self._pending), None) or next(iter(self._allowances), None)
                scope = waiting if self.breaker.is_down else None
                backlog, self._backlog = self._backlog and scope is None, self._backlog and scope is not None
                if self._closed or (scope is None and not chores and not backlog):
                    self._writer = None
                    return
            with self._writing:
                if self._closed:
                    continue
                try:
                    self._write_once(chores, scope)
                    if backlog:
                        self._write_backlog()
                except ReferenceError:  # the store was collected: nobody is left to read it
                    self._closed = True

    def _write_once(self, chores: list[tuple[str, tuple[Any, ...], datetime]], scope: str | None) -> None:
        """One turn of the writer thread: the chores again, and a pending scope's
        cooldown (whose success writes every other one back: ``_answered``)."""
        self._do_again(chores)
        if scope is not None:
            until = self.local.get(scope)
            if until is not None:
                self.write_through(self.inner.extend, (scope, until), None)
            else:
                self.write_through(self.inner.get, (scope,), None)

    def _write_backlog(self) -> None:
        """Write back everything pending (the writer thread, the store answering)."""
        try:
            self.write_back()
        except CooldownStoreError as exc:
            self.breaker.failed(exc, None)  # written at the next recovery

    def close(self) -> None:
        """Before the store closes: a write of the writer thread under way is waited
        for, and the thread writes nothing after (it ends at its next turn)."""
        with self._writing:
            self._closed = True

    def _do_again(self, chores: list[tuple[str, tuple[Any, ...], datetime]]) -> None:
        """Try the writes the store did not take again; keep those that fail while they
        still matter (past its give-up time a lease has expired, a permit stopped
        counting)."""
        now = datetime.now(timezone.utc)
        for chore in chores:
            operation, args, give_up = chore
            if give_up <= now:
                continue
            if not self.write_through(self._chore_operation(operation), args, None):
                with self.lock:
                    self._chores.append(chore)

    def _chore_operation(self, operation: str) -> Callable[..., Any]:
        """The store's operation a chore names (see :meth:`add_chore`)."""
        inner = self.inner
        if operation == "settle":
            return inner.settle
        if operation == "settle_weighed":
            return inner.settle_weighed
        if operation == "release":
            return inner.release
        raise ValueError(f"no such chore: {operation!r}")

    def give_back_later(self, scope: str, token: str) -> None:
        """A slot the store did not take back: the writer tries for up to
        :data:`RELEASE_KEPT` seconds (past that the lease has expired by itself)."""
        give_up = datetime.now(timezone.utc) + timedelta(seconds=RELEASE_KEPT)
        self.add_chore("release", (scope, token), give_up)

    def after_fork(self) -> None:
        self.lock = threading.Lock()
        self._writing = threading.Lock()
        self._writer = None  # the parent's thread does not exist here
        self._chores = []
