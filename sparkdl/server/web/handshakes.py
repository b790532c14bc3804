"""TLS handshakes off the selector thread, taken in turn peer by peer.

A full TLS handshake is the most CPU a client without the token can make the service
spend. The gate (:mod:`sparkdl.server.web.gate`) used to run handshakes on cheroot's one
selector thread, so a single peer's flood of them delayed every other peer's next
request (new-connection p99 8.5 -> 125 ms on 2 cores). :class:`Handshakes` runs them on
a thread of their own (OpenSSL releases the GIL while it computes) and serves the
waiting connections one peer at a time, round robin: a peer with a hundred handshakes
waiting delays another peer's one by at most one handshake per other waiting peer.

Example:
    >>> order = []
    >>> queue = PeerQueue()
    >>> for name in ["a1", "a2", "a3"]:
    ...     queue.put("10.0.0.1", name)
    >>> queue.put("10.0.0.2", "b1")
    >>> [queue.take()[1] for _ in range(4)]
    ['a1', 'b1', 'a2', 'a3']
"""

from __future__ import annotations

import contextlib
import logging
import ssl
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

__all__ = ["Handshakes", "PeerQueue"]

_log = logging.getLogger(__name__)


class PeerQueue:
    """Items queued per peer, taken one peer at a time in turn (not thread-safe)."""

    def __init__(self) -> None:
        self._peers: OrderedDict[str, deque[Any]] = OrderedDict()

    def __len__(self) -> int:
        return sum(len(items) for items in self._peers.values())

    def put(self, peer: str, item: Any) -> None:
        """Queues ``item`` behind ``peer``'s earlier ones."""
        self._peers.setdefault(peer, deque()).append(item)

    def take(self) -> tuple[str, Any]:
        """The oldest item of the peer whose turn it is; that peer goes to the back.

        Raises:
            IndexError: Nothing is queued.
        """
        peer, items = next(iter(self._peers.items()))
        item = items.popleft()
        del self._peers[peer]
        if items:
            self._peers[peer] = items  # to the back of the turn
        return peer, item

    def discard(self, peer: str, item: Any) -> None:
        """Removes ``item`` if it is queued."""
        items = self._peers.get(peer)
        if items is not None:
            with contextlib.suppress(ValueError):
                items.remove(item)
            if not items:
                del self._peers[peer]


class Handshakes:
    """A thread that completes TLS handshakes for the gate, peer by peer.

    Args:
        done: Called (on this thread) with a connection whose handshake completed, or
            is waiting for the peer's next bytes (``conn._tls_ready`` tells which): the
            gate then goes on with it.
        failed: Called with a connection that is not speaking TLS, or not our
            certificate's client, or past its head deadline: the gate closes it.
        head_seconds: A connection whose head clock (``conn.head_started``) ran longer
            than this while it waited in the queue fails.
    """

    def __init__(
        self, done: Callable[[Any], None], failed: Callable[[Any], None], head_seconds: float
    ) -> None:
        self._done = done
        self._head_seconds = head_seconds
        self._failed = failed
        self._queue = PeerQueue()
        self._wake = threading.Condition()
        self._stopped = False
        #: Handshakes completed, for the figures.
        self.completed = 0
        self._thread = threading.Thread(target=self._run, name="sparkdl-tls", daemon=True)
        self._thread.start()

    def submit(self, peer: str, conn: Any) -> None:
        """Queues ``conn`` (its socket readable) for its next handshake step."""
        with self._wake:
            self._queue.put(peer, conn)
            self._wake.notify()

    def stop(self) -> None:
        """Stops the thread and closes the connections still queued (``failed``)."""
        with self._wake:
            self._stopped = True
            self._wake.notify()
        self._thread.join(timeout=5)
        with self._wake:
            left = [self._queue.take()[1] for _ in range(len(self._queue))]
        for conn in left:
            self._failed(conn)

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._stopped:
                    self._wake.wait()
                if self._stopped:
                    return
                _, conn = self._queue.take()
            try:
                self._step(conn)
            except Exception as exc:  # one connection's failure closes that connection
                _log.debug("TLS handshake step failed: %r", exc)
                self._failed(conn)

    def _step(self, conn: Any) -> None:
        started = getattr(conn, "head_started", None)
        if getattr(conn, "evicted", False) or (
            started is not None and time.time() > started + self._head_seconds
        ):
            self._failed(conn)
            return
        sock = conn.socket
        timeout = sock.gettimeout()
        sock.settimeout(0.0)
        try:
            sock.do_handshake()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            pass  # (a handshake that must write waits for the peer's next bytes)
        except (OSError, ValueError, AttributeError):  # not TLS, not our certificate
            self._failed(conn)
            return
        else:
            conn._tls_ready = True
            self.completed += 1
        finally:
            with contextlib.suppress(OSError):
                sock.settimeout(timeout)
        self._done(conn)
