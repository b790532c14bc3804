"""What a push's metadata may hold: checked whole before the push changes anything.

A push's header carries, beside the weights, the worker's progress: its loss, where it
stands in the epoch, the logs of an epoch it finished. The service records them in the
ledger and the history and serves them in ``GET /status``, so a value that cannot be
recorded (a number too large for a float, a NaN that would make ``/status`` invalid
JSON, a nested object, thousands of metrics) must be refused before the center moves:
:func:`check_push_meta` refuses it with a 400 naming the field. An epoch's metric
states (``epoch_states``: ``{"train": [[...], ...], "val": ...}``, each metric
variable's values, :mod:`sparkdl.contract.metric_states`) are bounded in count and must be
finite numbers. Keys it does not know are ignored.

Example:
    >>> check_push_meta({"loss": 0.5, "epoch": 0, "step": 3, "epoch_logs": {"loss": 0.4}})
    >>> try:
    ...     check_push_meta({"loss": float("nan")})
    ... except StoreError as exc:
    ...     print(exc.status, exc.message[:38])
    400 Expected 'loss' in the push's metadata
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from sparkdl.contract.metric_states import MAX_STATE_VALUES
from sparkdl.server.state.errors import StoreError

__all__ = ["MAX_EPOCHS", "MAX_LOGS", "MAX_VALUE", "check_push_meta"]

#: Epoch numbers a push may name.
MAX_EPOCHS = 1_000_000
#: Metrics an epoch's logs may hold (a model of many outputs has several per output).
MAX_LOGS = 4096
#: The largest magnitude a loss or metric may have: a history weighs each by up to
#: 2**53 rows, which stays finite.
MAX_VALUE = 1e250
_MAX_NAME = 1000
_MAX_COUNT = 2**53


def check_push_meta(meta: dict[str, Any], *, rows: int | None = None) -> None:
    """Refuses metadata the service could not record exactly.

    Args:
        meta: The push's header metadata.
        rows: The rows the worker joined with: a push's epoch cannot have more.

    Raises:
        StoreError: 400 naming the field.
    """
    _number(meta, "loss")
    _number(meta, "comm_seconds", minimum=0.0)
    _count(meta, "epoch", MAX_EPOCHS)
    _count(meta, "step", _MAX_COUNT)
    _count(meta, "epoch_samples", rows if rows is not None else _MAX_COUNT)
    _count(meta, "val_samples", _MAX_COUNT)
    _states(meta.get("epoch_states"))
    logs = meta.get("epoch_logs")
    if logs is None:
        return
    if not isinstance(logs, dict) or len(logs) > MAX_LOGS:
        raise StoreError(
            400, f"Expected 'epoch_logs' to be an object of at most {MAX_LOGS} metrics."
        )
    for name in logs:
        if not isinstance(name, str) or len(name) > _MAX_NAME:
            raise StoreError(400, f"Expected metric names of at most {_MAX_NAME} characters.")
        _number(logs, name, where=f"epoch_logs[{name[:40]!r}]")


def _states(states: Any) -> None:
    """Checks ``epoch_states``: training and validation states, each ``None`` or a
    list of at most :data:`MAX_LOGS` lists of finite numbers, all of them together at
    most :data:`~sparkdl.contract.metric_states.MAX_STATE_VALUES`."""
    if states is None:
        return
    if not isinstance(states, dict) or set(states) - {"train", "val"}:
        raise StoreError(400, "Expected 'epoch_states' to be an object with 'train' and 'val'.")
    for key in ("train", "val"):
        part = states.get(key)
        if part is None:
            continue
        problem = _state_problem(part)
        if problem:
            raise StoreError(
                400,
                f"Expected 'epoch_states.{key}' to be a list of at most {MAX_LOGS} metric "
                f"variables, each a list of finite numbers, {MAX_STATE_VALUES} numbers in "
                f"all: {problem}.",
            )


def _state_problem(part: Any) -> str | None:
    if not isinstance(part, list) or len(part) > MAX_LOGS:
        return "not a list of that length"
    count = 0
    for values in part:
        if not isinstance(values, list):
            return "a variable is not a list"
        count += len(values)
        if count > MAX_STATE_VALUES:
            return "too many numbers"
        if not all(type(v) in (int, float) for v in values):
            return "a value is not a number"
        try:
            array = np.asarray(values, dtype=np.float64)
        except OverflowError:
            return "a value is too large"
        if array.size and not (np.abs(array) <= MAX_VALUE).all():
            return f"a value is not finite or beyond {MAX_VALUE:g}"
    return None


def _number(
    meta: dict[str, Any], key: str, *, minimum: float | None = None, where: str | None = None
) -> None:
    value = meta.get(key)
    if value is None:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        try:
            number = float(value)
        except OverflowError:  # an int beyond float's range
            number = math.inf
        ok = abs(number) <= MAX_VALUE and (minimum is None or number >= minimum)
    if not ok:
        bound = f" >= {minimum}" if minimum is not None else ""
        raise StoreError(
            400,
            f"Expected {where or repr(key)} in the push's metadata to be a finite number"
            f"{bound} (at most {MAX_VALUE:g} in size) or null. Received: {_short(value)}",
        )


def _count(meta: dict[str, Any], key: str, limit: int) -> None:
    value = meta.get(key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
        raise StoreError(
            400,
            f"Expected {key!r} in the push's metadata to be an int from 0 to {limit}. "
            f"Received: {_short(value)}",
        )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
