"""Flask routes of the parameter service.

Every route needs ``Authorization: Bearer <token>`` (checked in constant time). Weights
travel in the binary format of :mod:`sparkdl.protocol.wire`; everything else is JSON.
Errors are JSON ``{"error": ...}`` with a 4xx status; nothing is ever unpickled. Bodies
must come with a ``Content-Length`` no larger than the model's weights plus 1 MiB.

Routes:
    ``GET /status``: JSON snapshot of the training state.
    ``GET /weights?min_version=V&wait=S``: the center weights once their version is at
        least V (long poll up to S seconds; 202 while not yet). With compression,
        ``&worker=W&attempt=A&replica=R`` answers the change since the copy R the worker
        holds (R = -1: the full weights; :mod:`sparkdl.server.state.replicas`).
    ``POST /push?wait=S``: a worker's push (header ``worker``, ``seq``, ``attempt``,
        ``samples``, ``base_version``: the version it was computed against, the open
        round in synchronous mode; with compression ``replica``, its copy of the
        center, and the body holds the codec's arrays); the fit's mode runs it.
        Answers with the weights after it: at once for an asynchronous push, so one
        round trip both pushes and pulls; once the round merged for a synchronous one
        (202 while still open).
    ``POST /join?wait=S``: JSON ``{"worker": id, "rows": n, "attempt": a}``; answers
        ``{"rows": [...], "seq": s, "version": v, "position": [epoch, step] | null}``
        (synchronous mode: once every worker joined; 202 while not yet).
    ``GET /relay...``: the relay's routes, with a token of their own, when the service
        runs in the cluster (:mod:`sparkdl.server.web.relay`).
    ``POST /fail``: JSON ``{"worker": id, "traceback": text, "attempt": a, "fatal":
        bool}``; a fatal failure aborts training.
    ``POST /leave``: JSON ``{"worker": id, "attempt": a}``: the worker finished
        training (the host of a service in the cluster stops it once every worker left).

Example:
    >>> import numpy as np
    >>> from sparkdl.server.state.store import WeightStore
    >>> from sparkdl.sync.merges import Average
    >>> store = WeightStore([np.zeros(1, np.float32)], num_workers=1, merge=Average())
    >>> app = create_app(store, token="secret")
    >>> app.test_client().get("/status").status_code
    401
"""

from __future__ import annotations

import contextlib
import hmac
import json
import math
import threading
from collections.abc import Callable, Iterator
from typing import Any

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from sparkdl.protocol import wire
from sparkdl.server.state.store import StoreError, WeightStore
from sparkdl.server.web import relay
from sparkdl.server.web.attempts import AttemptCheck
from sparkdl.server.web.parse import (
    MAX_WAIT_SECONDS,
    int_arg,
    json_body,
    meta_int,
    read_body,
    replica_number,
    wait_arg,
    whole_flag,
)

__all__ = ["BUSY_WAIT_SECONDS", "MAX_WAIT_SECONDS", "create_app", "max_body_bytes"]

#: How long a long poll waits when every wait slot is taken (the client asks again).
BUSY_WAIT_SECONDS = 0.1
_HEADER_SLACK = 1 << 20


def max_body_bytes(store: WeightStore) -> int:
    """Largest request body the service accepts for this model: its weights plus 1 MiB."""
    weights = store.weights()
    return wire.payload_size([w.shape for w in weights], [w.dtype for w in weights]) + _HEADER_SLACK


def create_app(
    store: WeightStore,
    token: str,
    *,
    attempts: AttemptCheck | None = None,
    wait_slots: int | None = None,
    relay_digest: str | None = None,
) -> Flask:
    """Builds the Flask app that serves ``store``, guarded by ``token``.

    Args:
        store: The training state to serve.
        token: The per-fit secret every request must carry.
        attempts: Confirms a task attempt newer than any the store saw for that worker
            before a request of it is taken (a token holder could otherwise fence out
            the live task with a made-up attempt); ``None`` takes every attempt.
        wait_slots: Long polls (``wait=S``) waiting at once, at most; one past them
            waits :data:`BUSY_WAIT_SECONDS` at most, so long polls never hold every
            server thread. ``None``: twice the workers.
        relay_digest: The SHA-256 of the relay's token (:mod:`sparkdl.server.web.relay`):
            serve the relay's routes to its holder. ``None``: no relay routes.

    Returns:
        A Flask app (never run it with ``debug=True``; :class:`ParameterService` serves
        it with cheroot).
    """
    app = Flask("sparkdl.parameter_service")
    app.config["MAX_CONTENT_LENGTH"] = max_body_bytes(store)
    app.config["DEBUG"] = False
    app.config["PROPAGATE_EXCEPTIONS"] = False
    app.before_request(_authenticator(app, token, relay_digest))
    app.after_request(_counter(store))
    waiting = _WaitSlots(wait_slots if wait_slots is not None else 2 * store.num_workers)
    _Routes(store, attempts, waiting).register(app)
    if relay_digest is not None:
        _register_relay(app, relay.RelayRoutes(store), waiting)
    _register_error_handlers(app)
    return app


