"""Every use sparkdl makes of cheroot's private internals.

cheroot reads and writes sockets through its ``makefile.StreamReader`` and
``StreamWriter``, subclasses of the pure-Python ``_pyio.BufferedReader`` /
``BufferedWriter``; their buffers (``_read_buf`` and ``_read_pos``, ``_write_buf``,
each under its ``_read_lock`` / ``_write_lock``, and cheroot's own
``_flush_unlocked``) have no public interface. And cheroot parks idle connections in
its ``ConnectionManager``'s selector (``server._connections._selector``), which it only
offers through ``put_conn``, a method that also stamps and may dispatch the connection.
sparkdl needs both:

* :mod:`sparkdl.server.web.transport` moves large bodies without copying them in Python
  (:func:`reader_lock`, :func:`take_unread`, :func:`writer_lock`,
  :func:`write_buffer`, :func:`flush_unlocked`), and frees a closed connection at once
  (:func:`uncache_peer_creds`, :func:`discard_unread`);
* :mod:`sparkdl.server.web.gate` reads a waiting connection's bytes into its buffer without
  blocking and parks it in cheroot's selector until its request head is whole
  (:func:`unread_bytes`, :func:`unread_size`, :func:`unread_find`, :func:`unread_head`,
  :func:`move_unread`, :func:`append_unread`,
  :func:`park_in_selector`).

No function here falls back silently: a buffer of another shape would corrupt requests,
so a missing internal raises :class:`CherootChanged`, whose message names cheroot's
version and this module. ``tests/unit/test_compat_shapes.py`` checks each against the
installed cheroot (``pyproject.toml`` pins ``cheroot<12`` for them).

Example:
    >>> import socket
    >>> from cheroot import makefile
    >>> left, right = socket.socketpair()
    >>> reader = makefile.StreamReader(right, "rb", 64)
    >>> append_unread(reader, b"GET / HTTP/1.1\\r\\n")
    >>> unread_bytes(reader), unread_size(reader)
    (b'GET / HTTP/1.1\\r\\n', 16)
    >>> reader.read(3)
    b'GET'
    >>> reader.close(); left.close(); right.close()
"""

from __future__ import annotations

import selectors
from contextlib import AbstractContextManager
from typing import Any

__all__ = [
    "CherootChanged",
    "append_unread",
    "discard_unread",
    "flush_unlocked",
    "move_unread",
    "park_in_selector",
    "reader_lock",
    "take_unread",
    "uncache_peer_creds",
    "unread_bytes",
    "unread_find",
    "unread_head",
    "unread_size",
    "write_buffer",
    "writer_lock",
]

MODULE = "sparkdl/compat/cheroot.py"


class CherootChanged(RuntimeError):
    """An internal of cheroot (or of its ``_pyio`` streams) sparkdl relies on is gone."""


def _changed(what: str, exc: BaseException) -> CherootChanged:
    try:
        from cheroot import __version__ as version
    except Exception:  # pragma: no cover - cheroot without a version
        version = "?"
    return CherootChanged(
        f"cheroot {version} changed {what} ({type(exc).__name__}: {exc}); "
        f"sparkdl's parameter service needs {MODULE} updated."
    )


def reader_lock(reader: Any) -> AbstractContextManager[Any]:
    """The lock of a cheroot ``StreamReader``'s buffer (``_pyio``'s ``_read_lock``).

    Hold it around :func:`take_unread` and any raw read that must not interleave with
    another thread's buffered read.

    Raises:
        CherootChanged: The reader has no ``_read_lock``.
    """
    try:
        lock: AbstractContextManager[Any] = reader._read_lock
    except AttributeError as exc:
        raise _changed("StreamReader._read_lock", exc) from exc
    return lock


def unread_bytes(reader: Any) -> bytes:
    """The bytes a cheroot ``StreamReader`` holds that no read has returned yet
    (``_read_buf[_read_pos:]``), without consuming them.

    Raises:
        CherootChanged: The reader has no ``_read_buf`` / ``_read_pos``.
    """
    try:
        return bytes(reader._read_buf[reader._read_pos :])
    except AttributeError as exc:
        raise _changed("StreamReader._read_buf / _read_pos", exc) from exc


