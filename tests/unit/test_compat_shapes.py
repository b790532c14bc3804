"""Shape tests of the private internals sparkdl relies on (no Spark).

* ``http.client.HTTPConnection._send_output`` and ``_buffer``, overridden and read by
  :class:`sparkdl.compat.http_client.CoalescingConnection`;
* cheroot's socket reader / writer, connection, request and WSGI gateway, subclassed by
  :mod:`sparkdl.server.web.transport`, and their private ``_pyio`` buffers and selector,
  reached only through :mod:`sparkdl.compat.cheroot`;
* Keras's ``_flatten_layers``, ``_compile_config``, ``_learning_rate``, ``_inputs_struct`` and its
  ``Functional`` class
  (:mod:`sparkdl.compat.keras`);
* TensorFlow's eager ``_context_handle`` (:mod:`sparkdl.compat.tensorflow`);
* CPython's ``_imp`` import lock and ``sys.modules`` marks (:mod:`sparkdl.compat.imports`);
* MLflow's ``autologging_is_disabled`` (:mod:`sparkdl.compat.mlflow`);
* PySpark's ``Params._dummy`` and ``_resetUid`` (:mod:`sparkdl.compat.spark`; the
  internals that need a SparkSession are checked in
  ``tests/integration/test_compat_spark.py``).

Each failure names the dependency's version, what changed and the module to update.
"""

from __future__ import annotations

import gc
import hashlib
import http.client
import http.server
import inspect
import json
import platform
import socket
import sys
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from cheroot import __version__ as cheroot_version
from cheroot import makefile, server, wsgi

from sparkdl.compat import cheroot as cheroot_compat
from sparkdl.compat import imports as compat_imports
from sparkdl.compat import keras as compat_keras
from sparkdl.compat import libc as compat_libc
from sparkdl.compat import mlflow as compat_mlflow
from sparkdl.compat import spark as compat_spark
from sparkdl.compat.http_client import COALESCE_BYTES, CoalescingConnection

# Every stack of the matrix checks the internals its own releases have.
pytestmark = pytest.mark.compat

PYTHON = f"Python {sys.version.split()[0]}"
CHEROOT = f"cheroot {cheroot_version}"
HTTP_CLIENT_MODULE = "sparkdl/compat/http_client.py"
TRANSPORT_MODULE = "sparkdl/server/web/transport.py"
CHEROOT_MODULE = "sparkdl/compat/cheroot.py"


def _http_client_changed(what: str) -> str:
    return f"{PYTHON} changed http.client.HTTPConnection.{what}; update {HTTP_CLIENT_MODULE}"


def _cheroot_changed(cls: str, attr: str, detail: str) -> str:
    module = CHEROOT_MODULE if attr.startswith("_") else TRANSPORT_MODULE
    return f"{CHEROOT} changed {cls}.{attr} ({detail}); update {module}"


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
    from sparkdl.server.web import transport

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


# --- cheroot through sparkdl.compat.cheroot -------------------------------------------


def test_compat_cheroot_reader_buffer(socket_pair) -> None:
    """unread_bytes / unread_size / append_unread / take_unread on a real StreamReader."""
    cls = "cheroot.makefile.StreamReader"
    left, right = socket_pair
    reader = makefile.StreamReader(right, "rb", 64)
    try:
        with cheroot_compat.reader_lock(reader):  # a context manager, as in _pyio
            pass
        assert cheroot_compat.unread_bytes(reader) == b""
        cheroot_compat.append_unread(reader, b"GET / HTTP/1.1\r\n")
        cheroot_compat.append_unread(reader, b"Host: h\r\n\r\n")
        head = b"GET / HTTP/1.1\r\nHost: h\r\n\r\n"
        if cheroot_compat.unread_bytes(reader) != head:
            pytest.fail(_cheroot_changed(cls, "_read_buf", "appended bytes not read back"))
        assert cheroot_compat.unread_size(reader) == len(head)
        assert reader.has_data(), _cheroot_changed(cls, "_read_buf", "has_data ignores it")
        assert reader.read(4) == b"GET ", _cheroot_changed(cls, "_read_buf", "read skips it")
        assert cheroot_compat.unread_size(reader) == len(head) - 4
        view = memoryview(bytearray(6))
        with cheroot_compat.reader_lock(reader):
            took = cheroot_compat.take_unread(reader, view)
        assert took == 6 and bytes(view) == b"/ HTTP"
        left.sendall(b"tail")
        assert reader.read(len(head) - 10 + 4) == head[10:] + b"tail", _cheroot_changed(
            cls, "_read_pos", "a read after take_unread returns the wrong bytes"
        )
        assert cheroot_compat.unread_size(reader) == 0
    finally:
        reader.close()


