"""``KerasModel.evaluate``: Keras's evaluate on every partition, combined by rows.

Each Spark task loads the compiled model once per Python worker (cached like the
prediction model), runs ``model.evaluate`` on its partition, and returns its row count
and logs; the driver averages the logs weighted by rows. That is exact for the loss and
for every metric that is a mean over rows (accuracy, MSE, MAE, cross-entropies); metrics
that are not (AUC, precision, recall) come out as row-weighted means of per-partition
values.

Example:
    >>> combine([(1, {"loss": 1.0}), (3, {"loss": 3.0}), (0, {})])
    {'loss': 2.5}
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame

__all__ = ["combine", "evaluate_frame"]

_SCHEMA = "rows long, logs string"


def evaluate_frame(
    frame: DataFrame,
    broadcast: Any,
    digest: str,
    *,
    input_shapes: Sequence[tuple[int, ...]],
    label_kinds: Sequence[str],
    custom_objects: bytes | None,
    batch_size: int,
) -> dict[str, float]:
    """Evaluates the broadcast model on a prepared frame (features and label columns)."""

    def run(batches: Iterable[pa.RecordBatch]) -> Iterable[pa.RecordBatch]:
        from sparkdl.data import to_numpy_multi
        from sparkdl.predict import load_model

        xs, ys = to_numpy_multi(list(batches), input_shapes, label_kinds)
        rows = len(xs[0])
        logs: dict[str, float] = {}
        if rows:
            model = load_model(broadcast, digest, custom_objects, compile=True)
            x = xs[0] if len(xs) == 1 else xs
            y = ys[0] if len(ys) == 1 else ys
            result = model.evaluate(x, y, batch_size=batch_size, verbose=0, return_dict=True)
            logs = {str(k): float(v) for k, v in result.items()}
        yield pa.RecordBatch.from_pydict(
            {"rows": [rows], "logs": [json.dumps(logs)]},
            schema=pa.schema([("rows", pa.int64()), ("logs", pa.string())]),
        )

    parts = frame.mapInArrow(run, _SCHEMA).collect()
    return combine([(int(r["rows"]), json.loads(r["logs"])) for r in parts])


def combine(parts: Sequence[tuple[int, dict[str, float]]]) -> dict[str, float]:
    """Row-weighted mean of each log over the partitions that have rows."""
    total = sum(n for n, _ in parts if n > 0)
    keys = sorted({k for n, logs in parts if n > 0 for k in logs})
    return {k: sum(n * logs[k] for n, logs in parts if n > 0 and k in logs) / total for k in keys}
