"""DataFrame columns to model inputs: schema checks, one validation scan, Arrow to numpy.

Features become one ``array<float>`` column on the JVM side (ML vectors through
``vector_to_array``, numeric column lists through ``array``), so executors receive
plain Arrow lists they can view as a 2-D numpy array without a per-row loop.

Example:
    >>> from sparkdl.data import label_kind
    >>> from pyspark.sql.types import IntegerType
    >>> label_kind(IntegerType())
    'int'
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.ml.functions import vector_to_array
from pyspark.ml.linalg import VectorUDT
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, BooleanType, DataType, FloatType, NumericType

from sparkdl.errors import SchemaError

__all__ = [
    "FEATURES",
    "LABEL",
    "ColumnTypeError",
    "DataSummary",
    "feature_column",
    "label_column",
    "label_kind",
    "summarize",
    "to_numpy",
]

#: Names of the prepared columns that travel to the executors.
FEATURES = "__sparkdl_features"
LABEL = "__sparkdl_label"


class ColumnTypeError(SchemaError, TypeError):
    """A column has a type sparkdl cannot feed to a model (e.g. strings)."""


@dataclass(frozen=True)
class DataSummary:
    """What one scan of the prepared data found.

    Attributes:
        rows: Number of rows.
        width: Number of feature values per row.
        label_width: Values per label (1 for a scalar label).
        label_min: Smallest label value (scalar labels), for class-range checks.
        label_max: Largest label value (scalar labels).
    """

    rows: int
    width: int
    label_width: int
    label_min: float | None
    label_max: float | None


def feature_column(df: DataFrame, features: str | Sequence[str]) -> Column:
    """Returns an ``array<float>`` expression for the features.

    Args:
        df: The input DataFrame.
        features: One column (``array<numeric>``, ML ``Vector`` or a numeric scalar)
            or a list of numeric column names.

    Raises:
        SchemaError: A column is missing (the message lists the available ones).
        ColumnTypeError: A column is not numeric.
    """
    if isinstance(features, str):
        dtype = _column_type(df, features, "features_col")
        if isinstance(dtype, VectorUDT):
            return vector_to_array(F.col(_quote(features)), dtype="float32")
        if isinstance(dtype, ArrayType) and _numeric(dtype.elementType):
            return F.col(_quote(features)).cast(ArrayType(FloatType()))
        if _numeric(dtype):
            return F.array(F.col(_quote(features)).cast("float"))
        raise ColumnTypeError(
            f"Expected features_col {features!r} to be array<numeric>, an ML Vector, or a "
            f"numeric column. Received: {dtype.simpleString()}. Convert it (for example with "
            "VectorAssembler or StringIndexer) or pass a list of numeric column names."
        )
    names = list(features)
    if not names:
        raise SchemaError("Expected features_col to name at least one column. Received: []")
    for name in names:
        dtype = _column_type(df, name, "features_col")
        if not _numeric(dtype):
            raise ColumnTypeError(
                f"Expected every column in features_col to be numeric. Received: {name!r} of "
                f"type {dtype.simpleString()}."
            )
    return F.array(*[F.col(_quote(n)).cast("float") for n in names])


def label_column(df: DataFrame, label: str) -> tuple[Column, str]:
    """Returns the label expression and its kind (``"int"``, ``"float"`` or ``"array"``).

    Raises:
        SchemaError: The column is missing.
        ColumnTypeError: The column is not numeric, a numeric array, or a Vector.
    """
    dtype = _column_type(df, label, "label_col")
    kind = label_kind(dtype)
    col = F.col(_quote(label))
    if isinstance(dtype, VectorUDT):
        return vector_to_array(col, dtype="float32"), kind
    if kind == "array":
        return col.cast(ArrayType(FloatType())), kind
    return col.cast("int" if kind == "int" else "float"), kind


def label_kind(dtype: DataType) -> str:
    """Classifies a label type as ``"int"``, ``"float"`` or ``"array"``.

    Raises:
        ColumnTypeError: The type cannot be a label.

    Example:
        >>> from pyspark.sql.types import ArrayType, DoubleType
        >>> label_kind(ArrayType(DoubleType()))
        'array'
    """
    if isinstance(dtype, VectorUDT):
        return "array"
    if isinstance(dtype, ArrayType) and _numeric(dtype.elementType):
        return "array"
    if _numeric(dtype):
        name = dtype.typeName()
        return "int" if name in ("byte", "short", "integer", "long", "boolean") else "float"
    raise ColumnTypeError(
        f"Expected label_col to be numeric, array<numeric> or an ML Vector. Received: "
        f"{dtype.simpleString()}. Index string labels first (pyspark.ml.feature.StringIndexer)."
    )


def summarize(prepared: DataFrame, kind: str) -> DataSummary:
    """Scans the prepared data once and checks it: rows, nulls, NaNs, ragged widths.

    Args:
        prepared: A DataFrame with the :data:`FEATURES` and :data:`LABEL` columns.
        kind: The label kind from :func:`label_column`.

    Raises:
        SchemaError: The data is empty, or has nulls, NaNs or rows of differing width.
    """
    f = F.col(FEATURES)
    y = F.col(LABEL)
    bad_value = F.exists(f, lambda v: v.isNull() | F.isnan(v))
    aggs = [
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.when(f.isNull(), 1).otherwise(0)).alias("f_null"),
        F.sum(F.when(bad_value, 1).otherwise(0)).alias("f_nan"),
        F.min(F.size(f)).alias("f_min"),
        F.max(F.size(f)).alias("f_max"),
        F.sum(F.when(y.isNull(), 1).otherwise(0)).alias("y_null"),
    ]
    if kind == "array":
        y_bad = F.exists(y, lambda v: v.isNull() | F.isnan(v))
        aggs += [
            F.sum(F.when(y_bad, 1).otherwise(0)).alias("y_nan"),
            F.min(F.size(y)).alias("y_min_w"),
            F.max(F.size(y)).alias("y_max_w"),
        ]
    else:
        y_bad = F.isnan(y) if kind == "float" else F.lit(False)
        aggs += [
            F.sum(F.when(y_bad, 1).otherwise(0)).alias("y_nan"),
            F.min(y).cast("double").alias("y_min"),
            F.max(y).cast("double").alias("y_max"),
        ]
    row = prepared.agg(*aggs).first()
    assert row is not None
    stats: dict[str, Any] = row.asDict()
    rows = int(stats["rows"])
    if rows == 0:
        raise SchemaError("The DataFrame is empty: there are no rows to train on.")
    problems = []
    if stats["f_null"]:
        problems.append(f"{stats['f_null']} row(s) with null features")
    if stats["f_nan"]:
        problems.append(f"{stats['f_nan']} row(s) with NaN or null feature values")
    if stats["y_null"]:
        problems.append(f"{stats['y_null']} row(s) with a null label")
    if stats["y_nan"]:
        problems.append(f"{stats['y_nan']} row(s) with a NaN label")
    if problems:
        raise SchemaError(
            f"Found {', '.join(problems)} among {rows} rows. Drop them "
            "(df.dropna(), or a filter on isnan) or impute them before fit."
        )
    if stats["f_min"] != stats["f_max"]:
        raise SchemaError(
            f"Expected every row to have the same number of features. Received rows with "
            f"between {stats['f_min']} and {stats['f_max']} values."
        )
    if kind == "array" and stats["y_min_w"] != stats["y_max_w"]:
        raise SchemaError(
            f"Expected every label array to have the same length. Received lengths between "
            f"{stats['y_min_w']} and {stats['y_max_w']}."
        )
    return DataSummary(
        rows=rows,
        width=int(stats["f_min"]),
        label_width=int(stats["y_min_w"]) if kind == "array" else 1,
        label_min=None if kind == "array" else float(stats["y_min"]),
        label_max=None if kind == "array" else float(stats["y_max"]),
    )


def to_numpy(
    batches: Iterable[pa.RecordBatch], input_shape: Sequence[int], kind: str
) -> tuple[np.ndarray, np.ndarray]:
    """Turns the prepared Arrow batches of one partition into ``(x, y)`` arrays.

    Args:
        batches: Record batches with the :data:`FEATURES` and :data:`LABEL` columns.
        input_shape: The model's input shape without the batch axis.
        kind: The label kind.

    Returns:
        ``x`` as float32 of shape ``(rows, *input_shape)``; ``y`` as int32 or float32.

    Raises:
        SchemaError: A row's width does not fit ``input_shape``.
    """
    table = pa.Table.from_batches(list(batches)) if batches else None
    width = int(np.prod(input_shape))
    if table is None or table.num_rows == 0:
        x = np.zeros((0, *input_shape), np.float32)
        y = np.zeros((0,), np.int32 if kind == "int" else np.float32)
        return x, y
    x = _list_to_2d(table.column(FEATURES).combine_chunks(), width, "features")
    x = x.reshape((-1, *input_shape))
    ycol = table.column(LABEL).combine_chunks()
    if kind == "array":
        lengths = ycol.value_lengths().to_numpy(zero_copy_only=False)
        y = _list_to_2d(ycol, int(lengths[0]), "label")
    else:
        y = ycol.to_numpy(zero_copy_only=False).astype(
            np.int32 if kind == "int" else np.float32, copy=False
        )
    return x, y


def _list_to_2d(column: pa.Array, width: int, what: str) -> np.ndarray:
    values = column.flatten().to_numpy(zero_copy_only=False)
    if values.size != len(column) * width:
        raise SchemaError(
            f"Expected {what} rows of {width} values each; the partition holds "
            f"{values.size} values in {len(column)} rows."
        )
    return values.astype(np.float32, copy=False).reshape(len(column), width)


def _column_type(df: DataFrame, name: str, setting: str) -> DataType:
    fields = {f.name: f.dataType for f in df.schema.fields}
    if name not in fields:
        raise SchemaError(
            f"Column {name!r} given as {setting} is not in the DataFrame. "
            f"Available columns: {sorted(fields)}."
        )
    return fields[name]


def _numeric(dtype: DataType) -> bool:
    return isinstance(dtype, (NumericType, BooleanType))


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"
