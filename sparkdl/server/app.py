"""Flask routes of the parameter service.

Every route needs ``Authorization: Bearer <token>`` (checked in constant time). Weights
travel in the binary format of :mod:`sparkdl.server.wire`; everything else is JSON.
Errors are JSON ``{"error": ...}`` with a 4xx status; nothing is ever unpickled.

Routes:
    ``GET /status``: JSON snapshot of the training state.
    ``GET /weights?min_version=V&wait=S``: the center weights once their version is at
        least V (long poll up to S seconds; 202 while not yet).
    ``POST /push``: a worker's weights for the open round; answers with the merged
        weights (or 202 while the round is still open).
    ``POST /join?wait=S``: JSON ``{"worker": id, "rows": n}``; answers every worker's
        row count once all joined (202 while not yet).
    ``POST /fail``: JSON ``{"worker": id, "traceback": text}``; aborts open rounds.

Example:
    >>> import numpy as np
    >>> from sparkdl.server.rules import AverageRule
    >>> from sparkdl.server.store import WeightStore
    >>> store = WeightStore([np.zeros(1, np.float32)], num_workers=1, rule=AverageRule())
    >>> app = create_app(store, token="secret")
    >>> app.test_client().get("/status").status_code
    401
"""

from __future__ import annotations

import hmac
import json
import math
import threading
from typing import Any

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from sparkdl.server import wire
from sparkdl.server.store import StoreError, WeightStore

__all__ = ["MAX_WAIT_SECONDS", "create_app", "max_body_bytes"]

MAX_WAIT_SECONDS = 60.0
_MAX_JSON_BYTES = 1 << 20
_HEADER_SLACK = 1 << 20


def max_body_bytes(store: WeightStore) -> int:
    """Largest request body the service accepts for this model: its weights plus 1 MiB."""
    weights = store.weights()
    return wire.payload_size([w.shape for w in weights], [w.dtype for w in weights]) + _HEADER_SLACK


def create_app(store: WeightStore, token: str) -> Flask:
    """Builds the Flask app that serves ``store``, guarded by ``token``.

    Args:
        store: The training state to serve.
        token: The per-fit secret every request must carry.

    Returns:
        A Flask app (never run it with ``debug=True``; :class:`ParameterService` serves
        it with cheroot).
    """
    app = Flask("sparkdl.parameter_service")
    app.config["MAX_CONTENT_LENGTH"] = max_body_bytes(store)
    app.config["DEBUG"] = False
    app.config["PROPAGATE_EXCEPTIONS"] = False
    expected = f"Bearer {token}".encode()
    cache = _EncodedCache()

    @app.before_request
    def _authenticate() -> Response | None:
        given = request.headers.get("Authorization", "").encode("utf-8", "replace")
        if not hmac.compare_digest(given, expected):
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

    @app.get("/status")
    def _status() -> Response:
        return _json(200, store.status())

    @app.get("/weights")
    def _weights() -> Response:
        min_version = _int_arg("min_version", 0)
        wait = _float_arg("wait", 0.0)
        result = store.pull(min_version, min(wait, MAX_WAIT_SECONDS))
        if result is None:
            return _json(202, {"pending": True, "version": store.version})
        return cache.response(*result)

    @app.post("/push")
    def _push() -> Response:
        if request.mimetype != wire.CONTENT_TYPE:
            return _json_error(415, f"Expected Content-Type {wire.CONTENT_TYPE}.")
        arrays, meta = wire.decode(request.get_data(cache=False))
        worker = _meta_int(meta, "worker")
        result = store.push_sync(
            worker,
            seq=_meta_int(meta, "seq"),
            round_no=_meta_int(meta, "round"),
            arrays=arrays,
            samples=_meta_int(meta, "samples"),
            meta=meta,
            wait=min(_float_arg("wait", 0.0), MAX_WAIT_SECONDS),
        )
        if result is None:
            return _json(202, {"pending": True, "version": store.version})
        return cache.response(*result)

    @app.post("/join")
    def _join() -> Response:
        report = _json_body()
        rows = store.join(
            _meta_int(report, "worker"),
            _meta_int(report, "rows"),
            min(_float_arg("wait", 0.0), MAX_WAIT_SECONDS),
        )
        if rows is None:
            return _json(202, {"pending": True})
        return _json(200, {"rows": rows})

    @app.post("/fail")
    def _fail() -> Response:
        report = _json_body()
        if not isinstance(report.get("traceback"), str):
            return _json_error(400, "Expected a JSON body {'worker': int, 'traceback': str}.")
        store.report_failure(_meta_int(report, "worker"), report["traceback"])
        return _json(200, {"ok": True})

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

    return app


class _BadArg(StoreError):
    def __init__(self, message: str) -> None:
        super().__init__(400, message)


class _EncodedCache:
    """The encoded body of the newest version, built once and served to every worker."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._key: tuple[int, int] | None = None
        self._body = b""

    def response(self, arrays: list[Any], version: int) -> Response:
        key = (id(arrays), version)
        with self._lock:
            if key != self._key:
                self._body = wire.encode_bytes(arrays, {"version": version})
                self._key = key
            body = self._body
        return Response(body, status=200, mimetype=wire.CONTENT_TYPE)


def _json(status: int, payload: dict[str, Any]) -> Response:
    return Response(json.dumps(payload), status=status, mimetype="application/json")


def _json_error(status: int, message: str) -> Response:
    return _json(status, {"error": message, "status": status})


def _json_body() -> dict[str, Any]:
    body = request.get_data(cache=False)
    if len(body) > _MAX_JSON_BYTES:
        raise StoreError(413, f"JSON body exceeds {_MAX_JSON_BYTES} bytes.")
    try:
        value = json.loads(body)
    except ValueError:
        raise _BadArg("Expected a JSON object body.") from None
    if not isinstance(value, dict):
        raise _BadArg("Expected a JSON object body.")
    return value


def _meta_int(meta: dict[str, Any], key: str) -> int:
    value = meta.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**62:
        raise _BadArg(f"Expected '{key}' to be a non-negative int. Received: {value!r}")
    return value


def _int_arg(name: str, default: int) -> int:
    raw = request.args.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise _BadArg(f"Expected query '{name}' to be an int. Received: {raw!r}") from None
    if not 0 <= value < 2**62:
        raise _BadArg(f"Expected query '{name}' >= 0. Received: {raw!r}")
    return value


def _float_arg(name: str, default: float) -> float:
    raw = request.args.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise _BadArg(f"Expected query '{name}' to be a number. Received: {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise _BadArg(f"Expected query '{name}' >= 0. Received: {raw!r}")
    return value
