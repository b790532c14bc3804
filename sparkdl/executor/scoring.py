"""Scoring on the executors: ``transform``'s predictions and ``evaluate``'s metrics.

Both read rows one way, as a fit reads its partition: Arrow record batches in, the
rows' widths checked against the model's inputs (before the model loads, so a frame of
the wrong width fails fast), the cache's conversion (:func:`~sparkdl.executor.blocks.
convert`: float32 rows, or CSR for sparse vectors), the model called one chunk of
``batch_size`` rows at a time, and Arrow out: ``transform``'s predictions (an Arrow UDF
over the feature columns) are built as Arrow arrays from numpy (nulls where a row has a
null feature), never row by row.

Each Python worker loads a model once and keeps it for later batches and tasks (a
small LRU keyed by the model's digest); its first load imports Keras on the driver's
backend (``payload.backend``, :mod:`sparkdl.executor.backends`), as quietly as the
driver said (:mod:`sparkdl.contract.tf_logs`).
"""

from __future__ import annotations

import importlib
import itertools
import json
import threading
import warnings
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from sparkdl.contract.payload import Column, ScoringPayload, check_row_widths
from sparkdl.contract.tf_logs import TensorFlowLogs
from sparkdl.executor.backends import backend_for
from sparkdl.executor.blocks import Block, convert, row_widths, slice_block

__all__ = ["check_widths", "evaluate", "load_model", "predict"]

_CACHE_SIZE = 4
_cache: OrderedDict[str, Any] = OrderedDict()
_cache_lock = threading.Lock()


def predict(payload: ScoringPayload, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.Array]:
    """The model's predictions for each record batch of feature columns.

    Rows with a null feature get a null prediction. One output is a ``double``
    (single-unit) or ``list<float>`` array; several are a struct of them by name.
    """
    inputs, _, _ = payload.columns()
    model = None
    takes_sparse: list[bool] = []
    for batch in batches:
        present = _present(batch, inputs)
        kept = batch if present.all() else batch.filter(pa.array(present))
        check_widths(kept, inputs, payload)
        predictions: list[np.ndarray] = []
        if kept.num_rows:
            if model is None:  # loaded once a row needs it; its inputs read once
                from sparkdl.contract.keras_io import sparse_inputs

                model = load_model(payload)
                takes_sparse = sparse_inputs(model) or [False] * len(inputs)
            block = convert(kept, inputs)
            predictions = _predict(model, block, inputs, takes_sparse, payload)
        columns = [
            _output_array(predictions[j] if predictions else None, present, scalar)
            for j, (_, scalar) in enumerate(payload.outputs)
        ]
        if len(columns) == 1:
            yield columns[0]
        else:
            names = [n for n, _ in payload.outputs]
            yield pa.StructArray.from_arrays(columns, names=names, mask=pa.array(~present))


def evaluate(payload: ScoringPayload, batches: Iterable[pa.RecordBatch]) -> pa.RecordBatch:
    """One row: the partition's row count, ``model.evaluate``'s logs and the metrics'
    states (JSON), streamed one record batch at a time (the partition is never held)."""
    rows, logs, states = _evaluate(payload, iter(batches))
    return pa.RecordBatch.from_pydict(
        {"rows": [rows], "logs": [json.dumps(logs)], "states": [json.dumps(states)]},
        schema=pa.schema([("rows", pa.int64()), ("logs", pa.string()), ("states", pa.string())]),
    )


def check_widths(batch: pa.RecordBatch, inputs: Sequence[Column], payload: ScoringPayload) -> None:
    """The fit's width checks on one record batch's feature columns: rows of another
    width would be reshaped into other rows' predictions.

    Raises:
        SchemaError: Rows of unequal width, or a width that does not fill the input.
    """
    for column, shape, label in zip(
        inputs, payload.input_shapes, payload.input_labels, strict=True
    ):
        widths = row_widths(batch.column(column.name))
        if len(widths):
            check_row_widths(int(widths.min()), int(widths.max()), tuple(shape), label)


def load_model(payload: ScoringPayload, *, compile: bool = False) -> Any:
    """The payload's model, loaded once per Python worker and kept (LRU of 4); the
    worker's first load imports Keras on ``payload.backend``, as ``payload.tf_logs``
    says."""
    safe = payload.safe_mode
    key = f"{payload.digest}:{'compiled' if compile else 'plain'}:{'safe' if safe else 'any'}"
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    import cloudpickle

    logs = payload.tf_logs or TensorFlowLogs()
    backend_for(payload.backend).load(logs, lambda: importlib.import_module("keras"))
    from sparkdl.contract.keras_io import model_from_bytes

    custom = cloudpickle.loads(payload.custom_objects) if payload.custom_objects else None
    model = model_from_bytes(payload.model_bytes.value, custom, compile=compile, safe_mode=safe)
    with _cache_lock:
        _cache[key] = model
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return model


