"""The parameter service: the Flask app served by cheroot in a driver thread.

cheroot was chosen by measurement (``benchmarks/service.py``; figures in
``docs/benchmarks/service.md``): with the bulk I/O of :mod:`sparkdl.server.web.transport` it moves
large models several times faster than waitress tuned for large bodies or stock
cheroot. It is pure Python, threaded (synchronous pushes wait in a thread), and
needs no separate process, so the service lives beside the driver's training state.

Example:
    >>> import numpy as np
    >>> from sparkdl.server.state.store import WeightStore
    >>> from sparkdl.sync.merges import Average
    >>> store = WeightStore([np.zeros(1, np.float32)], num_workers=1, merge=Average())
    >>> with ParameterService(store, host="127.0.0.1") as service:
    ...     service.url.startswith("http://127.0.0.1:")
    True
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
from types import TracebackType

from cheroot import wsgi

from sparkdl.errors import ServiceError
from sparkdl.server.state.store import WeightStore
from sparkdl.server.web import tls
from sparkdl.server.web.app import create_app, max_body_bytes
from sparkdl.server.web.attempts import AttemptCheck
from sparkdl.server.web.bodies import BodyPolicy
from sparkdl.server.web.gate import GatedServer, HeadGate
from sparkdl.server.web.tls import Certificate

__all__ = [
    "MAX_HEADER_BYTES",
    "MAX_REQUEST_BYTES",
    "RESERVED_THREADS",
    "SERVER_NAME",
    "ParameterService",
]

#: Bound on a request's line and headers (cheroot's default is unbounded).
MAX_HEADER_BYTES = 64 * 1024
#: The bound cheroot applies to an announced body before the app runs. It is the same
#: for every model: the model's own bound (its weights plus 1 MiB) is checked by the
#: app after the token, so an unauthenticated client learns nothing of the model's size
#: from a 413 against a 401.
MAX_REQUEST_BYTES = 1 << 40
#: The ``Server`` header: names neither sparkdl nor the server software.
SERVER_NAME = "httpd"
#: Threads a long poll never takes: short requests always find one.
RESERVED_THREADS = 4
_SELECT_SECONDS = 0.02

_log = logging.getLogger(__name__)


class ParameterService:
    """Serves a :class:`WeightStore` over HTTP until :meth:`stop`.

    Args:
        store: The training state.
        host: Address to bind to; workers call this address.
        port: Port to bind to; 0 picks a free one.
        token: Per-fit secret; a random one is made when ``None``.
        threads: Server threads. Synchronous pushes wait in a thread, so this must
            exceed the number of workers; the default, twice the workers plus
            :data:`RESERVED_THREADS` (at least 8), leaves room for status calls. Long
            polls take at most all but :data:`RESERVED_THREADS` of them (and always
            one more than the workers).
        attempts: Confirms a worker's new task attempt before it is taken
            (:class:`sparkdl.server.web.attempts.SparkAttempts` in a fit); ``None`` takes
            every attempt.
        tls: Serve HTTPS with this certificate (:mod:`sparkdl.server.web.tls`); ``None``
            serves plain HTTP.
        relay_digest: Serve the relay's routes to the holder of the token of this
            SHA-256 (:mod:`sparkdl.server.web.relay`); ``None``: none.
    """

    def __init__(
        self,
        store: WeightStore,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        threads: int | None = None,
        attempts: AttemptCheck | None = None,
        tls: Certificate | None = None,
        relay_digest: str | None = None,
    ) -> None:
        self.store = store
        self._attempts = attempts
        self._tls = tls
        self._relay_digest = relay_digest
        self.token = token or secrets.token_urlsafe(32)
        self._host = host
        self._port = port
        self._threads = threads or max(8, 2 * store.num_workers + RESERVED_THREADS)
        self._server: wsgi.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Base URL workers use, e.g. ``http://127.0.0.1:41234``."""
        if self._server is None:
            raise ServiceError("The parameter service is not running; call start() first.")
        host, port = self._server.bind_addr[:2]
        host = f"[{host}]" if ":" in str(host) else host
        scheme = "https" if self._tls is not None else "http"
        return f"{scheme}://{host}:{port}"

    @property
    def port(self) -> int:
        """The bound port."""
        if self._server is None:
            raise ServiceError("The parameter service is not running; call start() first.")
        return int(self._server.bind_addr[1])

    @property
    def gate(self) -> HeadGate | None:
        """The gate before the server's threads (its counters), while running."""
        return getattr(self._server, "gate", None)

    def start(self) -> ParameterService:
        """Binds the socket and serves in a daemon thread.

        Raises:
            ServiceError: The address cannot be bound (port in use, unknown host).
        """
        app = create_app(
            self.store,
            self.token,
            attempts=self._attempts,
            wait_slots=max(self._threads - RESERVED_THREADS, self.store.num_workers + 1),
            relay_digest=self._relay_digest,
        )
        # Connections wait at a gate, not in a thread, until their request head is in,
        # and a token holder's body too (sparkdl.server.web.gate): idle, trickling or
        # stalled clients cannot hold the pool.
        server = GatedServer(
            (self._host, self._port),
            app,
            bodies=BodyPolicy(self.token, max_body_bytes(self.store)),
            numthreads=self._threads,
            server_name=SERVER_NAME,
            request_queue_size=1024,  # the listen backlog: a burst of connects is not dropped
            timeout=30,
            shutdown_timeout=2,
        )
        # Absurd bodies are refused (413, connection closed) before the app runs; the
        # app refuses the rest beyond the model's bound after checking the token, and
        # closes a connection whose body it did not read (nothing is read or drained).
        server.max_request_body_size = MAX_REQUEST_BYTES
        server.max_request_header_size = MAX_HEADER_BYTES
        # The selector loop's select() timeout, which is also how long stop() may wait
        # for it (cheroot's 0.5 s would add up to half a second to every fit).
        server.expiration_interval = _SELECT_SECONDS
        if self._tls is not None:
            with tls.temporary_directory() as keys:  # loaded now, then removed
                server.ssl_adapter = self._tls.adapter(keys)
        try:
            server.prepare()
        except OSError as exc:
            raise ServiceError(
                f"Could not bind the parameter service to {self._host}:{self._port}: {exc}. "
                "Pass another port= (0 picks a free one) or service_host=; where this "
                "process may not listen, service_placement='cluster' runs the service "
                "inside the training job."
            ) from exc
        sock = server.socket
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._server = server
        self._thread = threading.Thread(
            target=server.serve, name="sparkdl-parameter-service", daemon=True
        )
        self._thread.start()
        _log.info("parameter service listening on %s", self.url)
        return self

    def stop(self) -> None:
        """Stops serving, releases the port, and wakes any waiting request."""
        server, self._server = self._server, None
        if server is None:
            return
        self.store.abort("the fit ended")
        server.stop()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> ParameterService:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
