"""Batch inference as an Arrow pandas UDF, in the style of Spark's ``predict_batch_udf``.

The model bytes travel once per executor as a broadcast; each Python worker loads the
model once and keeps it for later batches and tasks (keyed by the model's digest).

Example:
    >>> _CACHE_SIZE
    4
"""

from __future__ import annotations

import hashlib
import importlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import Column
from pyspark.sql.functions import pandas_udf
from pyspark.sql.types import (
    ArrayType,
    DataType,
    DoubleType,
    FloatType,
    StructField,
    StructType,
)

from sparkdl.tf_logs import TensorFlowLogs

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
    input_shapes: Sequence[tuple[int, ...]],
    *,
    outputs: Sequence[tuple[str, bool]],
    batch_size: int = 1024,
    custom_objects: bytes | None = None,
    sparse: Sequence[bool] = (),
    safe_mode: bool = False,
    tf_logs: TensorFlowLogs | None = None,
) -> Callable[..., Column]:
    """Returns a pandas UDF that maps ``array<float>`` feature columns to predictions.

    Args:
        broadcast: Spark broadcast of the ``.keras`` bytes.
        digest: :func:`model_digest` of those bytes.
        input_shapes: Per-sample shape of each model input (one UDF argument each).
        outputs: ``(name, scalar)`` per model output; a scalar (single-unit) output is a
            ``double``, others ``array<float>``. With several outputs the UDF returns a
            struct with one field per output name.
        batch_size: Rows per ``predict_on_batch`` call.
        custom_objects: cloudpickled ``custom_objects``, or ``None``.
        sparse: Per input, whether its column is ML vectors kept sparse (they reach
            the UDF as ``type, size, indices, values`` columns and become a
            ``tf.SparseTensor``, or dense rows one chunk at a time).
        safe_mode: Keras's safe mode for the executors' load (a stage loaded from a
            directory).
        tf_logs: How the executors load TensorFlow (:mod:`sparkdl.tf_logs`).

    Rows with a null feature get a null prediction.
    """
    types: list[DataType] = [
        DoubleType() if scalar else ArrayType(FloatType()) for _, scalar in outputs
    ]
    single = len(outputs) == 1
    return_type: DataType = (
        types[0]
        if single
        else StructType([StructField(name, t) for (name, _), t in zip(outputs, types, strict=True)])
    )
    shapes = [tuple(s) for s in input_shapes]
    vectors = list(sparse) or [False] * len(shapes)

    def predict(batches: Iterator[Any]) -> Iterator[Any]:
        model = load_model(broadcast, digest, custom_objects, safe_mode=safe_mode, tf_logs=tf_logs)
        from sparkdl.keras_io import check_row_widths, input_label, sparse_inputs

        takes_sparse = sparse_inputs(model) or [False] * len(shapes)
        labels = [input_label(model, i) for i in range(len(shapes))]
        for batch in batches:
            columns = [batch] if isinstance(batch, (pd.Series, pd.DataFrame)) else list(batch)
            mask = np.logical_and.reduce([_present(c) for c in columns])
            results: list[list[Any]] = [[None] * len(columns[0]) for _ in outputs]
            if mask.any():
                # The fit's width checks, per batch: rows of another width would be
                # reshaped into other rows' predictions.
                for c, shape, label in zip(columns, shapes, labels, strict=True):
                    widths = _row_widths(c[mask])
                    check_row_widths(int(widths.min()), int(widths.max()), shape, label)
                xs = [
                    _csr(c[mask], int(np.prod(shape)))
                    if vector
                    else np.stack(c[mask].to_numpy())
                    .astype(np.float32, copy=False)
                    .reshape((-1, *shape))
                    for c, shape, vector in zip(columns, shapes, vectors, strict=True)
                ]
                preds = _predict(model, xs, batch_size, len(outputs), shapes, takes_sparse)
                rows = np.flatnonzero(mask)
                for out, values, (_, scalar) in zip(results, preds, outputs, strict=True):
                    values = values.reshape(len(rows), -1)
                    if scalar:
                        for r, v in zip(rows, values[:, 0].astype(np.float64), strict=True):
                            out[r] = float(v)
                    else:
                        for r, v in zip(rows, values.astype(np.float32, copy=False), strict=True):
                            out[r] = v
            series = [
                pd.Series(out, dtype="float64" if scalar else "object")
                for out, (_, scalar) in zip(results, outputs, strict=True)
            ]
            if single:
                yield series[0]
            else:
                yield pd.DataFrame({name: s for (name, _), s in zip(outputs, series, strict=True)})

    # pandas_udf reads the UDF's kind from its type hints: iterator of Series (one input)
    # or of tuples of Series (several), yielding Series (one output) or DataFrames.
    arg = pd.Series if len(shapes) == 1 else tuple[pd.Series, ...]
    predict.__annotations__ = {
        "batches": Iterator[arg],  # type: ignore[valid-type]
        "return": Iterator[pd.Series] if single else Iterator[pd.DataFrame],
    }
    return pandas_udf(predict, return_type)  # type: ignore[call-overload]