def test_compat_cheroot_finds_and_moves_unread_bytes(socket_pair) -> None:
    """unread_find / unread_head / move_unread on a real StreamReader: the gate finds a
    head's end and moves the body bytes that came with it, and reads still see the
    head (and only the head) afterwards."""
    cls = "cheroot.makefile.StreamReader"
    _, right = socket_pair
    reader = makefile.StreamReader(right, "rb", 64)
    try:
        head = b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\n"
        cheroot_compat.append_unread(reader, head + b"hel")
        assert reader.read(2) == b"PO"
        end = cheroot_compat.unread_find(reader, b"\r\n\r\n")
        assert end == len(head) - 6, _cheroot_changed(cls, "_read_pos", "found at the wrong place")
        assert cheroot_compat.unread_find(reader, b"nowhere") == -1
        assert cheroot_compat.unread_head(reader, 4) == b"ST /"
        view = memoryview(bytearray(5))
        moved = cheroot_compat.move_unread(reader, len(head) - 2, view)
        assert moved == 3 and bytes(view[:3]) == b"hel"
        assert cheroot_compat.unread_bytes(reader) == head[2:], _cheroot_changed(
            cls, "_read_buf", "move_unread left the wrong bytes"
        )
        assert reader.readline() == b"ST / HTTP/1.1\r\n"
    finally:
        reader.close()


def test_compat_cheroot_writer_buffer(socket_pair) -> None:
    """writer_lock / write_buffer / flush_unlocked on a real StreamWriter."""
    left, right = socket_pair
    writer = makefile.StreamWriter(right, "wb", 64)
    try:
        with cheroot_compat.writer_lock(writer):
            buffered = cheroot_compat.write_buffer(writer)
            buffered.extend(b"corked")
            left.setblocking(False)
            with pytest.raises(BlockingIOError):  # held in the buffer: nothing sent yet
                left.recv(64)
            left.settimeout(5)
            cheroot_compat.flush_unlocked(writer)
        assert left.recv(64) == b"corked", _cheroot_changed(
            "cheroot.makefile.StreamWriter", "_flush_unlocked", "the buffer was not sent"
        )
        assert not cheroot_compat.write_buffer(writer)
    finally:
        writer.close()


def test_compat_cheroot_parks_a_connection_in_the_selector(socket_pair) -> None:
    """park_in_selector registers the connection where cheroot's selector loop looks."""
    http_server = wsgi.Server(("127.0.0.1", 0), lambda environ, start: [])
    http_server.prepare()  # binds, builds the ConnectionManager, starts the pool
    try:
        _, right = socket_pair
        conn = server.HTTPConnection(http_server, right)
        cheroot_compat.park_in_selector(http_server, conn)
        manager: Any = getattr(http_server, "_connections", None)
        selector = getattr(manager, "_selector", None)
        if selector is None or not hasattr(selector, "connections"):
            pytest.fail(
                _cheroot_changed("cheroot.server.HTTPServer", "_connections._selector", "gone")
            )
        parked = [c for _, c in selector.connections]
        assert conn in parked, _cheroot_changed(
            "cheroot.connections.ConnectionManager", "_selector", "register did not park it"
        )
        selector.unregister(right.fileno())
    finally:
        http_server.stop()


def test_compat_cheroot_discards_a_readers_unread_bytes(socket_pair) -> None:
    """discard_unread empties a real StreamReader's buffer; later reads go to the socket."""
    left, right = socket_pair
    reader = makefile.StreamReader(right, "rb", 64)
    try:
        cheroot_compat.append_unread(reader, b"x" * 1000)
        cheroot_compat.discard_unread(reader)
        assert cheroot_compat.unread_size(reader) == 0 and not reader.has_data()
        left.sendall(b"next")
        assert reader.read(4) == b"next", _cheroot_changed(
            "cheroot.makefile.StreamReader", "_read_buf", "a read after a discard"
        )
    finally:
        reader.close()


