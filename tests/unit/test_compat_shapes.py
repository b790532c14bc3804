"""Shape tests of the private internals sparkdl relies on (no Spark).

* ``http.client.HTTPConnection._send_output`` and ``_buffer``, overridden and read by
  :class:`sparkdl.compat.http_client.CoalescingConnection`;
* cheroot's socket reader / writer, connection, request and WSGI gateway, subclassed by
  :mod:`sparkdl.server.transport`, which reads their private ``_pyio`` buffers.

Each failure names the dependency's version, what changed and the module to update.
"""

from __future__ import annotations

import hashlib
import http.client
import http.server
import inspect
import json
import socket
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from cheroot import __version__ as cheroot_version
from cheroot import makefile, server, wsgi

from sparkdl.compat.http_client import COALESCE_BYTES, CoalescingConnection

PYTHON = f"Python {sys.version.split()[0]}"
CHEROOT = f"cheroot {cheroot_version}"
HTTP_CLIENT_MODULE = "sparkdl/compat/http_client.py"
TRANSPORT_MODULE = "sparkdl/server/transport.py"


def _http_client_changed(what: str) -> str:
    return f"{PYTHON} changed http.client.HTTPConnection.{what}; update {HTTP_CLIENT_MODULE}"


def _cheroot_changed(cls: str, attr: str, detail: str) -> str:
    return f"{CHEROOT} changed {cls}.{attr} ({detail}); update {TRANSPORT_MODULE}"


def _require(obj: object, cls: str, attrs: list[str]) -> None:
    """Fails naming the first of ``attrs`` that ``obj`` lacks."""
    for attr in attrs:
        if not hasattr(obj, attr):
            pytest.fail(_cheroot_changed(cls, attr, "attribute is gone"))


def _require_callable(obj: object, cls: str, attrs: list[str]) -> None:
    _require(obj, cls, attrs)
    for attr in attrs:
        if not callable(getattr(obj, attr)):
            pytest.fail(_cheroot_changed(cls, attr, "is no longer callable"))


def _require_params(func: Any, cls: str, attr: str, names: list[str]) -> None:
    """Fails unless ``func``'s leading parameters are ``names``."""
    params = list(inspect.signature(func).parameters)
    if params[: len(names)] != names:
        pytest.fail(_cheroot_changed(cls, attr, f"parameters {params}, expected {names}"))


@pytest.fixture
def socket_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    left, right = socket.socketpair()
    left.settimeout(5)
    right.settimeout(5)
    yield left, right
    left.close()
    right.close()


# --- http.client ----------------------------------------------------------------------


def test_http_client_send_output_signature() -> None:
    method = getattr(http.client.HTTPConnection, "_send_output", None)
    if method is None:
        pytest.fail(_http_client_changed("_send_output (gone)"))
    params = inspect.signature(method).parameters
    got = [(name, p.default) for name, p in params.items()]
    want = [("self", inspect.Parameter.empty), ("message_body", None), ("encode_chunked", False)]
    assert got == want, _http_client_changed(f"_send_output: parameters {got}, expected {want}")


def test_http_client_buffer_holds_header_lines_after_putrequest() -> None:
    conn = http.client.HTTPConnection("127.0.0.1", 9, timeout=1)  # putrequest never connects
    try:
        conn.putrequest("PUT", "/w")
        conn.putheader("Content-Length", "3")
        buffered = getattr(conn, "_buffer", None)
        assert isinstance(buffered, list), _http_client_changed(
            f"_buffer: {type(buffered).__name__} after putrequest, expected a list"
        )
        assert all(isinstance(line, bytes) for line in buffered), _http_client_changed(
            "_buffer: holds something other than bytes lines"
        )
        assert buffered[0] == b"PUT /w HTTP/1.1", _http_client_changed(
            f"_buffer: first line {buffered[0]!r}, expected the request line"
        )
        assert b"Content-Length: 3" in buffered, _http_client_changed(
            "_buffer: putheader no longer appends the header line"
        )
    finally:
        conn.close()


class _Echo(http.server.BaseHTTPRequestHandler):
    """Answers each PUT with the length and SHA-256 of the body it read."""

    protocol_version = "HTTP/1.1"  # keep-alive, like the parameter service
    timeout = 10

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        answer = json.dumps({"size": len(body), "sha256": hashlib.sha256(body).hexdigest()})
        data = answer.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass


@pytest.fixture
def echo_server() -> Iterator[int]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield int(httpd.server_address[1])
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


class _CountingConnection(CoalescingConnection):
    """The class under test, counting its ``send`` calls."""

    sends = 0

    def send(self, data: Any) -> None:
        self.sends += 1
        super().send(data)


