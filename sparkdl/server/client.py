"""Worker-side client of the parameter service.

Keeps one pooled keep-alive connection, sends weights in the binary wire format, and
retries connection errors and 5xx answers with exponential backoff. Pushes carry a
sequence number, so a retried push is applied once.

Example:
    >>> import numpy as np
    >>> from sparkdl.server.rules import AverageRule
    >>> from sparkdl.server.service import ParameterService
    >>> from sparkdl.server.store import WeightStore
    >>> store = WeightStore([np.zeros(2, np.float32)], num_workers=1, rule=AverageRule())
    >>> with ParameterService(store) as service:
    ...     client = ServiceClient(service.url, service.token, worker=0)
    ...     weights, version = client.push_sync([np.ones(2, np.float32)], round_no=0, samples=3)
    ...     client.close()
    >>> version, weights[0].tolist()
    (1, [1.0, 1.0])
"""

from __future__ import annotations

import contextlib
import json
import time
import traceback
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import urllib3

from sparkdl.errors import ServiceError, TrainingError
from sparkdl.server import wire

__all__ = ["ServiceClient"]

_LONG_POLL = 20.0


class ServiceClient:
    """Talks to one parameter service on behalf of one worker.

    Args:
        url: The service's base URL.
        token: The fit's secret.
        worker: This worker's id (its Spark partition id).
        timeout: Seconds for connecting and for each read.
        retries: Retries after a connection error or a 5xx answer.
        backoff: Seconds before the first retry; doubles each time (capped at 5 s).
    """

    def __init__(
        self,
        url: str,
        token: str,
        *,
        worker: int,
        timeout: float = 60.0,
        retries: int = 5,
        backoff: float = 0.1,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ServiceError(f"Expected a service URL like http://host:port. Received: {url!r}")
        self.url = url
        self.worker = worker
        self.retries = retries
        self.backoff = backoff
        self.timeout = timeout
        self.comm_seconds = 0.0
        self.calls = 0
        self._seq = 0
        self._headers = {"Authorization": f"Bearer {token}"}
        self._pool = urllib3.HTTPConnectionPool(
            parts.hostname,
            parts.port,
            maxsize=2,
            block=False,
            timeout=urllib3.Timeout(connect=min(timeout, 10.0), read=timeout),
            retries=False,
        )

    def push_sync(
        self,
        arrays: Sequence[np.ndarray],
        *,
        round_no: int,
        samples: int,
        meta: dict[str, Any] | None = None,
    ) -> tuple[list[np.ndarray], int]:
        """Pushes weights for a synchronous round and returns the merged weights.

        Args:
            arrays: This worker's weights.
            round_no: The round being closed (the version the worker started from).
            samples: Samples trained on since the previous push.
            meta: Extra metadata (loss, epoch logs...).

        Returns:
            ``(weights, version)`` after the round merged.

        Raises:
            ServiceError: The service stayed unreachable or refused the push.
            TrainingError: Training was aborted (another worker failed).
        """
        self._seq += 1
        header = dict(meta or {})
        header.update(worker=self.worker, seq=self._seq, round=round_no, samples=samples)
        header["comm_seconds"] = self.comm_seconds
        body = wire.encode_bytes(arrays, header)
        status, data = self._request(
            "POST",
            f"/push?wait={_LONG_POLL}",
            body=body,
            headers={"Content-Type": wire.CONTENT_TYPE},
        )
        if status == 202:  # the round is still open: long-poll for its result
            return self.pull(round_no + 1)
        return self._arrays(status, data)

    def pull(self, min_version: int = 0) -> tuple[list[np.ndarray], int]:
        """Returns the center weights once their version is at least ``min_version``."""
        path = f"/weights?min_version={min_version}&wait={_LONG_POLL}"
        status, data = self._request("GET", path)
        while status == 202:
            status, data = self._request("GET", path)
        return self._arrays(status, data)

    def join(self, rows: int) -> list[int]:
        """Registers this worker's row count; returns every worker's once all joined."""
        body = json.dumps({"worker": self.worker, "rows": rows}).encode()
        headers = {"Content-Type": "application/json"}
        while True:
            status, data = self._request(
                "POST", f"/join?wait={_LONG_POLL}", body=body, headers=headers
            )
            if status == 200:
                result: list[int] = json.loads(data)["rows"]
                return result
            if status != 202:
                message = _error_text(self.url, status, data)
                raise TrainingError(message) if status == 409 else ServiceError(message)

    def status(self) -> dict[str, Any]:
        """The service's JSON status."""
        status, data = self._request("GET", "/status")
        if status != 200:
            raise ServiceError(_error_text(self.url, status, data))
        result: dict[str, Any] = json.loads(data)
        return result

    def report_failure(self, exc: BaseException) -> None:
        """Sends this worker's traceback to the service (best effort, never raises)."""
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        body = json.dumps({"worker": self.worker, "traceback": text[-20_000:]}).encode()
        with contextlib.suppress(Exception):  # the original failure matters more
            self._request(
                "POST", "/fail", body=body, headers={"Content-Type": "application/json"}, retries=1
            )

    def close(self) -> None:
        """Closes pooled connections."""
        self._pool.close()

    # ---------------------------------------------------------------- helpers
    def _arrays(self, status: int, data: bytes) -> tuple[list[np.ndarray], int]:
        if status != 200:
            message = _error_text(self.url, status, data)
            if status == 409:
                raise TrainingError(message)
            raise ServiceError(message)
        arrays, meta = wire.decode(data)
        return arrays, int(meta.get("version", 0))

    def _request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        retries: int | None = None,
    ) -> tuple[int, bytes]:
        all_headers = dict(self._headers)
        all_headers.update(headers or {})
        attempts = (self.retries if retries is None else retries) + 1
        delay = self.backoff
        last = ""
        start = time.perf_counter()
        try:
            for attempt in range(attempts):
                try:
                    response = self._pool.urlopen(
                        method,
                        path,
                        body=body,
                        headers=all_headers,
                        preload_content=True,
                        release_conn=True,
                        assert_same_host=False,
                    )
                except (urllib3.exceptions.HTTPError, OSError) as exc:
                    last = f"{type(exc).__name__}: {exc}"
                else:
                    if response.status < 500:
                        return response.status, response.data
                    last = _error_text(self.url, response.status, response.data)
                if attempt + 1 < attempts:
                    time.sleep(delay)
                    delay = min(delay * 2, 5.0)
        finally:
            self.calls += 1
            self.comm_seconds += time.perf_counter() - start
        raise ServiceError(
            f"Parameter service at {self.url} failed {attempts} time(s) for {method} "
            f"{path.split('?')[0]}: {last}. Check that executors can reach the driver at that "
            "address (set service_host= / port=), or raise request_retries= / request_timeout=."
        )


def _error_text(url: str, status: int, data: bytes) -> str:
    try:
        message = json.loads(data).get("error", "")
    except (ValueError, AttributeError):
        message = data[:200].decode("utf-8", "replace")
    return f"Parameter service at {url} answered {status}: {message}"
