"""A token holder's request body, read whole before the app sees the request.

cheroot's threads read bodies themselves, so a client holding the fit's token that sent
a push's head and then stalled in its body held a thread until the 30 s socket timeout
(or for as long as it trickled a byte at a time): 8 of them stopped the service. The
gate (:mod:`sparkdl.server.web.gate`) now finds, in each whole head, whether a body is worth
waiting for (:class:`BodyPolicy`: the token, and no more than the model's bound; other
requests are refused by the app without their body being read), and a
:class:`PendingBody` reads it into one buffer: a thread while it streams, the gate
without blocking once it stalls. The app reads the buffer without a copy
(:class:`sparkdl.server.web.transport.BulkReader`).

Example:
    >>> from sparkdl.server.web.framing import Head
    >>> BodyPolicy("secret", max_body=100).wanted(
    ...     Head(size=40, length=64, authorization=b"Bearer secret"))
    64
"""

from __future__ import annotations

import contextlib
import hmac
import ssl
import threading
import time
from typing import Any

import numpy as np

from sparkdl.server.web.framing import Head

__all__ = [
    "BODY_SECONDS",
    "BUDGET_BODIES",
    "BUDGET_FLOOR",
    "MIN_BODY_RATE",
    "STALL_SECONDS",
    "THREAD_BODY_RATE",
    "BodyPolicy",
    "PendingBody",
]

#: Seconds a token holder's body may take beyond its transfer at :data:`MIN_BODY_RATE`,
#: from the end of its head.
BODY_SECONDS = 5.0
#: The gate holds bodies not yet whole of at most this many times the model's bound at
#: once (and at least :data:`BUDGET_FLOOR` bytes); past it, a body is left to the thread
#: serving its request. Bounds what token holders can make the driver allocate.
BUDGET_BODIES = 4
BUDGET_FLOOR = 64 << 20
#: Seconds a thread waits for a body's next bytes before it leaves the body to the gate.
STALL_SECONDS = 0.01
#: A thread keeps reading a body while, ``t`` seconds after it began, it has read at
#: least ``(t - STALL_SECONDS) * THREAD_BODY_RATE`` bytes; else it leaves it to the gate.
THREAD_BODY_RATE = 50 << 20
#: The slowest body transfer waited for, in bytes per second: a body of ``n`` bytes
#: must be whole within ``BODY_SECONDS + n / MIN_BODY_RATE`` of its head, else the
#: connection is answered 408 and closed. 1 MiB/s is a hundredth of a slow cluster
#: network's rate; a 400 MB push may take up to 386 s.
MIN_BODY_RATE = 1 << 20


class BodyPolicy:
    """Which bodies the gate reads before a thread sees the request: those of requests
    with the fit's token announcing at most ``max_body`` bytes. Others go to a thread at
    once, where the app refuses them (401, 413) without reading the body.

    Args:
        token: The fit's token (the ``Authorization: Bearer`` value).
        max_body: The model's body bound (:func:`sparkdl.server.web.app.max_body_bytes`).

    Example:
        >>> policy = BodyPolicy("secret", max_body=100)
        >>> policy.wanted(Head(size=40, length=64, authorization=b"Bearer secret"))
        64
        >>> policy.wanted(Head(size=40, length=64, authorization=b"Bearer guess"))
        0
    """

    def __init__(self, token: str, max_body: int, budget: int | None = None) -> None:
        self._expected = f"Bearer {token}".encode()
        self.max_body = max_body
        #: Bytes of bodies not yet whole the gate may hold at once (past it, a body is
        #: left to the thread that serves its request, as before the gate read bodies).
        self.budget = max(BUDGET_BODIES * max_body, BUDGET_FLOOR) if budget is None else budget
        #: Bytes of the bodies now held (announced sizes).
        self.held = 0
        self._lock = threading.Lock()

    def wanted(self, head: Head) -> int:
        """Body bytes to read at the gate for ``head`` (0: none), reserved against the
        budget (:meth:`release` gives them back)."""
        if not head.length or head.length > self.max_body or head.authorization is None:
            return 0
        if head.expects_continue:  # the client waits for cheroot's 100 first
            return 0
        if not hmac.compare_digest(head.authorization, self._expected):
            return 0
        with self._lock:
            if self.held + head.length > self.budget:
                return 0
            self.held += head.length
        return head.length

    def release(self, size: int) -> None:
        """Gives back ``size`` reserved bytes (a body whole, or its connection closed)."""
        with self._lock:
            self.held -= size