def unread_size(reader: Any) -> int:
    """How many bytes :func:`unread_bytes` would return, without copying them.

    Raises:
        CherootChanged: The reader has no ``_read_buf`` / ``_read_pos``.
    """
    try:
        return len(reader._read_buf) - int(reader._read_pos)
    except AttributeError as exc:
        raise _changed("StreamReader._read_buf / _read_pos", exc) from exc


def append_unread(reader: Any, data: bytes) -> None:
    """Appends ``data`` (read from the socket by the caller) to a cheroot
    ``StreamReader``'s buffer, where its next reads find it; takes the buffer's lock.

    Raises:
        CherootChanged: The reader has no ``_read_lock`` / ``_read_buf`` / ``_read_pos``.
    """
    if not data:
        return
    with reader_lock(reader):
        try:
            reader._read_buf = reader._read_buf[reader._read_pos :] + data
            reader._read_pos = 0
        except AttributeError as exc:
            raise _changed("StreamReader._read_buf / _read_pos", exc) from exc


def unread_find(reader: Any, sub: bytes, start: int = 0, end: int | None = None) -> int:
    """Where ``sub`` first occurs in a cheroot ``StreamReader``'s unread bytes, from
    ``start`` on and ending by ``end`` (-1: nowhere), without copying them.

    Raises:
        CherootChanged: The reader has no ``_read_buf`` / ``_read_pos``.
    """
    try:
        pos = int(reader._read_pos)
        stop = None if end is None else pos + end
        found = int(reader._read_buf.find(sub, pos + start, stop))
    except AttributeError as exc:
        raise _changed("StreamReader._read_buf / _read_pos", exc) from exc
    return found - pos if found >= 0 else -1


def unread_head(reader: Any, size: int) -> bytes:
    """The first ``size`` unread bytes of a cheroot ``StreamReader`` (a copy of those
    only), without consuming them.

    Raises:
        CherootChanged: The reader has no ``_read_buf`` / ``_read_pos``.
    """
    try:
        pos = int(reader._read_pos)
        return bytes(reader._read_buf[pos : pos + size])
    except AttributeError as exc:
        raise _changed("StreamReader._read_buf / _read_pos", exc) from exc


def move_unread(reader: Any, keep: int, view: memoryview) -> int:
    """Moves the unread bytes of a cheroot ``StreamReader`` that follow its first
    ``keep`` ones into ``view`` (at most ``len(view)``; the buffer keeps the rest) and
    returns how many; takes the buffer's lock.

    Raises:
        CherootChanged: The reader has no ``_read_lock`` / ``_read_buf`` / ``_read_pos``.
    """
    with reader_lock(reader):
        try:
            pos = int(reader._read_pos)
            buffered = reader._read_buf
            tail = memoryview(buffered)[pos + keep : pos + keep + len(view)]
            moved = len(tail)
            view[:moved] = tail
            reader._read_buf = bytes(buffered[pos : pos + keep]) + bytes(
                buffered[pos + keep + moved :]
            )
            reader._read_pos = 0
        except AttributeError as exc:
            raise _changed("StreamReader._read_buf / _read_pos", exc) from exc
    return moved


def discard_unread(reader: Any) -> None:
    """Drops the bytes a cheroot ``StreamReader`` holds unread (``_read_buf``), so a
    closed connection's buffer is freed now rather than with its reader; takes the
    buffer's lock.

    Raises:
        CherootChanged: The reader has no ``_read_lock`` / ``_read_buf`` / ``_read_pos``.
    """
    with reader_lock(reader):
        try:
            reader._read_buf, reader._read_pos = b"", 0
        except AttributeError as exc:
            raise _changed("StreamReader._read_buf / _read_pos", exc) from exc


#: The methods cheroot's ``HTTPConnection.__init__`` wraps, per instance, in an
#: ``lru_cache`` of the bound method.
PEER_CREDS_CACHES = ("resolve_peer_creds", "get_peer_creds")