def test_compat_cheroot_a_connection_without_its_peer_creds_caches_has_no_cycle(
    socket_pair,
) -> None:
    """cheroot wraps two methods of each connection in an ``lru_cache`` of the bound method
    (a reference cycle); without the wrappers, the last reference frees the connection."""
    cls = "cheroot.server.HTTPConnection"
    http_server = wsgi.Server(("127.0.0.1", 0), lambda environ, start: [])
    _, right = socket_pair
    conn = server.HTTPConnection(http_server, right)
    for name in cheroot_compat.PEER_CREDS_CACHES:
        if name not in vars(conn):
            pytest.fail(_cheroot_changed(cls, name, "no longer cached per instance"))
    cheroot_compat.uncache_peer_creds(conn)
    _require_callable(conn, cls, list(cheroot_compat.PEER_CREDS_CACHES))
    gone = weakref.ref(conn)
    enabled = gc.isenabled()
    gc.disable()
    try:
        del conn
        if gone() is not None:
            pytest.fail(_cheroot_changed(cls, "__init__", "a connection is in another cycle"))
    finally:
        if enabled:
            gc.enable()


def test_compat_cheroot_names_itself_when_an_internal_is_gone() -> None:
    class Bare:
        pass

    for call in [
        lambda: cheroot_compat.unread_bytes(Bare()),
        lambda: cheroot_compat.unread_size(Bare()),
        lambda: cheroot_compat.unread_find(Bare(), b"x"),
        lambda: cheroot_compat.unread_head(Bare(), 1),
        lambda: cheroot_compat.reader_lock(Bare()),
        lambda: cheroot_compat.writer_lock(Bare()),
        lambda: cheroot_compat.write_buffer(Bare()),
        lambda: cheroot_compat.flush_unlocked(Bare()),
        lambda: cheroot_compat.park_in_selector(Bare(), Bare()),
        lambda: cheroot_compat.discard_unread(Bare()),
        lambda: cheroot_compat.uncache_peer_creds(Bare()),
    ]:
        with pytest.raises(cheroot_compat.CherootChanged, match=CHEROOT_MODULE):
            call()


# --- glibc through sparkdl.compat.libc ------------------------------------------------


def test_compat_libc_trims_on_glibc_and_is_a_no_op_elsewhere() -> None:
    on_glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    found = compat_libc._malloc_trim() is not None
    assert found == on_glibc, (
        f"glibc {platform.libc_ver()[1]}: malloc_trim found={found}; update sparkdl/compat/libc.py"
    )
    assert isinstance(compat_libc.malloc_trim(), bool)


# --- Keras through sparkdl.compat.keras -----------------------------------------------

KERAS_MODULE = "sparkdl/compat/keras.py"


def _keras_changed(what: str) -> str:
    import keras

    return f"keras {keras.__version__} changed {what}; update {KERAS_MODULE}"


def test_keras_flatten_layers_finds_nested_and_held_layers() -> None:
    import keras

    flatten = getattr(keras.layers.Layer, "_flatten_layers", None)
    if not callable(flatten):
        pytest.fail(_keras_changed("Layer._flatten_layers (gone)"))
    params = list(inspect.signature(flatten).parameters)
    assert params == ["self", "include_self", "recursive"], _keras_changed(
        f"Layer._flatten_layers: parameters {params}"
    )

    class Holder(keras.layers.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.inner = keras.layers.Dense(2, name="held")

        def call(self, x: Any) -> Any:
            return self.inner(x)

    inner = keras.Sequential([keras.Input((3,)), Holder()], name="inner")
    outer = keras.Sequential([keras.Input((3,)), inner, keras.layers.Dense(1)], name="outer")
    layers = compat_keras.flatten_layers(outer)
    names = [layer.name for layer in layers]
    assert layers[0] is outer, _keras_changed("Layer._flatten_layers: the model is not first")
    assert "inner" in names and "held" in names, _keras_changed(
        f"Layer._flatten_layers: nested or held layers missing from {names}"
    )
    assert len(names) == len(set(map(id, layers)))


def test_keras_compile_arguments_are_the_live_objects() -> None:
    import keras

    class MyLoss(keras.losses.Loss):
        def call(self, y_true: Any, y_pred: Any) -> Any:
            return keras.ops.mean(keras.ops.square(y_true - y_pred), axis=-1)

    loss = MyLoss()
    metric = keras.metrics.MeanAbsoluteError()
    net = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    assert compat_keras.compile_arguments(net) == {}  # not compiled
    net.compile(optimizer="sgd", loss=loss, metrics=[metric])
    config = getattr(getattr(net, "_compile_config", None), "config", None)
    assert isinstance(config, dict), _keras_changed(
        f"Trainer._compile_config.config: {type(config).__name__}, expected a dict"
    )
    args = compat_keras.compile_arguments(net)
    assert args.get("loss") is loss, _keras_changed(
        f"Trainer._compile_config: loss {args.get('loss')!r}, expected the object given"
    )
    assert args.get("metrics") == [metric]


def test_keras_input_struct_is_the_structure_the_model_was_built_on() -> None:
    import keras

    b, a = keras.Input((3,), name="b"), keras.Input((2,), name="a")
    out = keras.layers.Concatenate()([a, b])
    built = compat_keras.input_struct(keras.Model({"b": b, "a": a}, out))
    assert isinstance(built, dict) and list(built) == ["b", "a"], _keras_changed(
        f"Functional._inputs_struct: {built!r}, expected the dict as written"
    )
    assert built["b"] is b
    assert [t.name for t in keras.Model({"b": b, "a": a}, out).inputs] == ["a", "b"]
    listed = compat_keras.input_struct(keras.Model([b, a], out))
    assert isinstance(listed, list) and listed[0] is b, _keras_changed(
        f"Functional._inputs_struct: {listed!r}, expected the list as written"
    )
    assert compat_keras.input_struct(keras.Sequential([keras.Input((3,))])) is None


def test_keras_raw_learning_rate_keeps_a_schedule() -> None:
    import keras

    decay = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9)
    scheduled = keras.optimizers.SGD(decay)
    assert compat_keras.raw_learning_rate(scheduled) is decay, _keras_changed(
        "BaseOptimizer._learning_rate: not the schedule the optimizer was given"
    )

    def by_step() -> float:
        return 0.01

    assert compat_keras.raw_learning_rate(keras.optimizers.Adam(by_step)) is by_step
    fixed = compat_keras.raw_learning_rate(keras.optimizers.SGD(0.25))
    assert isinstance(fixed, keras.Variable), _keras_changed(
        f"BaseOptimizer._learning_rate: {type(fixed).__name__} for a fixed rate"
    )
    assert float(fixed) == pytest.approx(0.25)
    assert compat_keras.raw_learning_rate(None) is None