class PendingBody:
    """A token holder's body, read into one buffer as it arrives, by a thread while it
    streams and by the gate once it stalls.

    The bytes that came with the head start it. A pool thread reads the rest first
    (:meth:`read_on_thread`), as fast as it comes; if the body stalls for
    :data:`STALL_SECONDS`, or comes slower than :data:`THREAD_BODY_RATE`, the thread
    leaves it to the gate, which reads the rest without blocking in cheroot's selector
    thread (:meth:`fill`) and hands the request to a thread once it is whole. The
    buffer then goes to the connection's reader
    (:class:`sparkdl.server.web.transport.BulkReader` serves the body from it, without a
    copy).

    Args:
        size: The body's announced bytes (``filled``: how many are in, at first those
            that came with the head), reserved with ``policy``.
        policy: Released when the body is whole or its connection closes.
    """

    def __init__(self, size: int, policy: BodyPolicy | None = None) -> None:
        self.view = memoryview(np.empty(size, dtype=np.uint8).data)
        self.filled = 0
        self._policy = policy
        #: When the connection is answered 408 and closed if the body is not whole.
        self.deadline = time.time() + BODY_SECONDS + size / MIN_BODY_RATE
        #: A thread left it to the gate, which reads the rest.
        self.at_gate = False

    def fill(self, conn: Any) -> bool | None:
        """Reads what ``conn`` has ready, without blocking: ``True`` once whole, or once
        the peer stopped sending (handed to the reader; the app answers a truncated
        body 400), ``False`` while more is to come, ``None`` when the connection
        failed."""
        return self._read(conn, 0.0, None)

    def read_on_thread(self, conn: Any) -> bool | None:
        """As :meth:`fill`, waiting for the body on the calling thread while it keeps
        coming at :data:`THREAD_BODY_RATE` or faster (after :data:`STALL_SECONDS`);
        ``False`` leaves it to the gate (``at_gate``)."""
        ready = self._read(conn, STALL_SECONDS, time.time())
        if ready is False:
            self.at_gate = True
        return ready

    def release(self) -> None:
        """Gives the body's reservation back (once)."""
        policy, self._policy = self._policy, None
        if policy is not None:
            policy.release(len(self.view))

    def _read(self, conn: Any, wait: float, started: float | None) -> bool | None:
        """Reads until whole; with ``started`` (a thread's read) also gives up once the
        body falls behind ``THREAD_BODY_RATE`` since then, or passes its deadline."""
        sock = conn.socket
        timeout = sock.gettimeout()
        sock.settimeout(wait)
        first = self.filled
        try:
            while self.filled < len(self.view):
                if started is not None and time.time() > min(
                    self.deadline,
                    started + STALL_SECONDS + (self.filled - first) / THREAD_BODY_RATE,
                ):
                    return False
                try:
                    n = sock.recv_into(self.view[self.filled :])
                except (BlockingIOError, InterruptedError, TimeoutError):
                    return False
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    return False
                except (OSError, ValueError, AttributeError):
                    return None
                if not n:  # the peer stopped sending: the app answers the truncation
                    break
                self.filled += n
            _drain_tls(sock, conn.rfile)
        finally:
            with contextlib.suppress(OSError):
                sock.settimeout(timeout)
        self.release()
        conn.body = None
        conn.rfile.prefetched = self.view[: self.filled]
        return True


def _drain_tls(sock: Any, rfile: Any) -> None:
    """Keeps bytes OpenSSL already decrypted past the body (a pipelined request) for the
    connection's reader, which serves them once the body is read: ``select`` cannot see
    them, so they would wait unanswered for the keep-alive timeout."""
    pending = getattr(sock, "pending", None)
    chunks = []
    while pending is not None and pending():
        try:
            data = sock.recv(pending())
        except (OSError, ValueError):
            break
        if not data:
            break
        chunks.append(data)
    if chunks:
        rfile.pipelined = b"".join(chunks)