def _predict(
    model: Any,
    xs: list[Any],
    batch_size: int,
    outputs: int,
    shapes: Sequence[tuple[int, ...]],
    takes_sparse: Sequence[bool],
) -> list[np.ndarray]:
    """Predicts in chunks; returns one array per model output.

    ``xs`` holds arrays, or CSR matrices for sparse vector columns, which become a
    ``tf.SparseTensor`` (a sparse model input) or dense rows one chunk at a time.
    """
    from sparkdl.executor.cache import Csr

    chunks: list[list[np.ndarray]] = [[] for _ in range(outputs)]
    rows = len(xs[0])
    for start in range(0, rows, batch_size):
        part = []
        for x, shape, sparse in zip(xs, shapes, takes_sparse, strict=True):
            if isinstance(x, Csr):
                piece = x.slice(start, min(start + batch_size, rows))
                dense = None if sparse else piece.dense().reshape((-1, *shape))
                part.append(_sparse_tensor(piece) if sparse else dense)
            else:
                part.append(x[start : start + batch_size])
        out = model.predict_on_batch(part[0] if len(part) == 1 else part)
        out_list = out if isinstance(out, (list, tuple)) else [out]
        if isinstance(out, dict):
            out_list = list(out.values())
        for acc, value in zip(chunks, out_list, strict=True):
            acc.append(np.asarray(value))
    return [np.concatenate(acc) for acc in chunks]


def _row_widths(column: Any) -> np.ndarray:
    """Values per row of a UDF argument: array lengths, or ML vectors' sizes."""
    if isinstance(column, pd.DataFrame):
        dense = column["type"].to_numpy() == 1
        lengths = column["values"].map(len).to_numpy()
        sizes = column["size"].fillna(-1).to_numpy()
        return np.where(dense, lengths, sizes).astype(np.int64)
    return column.map(len).to_numpy().astype(np.int64)


def _present(column: Any) -> np.ndarray:
    """Which rows of a UDF argument are not null (a vector column is a DataFrame)."""
    if isinstance(column, pd.DataFrame):
        return column["values"].notna().to_numpy()
    return column.notna().to_numpy()


def _csr(vectors: pd.DataFrame, width: int) -> Any:
    """ML vectors (as the UDF receives them: ``type, size, indices, values`` columns)
    as one CSR matrix."""
    import pyarrow as pa

    from sparkdl.executor.cache import Column as Stored
    from sparkdl.executor.cache import Csr, convert

    frame = vectors.reset_index(drop=True)
    sizes = [None if s != s or s is None else int(s) for s in frame["size"]]  # NaN: none
    struct = pa.StructArray.from_arrays(
        [
            pa.array(frame["type"].astype("int8"), pa.int8()),
            pa.array(sizes, pa.int32()),
            pa.array(list(frame["indices"]), pa.list_(pa.int32())),
            pa.array(list(frame["values"]), pa.list_(pa.float64())),
        ],
        names=["type", "size", "indices", "values"],
    )
    batch = pa.RecordBatch.from_arrays([struct], names=["v"])
    value = convert(batch, [Stored("v", "sparse", width)])["v"]
    assert isinstance(value, Csr)
    return value


def _sparse_tensor(rows: Any) -> Any:
    import tensorflow as tf

    indices, values = rows.coo()
    return tf.SparseTensor(indices, values, (len(rows), rows.width))


def arg_max(prediction: Column, *, scalar: bool) -> Column:
    """The predicted class as a ``double``: the arg-max of an ``array<float>`` output,
    or ``prediction >= 0.5`` for a single-unit (sigmoid) output. Null stays null."""
    from pyspark.sql import functions as F

    if scalar:
        return (prediction >= F.lit(0.5)).cast("double")
    return (F.array_position(prediction, F.array_max(prediction)) - F.lit(1)).cast("double")


def load_model(
    broadcast: Any,
    digest: str,
    custom_objects: bytes | None,
    *,
    compile: bool = False,
    safe_mode: bool = False,
    tf_logs: TensorFlowLogs | None = None,
) -> Any:
    """The model of ``broadcast``, loaded once per Python worker and kept (LRU of 4);
    the worker's first load imports Keras (and TensorFlow) as ``tf_logs`` says."""
    key = f"{digest}:{'compiled' if compile else 'plain'}:{'safe' if safe_mode else 'any'}"
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    import cloudpickle

    (tf_logs or TensorFlowLogs()).load(lambda: importlib.import_module("keras"))
    from sparkdl.keras_io import model_from_bytes

    custom = cloudpickle.loads(custom_objects) if custom_objects else None
    model = model_from_bytes(broadcast.value, custom, compile=compile, safe_mode=safe_mode)
    with _cache_lock:
        _cache[key] = model
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return model