def test_keras_graph_model_tells_functional_from_subclassed() -> None:
    import keras

    try:
        from keras.src.models.functional import Functional
    except ImportError:
        pytest.fail(_keras_changed("keras.src.models.functional.Functional (gone)"))

    class Subclassed(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.dense = keras.layers.Dense(1)

        def call(self, x: Any) -> Any:
            return self.dense(x)

    inputs = keras.Input((2,))
    functional = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    assert isinstance(functional, Functional), _keras_changed(
        f"functional models: {type(functional).__name__}, not a Functional"
    )
    assert not isinstance(Subclassed(), Functional), _keras_changed(
        "subclassed models: now a Functional"
    )
    sequential = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    assert compat_keras.graph_model(sequential) and compat_keras.graph_model(functional)
    assert not compat_keras.graph_model(Subclassed())
    assert not compat_keras.graph_model(keras.layers.Dense(1))


# --- a fresh process: TensorFlow's context, the import lock's effect on Keras ----------

FRESH = """
import json, sys
from sparkdl.compat.imports import modules_hidden
from sparkdl.compat.tensorflow import runtime_started
facts = {"before_import": runtime_started()}
with modules_hidden(["sklearn", "matplotlib"]) as hidden:
    import keras
facts["hidden"] = hidden
facts["loaded"] = sorted(m for m in ("sklearn", "matplotlib") if sys.modules.get(m))
facts["marks_left"] = sorted(m for m in ("sklearn", "matplotlib") if m in sys.modules)
from tensorflow.python.eager import context
facts["has_handle"] = hasattr(context.context(), "_context_handle")
facts["imported"] = runtime_started()
import tensorflow as tf
tf.constant(1.0) + 1.0
facts["started"] = runtime_started()
print("FACTS " + json.dumps(facts))
"""


@pytest.fixture(scope="module")
def fresh_process() -> dict[str, Any]:
    import os
    import subprocess

    # TensorFlow's handle is reached only where TensorFlow is the backend; the stacks
    # without it (JAX, PyTorch) have nothing there to check.
    pytest.importorskip("tensorflow")

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "tensorflow"}
    done = subprocess.run(
        [sys.executable, "-c", FRESH],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("FACTS ")][-1]
    facts: dict[str, Any] = json.loads(line[len("FACTS ") :])
    return facts


def test_tensorflow_context_handle_tells_a_started_runtime(fresh_process) -> None:
    import tensorflow as tf

    changed = f"tensorflow {tf.__version__} changed %s; update sparkdl/compat/tensorflow.py"
    assert fresh_process["has_handle"], changed % "context.context()._context_handle (gone)"
    assert fresh_process["before_import"] is False
    assert fresh_process["imported"] is False, changed % (
        "_context_handle: set at import already (a warmed-up worker could not pick its GPU)"
    )
    assert fresh_process["started"] is True, changed % "_context_handle: unset after an op"


