"""``KerasModel.transform`` on the driver: the frame, the schema and the class column.

The rows are scored on the executors by :func:`sparkdl.executor.scoring.predict`, over
``mapInArrow`` as ``evaluate`` and the fit read theirs: every column of the frame
passes through as Arrow, the feature columns are read as the fit reads them, and the
predictions come back as Arrow arrays. The model bytes travel once per executor as a
broadcast; each Python worker loads the model once and keeps it.

Example:
    >>> from pyspark.sql.types import DoubleType
    >>> prediction_type([("out", True)]) == DoubleType()
    True
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql.types import ArrayType, DataType, DoubleType, FloatType, StructField, StructType

from sparkdl.payload import ScoringPayload, feature_name, predict_function

__all__ = ["arg_max", "model_digest", "prediction_type", "transform_frame"]


def model_digest(model_bytes: bytes) -> str:
    """A short digest that names one model version in the per-worker cache."""
    return hashlib.sha256(model_bytes).hexdigest()[:32]


def transform_frame(
    dataset: DataFrame, features: Sequence[Column], payload: ScoringPayload
) -> DataFrame:
    """``dataset`` with ``payload.prediction`` added (or replaced, in its place).

    Args:
        dataset: The rows to score; every column and row is kept.
        features: One expression per model input (:func:`sparkdl.data.model_features`).
        payload: The model and how to score it (its ``outputs`` and ``prediction``).
    """
    column = StructField(payload.prediction, prediction_type(payload.outputs))
    fields = [column if f.name == payload.prediction else f for f in dataset.schema.fields]
    if column not in fields:
        fields.append(column)
    frame = dataset.select("*", *[f.alias(feature_name(i)) for i, f in enumerate(features)])
    return frame.mapInArrow(predict_function(payload), StructType(fields))


def prediction_type(outputs: Sequence[tuple[str, bool]]) -> DataType:
    """The prediction column's type: per output a ``double`` (single unit) or an
    ``array<float>``; a struct of them, by name, for several outputs."""
    types: list[DataType] = [
        DoubleType() if scalar else ArrayType(FloatType()) for _, scalar in outputs
    ]
    if len(types) == 1:
        return types[0]
    return StructType([StructField(name, t) for (name, _), t in zip(outputs, types, strict=True)])


def arg_max(prediction: Column, *, scalar: bool) -> Column:
    """The predicted class as a ``double``: the arg-max of an ``array<float>`` output,
    or ``prediction >= 0.5`` for a single-unit (sigmoid) output. Null stays null."""
    from pyspark.sql import functions as F

    if scalar:
        return (prediction >= F.lit(0.5)).cast("double")
    return (F.array_position(prediction, F.array_max(prediction)) - F.lit(1)).cast("double")
