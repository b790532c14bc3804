"""Worker-side client of the parameter service.

Keeps one keep-alive HTTP/1.1 connection (a worker makes one call at a time, so a
pool of one), sends weights in the binary wire format straight from the arrays' own
buffers, reads answers straight into one numpy buffer (no intermediate ``bytes``),
and retries connection errors and 5xx answers with exponential backoff. Pushes carry
the worker id, a sequence number and the task attempt, so a retried push is applied
once and a zombie attempt is refused.

urllib3's ``Retry`` would do the same retries, but only inside urllib3's pool, measured
slower (``docs/benchmarks/service.md``, "Why a hand-written transport").

Example:
    >>> import numpy as np
    >>> from sparkdl.server.web.service import ParameterService
    >>> from sparkdl.server.state.store import WeightStore
    >>> from sparkdl.sync.merges import Average
    >>> store = WeightStore([np.zeros(2, np.float32)], num_workers=1, merge=Average())
    >>> with ParameterService(store) as service:
    ...     client = ServiceClient(service.url, service.token, worker=0)
    ...     joined = client.join(rows=3)
    ...     weights, version = client.push([np.ones(2, np.float32)], base_version=0, samples=3)
    ...     client.close()
    >>> version, weights[0].tolist()
    (1, [1.0, 1.0])
"""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import ssl
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from sparkdl.compat.http_client import CoalescingConnection
from sparkdl.errors import ServiceError, TrainingError
from sparkdl.protocol import wire
from sparkdl.protocol.failures import failure_text
from sparkdl.protocol.tls import client_context
from sparkdl.sync.schedule import Schedule

__all__ = ["DEFAULT_RETRIES", "DEFAULT_TIMEOUT", "ServiceClient"]

#: Seconds one service call may take, connect and read (``request_timeout``).
DEFAULT_TIMEOUT = 60.0
#: Retries of a failed service call (``request_retries``).
DEFAULT_RETRIES = 5

_LONG_POLL = 20.0
#: Errors of a kept-alive connection the server closed while idle: retried at once.
_STALE_ERRORS = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)
#: Large arrays go to the socket in slices, so the timeout bounds each slice.
_SEND_SLICE_BYTES = 4 << 20