def test_keras_imports_with_sklearn_and_matplotlib_hidden(fresh_process) -> None:
    import keras

    assert fresh_process["hidden"] == ["sklearn", "matplotlib"]
    assert fresh_process["loaded"] == [], (
        f"keras {keras.__version__} now needs {fresh_process['loaded']} at import (or no "
        "longer catches their ImportError); update sparkdl/compat/imports.py and "
        "sparkdl.executor.imports.UNUSED_ON_WORKERS"
    )
    assert fresh_process["marks_left"] == []


# --- CPython's import machinery through sparkdl.compat.imports ------------------------


def test_global_import_lock_holds_other_threads_imports(tmp_path, monkeypatch) -> None:
    import _imp

    assert callable(getattr(_imp, "acquire_lock", None)), f"{PYTHON}: _imp.acquire_lock gone"
    assert callable(getattr(_imp, "release_lock", None)), f"{PYTHON}: _imp.release_lock gone"
    (tmp_path / "sparkdl_lock_probe.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "sparkdl_lock_probe", raising=False)
    done = threading.Event()

    def other() -> None:
        import sparkdl_lock_probe  # noqa: F401

        done.set()

    with compat_imports.global_import_lock() as held:
        assert held is True and _imp.lock_held(), f"{PYTHON}: _imp.lock_held() is False"
        thread = threading.Thread(target=other, daemon=True)
        thread.start()
        assert not done.wait(0.3), (
            f"{PYTHON}: another thread imported a new module while the global import lock "
            "was held; update sparkdl/compat/imports.py"
        )
    assert done.wait(10)
    thread.join(5)
    assert not _imp.lock_held()


def test_modules_hidden_blocks_and_restores(monkeypatch) -> None:
    import json as already

    monkeypatch.delitem(sys.modules, "sparkdl_never_imported", raising=False)
    with compat_imports.modules_hidden(["json", "sparkdl_never_imported"]) as hidden:
        assert hidden == ["sparkdl_never_imported"]  # json stays: it is imported
        with pytest.raises(ModuleNotFoundError):
            import sparkdl_never_imported  # noqa: F401
        import json as again

        assert again is already
    assert "sparkdl_never_imported" not in sys.modules


# --- MLflow through sparkdl.compat.mlflow ---------------------------------------------


def test_mlflow_autologging_switch_is_readable() -> None:
    pytest.importorskip("mlflow")
    import mlflow
    from mlflow.utils import autologging_utils

    changed = f"mlflow {mlflow.__version__} changed %s; update sparkdl/compat/mlflow.py"
    check = getattr(autologging_utils, "autologging_is_disabled", None)
    assert callable(check), changed % "autologging_utils.autologging_is_disabled (gone)"
    params = list(inspect.signature(check).parameters)
    assert params == ["integration_name"], changed % f"its parameters {params}"
    disabled = check("keras")
    assert isinstance(disabled, bool), changed % f"its answer {disabled!r}"
    assert compat_mlflow.keras_autologging_on() is (not disabled)


# --- PySpark's Params through sparkdl.compat.spark (no session) -----------------------


def test_pyspark_params_dummy_and_reset_uid() -> None:
    import pyspark
    from pyspark.ml.param import Param, Params
    from pyspark.ml.param.shared import HasInputCol

    changed = f"pyspark {pyspark.__version__} changed %s; update sparkdl/compat/spark.py"
    parent = compat_spark.param_parent()
    assert isinstance(parent, Params) and parent.uid == "undefined", changed % (
        f"Params._dummy(): {parent!r}"
    )

    class Stage(HasInputCol):
        extra: Param[str] = Param(compat_spark.param_parent(), "extra", "a setting")

        def __init__(self) -> None:
            super().__init__()
            self._setDefault(extra="x")

    stage = Stage()
    stage._set(inputCol="features")
    compat_spark.reset_uid(stage, "Stage_saved")
    assert stage.uid == "Stage_saved"
    assert stage.extra.parent == "Stage_saved" and stage.inputCol.parent == "Stage_saved"
    assert stage.getInputCol() == "features", changed % "Params._resetUid (param map lost)"
    assert stage.getOrDefault(stage.extra) == "x", changed % "Params._resetUid (defaults)"
    assert stage.hasParam("extra")