def _put(conn: _CountingConnection, chunks: list[Any]) -> dict[str, Any]:
    size = sum(memoryview(c).nbytes for c in chunks)
    conn.sends = 0
    conn.request("PUT", "/w", body=chunks, headers={"Content-Length": str(size)})
    response = conn.getresponse()
    assert response.status == 200
    answer: dict[str, Any] = json.loads(response.read())
    return answer


def test_coalescing_connection_sends_small_request_once_and_large_intact(echo_server) -> None:
    conn = _CountingConnection("127.0.0.1", echo_server, timeout=10)
    try:
        small = [b"header", memoryview(b"x" * 1000), bytearray(b"y" * 3000)]
        answer = _put(conn, small)
        want = b"".join(bytes(c) for c in small)
        assert answer == {"size": len(want), "sha256": hashlib.sha256(want).hexdigest()}
        assert conn.sends == 1, (
            f"a {len(want)}-byte request left in {conn.sends} sends, expected 1: "
            f"{PYTHON} may have changed http.client.HTTPConnection._send_output; "
            f"update {HTTP_CLIENT_MODULE}"
        )

        edge = [b"h" * 16, b"e" * (COALESCE_BYTES - 16)]  # exactly the limit: still one send
        answer = _put(conn, edge)
        assert answer["size"] == COALESCE_BYTES
        assert conn.sends == 1

        big = [b"head", bytes(range(256)) * (COALESCE_BYTES // 256 + 1), b"tail" * 100]
        answer = _put(conn, big)  # same kept-alive connection
        want = b"".join(big)
        assert answer == {"size": len(want), "sha256": hashlib.sha256(want).hexdigest()}
        assert conn.sends > 1  # a large body goes out as http.client sends it, uncopied
        assert getattr(conn, "_buffer", None) == [], _http_client_changed(
            "_buffer: not emptied after a request"
        )
    finally:
        conn.close()


# --- cheroot --------------------------------------------------------------------------


def test_cheroot_stream_reader_buffer(socket_pair) -> None:
    """BulkReader.read takes what the buffer holds, then ``raw.readinto``s the rest."""
    cls = "cheroot.makefile.StreamReader"
    left, right = socket_pair
    _require_params(makefile.StreamReader.__init__, cls, "__init__", ["self", "sock", "mode"])
    _require_callable(makefile.StreamReader, cls, ["read", "has_data"])
    reader = makefile.StreamReader(right, "rb", 64)
    try:
        _require(reader, cls, ["raw", "bytes_read", "_read_lock", "_read_buf", "_read_pos"])
        left.sendall(b"hello world")
        assert reader.read(5) == b"hello"
        state: Any = reader
        buffered, pos = state._read_buf, state._read_pos
        if not isinstance(buffered, bytes) or not isinstance(pos, int):
            pytest.fail(
                _cheroot_changed(
                    cls, "_read_buf", f"{type(buffered).__name__} / {type(pos).__name__}"
                )
            )
        if buffered[pos:] != b" world":
            pytest.fail(_cheroot_changed(cls, "_read_buf", "no longer the unread bytes at pos"))
        with state._read_lock:  # a context manager, as in _pyio
            pass
        assert reader.has_data()
        assert reader.bytes_read == 5, _cheroot_changed(cls, "bytes_read", "not counted")
        left.sendall(b"!!")
        view = bytearray(8)
        n = reader.raw.readinto(view)
        assert bytes(view[:n]) == b"!!", _cheroot_changed(cls, "raw", "readinto")
    finally:
        reader.close()


def test_cheroot_stream_writer_buffer(socket_pair) -> None:
    """BulkWriter corks by extending ``_write_buf`` and sends by ``_flush_unlocked``."""
    cls = "cheroot.makefile.StreamWriter"
    left, right = socket_pair
    _require_params(
        makefile.StreamWriter.__init__, cls, "__init__", ["self", "sock", "mode", "bufsize"]
    )
    _require_callable(makefile.StreamWriter, cls, ["write", "_flush_unlocked"])
    writer = makefile.StreamWriter(right, "wb", 64)
    try:
        _require(writer, cls, ["bytes_written", "_write_lock", "_write_buf"])
        state: Any = writer
        if not isinstance(state._write_buf, bytearray):
            pytest.fail(_cheroot_changed(cls, "_write_buf", "no longer a bytearray"))
        with state._write_lock:
            state._write_buf.extend(b"corked")
            state._flush_unlocked()
        assert left.recv(64) == b"corked", _cheroot_changed(cls, "_flush_unlocked", "no send")
        assert not state._write_buf, _cheroot_changed(cls, "_flush_unlocked", "buffer kept")
        writer.write(b"abc")
        assert writer.bytes_written == 3, _cheroot_changed(cls, "bytes_written", "not counted")
        assert left.recv(64) == b"abc"
    finally:
        writer.close()


def test_cheroot_connection_and_server(socket_pair) -> None:
    """BulkConnection passes its makefile third and sets ``rbufsize``; use_bulk_io sets
    the server's ``ConnectionClass`` and ``gateway``."""
    _require(server.HTTPServer, "cheroot.server.HTTPServer", ["ConnectionClass", "gateway"])
    _require_callable(server.HTTPConnection, "cheroot.server.HTTPConnection", ["communicate"])
    _require(server.HTTPConnection, "cheroot.server.HTTPConnection", ["rbufsize", "wbufsize"])
    _require_params(
        server.HTTPConnection.__init__,
        "cheroot.server.HTTPConnection",
        "__init__",
        ["self", "server", "sock", "makefile"],
    )
    http_server = wsgi.Server(("127.0.0.1", 0), lambda environ, start: [])
    _require(http_server, "cheroot.wsgi.Server", ["wsgi_app", "ready"])
    assert http_server.ready is False
    made: list[tuple[str, int]] = []

    def recording(sock: socket.socket, mode: str = "r", bufsize: int = 8192) -> Any:
        made.append((mode, bufsize))
        return makefile.MakeFile(sock, mode, bufsize)

    class Sized(server.HTTPConnection):
        rbufsize = 12345

    _, right = socket_pair
    conn = Sized(http_server, right, recording)
    _require(conn, "cheroot.server.HTTPConnection", ["rfile", "wfile", "server", "socket"])
    if made[:1] != [("rb", 12345)]:
        pytest.fail(
            _cheroot_changed("cheroot.server.HTTPConnection", "__init__", f"makefile calls {made}")
        )
    assert conn.server is http_server and conn.socket is right


def test_cheroot_request_and_gateway(socket_pair) -> None:
    """BulkGateway.respond reads the request's state as cheroot's WSGI 1.0 gateway does."""
    seen: dict[str, Any] = {}

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("200 OK", [("Content-Length", "2")])
        return [b"ok"]

    class Recording(wsgi.Gateway_10):
        def respond(self) -> None:
            seen["req"] = self.req
            seen["env"] = self.env
            seen["remaining"] = getattr(self.req.rfile, "remaining", "missing")
            seen["chunked_read"] = getattr(self.req, "chunked_read", "missing")
            seen["wfile"] = self.req.conn.wfile
            seen["wsgi_app"] = self.req.server.wsgi_app
            super().respond()

    _require_callable(
        wsgi.Gateway_10, "cheroot.wsgi.Gateway_10", ["respond", "start_response", "write"]
    )
    _require_callable(
        server.HTTPRequest, "cheroot.server.HTTPRequest", ["ensure_headers_sent", "respond"]
    )
    http_server = wsgi.Server(("127.0.0.1", 0), app)
    http_server.gateway = Recording
    left, right = socket_pair
    conn = server.HTTPConnection(http_server, right)
    left.sendall(b"PUT /w HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc")
    req = server.HTTPRequest(http_server, conn)
    req.parse_request()
    _require(req, "cheroot.server.HTTPRequest", ["server", "conn", "close_connection", "rfile"])
    req.respond()
    assert seen["req"] is req, _cheroot_changed("cheroot.wsgi.Gateway_10", "req", "not the req")
    assert isinstance(seen["env"], dict), _cheroot_changed("cheroot.wsgi.Gateway_10", "env", "")
    assert seen["wsgi_app"] is app
    assert seen["wfile"] is conn.wfile
    if seen["chunked_read"] is not False:
        pytest.fail(
            _cheroot_changed(
                "cheroot.server.HTTPRequest", "chunked_read", repr(seen["chunked_read"])
            )
        )
    if seen["remaining"] != 3:  # transport closes a connection whose body was not read
        pytest.fail(
            _cheroot_changed(
                "cheroot.server.KnownLengthRFile",
                "remaining",
                f"a request's rfile.remaining is {seen['remaining']!r} with 3 bytes unread",
            )
        )
    answer = left.recv(4096)
    assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(b"\r\n\r\nok")


def test_transport_classes_still_build_on_cheroot() -> None:
    """transport.py's subclasses import and wire up (a changed base class fails here)."""
    from sparkdl.server import transport

    http_server = wsgi.Server(("127.0.0.1", 0), lambda environ, start: [])
    transport.use_bulk_io(http_server)
    assert http_server.ConnectionClass is transport.BulkConnection
    assert http_server.gateway is transport.BulkGateway
    for sub, base in [
        (transport.BulkReader, makefile.StreamReader),
        (transport.BulkWriter, makefile.StreamWriter),
        (transport.BulkConnection, server.HTTPConnection),
        (transport.BulkGateway, wsgi.Gateway_10),
    ]:
        assert issubclass(sub, base)
