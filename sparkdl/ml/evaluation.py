"""``KerasModel.evaluate``: Keras's evaluate on every partition, merged exactly.

Each Spark task loads the compiled model once per Python worker (cached like the
prediction model), runs ``model.evaluate`` on its partition, and returns its row count,
its logs and its metrics' states. The driver sums the states in its own copy of the
model's metrics (:class:`~sparkdl.contract.metric_states.MetricStates`), so AUC, precision,
recall and weighted metrics come out as one ``model.evaluate`` over all rows would give
them. If the states cannot be merged (a model whose metrics cannot be built on the
driver, states too large to travel), the logs are averaged by rows instead, which is
exact only for means over rows.

Example:
    >>> combine([(1, {"loss": 1.0}), (3, {"loss": 3.0}), (0, {})])
    {'loss': 2.5}
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame

from sparkdl.contract.metric_states import MetricStates
from sparkdl.contract.payload import EVALUATION_SCHEMA, ScoringPayload, evaluate_function

__all__ = ["combine", "evaluate_frame"]

_log = logging.getLogger(__name__)


def evaluate_frame(
    frame: DataFrame, payload: ScoringPayload, *, model: Any = None
) -> dict[str, float]:
    """Evaluates the payload's model on a prepared frame (features and label columns).

    Each task streams its partition through ``model.evaluate`` one record batch at a
    time (:func:`sparkdl.executor.scoring.evaluate`); ``model``: the driver's copy,
    whose metrics merge the partitions' states (``None``: logs averaged by rows).
    """
    parts = frame.mapInArrow(evaluate_function(payload), EVALUATION_SCHEMA).collect()
    logs = combine([(int(r["rows"]), json.loads(r["logs"])) for r in parts])
    states = [json.loads(r["states"]) for r in parts if int(r["rows"]) > 0]
    if model is None or not states or any(s["variables"] is None for s in states):
        return logs
    label_shapes = [tuple(s) for s in states[0]["label_shapes"]]
    merged = MetricStates(lambda: model, payload.input_shapes, payload.label_kinds, label_shapes)
    try:
        exact = merged.results([state["variables"] for state in states])
    except Exception as exc:  # metrics that cannot be built here: rows' means instead
        _log.info("evaluate: metric states not merged (%s); logs averaged by rows", exc)
        return logs
    return {**logs, **{k: v for k, v in exact.items() if k in logs}}


def combine(parts: Sequence[tuple[int, dict[str, float]]]) -> dict[str, float]:
    """Row-weighted mean of each log over the partitions that have rows."""
    total = sum(n for n, _ in parts if n > 0)
    keys = sorted({k for n, logs in parts if n > 0 for k in logs})
    return {k: sum(n * logs[k] for n, logs in parts if n > 0 and k in logs) / total for k in keys}
