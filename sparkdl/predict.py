"""Batch inference as an Arrow pandas UDF, in the style of Spark's ``predict_batch_udf``.

The model bytes travel once per executor as a broadcast; each Python worker loads the
model once and keeps it for later batches and tasks (keyed by the model's digest).

Example:
    >>> _CACHE_SIZE
    4
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import Column
from pyspark.sql.functions import pandas_udf
from pyspark.sql.types import ArrayType, DataType, DoubleType, FloatType

__all__ = ["arg_max", "load_model", "model_digest", "predict_udf"]

_CACHE_SIZE = 4
_cache: OrderedDict[str, Any] = OrderedDict()
_cache_lock = threading.Lock()


def model_digest(model_bytes: bytes) -> str:
    """A short digest that names one model version in the per-worker cache."""
    return hashlib.sha256(model_bytes).hexdigest()[:32]


def predict_udf(
    broadcast: Any,
    digest: str,
    input_shape: tuple[int, ...],
    *,
    scalar_output: bool,
    batch_size: int = 1024,
    custom_objects: bytes | None = None,
) -> Callable[[Column], Column]:
    """Returns a pandas UDF that maps an ``array<float>`` column to predictions.

    Args:
        broadcast: Spark broadcast of the ``.keras`` bytes.
        digest: :func:`model_digest` of those bytes.
        input_shape: Per-sample input shape.
        scalar_output: Return ``double`` (a single-unit output) instead of
            ``array<float>``.
        batch_size: Rows per ``predict_on_batch`` call.
        custom_objects: cloudpickled ``custom_objects``, or ``None``.

    Rows with null features get a null prediction.
    """
    return_type: DataType = DoubleType() if scalar_output else ArrayType(FloatType())

    def predict(series: Iterator[pd.Series]) -> Iterator[pd.Series]:
        model = load_model(broadcast, digest, custom_objects)
        for batch in series:
            mask = batch.notna().to_numpy()
            out: list[Any] = [None] * len(batch)
            if mask.any():
                x = np.stack(batch[mask].to_numpy()).astype(np.float32, copy=False)
                x = x.reshape((-1, *input_shape))
                preds = np.concatenate(
                    [
                        np.asarray(model.predict_on_batch(x[i : i + batch_size]))
                        for i in range(0, len(x), batch_size)
                    ]
                )
                preds = preds.reshape(len(x), -1)
                rows = np.flatnonzero(mask)
                if scalar_output:
                    values = preds[:, 0].astype(np.float64)
                    for r, v in zip(rows, values, strict=True):
                        out[r] = float(v)
                else:
                    values32 = preds.astype(np.float32, copy=False)
                    for r, v in zip(rows, values32, strict=True):
                        out[r] = v
            yield pd.Series(out, dtype="float64" if scalar_output else "object")

    return pandas_udf(predict, return_type)  # type: ignore[call-overload]


def arg_max(prediction: Column, *, scalar: bool) -> Column:
    """The predicted class as a ``double``: the arg-max of an ``array<float>`` output,
    or ``prediction >= 0.5`` for a single-unit (sigmoid) output. Null stays null."""
    from pyspark.sql import functions as F

    if scalar:
        return (prediction >= F.lit(0.5)).cast("double")
    return (F.array_position(prediction, F.array_max(prediction)) - F.lit(1)).cast("double")


def load_model(
    broadcast: Any, digest: str, custom_objects: bytes | None, *, compile: bool = False
) -> Any:
    """The model of ``broadcast``, loaded once per Python worker and kept (LRU of 4)."""
    key = f"{digest}:{'compiled' if compile else 'plain'}"
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    import cloudpickle

    from sparkdl.keras_io import model_from_bytes

    custom = cloudpickle.loads(custom_objects) if custom_objects else None
    model = model_from_bytes(broadcast.value, custom, compile=compile)
    with _cache_lock:
        _cache[key] = model
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return model