class _Routes:
    """The route handlers of one app: each reads its request, asks the store, answers.

    Args:
        store: The training state served.
        attempts: Confirms new task attempts (see :func:`create_app`).
        waiting: The long polls' wait slots.
    """

    def __init__(
        self, store: WeightStore, attempts: AttemptCheck | None, waiting: _WaitSlots
    ) -> None:
        self.store = store
        self.attempts = attempts
        self.waiting = waiting

    def register(self, app: Flask) -> None:
        """Adds every route to ``app`` (endpoints named after the handlers)."""
        app.get("/status")(self._status)
        app.get("/weights")(self._weights)
        app.post("/push")(self._push)
        app.post("/join")(self._join)
        app.post("/fail")(self._fail)
        app.post("/leave")(self._leave)

    def vouched(self, worker: int, attempt: int) -> int:
        """``attempt``, once confirmed when it is new for ``worker`` (a known worker)."""
        store, attempts = self.store, self.attempts
        store.check_worker(worker)
        if (
            attempts is not None
            and attempt > store.newest_attempt(worker)
            and not attempts(worker, attempt)
        ):
            raise StoreError(
                409,
                f"Worker {worker} attempt {attempt} is not a running task of this fit's "
                "Spark job; its requests are refused.",
            )
        return attempt

    def _status(self) -> Response:
        return _json(200, _finite(self.store.status()))

    def answer(self, min_version: int, copy: tuple[int, int, int] | None) -> Response:
        """The weights once their version is ``min_version`` (202 after the long poll):
        in full, or for ``copy = (worker, attempt, replica)`` under compression, the
        change since the copy that worker holds (:mod:`sparkdl.server.state.replicas`)."""
        store = self.store
        with self.waiting(wait_arg()) as wait:
            if copy is None or store.replicas is None:
                result = store.encoded(min_version, wait)
                chunks = result[0] if result is not None else None
            else:
                snapshot = store.snapshot(min_version, wait)
                chunks = None
                if snapshot is not None:
                    arrays, meta = store.replicas.answer(*copy, snapshot[0], snapshot[2])
                    chunks = wire.encode(arrays, meta)
        if chunks is None:
            return _json(202, {"pending": True, "version": store.version})
        return _weights_response(chunks)

    def _weights(self) -> Response:
        min_version = int_arg("min_version", 0)
        copy = None
        if "replica" in request.args:
            worker = int_arg("worker", 0)
            attempt = self.vouched(worker, int_arg("attempt", 0))
            copy = (worker, attempt, replica_number(request.args.get("replica")))
        return self.answer(min_version, copy)

    def _push(self) -> Response:
        store = self.store
        if request.mimetype != wire.CONTENT_TYPE:
            return _json_error(415, f"Expected Content-Type {wire.CONTENT_TYPE}.")
        arrays, meta = wire.decode(read_body())
        worker = meta_int(meta, "worker")
        attempt = self.vouched(worker, meta_int(meta, "attempt", 0))
        copy = None
        if store.replicas is not None:  # compressed: decoded against the worker's copy
            copy = (worker, attempt, replica_number(meta.get("replica")))
            arrays = store.replicas.unpack(
                *copy, arrays, whole=whole_flag(meta.get("whole", False))
            )
        target = store.push(
            worker,
            seq=meta_int(meta, "seq"),
            attempt=attempt,
            base_version=meta_int(meta, "base_version"),
            arrays=arrays,
            samples=meta_int(meta, "samples"),
            meta=meta,
        )
        if "epoch_logs" in meta and store.control.callback_lag is not None:
            # An asynchronous epoch end waits for the driver's callbacks (their
            # stop_training) to come within the lag.
            with self.waiting(wait_arg()) as wait:
                store.wait_callbacks(worker, wait)
        # An asynchronous push, or a late synchronous one, is answered at once; a
        # synchronous push waits (long poll) for its round to merge.
        return self.answer(target, copy)

    def _join(self) -> Response:
        report = json_body()
        worker = meta_int(report, "worker")
        attempt = self.vouched(worker, meta_int(report, "attempt", 0))
        with self.waiting(wait_arg()) as wait:
            joined = self.store.join(worker, meta_int(report, "rows"), wait, attempt=attempt)
        if joined is None:
            return _json(202, {"pending": True})
        return _json(200, joined)

    def _fail(self) -> Response:
        report = json_body()
        if not isinstance(report.get("traceback"), str) or not isinstance(
            report.get("fatal", True), bool
        ):
            return _json_error(
                400,
                "Expected a JSON body {'worker': int, 'traceback': str, 'attempt': int, "
                "'fatal': bool}.",
            )
        worker = meta_int(report, "worker")
        self.store.report_failure(
            worker,
            report["traceback"],
            attempt=self.vouched(worker, meta_int(report, "attempt", 0)),
            fatal=report.get("fatal", True),
        )
        return _json(200, {"ok": True})

    def _leave(self) -> Response:
        report = json_body()
        worker = meta_int(report, "worker")
        self.store.leave(worker, attempt=self.vouched(worker, meta_int(report, "attempt", 0)))
        return _json(200, {"ok": True})


