"""Loopback ports for outage tests and benchmarks: one free a moment ago
(:func:`free_port`), one that refuses connections (:func:`closed_port`), one that
accepts them and never answers (:func:`black_hole`: a hung server) and one that never
accepts (:func:`connect_hangs`). Each context manager yields the port on 127.0.0.1 and
closes every socket on leaving.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

__all__ = ["black_hole", "closed_port", "connect_hangs", "free_port"]


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def closed_port() -> Iterator[int]:
    """A port with a bound but not listening socket: connecting is refused (and the
    port cannot be taken by anyone else meanwhile)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    try:
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


@contextlib.contextmanager
def black_hole() -> Iterator[int]:
    """A port that accepts TCP connections and never answers on them: a hung server
    (an HTTP origin, or a Redis, that stopped answering)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(256)
    listener.settimeout(0.05)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        thread.join(2)
        for conn in held:
            conn.close()
        listener.close()


@contextlib.contextmanager
def connect_hangs() -> Iterator[int]:
    """A port whose accept queue is full: a new connect gets no answer (its SYN is
    dropped) until the client gives up."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = int(listener.getsockname()[1])
    fillers = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)
    time.sleep(0.05)  # the fillers' handshakes fill the queue
    try:
        yield port
    finally:
        for filler in fillers:
            filler.close()
        listener.close()
