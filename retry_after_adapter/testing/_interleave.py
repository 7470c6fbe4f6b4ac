"""Two operations on a store run in an order the conformance kit chooses, not in one
the threads happen to take: the kit's check that ``admit`` is atomic (see
:func:`first_overlap`).

The first operation runs on a thread of its own, traced, and is paused at one line of
the store's own code (its ``k``-th); the second then runs on another thread until it
ends or waits for something the first one holds (a lock, a database's write lock);
then the first goes on. ``k`` takes every line of the first operation in turn, so a
store that reads, lets go, and writes what it read (a read-then-write without a lock
held across, a READ COMMITTED transaction) is caught between its read and its write
on every run; a store whose operation holds a lock from its read to its write makes
the second one wait there, and passes. Nothing depends on how the threads are
scheduled but for one judgement: that the second one waits (its thread asleep, read
from ``/proc`` where there is one, and no line run for a few milliseconds); a wrong
judgement only lets the two run together.

The store's own code is that of the packages its classes come from (a class of a
package ``acme.stores`` makes every file of ``acme`` the store's), less the standard
library and this kit, wherever they are installed; a client library it calls
(redis-py, a database driver) is not paused in. A store none of whose code could be
paused in (no line of Python run by its first admission) is tried in no order: the kit
says so.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

__all__ = ["Overlap", "first_overlap", "store_files"]

#: Seconds the second operation must be seen asleep without running a line before the
#: kit takes it to wait for the first (where the thread's state cannot be read: seconds
#: without a line run).
ASLEEP_FOR = 0.015
QUIET_FOR = 0.1
#: Seconds the kit waits at most for either operation to reach its next step.
STEP_LIMIT = 10.0
#: The most orders tried: an operation that runs more lines of the store's code is
#: paused at every n-th line, evenly spread (the package's stores run 50 to 150).
MOST_ORDERS = 2000

_KIT = os.path.dirname(os.path.abspath(__file__))


def store_files(store: object) -> Callable[[str], bool]:
    """Whether a file holds ``store``'s own code (see the module)."""
    roots: set[str] = set()
    for cls in type(store).__mro__:
        name = cls.__module__.partition(".")[0]
        module = sys.modules.get(cls.__module__)
        path = getattr(module, "__file__", None)
        if not path or name in sys.stdlib_module_names:
            continue
        package = getattr(sys.modules.get(name), "__path__", None)
        if package:
            roots.update(os.path.abspath(p) for p in package)
        else:
            roots.add(os.path.abspath(path))
    known: dict[str, bool] = {}

    def own(filename: str) -> bool:
        mine = known.get(filename)
        if mine is None:
            path = os.path.abspath(filename)
            mine = known[filename] = not path.startswith(_KIT) and any(
                path == root or path.startswith(root + os.sep) for root in roots
            )
        return mine

    return own


class _Traced:
    """One operation on a thread of its own, counting the lines of the store's code it
    runs, and parked at the line numbered ``stop`` (0: never) until told to go on."""

    def __init__(self, operation: Callable[[], Any], own: Callable[[str], bool], stop: int) -> None:
        self.operation = operation
        self.own = own
        self.stop = stop
        self.lines = 0
        self.where = ""
        self.parked = False
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, name="store-contract-overlap", daemon=True)

    def _run(self) -> None:
        sys.settrace(self._call)
        try:
            self.result = self.operation()
        except BaseException as exc:  # reported by the kit, whatever it is
            self.error = exc
        finally:
            sys.settrace(None)
            with self.cond:
                self.done = True
                self.cond.notify_all()

    def _call(self, frame: FrameType, event: str, arg: object) -> Any:
        return self._line if self.own(frame.f_code.co_filename) else None

    def _line(self, frame: FrameType, event: str, arg: object) -> Any:
        if event == "line":
            self.lines += 1
            if self.lines == self.stop:
                self.where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
                with self.cond:
                    self.parked = True
                    self.cond.notify_all()
                    self.cond.wait_for(lambda: not self.parked, timeout=STEP_LIMIT)
        return self._line

    def start(self) -> None:
        self.thread.start()

    def wait_parked_or_done(self) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.parked or self.done, timeout=STEP_LIMIT)

    def step(self) -> None:
        """Go on to the next line of the store's code (or to the end)."""
        with self.cond:
            self.stop = self.lines + 1
            self.parked = False
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.parked or self.done, timeout=STEP_LIMIT)

    def release(self) -> None:
        with self.cond:
            self.stop = 0
            self.parked = False
            self.cond.notify_all()

    def join(self) -> None:
        self.thread.join(STEP_LIMIT)