class _WaitSlots:
    """Bounds the long polls that wait at once (each holds a server thread)."""

    def __init__(self, slots: int) -> None:
        self._slots = threading.BoundedSemaphore(max(1, slots))

    @contextlib.contextmanager
    def __call__(self, wait: float) -> Iterator[float]:
        """Yields how long this request may wait: ``wait`` when a slot is free."""
        if wait <= BUSY_WAIT_SECONDS or not self._slots.acquire(blocking=False):
            yield min(wait, BUSY_WAIT_SECONDS)
            return
        try:
            yield wait
        finally:
            self._slots.release()


def _register_relay(app: Flask, routes: relay.RelayRoutes, waiting: _WaitSlots) -> None:
    """The relay's routes; its long poll takes a wait slot like the workers'."""

    def exchange() -> Response:
        with waiting(wait_arg()) as wait:
            return _json(200, _finite(routes.exchange(wait)))

    app.get(relay.PREFIX, endpoint="relay")(exchange)
    app.get(relay.PREFIX + "/weights", endpoint="relay_weights")(
        lambda: _weights_response(routes.weights())
    )


def _authenticator(
    app: Flask, token: str, relay_digest: str | None
) -> Callable[[], Response | None]:
    """Checks the token (in constant time): the relay's on its routes, the workers' on
    every other; then the announced body size."""
    expected = f"Bearer {token}".encode()

    def authenticate() -> Response | None:
        header = request.headers.get("Authorization", "")
        given = header.encode("utf-8", "replace")
        if relay.is_relay_path(request.path):
            trusted = relay_digest is not None and relay.token_matches(header, relay_digest)
        else:
            trusted = hmac.compare_digest(given, expected)
        if not trusted:
            return _json_error(
                401, "Missing or wrong token: send 'Authorization: Bearer <token>' of this fit."
            )
        length = request.content_length
        if length is not None and length > app.config["MAX_CONTENT_LENGTH"]:
            return _json_error(
                413,
                f"Request body of {length} bytes exceeds the bound of "
                f"{app.config['MAX_CONTENT_LENGTH']} bytes for this model.",
            )
        return None

    return authenticate


def _counter(store: WeightStore) -> Callable[[Response], Response]:
    """Counts each answered request's body bytes in and out (:attr:`store.traffic`):
    those answered 200 or 202 only, whose bodies were read whole (a refused one may
    announce a length it never sent)."""

    def count(response: Response) -> Response:
        if response.status_code in (200, 202):
            store.traffic.count(request.content_length or 0, response.content_length or 0)
        return response

    return count


def _register_error_handlers(app: Flask) -> None:
    """Every error is JSON ``{"error": ..., "status": ...}``; nothing leaks a traceback."""

    @app.errorhandler(StoreError)
    def _store_error(exc: StoreError) -> Response:
        return _json_error(exc.status, exc.message)

    @app.errorhandler(wire.WireError)
    def _wire_error(exc: wire.WireError) -> Response:
        return _json_error(400, f"Malformed body: {exc}")

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException) -> Response:
        return _json_error(exc.code or 500, exc.description or exc.name)

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception) -> Response:  # pragma: no cover - defensive
        app.logger.exception("parameter service error")
        return _json_error(500, f"Internal error: {type(exc).__name__}")


def _json(status: int, payload: dict[str, Any]) -> Response:
    # allow_nan=False: NaN and Infinity are not JSON (the store never holds them).
    body = json.dumps(payload, allow_nan=False)
    return Response(body, status=status, mimetype="application/json")


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by ``None`` (JSON null):
    a history's epoch without a metric is NaN on the driver, null on the wire."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _json_error(status: int, message: str) -> Response:
    return _json(status, {"error": message, "status": status})


def _weights_response(chunks: list[Any]) -> Response:
    response = Response(chunks, status=200, mimetype=wire.CONTENT_TYPE)
    response.content_length = sum(memoryview(c).nbytes for c in chunks)
    return response
