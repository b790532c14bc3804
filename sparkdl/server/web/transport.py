"""cheroot connections that move large bodies without copying them in Python.

cheroot reads and writes sockets through the pure-Python ``_pyio`` buffered streams.
That is fine for headers and small bodies, but a body of tens of megabytes is read
in pieces that are each copied, joined and sliced again, and a large response is
re-copied on every partial ``send`` (``benchmarks/service.py`` measures it). The
classes here keep cheroot's HTTP parsing, keep-alive handling and thread pool, and
change only the bulk path: a read of at least :data:`BULK_BYTES` goes straight from
the socket into one preallocated buffer (``recv_into``), and a write of at least
:data:`BULK_BYTES` goes out with one ``sendall`` of the caller's buffer.

Small answers go the other way: cheroot sends every write at once, so the status line,
the headers and each array of a small model left in separate ``send`` calls (six for
a 4-array model), each waking the worker. :class:`BulkGateway` corks the writer for
the whole answer, which then leaves in one ``send`` when smaller than
:data:`BULK_BYTES`; and a connection reads requests through a 64 KiB buffer, so a
small push arrives in one ``recv``.

cheroot answers some requests itself, before the app runs (a malformed request line,
headers too large, a body over the size bound): :class:`JSONErrorRequest` makes those
answers JSON ``{"error": ..., "status": ...}`` like every answer of the app.

Example:
    >>> from cheroot import wsgi
    >>> server = wsgi.Server(("127.0.0.1", 0), lambda environ, start: [])
    >>> use_bulk_io(server)
    >>> server.ConnectionClass is BulkConnection and server.gateway is BulkGateway
    True
"""

from __future__ import annotations

import contextlib
import json
import selectors
import socket
import ssl
from typing import Any

import numpy as np
from cheroot import makefile, server, wsgi
from cheroot.ssl.builtin import BuiltinSSLAdapter

from sparkdl.compat.cheroot import (
    append_unread,
    discard_unread,
    flush_unlocked,
    reader_lock,
    take_unread,
    uncache_peer_creds,
    unread_size,
    write_buffer,
    writer_lock,
)
from sparkdl.server.web.trim import TRIMMER

__all__ = [
    "BULK_BYTES",
    "LINGER_SECONDS",
    "READ_BUFFER_BYTES",
    "SEND_SLICE_BYTES",
    "BulkConnection",
    "BulkGateway",
    "BulkReader",
    "BulkWriter",
    "DeferredHandshakeAdapter",
    "JSONErrorRequest",
    "use_bulk_io",
]

BULK_BYTES = 256 * 1024
#: Read buffer of a connection: a small request (headers and body) fits in one recv.
READ_BUFFER_BYTES = 64 * 1024
LINGER_SECONDS = 0.05
#: Large writes go out in slices of this size, so the socket timeout bounds each slice
#: (as with stock cheroot's small writes), not the whole body.
SEND_SLICE_BYTES = 4 << 20


def use_bulk_io(http_server: server.HTTPServer) -> None:
    """Makes ``http_server`` use :class:`BulkConnection` and :class:`BulkGateway`."""
    http_server.ConnectionClass = BulkConnection
    http_server.gateway = BulkGateway