def _asleep(thread: threading.Thread) -> bool | None:
    """Whether ``thread`` sleeps (waits for a lock, a timer, I/O) rather than runs or
    waits for a CPU; None where that cannot be read."""
    try:
        with open(f"/proc/self/task/{thread.native_id}/stat", encoding="ascii") as stat:
            state = stat.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError, UnicodeDecodeError):
        return None
    return state in ("S", "D")


def _waits(second: _Traced) -> bool:
    """Wait for ``second`` to end; True if it waits for something instead (see
    :data:`ASLEEP_FOR`)."""
    seen, since, started = second.lines, time.monotonic(), time.monotonic()
    while not second.done:
        time.sleep(0.001)
        now = time.monotonic()
        if second.lines != seen:
            seen, since = second.lines, now
            continue
        asleep = _asleep(second.thread)
        if asleep is False:
            since = now  # running, or waiting for a CPU: it goes on by itself
        elif now - since >= (ASLEEP_FOR if asleep else QUIET_FOR):
            return True
        if now - started > STEP_LIMIT:
            return True
    return False


@dataclass(frozen=True)
class Overlap:
    """Two operations run with the first paused at ``where`` (the store's file and
    line) while the second ran: what each returned or raised."""

    where: str
    first: Any
    second: Any
    first_error: BaseException | None
    second_error: BaseException | None


def first_overlap(
    store: object,
    first: Callable[[int], Callable[[], Any]],
    second: Callable[[int], Callable[[], Any]],
    broken: Callable[[Overlap], bool],
) -> tuple[Overlap | None, int]:
    """Run ``first(n)()`` and ``second(n)()`` (``n``: the trial's number, for a scope
    of its own) with the first paused at each line of ``store``'s code in turn while
    the second runs (see the module); the first :class:`Overlap` that ``broken`` finds
    wrong (None: none), and how many orders were tried."""
    own = store_files(store)
    calibration = _Traced(first(0), own, 0)
    calibration.start()
    calibration.join()
    lines = calibration.lines
    stride = -(-lines // MOST_ORDERS)  # every line, up to MOST_ORDERS of them; else evenly spread
    trial, k = 0, 1
    while k <= lines:
        trial += 1
        one = _Traced(first(trial), own, k)
        one.start()
        one.wait_parked_or_done()
        two = _Traced(second(trial), own, 0)
        two.start()
        if _waits(two) and one.parked:
            # The second waits for what the first holds: the first goes on, a line at a
            # time, until the second runs again (a later pause would wait as long).
            seen = two.lines
            while not one.done and not two.done and two.lines == seen and _asleep(two.thread) is not False:
                one.step()
                if _asleep(two.thread) is None:
                    time.sleep(0.001)  # its state cannot be read: a moment to run a line
            k = max(k + stride, one.lines)
        else:
            k += stride
        one.release()
        one.join()
        two.join()
        if one.thread.is_alive() or two.thread.is_alive():
            raise AssertionError(f"two admissions did not end within {STEP_LIMIT:g} s of each other")
        overlap = Overlap(one.where, one.result, two.result, one.error, two.error)
        if broken(overlap):
            return overlap, trial
    return None, trial
