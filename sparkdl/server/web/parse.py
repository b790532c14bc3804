"""Reads what a request carries: its body, a JSON object, typed fields and query args.

Every reader bounds what it takes and refuses a bad value with a 4xx
(:class:`~sparkdl.server.state.errors.StoreError`) that names the field and what it expected,
before the store sees anything. The routes of :mod:`sparkdl.server.web.app` call them
inside a request (they read :data:`flask.request`); kept apart from the routes so a
route reads as what it asks the store.

Example:
    >>> from flask import Flask
    >>> with Flask("example").test_request_context("/weights?min_version=3&wait=99"):
    ...     int_arg("min_version", 0), wait_arg()
    (3, 60.0)
"""

from __future__ import annotations

import contextlib
import json
import math
from typing import Any

from flask import request

from sparkdl.server.state.errors import StoreError

__all__ = [
    "MAX_WAIT_SECONDS",
    "BadArg",
    "float_arg",
    "int_arg",
    "json_body",
    "meta_int",
    "read_body",
    "replica_number",
    "wait_arg",
    "whole_flag",
]

MAX_WAIT_SECONDS = 60.0
_MAX_JSON_BYTES = 1 << 20


class BadArg(StoreError):
    """A malformed field or query argument (400)."""

    def __init__(self, message: str) -> None:
        super().__init__(400, message)


def read_body(limit: int | None = None) -> Any:
    """Reads the whole request body (its Content-Length, at most ``limit`` bytes)."""
    length = request.content_length
    if length is None:
        raise StoreError(
            411, "Send the body with a Content-Length header; chunked bodies are not accepted."
        )
    if limit is not None and length > limit:
        raise StoreError(413, f"Request body of {length} bytes exceeds the {limit}-byte bound.")
    try:
        body = request.environ["wsgi.input"].read(length) if length else b""
    except TimeoutError:
        raise StoreError(408, "Timed out waiting for the request body.") from None
    if len(body) != length:
        raise StoreError(
            400,
            f"Body truncated: received {len(body)} of the {length} bytes its Content-Length "
            "announced.",
        )
    return body


def json_body() -> dict[str, Any]:
    """The body as a JSON object (at most 1 MiB)."""
    body = read_body(_MAX_JSON_BYTES)
    try:
        value = json.loads(bytes(body))
    except (ValueError, RecursionError):
        raise BadArg("Expected a JSON object body.") from None
    if not isinstance(value, dict):
        raise BadArg("Expected a JSON object body.")
    return value


def meta_int(meta: dict[str, Any], key: str, default: int | None = None) -> int:
    """``meta[key]`` (a header or JSON field), an int in ``[0, 2**62)``."""
    value = meta.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**62:
        raise BadArg(f"Expected '{key}' to be a non-negative int. Received: {repr(value)[:60]}")
    return value


def int_arg(name: str, default: int) -> int:
    """The query argument ``name``, an int in ``[0, 2**62)``; ``default`` when absent."""
    raw = request.args.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadArg(f"Expected query '{name}' to be an int. Received: {raw!r}") from None
    if not 0 <= value < 2**62:
        raise BadArg(f"Expected query '{name}' >= 0. Received: {raw!r}")
    return value


def replica_number(value: Any) -> int:
    """A worker's copy number (:mod:`sparkdl.server.state.replicas`): an int >= -1."""
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not -1 <= value < 2**62:
        raise BadArg(
            "Expected 'replica' (the copy of the center the worker holds) to be an int >= "
            f"-1. Received: {repr(value)[:60]}"
        )
    return value


def whole_flag(value: Any) -> bool:
    """Whether a compressed push sends its update whole (a worker's closing push)."""
    if not isinstance(value, bool):
        raise BadArg(f"Expected 'whole' to be true or false. Received: {repr(value)[:60]}")
    return value


def wait_arg() -> float:
    """The long poll's ``wait`` in seconds, capped at :data:`MAX_WAIT_SECONDS`."""
    return min(float_arg("wait", 0.0), MAX_WAIT_SECONDS)


def float_arg(name: str, default: float) -> float:
    """The query argument ``name``, a finite number >= 0; ``default`` when absent."""
    raw = request.args.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise BadArg(f"Expected query '{name}' to be a number. Received: {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise BadArg(f"Expected query '{name}' >= 0. Received: {raw!r}")
    return value
