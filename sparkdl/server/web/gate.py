"""Requests reach a server thread only once their whole head has arrived.

cheroot hands every new connection to a thread of its pool at once, and that thread
then waits (up to the socket timeout, 30 s) for a request line: eight clients that
connect and send nothing, or one header byte every few seconds, held the whole pool,
and every push and ``/status`` timed out. :class:`GatedServer` puts a gate in front of
the pool. In cheroot's selector thread, a waiting connection's bytes are read without
blocking into the connection's own read buffer (its TLS handshake on a thread of its
own, peer by peer: :mod:`sparkdl.server.web.handshakes`), and the connection goes to the
pool only when its request line and headers are all in (or more than the header bound
arrived, which cheroot then refuses). A thread is therefore only ever busy with a
request it can parse at once. A whole head's framing is checked here
(:mod:`sparkdl.server.web.framing`: an ambiguous one is answered 400), and a token holder's
body is read before the app runs (:mod:`sparkdl.server.web.bodies`: a thread while it
streams, the gate once it stalls, 408 past its deadline).

waitress, which reads requests before a thread sees them, was measured in its place
(``docs/benchmarks/service.md``, "Why a hand-written transport"): slower by 2-3x, no
TLS, and locked out by one peer at its ``connection_limit``.

Bounds on what waits at the gate:

- A head must arrive whole within :data:`HEAD_SECONDS` of the connection's accept (TLS
  handshake included) or, on a kept-alive connection, of its first wake-up; a
  connection idle between requests is closed after the server's timeout, as in cheroot.
- Connections that never made an authenticated request are capped at
  :data:`PEER_CAP` per peer (an IPv4 address, or an IPv6 /64) and :data:`UNTRUSTED_CAP`
  in all. Past the per-peer cap, that peer's oldest waiting connection is closed; past
  the global one, the oldest of the peer holding the most. A worker's new connection
  sends its head at once, so it usually leaves the gate long before it is the oldest;
  a flood of new connections from its own address (one machine) can still close it,
  and the worker's client then retries.

What is not bounded here: unauthenticated requests whose head is whole wait in
cheroot's request queue beside the workers' (each is answered 401 at once).
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
import ipaddress
import logging
import socket
import ssl
import threading
import time
from collections import OrderedDict
from typing import Any

from cheroot import wsgi

from sparkdl.compat.cheroot import (
    append_unread,
    move_unread,
    park_in_selector,
    unread_find,
    unread_head,
    unread_size,
)
from sparkdl.server.web.bodies import BodyPolicy, PendingBody
from sparkdl.server.web.framing import FramingError, parse_head
from sparkdl.server.web.handshakes import Handshakes
from sparkdl.server.web.transport import READ_BUFFER_BYTES, use_bulk_io

__all__ = ["HEAD_SECONDS", "PEER_CAP", "UNTRUSTED_CAP", "GatedServer", "HeadGate"]

#: Seconds a request's line and headers may take to arrive, from the first byte.
HEAD_SECONDS = 10.0
#: Waiting connections without an authenticated request, per peer address.
PEER_CAP = 128
#: Waiting connections without an authenticated request, in all.
UNTRUSTED_CAP = 512

_HEAD_END = b"\r\n\r\n"
_BARE_END = b"\n\n"
_log = logging.getLogger(__name__)
_CRLF = b"\r\n"


class GatedServer(wsgi.Server):
    """cheroot's WSGI server with bulk I/O and a :class:`HeadGate` before its pool.

    Args:
        *args: As :class:`cheroot.wsgi.Server`.
        **kwargs: As :class:`cheroot.wsgi.Server`.
    """

    def __init__(self, *args: Any, bodies: BodyPolicy | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        use_bulk_io(self)
        self.gate = HeadGate(self, bodies=bodies)
        # cheroot counts every connection in its selector against this limit (10),
        # waiting ones included; the gate bounds those that lack the token instead.
        self.keep_alive_conn_limit = None  # type: ignore[assignment]

    def stop(self) -> None:
        """The gate's handshake thread (its queued connections closed), then cheroot's
        ``stop``."""
        try:
            self.gate.close()
        finally:
            super().stop()

    def process_conn(self, conn: Any) -> None:
        """Hands ``conn`` to the pool once its request head is in (else it waits).

        Runs in cheroot's selector thread, and in a pool thread that puts a kept-alive
        connection back: whatever goes wrong with one connection closes that
        connection and nothing else.
        """
        try:
            admitted = self.gate.admit(conn)
        except Exception as exc:
            _log.warning("closing a connection the gate could not read: %r", exc)
            self.gate.forget(conn)
            with contextlib.suppress(Exception):
                conn.close()
            return
        if admitted:
            super().process_conn(conn)


class HeadGate:
    """Holds connections in cheroot's selector until a request head is in.

    Args:
        http_server: The server whose selector and pool the gate stands before.
        head_seconds: See :data:`HEAD_SECONDS` (the default).
        peer_cap: See :data:`PEER_CAP` (the default).
        untrusted_cap: See :data:`UNTRUSTED_CAP` (the default).
        bodies: Which requests' bodies are read at the gate before a thread sees
            them (:class:`BodyPolicy`); ``None`` reads none there.
    """

    def __init__(
        self,
        http_server: Any,
        *,
        head_seconds: float | None = None,
        peer_cap: int | None = None,
        untrusted_cap: int | None = None,
        bodies: BodyPolicy | None = None,
    ) -> None:
        self.server = http_server
        #: Which bodies wait at the gate (``None``: none; a thread reads every body).
        self.bodies = bodies
        self.head_seconds = HEAD_SECONDS if head_seconds is None else head_seconds
        self.peer_cap = PEER_CAP if peer_cap is None else peer_cap
        self.untrusted_cap = UNTRUSTED_CAP if untrusted_cap is None else untrusted_cap
        #: Waiting connections closed to make room under a cap.
        self.evicted = 0
        #: The most connections without the token that waited at once.
        self.held_max = 0
        self._lock = threading.Lock()
        self._waiting: OrderedDict[Any, str] = OrderedDict()  # untrusted, oldest first
        self._per_peer: dict[str, OrderedDict[Any, None]] = {}  # the same, by peer
        self._handshakes: Handshakes | None = None  # started at the first TLS connection

    def admit(self, conn: Any) -> bool:
        """Whether ``conn`` may go to the pool now; if not, it waits or is closed."""
        if not getattr(conn, "_tls_ready", True) and not getattr(conn, "evicted", False):
            self._handshake(conn)  # the handshake thread goes on with it
            return False
        ready = self._progress(conn)
        if ready is None or ready:
            self._leave(conn)
            if ready is None:
                conn.close()
            return bool(ready)
        self._wait(conn)
        return False

    def ready_now(self, conn: Any) -> bool | None:
        """For a connection lingering on its thread between requests: ``True`` once its
        next request can be served (head, and a token holder's body), ``False`` when it
        must wait at the gate, ``None`` if closed."""
        return self._progress(conn)

    def forget(self, conn: Any) -> None:
        """Drops a closed connection from the caps."""
        self._leave(conn)

    def close(self) -> None:
        """Stops the handshake thread (the server stopped)."""
        with self._lock:
            handshakes, self._handshakes = self._handshakes, None
        if handshakes is not None:
            handshakes.stop()

    @property
    def handshakes_completed(self) -> int:
        """TLS handshakes the gate's handshake thread completed."""
        handshakes = self._handshakes
        return handshakes.completed if handshakes is not None else 0

    @property
    def waiting_untrusted(self) -> int:
        """Connections without an authenticated request waiting at the gate now."""
        with self._lock:
            return len(self._waiting)

    # ------------------------------------------------------------------ helpers
    def _head_limit(self) -> int:
        return int(self.server.max_request_header_size or 64 * 1024) + 4096

    def _handshake(self, conn: Any) -> None:
        """Queues ``conn``'s next TLS handshake step on the handshake thread, which
        takes one peer's connections in turn with the others'; it counts against the
        caps meanwhile, and its head's clock runs."""
        conn.head_started = getattr(conn, "head_started", None) or time.time()
        self._enlist(conn)
        with self._lock:
            if self._handshakes is None:
                self._handshakes = Handshakes(
                    self._handshaken, self._handshake_failed, self.head_seconds
                )
            handshakes = self._handshakes
        handshakes.submit(peer_key(getattr(conn, "remote_addr", None)), conn)

    def _handshaken(self, conn: Any) -> None:
        """On the handshake thread: a step done. Whole: on as any connection (its head
        may be in already); else it waits for the peer's next bytes."""
        if getattr(conn, "_tls_ready", True):
            self.server.process_conn(conn)
        else:
            self._wait(conn)

    def _handshake_failed(self, conn: Any) -> None:
        with contextlib.suppress(Exception):
            conn.close()

    def _progress(self, conn: Any) -> bool | None:
        """Reads what ``conn`` has ready: ``True`` once its request can be served
        without waiting, ``False`` while it must wait, ``None`` when it closed."""
        if getattr(conn, "evicted", False):
            return None
        body = getattr(conn, "body", None)
        if body is None:
            limit = self._head_limit()
            complete = head_complete(conn.rfile, limit)
            if not complete:
                if not fill(conn, limit):
                    return None
                complete = head_complete(conn.rfile, limit)
            if complete:
                # A thread reads a new body first (PendingBody.read_on_thread).
                self._inspect_head(conn)
            return complete
        return body.fill(conn) if body.at_gate else True

    def _inspect_head(self, conn: Any) -> None:
        """Reads the whole head's framing: a refused one is marked for a 400 answer
        (``conn.refusal``); a token holder's body not yet in gets a
        :class:`PendingBody` (``conn.body``), read by a thread, then by the gate if
        it stalls."""
        rfile = conn.rfile
        try:
            head = parse_head(unread_head(rfile, _head_extent(rfile, self._head_limit())))
        except FramingError as exc:
            conn.refusal = str(exc)
            return
        if head is None or self.bodies is None:
            return  # a head over the bound: cheroot refuses it
        wanted = self.bodies.wanted(head)
        if wanted <= unread_size(rfile) - head.size:
            self.bodies.release(wanted)  # (already in: nothing to hold)
            return
        conn.body = body = PendingBody(wanted, self.bodies)
        body.filled = move_unread(rfile, head.size, body.view)
        conn.trusted = True  # it carries the token: no untrusted cap applies

    def _wait(self, conn: Any) -> None:
        # The head's clock runs from the accept, or from the first wake-up of a kept-alive
        # connection (connections idle between requests wait in cheroot's selector
        # without the gate, under the server's keep-alive timeout).
        now = time.time()
        started = getattr(conn, "head_started", None) or now
        conn.head_started = started
        # cheroot's selector loop closes a connection once it has not been used for the
        # server timeout: date it so that this happens at the head's (or the body's)
        # deadline. A body's closing answers 408 (BulkConnection.close).
        body = getattr(conn, "body", None)
        deadline = body.deadline if body is not None else started + self.head_seconds
        conn.last_used = min(deadline - self.server.timeout, now)
        if body is not None:
            self._leave(conn)
        elif not getattr(conn, "trusted", False):
            self._enlist(conn)
        park_in_selector(self.server, conn)

    def _enlist(self, conn: Any) -> None:
        peer = peer_key(getattr(conn, "remote_addr", None))
        victim = None
        with self._lock:
            if conn in self._waiting:
                return
            mine = self._per_peer.get(peer)
            if mine is not None and len(mine) >= self.peer_cap:
                victim = next(iter(mine))
            elif len(self._waiting) >= self.untrusted_cap:
                # The peer holding the most pays: many peers each under the per-peer
                # cap cannot push out the few new connections of another.
                crowded = max(self._per_peer.values(), key=len)
                victim = next(iter(crowded))
            if victim is not None:
                self._drop_locked(victim)
                self.evicted += 1
            self._waiting[conn] = peer
            self._per_peer.setdefault(peer, OrderedDict())[conn] = None
            self.held_max = max(self.held_max, len(self._waiting))
        if victim is not None:
            _evict(victim)

    def _leave(self, conn: Any) -> None:
        conn.head_started = None
        with self._lock:
            self._drop_locked(conn)

    def _drop_locked(self, conn: Any) -> None:
        peer = self._waiting.pop(conn, None)
        if peer is None:
            return
        mine = self._per_peer[peer]
        mine.pop(conn, None)
        if not mine:
            del self._per_peer[peer]


def peer_key(address: Any) -> str:
    """The peer a connection counts against: its IPv4 address, or its IPv6 /64 (one
    host usually holds a whole /64)."""
    text = str(address or "")
    try:
        ip = ipaddress.ip_address(text.split("%")[0])
    except ValueError:
        return text
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def head_complete(rfile: Any, limit: int) -> bool:
    """Whether ``rfile``'s buffer holds a whole request head (or ``limit`` bytes)."""
    return _head_extent(rfile, limit) < limit or unread_size(rfile) >= limit


def _head_extent(rfile: Any, limit: int) -> int:
    """Bytes up to the end of the head in ``rfile``'s buffer (its blank line, or bare
    line feeds), or ``limit`` when neither is in; nothing is copied."""
    start = 2 if unread_head(rfile, 2) == _CRLF else 0  # cheroot skips one empty line
    crlf = unread_find(rfile, _HEAD_END, start)
    # Bare line feeds count only before the blank line (the body may hold any bytes).
    bare = unread_find(rfile, _BARE_END, start, None if crlf == -1 else crlf + 2)
    if bare != -1:
        return bare + len(_BARE_END)
    return crlf + len(_HEAD_END) if crlf != -1 else limit


def fill(conn: Any, limit: int) -> bool:
    """Reads what ``conn`` has ready, without blocking, into its read buffer.

    Reads nothing while a TLS handshake is under way (:class:`~sparkdl.server.
    handshakes.Handshakes` completes it). Stops at a whole head, at ``limit`` buffered
    bytes, or when nothing more is ready.

    Returns:
        ``False`` when the peer closed or the connection failed (nothing to serve).
    """
    sock = conn.socket
    timeout = sock.gettimeout()
    sock.settimeout(0.0)
    chunks: list[bytes] = []
    try:
        if not getattr(conn, "_tls_ready", True):
            return True  # the handshake thread's (HeadGate._handshake)
        state: Any = conn.rfile
        held = unread_size(state)
        while held < limit:
            try:
                data = sock.recv(min(limit - held, READ_BUFFER_BYTES))
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
                break
            except ssl.SSLWantWriteError:
                break
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                data = b""  # closed: as a plain socket's end of stream
            except (OSError, ValueError, AttributeError):
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
    if chunks:
        append_unread(state, b"".join(chunks))


def _evict(conn: Any) -> None:
    """Makes cheroot's selector loop close ``conn`` at its next turn."""
    conn.evicted = True  # the gate closes it when it wakes
    conn.last_used = 0.0  # else the loop's expiry closes it
    with contextlib.suppress(OSError, ValueError):
        # Readable now. The plain socket's shutdown: an SSLSocket's own would drop its
        # TLS state first, under the selector's feet.
        socket.socket.shutdown(conn.socket, socket.SHUT_RDWR)