def uncache_peer_creds(conn: Any) -> None:
    """Removes the ``lru_cache`` wrappers cheroot's ``HTTPConnection.__init__`` puts on
    each connection (:data:`PEER_CREDS_CACHES`), leaving the class's own methods.

    Each wrapper holds a bound method of the connection: a reference cycle, so a closed
    connection (its socket object and read buffer with it) is freed only by Python's
    cyclic collector, which under a churn of connections runs long after thousands have
    closed. Without the wrappers, a connection is freed when its last reference goes.
    The peer credentials they cache exist for UNIX sockets only (unused here).

    Raises:
        CherootChanged: ``conn`` does not hold the wrappers as instance attributes.
    """
    try:
        for name in PEER_CREDS_CACHES:
            delattr(conn, name)
    except AttributeError as exc:
        raise _changed(f"HTTPConnection.__init__'s cached {PEER_CREDS_CACHES}", exc) from exc


def take_unread(reader: Any, view: memoryview) -> int:
    """Moves up to ``len(view)`` buffered bytes of a cheroot ``StreamReader`` into
    ``view`` (consuming them) and returns how many; the caller holds
    :func:`reader_lock`.

    Raises:
        CherootChanged: The reader has no ``_read_buf`` / ``_read_pos``.
    """
    try:
        buffered, pos = reader._read_buf, reader._read_pos
        take = min(len(buffered) - pos, len(view))
        view[:take] = buffered[pos : pos + take]
        reader._read_pos = pos + take
    except AttributeError as exc:
        raise _changed("StreamReader._read_buf / _read_pos", exc) from exc
    return take


def writer_lock(writer: Any) -> AbstractContextManager[Any]:
    """The lock of a cheroot ``StreamWriter``'s buffer (``_pyio``'s ``_write_lock``).

    Raises:
        CherootChanged: The writer has no ``_write_lock``.
    """
    try:
        lock: AbstractContextManager[Any] = writer._write_lock
    except AttributeError as exc:
        raise _changed("StreamWriter._write_lock", exc) from exc
    return lock


def write_buffer(writer: Any) -> bytearray:
    """A cheroot ``StreamWriter``'s pending bytes (``_write_buf``), which the caller may
    extend while holding :func:`writer_lock`; :func:`flush_unlocked` sends them.

    Raises:
        CherootChanged: The writer has no ``_write_buf`` bytearray.
    """
    try:
        buffered = writer._write_buf
    except AttributeError as exc:
        raise _changed("StreamWriter._write_buf", exc) from exc
    if not isinstance(buffered, bytearray):
        raise _changed("StreamWriter._write_buf", TypeError(type(buffered).__name__))
    return buffered


def flush_unlocked(writer: Any) -> None:
    """Sends a cheroot ``StreamWriter``'s pending bytes (cheroot's
    ``BufferedWriter._flush_unlocked``); the caller holds :func:`writer_lock`.

    Raises:
        CherootChanged: The writer has no ``_flush_unlocked``.
    """
    try:
        flush = writer._flush_unlocked
    except AttributeError as exc:
        raise _changed("BufferedWriter._flush_unlocked", exc) from exc
    flush()


def park_in_selector(http_server: Any, conn: Any) -> None:
    """Registers ``conn`` for reading in cheroot's selector thread, as cheroot does for
    an idle kept-alive connection (``server._connections._selector.register``).

    The public ``HTTPServer.put_conn`` would also stamp ``conn.last_used`` and, when
    its buffer holds bytes, hand it straight back to ``process_conn``: a connection
    whose head is only partly in would loop there instead of waiting.

    Raises:
        CherootChanged: The server has no ``_connections._selector`` to register with.
    """
    try:
        selector = http_server._connections._selector
        register = selector.register
    except AttributeError as exc:
        raise _changed("HTTPServer._connections._selector", exc) from exc
    register(conn.socket.fileno(), selectors.EVENT_READ, data=conn)
