"""Requests reach a server thread only once their whole head has arrived.

cheroot hands every new connection to a thread of its pool at once, and that thread
then waits (up to the socket timeout, 30 s) for a request line: eight clients that
connect and send nothing, or one header byte every few seconds, held the whole pool,
and every push and ``/status`` timed out. :class:`GatedServer` puts a gate in front of
the pool. In cheroot's selector thread, a waiting connection's bytes (and its TLS
handshake) are read without blocking into the connection's own read buffer, and the
connection goes to the pool only when its request line and headers are all in (or more
than the header bound arrived, which cheroot then refuses). A thread is therefore only
ever busy with a request it can parse at once.

Bounds on what waits at the gate:

- A head must arrive whole within :data:`HEAD_SECONDS` of the connection's accept (or,
  on a kept-alive connection, of the head's first byte); a connection idle between
  requests is closed after the server's timeout, as in cheroot.
- Connections that never made an authenticated request are capped at
  :data:`PEER_CAP` per peer address and :data:`UNTRUSTED_CAP` in all. Past a cap the
  oldest waiting one (of that peer first) is closed: a worker's new connection sends its
  head at once, so it leaves the gate long before it could become the oldest.
- Only an authenticated request keeps a connection alive (:class:`BulkConnection`
  closes the others after their answer), so the gate's caps bound every connection of a
  client without the token.

Long polls are bounded in the app (``create_app(wait_slots=...)``): they never take the
last threads of the pool.

Example:
    >>> server = GatedServer(("127.0.0.1", 0), lambda environ, start: [])
    >>> isinstance(server.gate, HeadGate) and server.keep_alive_conn_limit is None
    True
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import ssl
import threading
import time
from collections import OrderedDict
from typing import Any

from cheroot import wsgi

from sparkdl.server.transport import READ_BUFFER_BYTES, use_bulk_io

__all__ = ["HEAD_SECONDS", "PEER_CAP", "UNTRUSTED_CAP", "GatedServer", "HeadGate"]

#: Seconds a request's line and headers may take to arrive, from the first byte.
HEAD_SECONDS = 10.0
#: Waiting connections without an authenticated request, per peer address.
PEER_CAP = 128
#: Waiting connections without an authenticated request, in all.
UNTRUSTED_CAP = 512

_HEAD_END = b"\r\n\r\n"
_CRLF = b"\r\n"


class GatedServer(wsgi.Server):
    """cheroot's WSGI server with bulk I/O and a :class:`HeadGate` before its pool.

    Args:
        *args: As :class:`cheroot.wsgi.Server`.
        **kwargs: As :class:`cheroot.wsgi.Server`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        use_bulk_io(self)
        self.gate = HeadGate(self)
        # cheroot counts every connection in its selector against this limit (10),
        # waiting ones included; the gate bounds those that lack the token instead.
        self.keep_alive_conn_limit = None  # type: ignore[assignment]

    def process_conn(self, conn: Any) -> None:
        """Hands ``conn`` to the pool once its request head is in (else it waits)."""
        if self.gate.admit(conn):
            super().process_conn(conn)