def _present(batch: pa.RecordBatch, inputs: Sequence[Column]) -> np.ndarray:
    """Which rows have every feature (not null)."""
    mask = np.ones(batch.num_rows, bool)
    for column in inputs:
        mask &= batch.column(column.name).is_valid().to_numpy(zero_copy_only=False)
    return mask


def _predict(
    model: Any,
    block: Block,
    inputs: Sequence[Column],
    takes_sparse: Sequence[bool],
    payload: ScoringPayload,
) -> list[np.ndarray]:
    """Predicts ``block`` in chunks of ``batch_size`` rows; one array per output, one
    row per block row. A CSR input becomes the backend's sparse batch (``takes_sparse``: a
    sparse model input) or dense rows one chunk at a time."""
    from sparkdl.contract.payload import pack_inputs
    from sparkdl.executor.feed import model_input

    rows = len(block[inputs[0].name])
    chunks: list[list[np.ndarray]] = [[] for _ in payload.outputs]
    for start in range(0, rows, payload.batch_size):
        stop = min(start + payload.batch_size, rows)
        piece = slice_block(block, start, stop)
        xs = [
            model_input(piece[column.name], shape, sparse, payload.backend, tensor=True)
            for column, shape, sparse in zip(
                inputs, payload.input_shapes, takes_sparse, strict=True
            )
        ]
        out = model.predict_on_batch(pack_inputs(payload.input_structure, xs))
        values = list(out.values()) if isinstance(out, dict) else out
        values = values if isinstance(values, (list, tuple)) else [values]
        for acc, value in zip(chunks, values, strict=True):
            acc.append(np.asarray(value).reshape(stop - start, -1))
    return [np.concatenate(acc) for acc in chunks]


def _output_array(values: np.ndarray | None, present: np.ndarray, scalar: bool) -> pa.Array:
    """One output's predictions for every row of a batch (null where not ``present``):
    a ``double`` per row, or a ``list<float>``."""
    if scalar:
        full = np.zeros(len(present), np.float64)
        if values is not None:
            full[present] = values[:, 0]
        return pa.array(full, pa.float64(), mask=~present)
    width = values.shape[1] if values is not None else 0
    offsets = np.zeros(len(present) + 1, np.int32)
    np.cumsum(np.where(present, width, 0), out=offsets[1:])
    flat = (
        values.astype(np.float32, copy=False).reshape(-1)
        if values is not None
        else np.zeros(0, np.float32)
    )
    return pa.ListArray.from_arrays(
        pa.array(offsets, pa.int32()), pa.array(flat, pa.float32()), mask=pa.array(~present)
    )


def _evaluate(
    payload: ScoringPayload, batches: Iterator[pa.RecordBatch]
) -> tuple[int, dict[str, float], dict[str, Any]]:
    """``(rows, logs, states)`` of ``model.evaluate`` over one partition's record
    batches: its metrics' variables and the label shapes it fed."""
    first = next((b for b in batches if b.num_rows), None)
    if first is None:
        return 0, {}, {}
    inputs, outputs, weight = payload.columns()
    check_widths(first, inputs, payload)  # before the model loads: a wrong frame fails fast
    model = load_model(payload, compile=True)  # a worker's first load imports Keras
    from sparkdl.contract import keras_io
    from sparkdl.contract.metric_states import MetricStates
    from sparkdl.executor.feed import Feed

    takes_sparse = keras_io.sparse_inputs(model) or [False] * len(inputs)  # subclassed: none
    # Each array label takes its output's shape (its width read from the first batch).
    output_shapes = [
        keras_io.label_shape(model, "array", _first_width(first, c.name), j)
        if c.kind == "dense"
        else ()
        for j, c in enumerate(outputs)
    ]
    feed = Feed(
        None,
        inputs,
        payload.input_shapes,
        takes_sparse,
        outputs,
        payload.batch_size,
        weight,
        output_shapes,
        backend=payload.backend,
        input_structure=payload.input_structure,
    )
    rows = 0

    def blocks() -> Iterator[Any]:
        nonlocal rows
        for i, batch in enumerate(itertools.chain([first], batches)):
            if i:  # the first was checked
                check_widths(batch, inputs, payload)
            block = convert(batch, [*inputs, *outputs, *([weight] if weight else [])])
            rows += batch.num_rows
            for lo in range(0, batch.num_rows, payload.batch_size):
                yield feed.structure(slice_block(block, lo, lo + payload.batch_size))

    data = feed.stream(blocks)
    with warnings.catch_warnings():  # a stream's length is unknown until it ends
        warnings.filterwarnings("ignore", message="Your input ran out of data")
        result = model.evaluate(data, verbose=0, return_dict=True)
    states = {
        "variables": MetricStates.read(model),
        "label_shapes": [list(shape) for shape in output_shapes],
    }
    return rows, {str(k): float(v) for k, v in result.items()}, states


def _first_width(first: pa.RecordBatch, name: str) -> int:
    """Values of the first row's array label in a batch."""
    lengths = first.column(name).value_lengths()
    return int(lengths[0].as_py() or 0) if len(lengths) else 0