class ServiceClient:
    """Talks to one parameter service on behalf of one worker.

    Args:
        url: The service's base URL.
        token: The fit's secret.
        worker: This worker's id (its Spark partition id).
        timeout: Seconds for connecting and for each read.
        retries: Retries after a connection error or a 5xx answer.
        backoff: Seconds before the first retry; doubles each time (capped at 5 s).
        attempt: This task's attempt number; a higher one supersedes the worker's
            earlier attempts on the service.
        tls_cert: The fit's certificate (PEM) for an ``https://`` service: the only
            one this client trusts (:mod:`sparkdl.protocol.tls`).
    """

    def __init__(
        self,
        url: str,
        token: str,
        *,
        worker: int,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = DEFAULT_RETRIES,
        backoff: float = 0.1,
        attempt: int = 0,
        tls_cert: bytes | None = None,
    ) -> None:
        parts = urlsplit(url)
        scheme = "https" if tls_cert is not None else "http"
        if parts.scheme != scheme or not parts.hostname or not parts.port:
            raise ServiceError(
                f"Expected a service URL like {scheme}://host:port"
                f"{' (https needs the certificate)' if parts.scheme == 'https' else ''}. "
                f"Received: {url!r}"
            )
        self.url = url
        self.worker = worker
        self.retries = retries
        self.backoff = backoff
        self.timeout = timeout
        self.attempt = attempt
        # A long poll must answer well before the read timeout fires.
        self._long_poll = max(min(_LONG_POLL, timeout / 2), 0.0)
        self.comm_seconds = 0.0
        self.calls = 0
        #: Bytes of the push bodies sent and of the weights answers read.
        self.bytes_sent = 0
        self.bytes_received = 0
        #: The metadata of the last weights answer: version, stop flag, learning rate.
        self.control: dict[str, Any] = {}
        self._seq = 0
        self._headers = {"Authorization": f"Bearer {token}"}
        context = client_context(tls_cert) if tls_cert is not None else None
        self._conn = _KeepAlive(
            parts.hostname, parts.port, min(timeout, 10.0), timeout, context=context
        )

    def push(
        self,
        arrays: Sequence[np.ndarray],
        *,
        base_version: int,
        samples: int,
        meta: dict[str, Any] | None = None,
        replica: int | None = None,
    ) -> tuple[list[np.ndarray], int]:
        """Pushes an update and returns the center weights that answer it.

        Args:
            arrays: The update (what the fit's merge pushes).
            base_version: The version the update was computed against (in synchronous
                mode, the round it closes).
            samples: Samples trained on since the previous push.
            meta: Extra metadata (loss, epoch logs...).
            replica: With compression, the copy of the center this worker holds
                (:mod:`sparkdl.server.state.replicas`); the answer's arrays are then the
                codec's, and :attr:`control` says whether they are the full weights.

        Returns:
            ``(weights, version)``: at once after an asynchronous push; after the round
            merged for a synchronous one (long-polling while it is open).

        Raises:
            ServiceError: The service stayed unreachable or refused the push.
            TrainingError: Training was aborted, or this attempt was superseded.
        """
        header = dict(meta or {})
        header.update(base_version=base_version)
        if replica is not None:
            header.update(replica=replica)
        status, data = self._push(arrays, samples, header)
        if status == 202:  # the round is still open: long-poll for its result
            return self.pull(base_version + 1, replica=replica)
        return self._arrays(status, data)

    def pull(
        self, min_version: int = 0, *, replica: int | None = None
    ) -> tuple[list[np.ndarray], int]:
        """Returns the center weights once their version is at least ``min_version``.

        ``replica``: with compression, the copy of the center this worker holds (``-1``:
        none, answer the full weights), as in :meth:`push`.
        """
        path = f"/weights?min_version={min_version}&wait={self._long_poll}"
        if replica is not None:
            path += f"&worker={self.worker}&attempt={self.attempt}&replica={replica}"
        status, data = self._request("GET", path)
        while status == 202:
            status, data = self._request("GET", path)
        return self._arrays(status, data)

    def join(self, rows: int) -> dict[str, Any]:
        """Registers this worker (or rejoins after a task retry) with its row count.

        Also continues this worker's sequence numbers from the last one the service
        applied, so a retried task never reuses one.

        Returns:
            ``{"rows": [...], "version": v, "position": [epoch, step] | None, ...}``:
            every worker's row count (synchronous mode: once all joined), the
            service's version, and where this worker's last applied push left it.

        Raises:
            TrainingError: The service refused the join (more rows than the driver
                planned for this worker: a retry would be refused too), training was
                aborted, or this attempt was superseded.
            ServiceError: The service stayed unreachable.
        """
        body = json.dumps({"worker": self.worker, "rows": rows, "attempt": self.attempt})
        headers = {"Content-Type": "application/json"}
        while True:
            status, data = self._request(
                "POST", f"/join?wait={self._long_poll}", body=body.encode(), headers=headers
            )
            if status == 200:
                answer = json.loads(bytes(data))
                self._seq = max(self._seq, int(answer["seq"]))
                result: dict[str, Any] = answer
                return result
            if status != 202:
                message = _error_text(self.url, status, data)
                raise TrainingError(message) if status in (400, 409) else ServiceError(message)

    def standing(
        self, joined: dict[str, Any], schedule: Schedule, *, barrier: bool
    ) -> dict[str, Any]:
        """The join's answer as the point this worker resumes from: ``joined`` itself
        (the answers of a sharded service's shards may differ:
        :meth:`sparkdl.protocol.sharded.ShardedClient.standing`)."""
        return joined

    def continue_from(self, seq: int) -> None:
        """Numbers the next push ``seq + 1``: a push the service already took under that
        number is then taken as a retry, not again (a sharded worker's shards that took
        more of its pushes than another: :mod:`sparkdl.protocol.sharded`)."""
        self._seq = int(seq)

    def status(self) -> dict[str, Any]:
        """The service's JSON status."""
        status, data = self._request("GET", "/status")
        if status != 200:
            raise ServiceError(_error_text(self.url, status, data))
        result: dict[str, Any] = json.loads(bytes(data))
        return result

    def get(self, path: str) -> tuple[int, Any]:
        """``(status, body)`` of a GET of ``path`` (the relay's routes:
        :mod:`sparkdl.driver.relay`), retried like every call.

        Raises:
            ServiceError: No answer after the retries.
        """
        return self._request("GET", path)

    def report_failure(self, exc: BaseException, *, fatal: bool = True) -> None:
        """Sends this worker's traceback to the service (best effort, never raises),
        after its position in training where known
        (:mod:`sparkdl.protocol.failures`).

        ``fatal=True`` aborts the fit (a retry would fail the same way); ``False``
        only records it while Spark retries the task.
        """
        body = json.dumps(
            {
                "worker": self.worker,
                "traceback": failure_text(exc),
                "attempt": self.attempt,
                "fatal": fatal,
            }
        ).encode()
        with contextlib.suppress(Exception):  # the original failure matters more
            self._request(
                "POST", "/fail", body=body, headers={"Content-Type": "application/json"}, retries=1
            )

    def leave(self) -> None:
        """Tells the service this worker finished training (its host waits for every
        worker before it stops: :mod:`sparkdl.executor.hosting`)."""
        body = json.dumps({"worker": self.worker, "attempt": self.attempt}).encode()
        status, data = self._request(
            "POST", "/leave", body=body, headers={"Content-Type": "application/json"}
        )
        if status != 200:  # the host would wait for this worker for ever
            raise ServiceError(_error_text(self.url, status, data))

    def close(self) -> None:
        """Closes the connection."""
        self._conn.close()

    # ---------------------------------------------------------------- helpers
    def _push(
        self, arrays: Sequence[np.ndarray], samples: int, header: dict[str, Any]
    ) -> tuple[int, bytes]:
        self._seq += 1
        header.update(
            worker=self.worker,
            seq=self._seq,
            attempt=self.attempt,
            samples=samples,
            comm_seconds=self.comm_seconds,
        )
        chunks = _sliced(wire.encode(arrays, header))
        size = sum(len(c) for c in chunks)
        self.bytes_sent += size
        return self._request(
            "POST",
            f"/push?wait={self._long_poll}",
            body=chunks,
            headers={"Content-Type": wire.CONTENT_TYPE, "Content-Length": str(size)},
        )

    def _arrays(self, status: int, data: Any) -> tuple[list[np.ndarray], int]:
        if status != 200:
            message = _error_text(self.url, status, data)
            if status == 409:
                raise TrainingError(message)
            raise ServiceError(message)
        self.bytes_received += len(memoryview(data).cast("B"))
        arrays, meta = wire.decode(data)
        self.control = meta
        return arrays, int(meta.get("version", 0))

    def _request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | list[Any] | None = None,
        headers: dict[str, str] | None = None,
        retries: int | None = None,
    ) -> tuple[int, Any]:
        all_headers = dict(self._headers)
        all_headers.update(headers or {})
        attempts = (self.retries if retries is None else retries) + 1
        delay = self.backoff
        last = ""
        start = time.perf_counter()
        try:
            failures = 0
            stale_retry = True
            while True:
                reused = self._conn.is_open
                try:
                    status, data = self._conn.request(method, path, body, all_headers)
                except (http.client.HTTPException, OSError) as exc:
                    last = f"{type(exc).__name__}: {exc}"
                    if reused and stale_retry and isinstance(exc, _STALE_ERRORS):
                        stale_retry = False  # a kept-alive connection the server closed
                        continue
                else:
                    if status < 500:
                        return status, data
                    last = _error_text(self.url, status, data)
                failures += 1
                if failures >= attempts:
                    break
                time.sleep(delay * random.uniform(0.5, 1.5))  # jitter: workers spread out
                delay = min(delay * 2, 5.0)
        finally:
            self.calls += 1
            self.comm_seconds += time.perf_counter() - start
        raise ServiceError(
            f"Parameter service at {self.url} failed {attempts} time(s) for {method} "
            f"{path.split('?')[0]}: {last}. Check that executors can reach the driver at that "
            "address (set service_host= / port=), or raise request_retries= / request_timeout=."
        )