class BulkGateway(wsgi.Gateway_10):
    """cheroot's WSGI 1.0 gateway, accepting any bytes-like body chunk.

    cheroot refuses chunks that are not ``bytes``; building a ``bytes`` of a large
    model costs a copy plus a page fault per 4 KiB page. This gateway also takes
    ``memoryview`` chunks, so the service sends numpy arrays' own memory.
    """

    def start_response(self, status: Any, headers: Any, exc_info: Any = None) -> Any:
        """cheroot's ``start_response``; a 401 closes the connection after its answer,
        any other answer of the app marks the connection as authenticated."""
        write = super().start_response(status, headers, exc_info)
        if str(status).startswith("401"):
            self.req.close_connection = True
        else:
            self.req.conn.trusted = True
        return write

    def respond(self) -> None:
        response = self.req.server.wsgi_app(self.env, self.start_response)
        # A request answered without reading its whole body (a 401, 411, 413, a
        # truncated or timed-out body) would make cheroot read and discard the rest
        # before answering: close the connection instead, so an unauthenticated client
        # cannot make a thread drain a large body, and the next request on the
        # connection is never parsed from leftover body bytes.
        if self.req.chunked_read or getattr(self.req.rfile, "remaining", 0):
            self.req.close_connection = True
        wfile = self.req.conn.wfile
        corked = isinstance(wfile, BulkWriter)
        if corked:
            wfile.cork()  # the headers and a small body leave in one send
        try:
            for chunk in response:
                if not isinstance(chunk, (bytes, bytearray, memoryview)):
                    raise TypeError(
                        f"WSGI apps must yield bytes-like chunks. Received: {type(chunk)}"
                    )
                if len(chunk):
                    self.write(chunk)
        finally:
            try:
                self.req.ensure_headers_sent()
            finally:
                if corked:
                    wfile.uncork()
                if hasattr(response, "close"):
                    response.close()


class BulkReader(makefile.StreamReader):
    """cheroot's socket reader, with large reads done by ``recv_into`` one buffer.

    A read of ``size >= BULK_BYTES`` returns a ``memoryview`` of a fresh, uninitialised
    numpy buffer (no zero-filling, no intermediate copies); smaller reads behave as in
    cheroot and return ``bytes``. Fewer bytes than asked come back only at end of
    stream, as with any file object.

    A body the gate read before the request reached a thread
    (:class:`sparkdl.server.web.bodies.PendingBody`) is served from its buffer
    (``prefetched``) once the head is consumed, by ``read``, ``read1``, ``readinto`` and
    ``peek`` alike (``readline`` reads through ``peek`` and ``read``): ``memoryview``
    slices of it from :data:`BULK_BYTES` up, ``bytes`` below.
    """

    #: The request body the gate read, not yet returned (``None``: read the socket).
    prefetched: memoryview | None = None
    #: Bytes that came after that body (TLS: already decrypted), served after it.
    pipelined: bytes = b""

    def read(self, size: int | None = -1) -> Any:
        # (The head is read first, from the buffer: cheroot's readline reads through here.)
        if self.prefetched is not None and not unread_size(self):
            return self._read_prefetched(size)
        if size is None or size < BULK_BYTES:
            return super().read(size)
        view = memoryview(np.empty(size, dtype=np.uint8).data)
        with reader_lock(self):
            got = take_unread(self, view)
            while got < size:
                n = self.raw.readinto(view[got:])
                if not n:
                    break
                got += n
        self.bytes_read += got
        return view[:got]

    def peek(self, size: int = 0) -> bytes:
        if self.prefetched is not None and not unread_size(self):
            return bytes(self.prefetched[: max(size, 1)])
        return super().peek(size)

    def read1(self, size: int = -1) -> Any:
        if self.prefetched is not None and not unread_size(self):
            return self._read_prefetched(size)
        return super().read1(size)

    def readinto(self, buffer: Any) -> int:
        if self.prefetched is not None and not unread_size(self):
            data = self._read_prefetched(len(buffer))
            memoryview(buffer).cast("B")[: len(data)] = data
            return len(data)
        return super().readinto(buffer)

    def _read_prefetched(self, size: int | None) -> Any:
        body = self.prefetched
        assert body is not None
        take = len(body) if size is None or size < 0 else min(size, len(body))
        out, rest = body[:take], body[take:]
        self.prefetched = rest if len(rest) else None
        if self.prefetched is None and self.pipelined:  # what came after the body
            append_unread(self, self.pipelined)
            self.pipelined = b""
        self.bytes_read += take
        return out if take >= BULK_BYTES else bytes(out)


