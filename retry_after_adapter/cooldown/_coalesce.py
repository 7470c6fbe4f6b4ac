"""Settles written together: one store operation carries every permit settle a process
made within a short while (owned by the failure layer, one per store).

An answered attempt settles its quota permit (``Store.settle``): an open permit ends
exactly at ``answer + per``, a late one moves there. Written one by one, that is a
store round trip per attempt. Here each settle waits at most
:func:`settle_delay` seconds (a quarter of the quota's ``per``, 0.25 s at most) and every
settle waiting goes in one ``Store.settle_many`` (one Redis pipeline, one SQLite
transaction), once the first of them is due, :data:`FLUSH_COUNT` wait, or a batch's
hold ends (its unspent open permits given back go with them: one write per batch).

Why the wait never lets a request too many through: until its settle lands, a permit
counts as the store holds it, and only a settle that ends its permit no later than
stored waits (:func:`may_wait`: an open permit's, which counts until its grant + per +
margin + ``OPEN_FOR`` until settled); one that moves a permit later is written at once.
So the store counts every permit at least as long as its settle makes it. A write the
store failed is not tried again: lost, its permits count longer; written twice (its
reply lost, not the write), it could move another open permit of the same stored end (a
batch's), whose request may still be on its way. What the delay
costs while a quota binds is in the eligible times the store gives refused
admissions (see :data:`SETTLE_DELAY`): it is kept short, a burst's settles go as
soon as :data:`FLUSH_COUNT` wait, and a refusal of a scope whose settles wait here
writes them before it is answered (:meth:`Coalescer.holds`). A process killed (or ended
by ``os._exit``) with settles waiting leaves its open permits open: they count
``OPEN_FOR`` seconds more, as a killed worker's always did. One that exits normally, or
closes its store, writes them first.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
import weakref
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from .. import _forksafe
from ._health import StoreBudget
from ._writeback import WriteBack

__all__ = ["FLUSH_COUNT", "SETTLE_DELAY", "SETTLE_SHARE", "Coalescer", "may_wait", "settle_delay"]

#: The longest (seconds) a settle waits to be written with others. Not longer: while
#: it waits, another process's refused admission takes its open permit to end ``per``
#: after the refusal at the earliest (``base.free_at``: the store does not know it was
#: answered), so a binding quota's waiters are told to come back later than they need
#: (a refusal in this process writes the scope's waiting settles first and asks
#: again: see ``StoreGuard.admit``). Measured with
#: 4 processes x 8 threads under a binding ``Quota(250, per=1)``: 0.5 s and 256
#: settles a write, 2/3 of the allowed rate; 0.25 s and 64, all of it.
SETTLE_DELAY = 0.25
#: ... and at most this share of its quota's ``per``.
SETTLE_SHARE = 0.25
#: Settles waiting that are written at once (by the thread that adds the last): a
#: burst's settles land before its waiters ask again.
FLUSH_COUNT = 64

def settle_delay(per: float) -> float:
    """Seconds a settle of a quota of window ``per`` may wait to be written."""
    return min(SETTLE_DELAY, per * SETTLE_SHARE)


def may_wait(expires: datetime, at: datetime, per: float, exact: bool) -> bool:
    """Whether a settle (of a permit stored to end at ``expires``, answered at ``at``)
    may wait to be written with others: only one that ends the permit no later than
    stored (an open permit's, answered within ``OPEN_FOR``): lost (the process killed),
    the permit counts longer, never shorter. One that moves a permit later (a late
    answer) is written at once."""
    return exact and at + timedelta(seconds=per) <= expires


class Coalescer:
    """The settles of one store waiting to be written, and the thread that writes them
    when the first is due (``writeback``: the store's, whose chores take a write the
    store did not take)."""

    def __init__(self, writeback: WriteBack) -> None:
        self.writeback = writeback
        self._cond = threading.Condition(threading.Lock())
        #: Settles waiting, as ``Store.settle``'s arguments.
        self._waiting: list[tuple[Any, ...]] = []
        #: When the first waiting settle is due (monotonic seconds).
        self._due = float("inf")
        #: Checks to run when due (monotonic seconds), each told whether the process
        #: exits: a batch's open permits not spent by then are given back (they add
        #: settles here).
        self._checks: list[tuple[float, Callable[[bool], None]]] = []
        self._thread: threading.Thread | None = None
        #: Held while settles are written (``close`` waits for a write under way: a
        #: store closed under it crashed the process) and once closed.
        self._writing = threading.Lock()
        self._closed = False
        #: Operations that carried settles, and the settles they carried.
        self.flushes = 0
        self.carried = 0
        _forksafe.register(self)
        # At exit (an open permit left open would count ``OPEN_FOR`` longer).
        atexit.register(_flush_at_exit, weakref.ref(self))

    def add(self, args: tuple[Any, ...], per: float) -> None:
        """One settle (``Store.settle``'s arguments) of a quota of window ``per``, to be
        written within :func:`settle_delay` seconds."""
        self.add_many([args], per)

    def add_many(self, settles: list[tuple[Any, ...]], per: float) -> None:
        """Settles of a quota of window ``per`` (a batch's permits given back), added
        together: written in one operation with what waits once :data:`FLUSH_COUNT` or
        more wait, else within :func:`settle_delay` seconds."""
        due = time.monotonic() + settle_delay(per)
        with self._cond:
            if self._closed:
                return  # the store is closed: nothing is written to it
            self._waiting.extend(settles)
            full = len(self._waiting) >= FLUSH_COUNT
            if due < self._due:
                self._due = due
                self._cond.notify()
            if not full:
                self._start()
        if full:
            self.flush()

    def holds(self, scope: str) -> bool:
        """Whether a settle of ``scope`` waits to be written (a refused admission of the
        scope was answered without it: see ``StoreGuard.admit``)."""
        with self._cond:
            return any(args[0] == scope for args in self._waiting)

    def check_at(self, due: float, check: Callable[[bool], None]) -> None:
        """Run ``check(exiting)`` at ``due`` (monotonic seconds; at exit, with ``exiting``
        True): what it adds is written with the other settles."""
        with self._cond:
            if self._closed:
                return
            self._checks.append((due, check))
            self._cond.notify()
            self._start()

    def flush(self, exiting: bool = False, budget: StoreBudget | None = None) -> None:
        """Write every waiting settle now, in one store operation (``exiting``: every
        check run first; ``budget``: a call's, whose time left bounds the write); a
        write the store does not take is dropped (see below)."""
        if exiting:
            self._run_checks(float("inf"))
        with self._cond:
            waiting, self._waiting, self._due = self._waiting, [], float("inf")
        if not waiting:
            return
        writeback = self.writeback
        with self._writing:
            if self._closed:
                return  # the store is closed: its permits count as stored
            try:
                settle_many = writeback.inner.settle_many
            except ReferenceError:  # the store was collected (its layer holds it weakly)
                return
            if writeback.write_through(settle_many, (waiting,), budget):
                self.flushes += 1
                self.carried += len(waiting)
        # Not tried again when the store failed it: each ends its permit no later than
        # stored (:func:`may_wait`), so one lost leaves it counting longer; one tried
        # again after it was written (its reply lost) could move another open permit
        # of the same stored end (a batch's) before that one's answer.

    def close(self) -> None:
        """Before the store closes: every check run and every settle written, a write
        under way waited for; nothing is written after."""
        self.flush(exiting=True)
        with self._writing:
            self._closed = True
        with self._cond:
            self._waiting, self._checks = [], []
            self._cond.notify()

    def _run_checks(self, now: float) -> bool:
        """Run the checks due at ``now`` (monotonic seconds; inf: every one, at exit);
        whether any was."""
        exiting = now == float("inf")
        with self._cond:
            due = [check for at, check in self._checks if at <= now]
            if due:
                self._checks = [(at, check) for at, check in self._checks if at > now]
        for check in due:
            check(exiting)
        return bool(due)

    def _start(self) -> None:
        """(Lock held.) Start the writer thread unless it runs (and have what waits
        written at a multiprocessing worker's exit, which skips ``atexit``)."""
        _flush_at_worker_exit(self)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="retry-after-settles", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        """The writer thread: runs each check when due, and writes the waiting settles
        when the first is due; ends when nothing waits."""
        while True:
            with self._cond:
                while True:
                    if self._closed or not (self._waiting or self._checks):
                        self._thread = None
                        return
                    now = time.monotonic()
                    wake = min(self._due, min((at for at, _ in self._checks), default=float("inf")))
                    if wake <= now:
                        break
                    self._cond.wait(wake - now)
            # A check ends a batch's hold: what waits goes with what it gave back.
            if self._run_checks(now) or self._due <= time.monotonic():
                self.flush()

    def _after_fork(self) -> None:
        # The parent's settles are the parent's to write; its thread is not here.
        self._cond = threading.Condition(threading.Lock())
        self._waiting, self._due, self._thread, self._checks = [], float("inf"), None, []
        self._writing = threading.Lock()


#: Coalescers that had settles to write in this process, and the process the
#: multiprocessing exit hook is for.
_WRITING: weakref.WeakSet[Coalescer] = weakref.WeakSet()
_HOOKED = [0]


def _flush_at_worker_exit(coalescer: Coalescer) -> None:
    """Have ``coalescer``'s waiting settles written when this process ends as a
    multiprocessing worker (through multiprocessing's exit function: ``atexit`` does
    not run there; a pool worker of ``maxtasksperchild`` ends so after its tasks, and
    its open permits left open counted ``OPEN_FOR`` seconds more). Registered once
    per process, at its first settle (a forked child starts without its parent's)."""
    _WRITING.add(coalescer)
    pid = os.getpid()
    if _HOOKED[0] == pid:
        return
    _HOOKED[0] = pid
    import multiprocessing.util

    multiprocessing.util.Finalize(None, _flush_every_one, exitpriority=100)


def _flush_every_one() -> None:
    for coalescer in list(_WRITING):
        _flush_at_exit(weakref.ref(coalescer))


def _flush_at_exit(ref: weakref.ref[Coalescer]) -> None:
    """At exit, every waiting settle is written (an open permit left open would count
    ``OPEN_FOR`` seconds more against the next run)."""
    coalescer = ref()
    if coalescer is not None:
        with contextlib.suppress(Exception):  # at exit: a store down keeps its permits
            coalescer.flush(exiting=True)
