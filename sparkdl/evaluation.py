"""``KerasModel.evaluate``: Keras's evaluate on every partition, merged exactly.

Each Spark task loads the compiled model once per Python worker (cached like the
prediction model), runs ``model.evaluate`` on its partition, and returns its row count,
its logs and its metrics' states. The driver sums the states in its own copy of the
model's metrics (:class:`~sparkdl.metric_states.MetricStates`), so AUC, precision,
recall and weighted metrics come out as one ``model.evaluate`` over all rows would give
them. If the states cannot be merged (a model whose metrics cannot be built on the
driver, states too large to travel), the logs are averaged by rows instead, which is
exact only for means over rows.

Example:
    >>> combine([(1, {"loss": 1.0}), (3, {"loss": 3.0}), (0, {})])
    {'loss': 2.5}
"""

from __future__ import annotations

import itertools
import json
import logging
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame

from sparkdl.metric_states import MetricStates
from sparkdl.payload import WEIGHT, feature_name, label_name
from sparkdl.predict import load_model
from sparkdl.tf_logs import TensorFlowLogs

__all__ = ["combine", "evaluate_frame"]

_log = logging.getLogger(__name__)

_SCHEMA = "rows long, logs string, states string"


def evaluate_frame(
    frame: DataFrame,
    broadcast: Any,
    digest: str,
    *,
    input_shapes: Sequence[tuple[int, ...]],
    label_kinds: Sequence[str],
    custom_objects: bytes | None,
    batch_size: int,
    sparse: Sequence[bool] = (),
    safe_mode: bool = False,
    weighted: bool = False,
    model: Any = None,
    tf_logs: TensorFlowLogs | None = None,
) -> dict[str, float]:
    """Evaluates the broadcast model on a prepared frame (features and label columns).

    Each task streams its partition through ``model.evaluate`` one record batch at a
    time (it never holds the partition); ``sparse`` says which feature columns are ML
    vectors kept sparse; ``weighted``: the frame's :data:`~sparkdl.payload.WEIGHT` column
    is Keras's ``sample_weight``; ``model``: the driver's copy, whose metrics merge the
    partitions' states (``None``: logs averaged by rows); ``tf_logs``: how the
    executors load TensorFlow (:mod:`sparkdl.tf_logs`).
    """

    def run(batches: Iterable[pa.RecordBatch]) -> Iterable[pa.RecordBatch]:
        rows, logs, states = _evaluate_partition(
            iter(batches),
            load=lambda: load_model(
                broadcast,
                digest,
                custom_objects,
                compile=True,
                safe_mode=safe_mode,
                tf_logs=tf_logs,
            ),
            input_shapes=input_shapes,
            label_kinds=label_kinds,
            sparse=sparse,
            batch_size=batch_size,
            weighted=weighted,
        )
        yield pa.RecordBatch.from_pydict(
            {"rows": [rows], "logs": [json.dumps(logs)], "states": [json.dumps(states)]},
            schema=pa.schema(
                [("rows", pa.int64()), ("logs", pa.string()), ("states", pa.string())]
            ),
        )

    parts = frame.mapInArrow(run, _SCHEMA).collect()
    logs = combine([(int(r["rows"]), json.loads(r["logs"])) for r in parts])
    states = [json.loads(r["states"]) for r in parts if int(r["rows"]) > 0]
    if model is None or not states or any(s["variables"] is None for s in states):
        return logs
    label_shapes = [tuple(s) for s in states[0]["label_shapes"]]
    merged = MetricStates(lambda: model, input_shapes, label_kinds, label_shapes)
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


def _evaluate_partition(
    batches: Iterator[pa.RecordBatch],
    *,
    load: Any,
    input_shapes: Sequence[tuple[int, ...]],
    label_kinds: Sequence[str],
    sparse: Sequence[bool],
    batch_size: int,
    weighted: bool = False,
) -> tuple[int, dict[str, float], dict[str, Any]]:
    """``(rows, logs, states)`` of ``model.evaluate`` over one partition's record
    batches: its metrics' variables and the label shapes it fed."""
    first = next((b for b in batches if b.num_rows), None)
    if first is None:
        return 0, {}, {}
    model = load()  # first: a worker's first load imports Keras as the driver said
    from sparkdl import keras_io
    from sparkdl.executor.cache import Column, convert, slice_block
    from sparkdl.executor.feed import Feed

    flags = list(sparse) or [False] * len(input_shapes)
    inputs = [
        Column(feature_name(i), "sparse" if s else "dense", int(np.prod(shape)))
        for i, (shape, s) in enumerate(zip(input_shapes, flags, strict=True))
    ]
    outputs = [
        Column(label_name(j), "dense" if kind == "array" else kind, 0)
        for j, kind in enumerate(label_kinds)
    ]
    takes_sparse = keras_io.sparse_inputs(model) or [False] * len(inputs)  # subclassed: none
    weight = Column(WEIGHT, "float", 1) if weighted else None
    # Each array label takes its output's shape (its width read from the first batch).
    output_shapes = [
        keras_io.label_shape(model, "array", _first_width(first, c.name), j)
        if c.kind == "dense"
        else ()
        for j, c in enumerate(outputs)
    ]
    feed = Feed(
        None, inputs, input_shapes, takes_sparse, outputs, batch_size, weight, output_shapes
    )
    rows = 0

    def blocks() -> Iterator[Any]:
        nonlocal rows
        for batch in itertools.chain([first], batches):
            for i, shape in enumerate(input_shapes):  # the fit's width checks
                widths = _row_widths(batch.column(feature_name(i)))
                if len(widths):
                    label = keras_io.input_label(model, i)
                    keras_io.check_row_widths(
                        int(widths.min()), int(widths.max()), tuple(shape), label
                    )
            block = convert(batch, [*inputs, *outputs, *([weight] if weight else [])])
            rows += batch.num_rows
            for lo in range(0, batch.num_rows, batch_size):
                yield feed.structure(slice_block(block, lo, lo + batch_size))

    data = feed.stream(blocks)
    with warnings.catch_warnings():  # a stream's length is unknown until it ends
        warnings.filterwarnings("ignore", message="Your input ran out of data")
        result = model.evaluate(data, verbose=0, return_dict=True)
    states = {
        "variables": MetricStates.read(model),
        "label_shapes": [list(shape) for shape in output_shapes],
    }
    return rows, {str(k): float(v) for k, v in result.items()}, states


def _row_widths(column: pa.Array) -> np.ndarray:
    """Values per row of a feature column: list lengths, or ML vectors' sizes (nulls
    left out)."""
    if pa.types.is_struct(column.type):
        kinds = column.field("type").to_numpy(zero_copy_only=False)
        lengths = column.field("values").value_lengths().to_numpy(zero_copy_only=False)
        sizes = column.field("size").to_numpy(zero_copy_only=False)
        widths = np.where(kinds == 1, lengths, sizes)
    else:
        widths = column.value_lengths().to_numpy(zero_copy_only=False)
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    return np.asarray(widths, dtype=np.float64)[valid].astype(np.int64)


def _first_width(first: pa.RecordBatch, name: str) -> int:
    """Values of the first row's array label in a batch."""
    lengths = first.column(name).value_lengths()
    return int(lengths[0].as_py() or 0) if len(lengths) else 0