class BulkWriter(makefile.StreamWriter):
    """cheroot's socket writer, with large writes sent by one ``sendall`` (no copy).

    While corked (:meth:`cork`), small writes gather in the buffer until
    :meth:`uncork`, or until they pass :data:`BULK_BYTES`, instead of each going out
    at once.
    """

    def __init__(self, sock: socket.socket, mode: str = "w", bufsize: int = 8192) -> None:
        super().__init__(sock, mode, bufsize)
        self._sock = sock
        self._corked = False

    def cork(self) -> None:
        """Holds small writes back until :meth:`uncork`."""
        self._corked = True

    def uncork(self) -> None:
        """Sends what the cork held back."""
        self._corked = False
        with writer_lock(self):
            flush_unlocked(self)

    def write(self, data: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        size = len(data)
        if size < BULK_BYTES:
            if not self._corked:
                return super().write(data, *args, **kwargs)
            with writer_lock(self):
                buffered = write_buffer(self)
                buffered.extend(data)
                if len(buffered) >= BULK_BYTES:
                    flush_unlocked(self)
            self.bytes_written += size
            return size
        view = memoryview(data).cast("B")
        with writer_lock(self):
            flush_unlocked(self)
            for start in range(0, size, SEND_SLICE_BYTES):
                self._sock.sendall(view[start : start + SEND_SLICE_BYTES])
        self.bytes_written += size
        return size


class JSONErrorRequest(server.HTTPRequest):
    """cheroot's request handler, whose own error answers are JSON."""

    def simple_response(self, status: Any, msg: Any = "") -> None:
        code, _, reason = str(status).partition(" ")
        if not code.isdigit() or int(code) < 400:
            super().simple_response(status, msg)
            return
        text = msg.decode("latin-1") if isinstance(msg, bytes) else str(msg or reason)
        body = json.dumps({"error": text or reason, "status": int(code)}).encode()
        lines = [
            f"{self.server.protocol} {status}",
            f"Content-Length: {len(body)}",
            "Content-Type: application/json",
        ]
        if code in ("413", "414"):
            self.close_connection = True  # the rest of the request is never read
        if self.close_connection:
            lines.append("Connection: close")
        head = "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n"
        with contextlib.suppress(OSError):  # the client is gone
            self.conn.wfile.write(head + body)


class DeferredHandshakeAdapter(BuiltinSSLAdapter):
    """cheroot's built-in TLS adapter, handshaking at the connection's first read.

    cheroot wraps each accepted socket in its accepting thread; with the handshake
    there, one silent client would stop the server from accepting anyone else for
    the socket timeout. OpenSSL handshakes at the first read instead, on the thread
    that serves the connection, under the same timeout as a request.
    """

    def __init__(self, certificate: str, private_key: str) -> None:
        super().__init__(certificate, private_key)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2

    def wrap(self, sock: Any) -> tuple[Any, dict[str, str]]:
        wrapped = self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return wrapped, {"wsgi.url_scheme": "https", "HTTPS": "on"}


class BulkConnection(server.HTTPConnection):
    """A cheroot HTTP connection with bulk I/O that keeps its thread between requests.

    cheroot hands an idle keep-alive connection back to its selector thread after each
    request, and the next request then travels selector -> queue -> worker thread: two
    thread switches per request. A worker talks to the service in a tight loop, so the
    connection first waits up to :data:`LINGER_SECONDS` on its own thread for the next
    request. The service runs more threads than workers, so a lingering connection
    never starves another.

    Only a connection whose request the app answered with anything but a 401
    (``trusted``) is kept alive or lingers; the others close after one answer. Behind a
    :class:`sparkdl.server.web.gate.HeadGate`, a lingering connection takes its next
    request only once the whole head is in, and waits at the gate otherwise.
    """

    rbufsize = READ_BUFFER_BYTES
    RequestHandlerClass = JSONErrorRequest

    def __init__(self, http_server: server.HTTPServer, sock: socket.socket, makefile: Any = None):
        super().__init__(http_server, sock, _bulk_makefile)
        uncache_peer_creds(self)  # no self-cycle: a closed connection is freed at once
        self._tls_ready = not isinstance(sock, ssl.SSLSocket)
        #: The app answered a request of this connection with anything but a 401.
        self.trusted = False
        self.head_started: float | None = None

    def communicate(self) -> bool:
        if not self._handshake():
            return False  # cheroot closes the connection
        while True:
            body = getattr(self, "body", None)  # a token holder's body the gate found
            if body is not None:
                ready = body.read_on_thread(self)
                if ready is None:
                    return False
                if not ready:
                    return True  # it stalled: the gate reads the rest (put_conn)
            if not self._serve_one():
                return False
            ready = self._next_request_within(LINGER_SECONDS)
            if ready is None:
                return False
            if not ready:
                return True

    def close(self) -> None:
        gate = getattr(self.server, "gate", None)
        if gate is not None:
            gate.forget(self)
        body = getattr(self, "body", None)
        if body is not None:  # the gate's body deadline passed
            self.body = None
            body.release()
            _send_now(self.socket, _timeout_answer(self.server.protocol))
        super().close()
        # An unfinished head's bytes (up to the gate's bound) are freed now, and once
        # enough were, the allocator hands them back to the system (server/web/trim.py).
        unread = unread_size(self.rfile)
        discard_unread(self.rfile)
        if unread:
            TRIMMER.released(unread)

    def _serve_one(self) -> bool:
        refusal = getattr(self, "refusal", None)
        if refusal is not None:  # the gate found the head's framing ambiguous
            self.refusal = None
            request = self.RequestHandlerClass(self.server, self)
            request.close_connection = True
            request.simple_response("400 Bad Request", refusal)
            return False
        keep = bool(super().communicate())
        if self.rfile.prefetched is not None:  # a body the request did not read whole
            self.rfile.prefetched, self.rfile.pipelined = None, b""
            return False
        return keep and self.trusted

    def _handshake(self) -> bool:
        """Completes a TLS handshake (:class:`DeferredHandshakeAdapter`) on this thread;
        ``False`` for a client without the fit's certificate or not speaking TLS. Behind
        a gate the handshake is already done, without blocking."""
        if getattr(self, "_tls_ready", True) or not isinstance(self.socket, ssl.SSLSocket):
            return True
        try:
            self.socket.do_handshake()
        except (ssl.SSLError, OSError):
            return False
        self._tls_ready = True
        return True

    def _next_request_within(self, seconds: float) -> bool | None:
        """Whether the next request can be served on this thread now (``None``: the
        connection closed)."""
        gate = getattr(self.server, "gate", None)
        if self.rfile.has_data():
            return True if gate is None else gate.ready_now(self)
        if not self.server.ready:
            return False
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(self.socket, selectors.EVENT_READ)
                if not selector.select(seconds):
                    return False
        except (OSError, ValueError):
            return False
        return True if gate is None else gate.ready_now(self)


def _timeout_answer(protocol: str) -> bytes:
    """The 408 answer for a body that did not arrive in time (JSON, as every answer)."""
    body = json.dumps({"error": "Timed out waiting for the request body.", "status": 408}).encode()
    head = (
        f"{protocol} 408 Request Timeout\r\nContent-Length: {len(body)}\r\n"
        "Content-Type: application/json\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


def _send_now(sock: Any, data: bytes) -> None:
    """Sends ``data`` if the socket takes it at once (a short answer before a close,
    from the selector thread, which must never block)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        sock.settimeout(0.0)
        sock.send(data)


def _bulk_makefile(sock: socket.socket, mode: str = "r", bufsize: int = 8192) -> Any:
    if "r" in mode:
        return BulkReader(sock, mode, bufsize)
    return BulkWriter(sock, mode, bufsize)
