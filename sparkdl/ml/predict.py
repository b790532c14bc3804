"""``KerasModel.transform`` on the driver: the frame, the schema and the class column.

The rows are scored on the executors by :func:`sparkdl.executor.scoring.predict`, in an
Arrow UDF (``pyspark.sql.functions.arrow_udf``; before PySpark 4.1 a ``pandas_udf`` that
hands the same Arrow arrays on, :mod:`sparkdl.compat.spark_versions`) over the feature
columns: they arrive as Arrow arrays, are read as the fit and ``evaluate`` read theirs,
and the predictions go back as Arrow arrays. Being a column expression, it keeps
``withColumn``'s plan: the other columns never leave the JVM, and Spark may prune or
filter before scoring. The model bytes travel once per executor as a broadcast; each
Python worker loads the model once and keeps it.

Example:
    >>> from pyspark.sql.types import DoubleType
    >>> prediction_type([("out", True)]) == DoubleType()
    True
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql.types import ArrayType, DataType, DoubleType, FloatType, StructField, StructType

from sparkdl.compat.spark_versions import arrow_scalar_udf, has_arrow_udf
from sparkdl.contract.payload import ScoringPayload, predict_function

__all__ = ["arg_max", "model_digest", "prediction_type", "transform_frame"]


def model_digest(model_bytes: bytes) -> str:
    """A short digest that names one model version in the per-worker cache."""
    return hashlib.sha256(model_bytes).hexdigest()[:32]


def transform_frame(
    dataset: DataFrame, prediction: str, features: Sequence[Column], payload: ScoringPayload
) -> DataFrame:
    """``dataset`` with the column ``prediction`` added (or replaced), as ``withColumn``.

    Args:
        dataset: The rows to score; every column and row is kept.
        prediction: The column the predictions go to.
        features: One expression per model input (:func:`sparkdl.driver.data.model_features`).
        payload: The model and how to score it.
    """
    from pyspark.sql import functions as F

    def types() -> list[DataType]:
        return [field.dataType for field in dataset.select(*features).schema.fields]

    udf = arrow_scalar_udf(predict_function(payload), prediction_type(payload.outputs), types)
    scored = udf(*features)
    if len(payload.outputs) > 1 and not has_arrow_udf():
        # A pandas UDF's struct result has no null rows: a row with a null feature gets
        # a null prediction here, as from the Arrow UDF.
        present = functools.reduce(lambda a, b: a & b, [f.isNotNull() for f in features])
        scored = F.when(present, scored)
    return dataset.withColumn(prediction, scored)


def prediction_type(outputs: Sequence[tuple[str, bool]]) -> DataType:
    """The prediction column's type: per output a ``double`` (single unit) or an
    ``array<float>``; a struct of them, by name, for several outputs."""
    types: list[DataType] = [
        DoubleType() if scalar else ArrayType(FloatType()) for _, scalar in outputs
    ]
    if len(types) == 1:
        return types[0]
    return StructType([StructField(name, t) for (name, _), t in zip(outputs, types, strict=True)])


def arg_max(prediction: str, *, scalar: bool) -> Column:
    """The predicted class as a ``double``: the arg-max of the ``array<float>`` column
    named ``prediction``, or ``prediction >= 0.5`` for a single-unit (sigmoid) output.
    Null stays null. (An SQL expression: PySpark 3.5's ``array_position`` takes no
    column for its value.)"""
    from pyspark.sql import functions as F

    name = "`" + prediction.replace("`", "``") + "`"
    if scalar:
        return F.expr(f"CAST({name} >= 0.5 AS DOUBLE)")
    return F.expr(f"CAST(array_position({name}, array_max({name})) - 1 AS DOUBLE)")
