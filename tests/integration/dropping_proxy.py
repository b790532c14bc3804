"""A TCP proxy on 127.0.0.1 that loses some HTTP answers on purpose.

Requests go to the server byte for byte. Each answer is read whole (status line,
headers, Content-Length body); for every ``drop_every``-th answer the proxy closes
both connections instead of forwarding it. The server has then read the request and
acted on it, and the client sees its connection drop without an answer: the case a
retried push must survive without being applied twice.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType


class DroppingProxy:
    def __init__(self, upstream_port: int, *, drop_every: int) -> None:
        self.upstream_port = upstream_port
        self.drop_every = drop_every
        self.answers = 0
        self.dropped = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._sockets: list[socket.socket] = []
        self._stopped = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def __enter__(self) -> DroppingProxy:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stopped = True
        self._listener.close()
        for sock in list(self._sockets):
            _close(sock)

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sockets += [client, upstream]
            threading.Thread(target=self._requests, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._answers, args=(client, upstream), daemon=True).start()

    def _requests(self, client: socket.socket, upstream: socket.socket) -> None:
        try:
            while data := client.recv(1 << 20):
                upstream.sendall(data)
        except OSError:
            pass
        _close(upstream)

    def _answers(self, client: socket.socket, upstream: socket.socket) -> None:
        reader = upstream.makefile("rb")
        try:
            while True:
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    line = reader.readline(65536)
                    if not line:
                        return
                    head += line
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = reader.read(length)
                with self._lock:
                    self.answers += 1
                    drop = self.answers % self.drop_every == 0
                    self.dropped += drop
                if drop:
                    return
                client.sendall(head + body)
        except OSError:
            return
        finally:
            _close(client)
            _close(upstream)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
