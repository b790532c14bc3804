"""A token holder's request body, read whole before the app sees the request.

cheroot's threads read bodies themselves, so a client holding the fit's token that sent
a push's head and then stalled in its body held a thread until the 30 s socket timeout
(or for as long as it trickled a byte at a time): 8 of them stopped the service. The
gate (:mod:`sparkdl.server.gate`) now finds, in each whole head, whether a body is worth
waiting for (:class:`BodyPolicy`: the token, and no more than the model's bound; other
requests are refused by the app without their body being read), and a
:class:`PendingBody` reads it into one buffer: a thread while it streams, the gate
without blocking once it stalls. The app reads the buffer without a copy
(:class:`sparkdl.server.transport.BulkReader`).

Example:
    >>> from sparkdl.server.framing import Head
    >>> BodyPolicy("secret", max_body=100).wanted(
    ...     Head(size=40, length=64, authorization=b"Bearer secret"))
    64
"""

from __future__ import annotations

import contextlib
import hmac
import ssl
import time
from typing import Any

import numpy as np

from sparkdl.server.framing import Head

__all__ = [
    "BODY_SECONDS",
    "MIN_BODY_RATE",
    "STALL_SECONDS",
    "THREAD_BODY_RATE",
    "BodyPolicy",
    "PendingBody",
]

#: Seconds a token holder's body may take beyond its transfer at :data:`MIN_BODY_RATE`,
#: from the end of its head.
BODY_SECONDS = 5.0
#: Seconds a thread waits for a body's next bytes before it leaves the body to the gate.
STALL_SECONDS = 0.01
#: A thread reads a body for at most ``STALL_SECONDS + n / THREAD_BODY_RATE`` (``n``
#: bytes still to come) before it leaves the body to the gate.
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
        max_body: The model's body bound (:func:`sparkdl.server.app.max_body_bytes`).

    Example:
        >>> policy = BodyPolicy("secret", max_body=100)
        >>> policy.wanted(Head(size=40, length=64, authorization=b"Bearer secret"))
        64
        >>> policy.wanted(Head(size=40, length=64, authorization=b"Bearer guess"))
        0
    """

    def __init__(self, token: str, max_body: int) -> None:
        self._expected = f"Bearer {token}".encode()
        self.max_body = max_body

    def wanted(self, head: Head) -> int:
        """Body bytes to read at the gate for ``head`` (0: none)."""
        if not head.length or head.length > self.max_body or head.authorization is None:
            return 0
        return head.length if hmac.compare_digest(head.authorization, self._expected) else 0


class PendingBody:
    """A token holder's body, read into one buffer as it arrives, by a thread while it
    streams and by the gate once it stalls.

    The bytes that came with the head start it. A pool thread reads the rest first
    (:meth:`read_on_thread`), as fast as it comes; if the body stalls for
    :data:`STALL_SECONDS`, or comes slower than :data:`THREAD_BODY_RATE`, the thread
    leaves it to the gate, which reads the rest without blocking in cheroot's selector
    thread (:meth:`fill`) and hands the request to a thread once it is whole. The
    buffer then goes to the connection's reader
    (:class:`sparkdl.server.transport.BulkReader` serves the body from it, without a
    copy).

    Args:
        size: The body's announced bytes (``filled``: how many are in, at first those
            that came with the head).
    """

    def __init__(self, size: int) -> None:
        self.view = memoryview(np.empty(size, dtype=np.uint8).data)
        self.filled = 0
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
        coming; ``False`` leaves it to the gate (``at_gate``)."""
        remaining = len(self.view) - self.filled
        until = min(self.deadline, time.time() + STALL_SECONDS + remaining / THREAD_BODY_RATE)
        ready = self._read(conn, STALL_SECONDS, until)
        if ready is False:
            self.at_gate = True
        return ready

    def _read(self, conn: Any, wait: float, until: float | None) -> bool | None:
        sock = conn.socket
        timeout = sock.gettimeout()
        sock.settimeout(wait)
        try:
            while self.filled < len(self.view):
                if until is not None and time.time() > until:
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
        finally:
            with contextlib.suppress(OSError):
                sock.settimeout(timeout)
        conn.body = None
        conn.rfile.prefetched = self.view[: self.filled]
        return True
