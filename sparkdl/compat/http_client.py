"""``http.client``'s connection, sending a small request in one ``send`` call.

The standard library's ``HTTPConnection`` sends the request line and headers, then each
chunk of a list body, in separate ``send`` calls. With ``TCP_NODELAY`` (which
``http.client`` sets) each call is its own packet and wakes the server: a worker's push
of a small model went out in six. :class:`CoalescingConnection` joins the headers and a
body of at most :data:`COALESCE_BYTES` into one buffer and one ``send``.

No public hook does that, so it overrides the private
``HTTPConnection._send_output(message_body=None, encode_chunked=False)`` and empties the
private ``self._buffer`` (the list of header lines ``putrequest`` / ``putheader``
collect) the way the standard library does. This module is the only place sparkdl
touches those internals; ``tests/unit/test_compat_shapes.py`` checks they are still
there.

Example:
    >>> import socket
    >>> listener = socket.create_server(("127.0.0.1", 0))
    >>> conn = CoalescingConnection("127.0.0.1", listener.getsockname()[1], timeout=5)
    >>> conn.request("PUT", "/w", body=[b"head", b"body"], headers={"Content-Length": "8"})
    >>> peer, _ = listener.accept()
    >>> peer.settimeout(5)
    >>> peer.recv(4096).endswith(b"\\r\\n\\r\\nheadbody")
    True
    >>> conn.close(); peer.close(); listener.close()
"""

from __future__ import annotations

import http.client
from typing import Any

__all__ = ["COALESCE_BYTES", "CoalescingConnection"]

#: A request up to this size leaves in one send (headers and body copied together).
COALESCE_BYTES = 256 * 1024


class CoalescingConnection(http.client.HTTPConnection):
    """``http.client``'s connection, sending a small request in one ``send``.

    The standard library sends the headers, then each body chunk, in separate calls;
    with ``TCP_NODELAY`` each is its own packet and wakes the server. A push of a
    small model (a header and four arrays) went out in six sends; joined, one copy
    of a few KiB costs less than the five extra round trips through the kernel.

    Only a list body (of bytes-like chunks, sent with a ``Content-Length``) of at most
    :data:`COALESCE_BYTES` is joined; anything else goes out as ``http.client`` sends it.

    Example:
        >>> conn = CoalescingConnection("127.0.0.1", 8080, timeout=5)
        >>> conn.request(  # doctest: +SKIP
        ...     "POST", "/push", body=[header, array], headers={"Content-Length": str(size)}
        ... )
    """

    def _send_output(self, message_body: Any = None, encode_chunked: bool = False) -> None:
        if isinstance(message_body, list) and not encode_chunked:
            size = sum(memoryview(chunk).nbytes for chunk in message_body)
            if size <= COALESCE_BYTES:
                buffered: list[bytes] = self._buffer  # type: ignore[attr-defined]
                buffered.extend((b"", b""))
                head = b"\r\n".join(buffered)
                del buffered[:]
                self.send(b"".join([head, *message_body]))
                return
        super()._send_output(message_body, encode_chunked)  # type: ignore[misc]