class HeadGate:
    """Holds connections in cheroot's selector until a request head is in.

    Args:
        http_server: The server whose selector and pool the gate stands before.
        head_seconds: See :data:`HEAD_SECONDS` (the default).
        peer_cap: See :data:`PEER_CAP` (the default).
        untrusted_cap: See :data:`UNTRUSTED_CAP` (the default).
    """

    def __init__(
        self,
        http_server: Any,
        *,
        head_seconds: float | None = None,
        peer_cap: int | None = None,
        untrusted_cap: int | None = None,
    ) -> None:
        self.server = http_server
        self.head_seconds = HEAD_SECONDS if head_seconds is None else head_seconds
        self.peer_cap = PEER_CAP if peer_cap is None else peer_cap
        self.untrusted_cap = UNTRUSTED_CAP if untrusted_cap is None else untrusted_cap
        #: Waiting connections closed to make room under a cap.
        self.evicted = 0
        #: The most connections without the token that waited at once.
        self.held_max = 0
        self._lock = threading.Lock()
        self._waiting: OrderedDict[Any, str] = OrderedDict()  # untrusted, oldest first
        self._per_peer: dict[str, int] = {}

    def admit(self, conn: Any) -> bool:
        """Whether ``conn`` may go to the pool now; if not, it waits or is closed."""
        if head_complete(conn.rfile, self._head_limit()):
            self._leave(conn)
            return True
        if not fill(conn, self._head_limit()):
            self._leave(conn)
            conn.close()
            return False
        if head_complete(conn.rfile, self._head_limit()):
            self._leave(conn)
            return True
        self._wait(conn)
        return False

    def ready_now(self, conn: Any) -> bool | None:
        """For a connection lingering on its thread between requests: ``True`` once its
        next head is in, ``False`` when it must wait at the gate, ``None`` if closed."""
        limit = self._head_limit()
        if not fill(conn, limit):
            return None
        return head_complete(conn.rfile, limit)

    def forget(self, conn: Any) -> None:
        """Drops a closed connection from the caps."""
        self._leave(conn)

    @property
    def waiting_untrusted(self) -> int:
        """Connections without an authenticated request waiting at the gate now."""
        with self._lock:
            return len(self._waiting)

    # ------------------------------------------------------------------ helpers
    def _head_limit(self) -> int:
        return int(self.server.max_request_header_size or 64 * 1024) + 4096

    def _wait(self, conn: Any) -> None:
        now = time.time()
        started = getattr(conn, "head_started", None)
        if started is None:
            buffered = conn.rfile.has_data()
            started = conn.head_started = now if (buffered or _fresh(conn)) else None
        if started is None:  # idle between requests: the server's keep-alive timeout
            conn.last_used = now
        else:
            # cheroot's selector loop closes a connection once it has not been used for
            # the server timeout: date it so that this happens at the head's deadline.
            deadline = started + self.head_seconds
            conn.last_used = min(deadline - self.server.timeout, now)
        if not getattr(conn, "trusted", False):
            self._enlist(conn)
        manager = self.server._connections
        manager._selector.register(conn.socket.fileno(), selectors.EVENT_READ, data=conn)

    def _enlist(self, conn: Any) -> None:
        peer = str(getattr(conn, "remote_addr", "") or "")
        victims = []
        with self._lock:
            if conn in self._waiting:
                return
            if self._per_peer.get(peer, 0) >= self.peer_cap:
                victims.append(next(c for c, p in self._waiting.items() if p == peer))
            elif len(self._waiting) >= self.untrusted_cap:
                victims.append(next(iter(self._waiting)))
            for victim in victims:
                self._drop_locked(victim)
            self._waiting[conn] = peer
            self._per_peer[peer] = self._per_peer.get(peer, 0) + 1
            self.evicted += len(victims)
            self.held_max = max(self.held_max, len(self._waiting))
        for victim in victims:
            _evict(victim)

    def _leave(self, conn: Any) -> None:
        conn.head_started = None
        with self._lock:
            self._drop_locked(conn)

    def _drop_locked(self, conn: Any) -> None:
        peer = self._waiting.pop(conn, None)
        if peer is None:
            return
        left = self._per_peer[peer] - 1
        if left:
            self._per_peer[peer] = left
        else:
            del self._per_peer[peer]


def head_complete(rfile: Any, limit: int) -> bool:
    """Whether ``rfile``'s buffer holds a whole request head (or ``limit`` bytes)."""
    state: Any = rfile  # _pyio.BufferedReader's buffer, which cheroot's stubs omit
    data = state._read_buf[state._read_pos :]
    if data.startswith(_CRLF):  # cheroot skips one empty line before a request
        data = data[2:]
    return _HEAD_END in data or len(data) >= limit


def fill(conn: Any, limit: int) -> bool:
    """Reads what ``conn`` has ready, without blocking, into its read buffer.

    Completes a TLS handshake first when one is under way. Stops at a whole head, at
    ``limit`` buffered bytes, or when nothing more is ready.

    Returns:
        ``False`` when the peer closed or the connection failed (nothing to serve).
    """
    sock = conn.socket
    timeout = sock.gettimeout()
    sock.settimeout(0.0)
    chunks: list[bytes] = []
    try:
        if not getattr(conn, "_tls_ready", True):
            try:
                sock.do_handshake()
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return True
            except OSError:  # not TLS, or not our certificate
                return False
            conn._tls_ready = True
        state: Any = conn.rfile
        held = len(state._read_buf) - state._read_pos
        while held < limit:
            try:
                data = sock.recv(min(limit - held, READ_BUFFER_BYTES))
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
                break
            except ssl.SSLWantWriteError:
                break
            except OSError:
                return False
            if not data:  # closed: serve what is whole, drop the rest
                _append(state, chunks)
                chunks = []
                return head_complete(state, limit)
            chunks.append(data)
            held += len(data)
            if _HEAD_END in data or (len(chunks) > 1 and _HEAD_END in b"".join(chunks[-2:])):
                break
        return True
    finally:
        _append(conn.rfile, chunks)
        with contextlib.suppress(OSError):
            sock.settimeout(timeout)


def _append(state: Any, chunks: list[bytes]) -> None:
    if not chunks:
        return
    with state._read_lock:
        state._read_buf = state._read_buf[state._read_pos :] + b"".join(chunks)
        state._read_pos = 0


def _fresh(conn: Any) -> bool:
    """A connection that has not made a request yet."""
    return not getattr(conn, "requests_served", 0)


def _evict(conn: Any) -> None:
    """Makes cheroot's selector loop close ``conn`` at its next turn."""
    conn.last_used = 0.0  # expired: the loop closes it
    with contextlib.suppress(OSError):
        conn.socket.shutdown(socket.SHUT_RDWR)  # readable now: the gate sees it closed