def _sliced(chunks: list[Any]) -> list[memoryview]:
    """Byte views of ``chunks``, none longer than ``_SEND_SLICE_BYTES``."""
    out: list[memoryview] = []
    for chunk in chunks:
        view = memoryview(chunk).cast("B")
        out.extend(view[i : i + _SEND_SLICE_BYTES] for i in range(0, len(view), _SEND_SLICE_BYTES))
    return out


class _KeepAlive:
    """One persistent HTTP/1.1 connection, opened on demand and dropped after an error."""

    def __init__(
        self,
        host: str,
        port: int,
        connect_timeout: float,
        read_timeout: float,
        *,
        context: ssl.SSLContext | None = None,
    ):
        self._host = host
        self._port = port
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._context = context
        self._conn: http.client.HTTPConnection | None = None

    @property
    def is_open(self) -> bool:
        return self._conn is not None

    def request(
        self, method: str, path: str, body: Any, headers: dict[str, str]
    ) -> tuple[int, Any]:
        """Sends one request; returns ``(status, body)`` with the body in a numpy buffer."""
        conn = self._conn
        if conn is None:
            conn = CoalescingConnection(self._host, self._port, timeout=self._connect_timeout)
            conn.connect()  # sets TCP_NODELAY
            try:
                if self._context is not None:  # handshake within the connect timeout
                    conn.sock = self._context.wrap_socket(conn.sock, server_hostname=self._host)
                if conn.sock is not None:
                    conn.sock.settimeout(self._read_timeout)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        try:
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            data = _read_all(response)
        except BaseException:
            self.close()
            raise
        if response.will_close:
            self.close()
        return response.status, data

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def _read_all(response: http.client.HTTPResponse) -> Any:
    """Reads a response body into one uninitialised numpy buffer (no ``bytes`` copy)."""
    length = response.length
    if length is None:
        return response.read()
    view = memoryview(np.empty(length, dtype=np.uint8).data)
    got = 0
    while got < length:
        n = response.readinto(view[got:])
        if not n:
            raise http.client.IncompleteRead(bytes(view[:got]), length - got)
        got += n
    return view


def _error_text(url: str, status: int, data: Any) -> str:
    data = bytes(data[:4096])
    try:
        message = json.loads(data).get("error", "")
    except (ValueError, AttributeError):
        message = data[:200].decode("utf-8", "replace")
    return f"Parameter service at {url} answered {status}: {message}"
