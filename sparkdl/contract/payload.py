"""What crosses from the driver to the executors: the column contract and the payload.

The driver prepares a DataFrame whose columns have the names below and ships a
:class:`WorkerPayload` (plain values: the resolved plan, the shapes, the service's
address) with the function ``mapInArrow`` runs. This module is the one both sides
import, and it imports neither side: no Keras, no TensorFlow, no ``pyspark.ml``, no
driver module. Imports run one way, driver -> payload <- executor
(:mod:`sparkdl.executor.task` is the task entry).

Example:
    >>> feature_name(0), feature_name(1), label_name(0)
    ('__sparkdl_features', '__sparkdl_features_1', '__sparkdl_label')
    >>> inputs, outputs, weight = cached_columns([(2, 3)], [False], ["int"], [1], False)
    >>> inputs[0], outputs[0].kind, weight
    (Column(name='__sparkdl_features', kind='dense', width=6), 'int', None)
"""

from __future__ import annotations

import importlib
import io
import json
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from sparkdl.errors import SchemaError

if TYPE_CHECKING:
    import pyarrow as pa

    from sparkdl.contract.plan import FitPlan
    from sparkdl.contract.tf_logs import TensorFlowLogs
    from sparkdl.sync.shards import ShardLayout

__all__ = [
    "EVALUATION_SCHEMA",
    "FEATURES",
    "LABEL",
    "RESULT_SCHEMA",
    "VALIDATION",
    "WEIGHT",
    "Column",
    "Hosting",
    "ScoringPayload",
    "WorkerPayload",
    "cached_columns",
    "check_row_widths",
    "evaluate_function",
    "feature_name",
    "label_name",
    "pack_inputs",
    "predict_function",
    "ragged_rows_message",
    "result_rows",
    "service_result",
    "train_function",
    "width_error",
]

#: Names of the prepared columns that travel to the executors.
FEATURES = "__sparkdl_features"
LABEL = "__sparkdl_label"
#: A boolean column marking the rows of validation data travelling with a partition.
VALIDATION = "__sparkdl_validation"
#: The prepared column of per-row weights (``weight_col``, ``class_weight``).
WEIGHT = "__sparkdl_weight"
#: Schema of the rows a training task returns: each worker one row, its id and its
#: report as JSON (``blob`` null); the service's host, when the service runs in the
#: cluster, also its result (:mod:`sparkdl.executor.hosting`), in rows of negative id.
RESULT_SCHEMA = "worker int, report string, blob binary"
#: Bytes of a hosted service's final weights per result row (below gRPC's limits).
CHUNK_BYTES = 4 << 20
#: Result rows of the service's host: ``worker`` -1 holds the JSON result, -2 the
#: weights' chunks.
RESULT_ROW, WEIGHTS_ROW = -1, -2
#: Schema of the one row each ``evaluate`` task returns: rows, logs and metric states.
EVALUATION_SCHEMA = "rows long, logs string, states string"


def feature_name(index: int) -> str:
    """The prepared column of model input ``index``."""
    return FEATURES if index == 0 else f"{FEATURES}_{index}"


def label_name(index: int) -> str:
    """The prepared column of model output ``index``'s label."""
    return LABEL if index == 0 else f"{LABEL}_{index}"


def check_row_widths(
    smallest: int, largest: int, shape: tuple[int, ...], input_label: str = ""
) -> None:
    """Checks that rows of ``smallest`` to ``largest`` values fit a per-sample ``shape``:
    the one row-width rule, with the messages the fit's data check gives before a fit
    (``transform`` and ``evaluate`` check each batch on the executors with it).

    Raises:
        SchemaError: The rows' widths differ, or do not fill ``shape``.

    Example:
        >>> check_row_widths(13, 13, (13,))
        >>> try:
        ...     check_row_widths(26, 26, (13,))
        ... except SchemaError as exc:
        ...     print(str(exc)[:59])
        Expected 13 feature values per row to fit the model's input
    """
    if smallest != largest:
        raise SchemaError(ragged_rows_message(smallest, largest))
    size = math.prod(shape)
    if smallest != size:
        raise width_error(str(size), input_label, shape, smallest)


def ragged_rows_message(smallest: int, largest: int) -> str:
    """What :func:`check_row_widths` and the fit's data check say of rows of unequal width."""
    return (
        f"Expected every row to have the same number of features. Received rows with "
        f"between {smallest} and {largest} values."
    )


def width_error(expected: str, label: str, shape: tuple[Any, ...], width: int) -> SchemaError:
    """Rows of ``width`` values for an input of per-sample ``shape``: the error."""
    return SchemaError(
        f"Expected {expected} feature values per row to fit the model's input{label} shape "
        f"{(None, *shape)}. Received rows of {width} values. Check features_col, or change "
        "the model's keras.Input(shape=...)."
    )


@dataclass(frozen=True)
class Column:
    """How one prepared column is read and stored on an executor.

    Attributes:
        name: The prepared column (:func:`feature_name` / :func:`label_name`).
        kind: ``"dense"`` (float32 rows of ``width`` values), ``"bytes"`` (uint8 rows
            of ``width`` values: an image's bytes), ``"int"`` or ``"float"`` (one int32
            or float32 value a row), or ``"sparse"`` (an ML vector of size ``width``,
            stored as CSR).
        width: Values per row (dense), the vector size (sparse), 1 (scalar).
    """

    name: str
    kind: str
    width: int

    @property
    def dtype(self) -> np.dtype[Any]:
        """The dtype of its values."""
        return np.dtype({"int": np.int32, "bytes": np.uint8}.get(self.kind, np.float32))

    @property
    def rows_of_values(self) -> bool:
        """Whether each row holds ``width`` values (dense or bytes), not one."""
        return self.kind in ("dense", "bytes")


def cached_columns(
    input_shapes: Sequence[Sequence[int]],
    sparse: Sequence[bool],
    label_kinds: Sequence[str],
    label_widths: Sequence[int],
    weighted: bool,
    binary: Sequence[bool] = (),
) -> tuple[list[Column], list[Column], Column | None]:
    """The feature, label and weight columns of a prepared frame, as the executors
    read them (training, validation and ``evaluate`` alike).

    Args:
        input_shapes: Per-sample shape of each model input.
        sparse: Whether each feature column is ML vectors kept sparse (empty: none).
        label_kinds: ``"int"``, ``"float"`` or ``"array"``, per model output.
        label_widths: Values per label, per output (empty: 1 each; 0: an array label
            whose width the rows tell).
        weighted: Whether the frame has the :data:`WEIGHT` column.
        binary: Whether each feature column is image bytes (uint8; empty: none).

    Returns:
        ``(inputs, outputs, weight)``; ``weight`` is ``None`` for an unweighted frame.
    """
    flags = list(sparse) or [False] * len(input_shapes)
    images = list(binary) or [False] * len(input_shapes)
    inputs = [
        Column(feature_name(i), "sparse" if s else "bytes" if b else "dense", int(np.prod(shape)))
        for i, (shape, s, b) in enumerate(zip(input_shapes, flags, images, strict=True))
    ]
    widths = list(label_widths) or [1] * len(label_kinds)
    outputs = [
        Column(label_name(j), "dense" if kind == "array" else kind, widths[j])
        for j, kind in enumerate(label_kinds)
    ]
    return inputs, outputs, (Column(WEIGHT, "float", 1) if weighted else None)


@dataclass(frozen=True)
class Hosting:
    """What the workers need to run the service among themselves
    (``service_placement="cluster"``: :mod:`sparkdl.executor.hosting`).

    Attributes:
        fit_id: Names the fit's rendezvous and snapshot files on the executors.
        relay_digest: SHA-256 of the relay's token (:mod:`sparkdl.server.web.relay`).
        gate_epochs: Synchronous workers wait at each epoch's end for the driver's
            callbacks.
        history: Logs of the epochs done before (a resumed fit).
        planned_rows: The driver's plan of training rows per worker.
        bind_host: The address the service binds to: ``"127.0.0.1"`` on a local
            master; ``None``: the host's executor address.
        outer: The outer optimizer's state a resumed fit starts from (its arrays in
            the wire format, the push count in its metadata), or ``None``.
    """

    fit_id: str
    relay_digest: str
    gate_epochs: bool
    history: dict[str, list[float]] | None
    planned_rows: list[int]
    bind_host: str | None
    outer: bytes | None = None

    def outer_state(
        self, layout: ShardLayout | None, shard: int
    ) -> tuple[list[np.ndarray], int] | None:
        """The outer optimizer's state to start ``shard`` from (``None``: fresh)."""
        if self.outer is None:
            return None
        from sparkdl.protocol import wire
        from sparkdl.sync.shards import split_outer

        arrays, meta = wire.decode(self.outer)
        arrays = [np.array(a) for a in arrays]
        part = split_outer(layout, arrays)[shard] if layout is not None else arrays
        return part, int(meta["pushes"])


def pack_inputs(structure: Any, values: Sequence[Any]) -> Any:
    """``values`` (one per model input, in ``model.inputs`` order) as the model takes
    them: packed into :func:`~sparkdl.contract.keras_io.input_structure`'s template,
    else the one value or a tuple.

    Example:
        >>> pack_inputs({"b": 1, "a": 0}, ["A", "B"])
        {'b': 'B', 'a': 'A'}
        >>> pack_inputs(None, ["A"]), pack_inputs(None, ["A", "B"])
        ('A', ('A', 'B'))
    """
    if structure is None:
        return values[0] if len(values) == 1 else tuple(values)
    return _packed(structure, values)


def _packed(node: Any, values: Sequence[Any]) -> Any:
    if isinstance(node, int):
        return values[node]
    if isinstance(node, dict):
        return {k: _packed(v, values) for k, v in node.items()}
    return type(node)(_packed(v, values) for v in node)


@dataclass(frozen=True)
class WorkerPayload:
    """Everything a worker needs, as plain values.

    Attributes:
        plan: The fit's resolved plan.
        url: The parameter service's URL.
        token: The fit's secret (never shown by ``repr``).
        model_bytes: A Spark broadcast of the ``.keras`` archive bytes.
        custom_objects: cloudpickled ``custom_objects`` dict, or ``None``.
        input_shapes: Per-sample shape of each model input.
        label_kinds: ``"int"``, ``"float"`` or ``"array"``, per model output.
        label_widths: Values per label, per model output.
        sparse_columns: Whether each feature column arrives as ML vectors (kept sparse)
            rather than float arrays.
        byte_columns: Whether each feature column arrives as image bytes (uint8).
        sparse_inputs: Whether each model input takes a ``tf.SparseTensor``.
        tls_cert: The service's certificate (PEM) when it speaks HTTPS.
        validation: Whether the partition carries validation rows (marked in the
            :data:`VALIDATION` column), cached apart from the rest.
        weighted: Whether rows carry a weight (:data:`WEIGHT`), fed to Keras as
            ``sample_weight``.
        label_shapes: Per-sample shape of each output's label (array labels are
            reshaped to it; ``()`` for a scalar).
        initial_steps: The step count the model's optimizer arrived with (a schedule
            goes on from it).
        class_weighted: The weights are ``class_weight``'s, which Keras does not apply
            to validation rows.
        hosting: The service runs among the workers (``url`` and ``tls_cert`` are
            then learnt at the rendezvous); ``None``: it runs in the driver.
        shard_urls: With ``service_shards`` > 1, every shard's URL (``url`` is shard
            0's); empty for one service.
        shard_layout: Which part of the weights each shard holds
            (:meth:`sparkdl.sync.shards.ShardLayout.to_json`); ``None`` for one service.
        shard_certs: Every shard's certificate, where each has its own (shards in
            the cluster, TLS on); empty: every shard speaks ``tls_cert``.
        input_structure: The structure the model takes its inputs in
            (:func:`~sparkdl.contract.keras_io.input_structure`); ``None``: a tuple.
    """

    plan: FitPlan
    url: str
    token: str = field(repr=False)
    model_bytes: Any
    custom_objects: bytes | None
    input_shapes: list[tuple[int, ...]]
    label_kinds: list[str]
    label_widths: list[int] = field(default_factory=list)
    sparse_columns: list[bool] = field(default_factory=list)
    byte_columns: list[bool] = field(default_factory=list)
    sparse_inputs: list[bool] = field(default_factory=list)
    validation: bool = False
    tls_cert: bytes | None = None
    weighted: bool = False
    label_shapes: list[tuple[int, ...]] = field(default_factory=list)
    initial_steps: int = 0
    class_weighted: bool = False
    hosting: Hosting | None = None
    shard_urls: tuple[str, ...] = ()
    shard_layout: dict[str, Any] | None = None
    shard_certs: tuple[bytes, ...] = ()
    input_structure: Any = None

    def columns(self) -> tuple[list[Column], list[Column], Column | None]:
        """How the feature, label and weight columns are cached
        (:func:`cached_columns`)."""
        return cached_columns(
            self.input_shapes,
            self.sparse_columns,
            self.label_kinds,
            self.label_widths,
            self.weighted,
            self.byte_columns,
        )

    def cached_columns(self) -> list[Column]:
        """Every column a worker caches: features, labels and weights."""
        inputs, outputs, weight = self.columns()
        return [*inputs, *outputs, *([weight] if weight else [])]


def train_function(
    payload: WorkerPayload,
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function ``mapInArrow`` runs on each partition (one worker each).

    It names the task entry by module, so the driver never imports the executor side:
    the task imports :mod:`sparkdl.executor.task` when it starts.
    """

    def train_partition(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task = importlib.import_module("sparkdl.executor.task")
        yield from task.run(payload, batches)

    return train_partition


@dataclass(frozen=True)
class ScoringPayload:
    """What ``transform`` and ``evaluate`` ship to their tasks, as plain values.

    Attributes:
        model_bytes: A Spark broadcast of the ``.keras`` archive bytes.
        digest: Names this model version in each Python worker's model cache.
        custom_objects: cloudpickled ``custom_objects`` dict, or ``None``.
        input_shapes: Per-sample shape of each model input.
        sparse_columns: Whether each feature column is ML vectors kept sparse.
        byte_columns: Whether each feature column is image bytes (uint8).
        input_labels: `` 'name'`` of each input for messages (empty: one input).
        batch_size: Rows per model call.
        safe_mode: Keras's safe mode for the executors' load.
        tf_logs: How the executors load TensorFlow (:mod:`sparkdl.contract.tf_logs`).
        outputs: ``transform``: ``(name, scalar)`` per model output, in order (a
            struct of them by name for several outputs).
        label_kinds: ``evaluate``: the kind of each output's label.
        weighted: ``evaluate``: the frame has the :data:`WEIGHT` column.
        backend: The Keras backend the executors load the model on, the driver's
            (:func:`~sparkdl.contract.backends.training_backend`).
        input_structure: As :class:`WorkerPayload`'s.
    """

    model_bytes: Any
    digest: str
    custom_objects: bytes | None
    input_shapes: list[tuple[int, ...]]
    sparse_columns: list[bool]
    input_labels: list[str]
    batch_size: int
    safe_mode: bool = False
    tf_logs: TensorFlowLogs | None = None
    outputs: list[tuple[str, bool]] = field(default_factory=list)
    label_kinds: list[str] = field(default_factory=list)
    weighted: bool = False
    backend: str = "tensorflow"
    input_structure: Any = None
    byte_columns: list[bool] = field(default_factory=list)

    def columns(self) -> tuple[list[Column], list[Column], Column | None]:
        """How the feature (and, to evaluate, label and weight) columns are read; an
        array label's width comes from its rows."""
        return cached_columns(
            self.input_shapes,
            self.sparse_columns,
            self.label_kinds,
            [0 if kind == "array" else 1 for kind in self.label_kinds],
            self.weighted,
            self.byte_columns,
        )


def predict_function(payload: ScoringPayload) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The function ``transform``'s Arrow UDF runs: an iterator of feature arrays (a
    tuple of them for several inputs) to an iterator of prediction arrays
    (:func:`sparkdl.executor.scoring.predict`). Its type hints tell Spark the UDF's kind."""
    import pyarrow as pa

    names = [feature_name(i) for i in range(len(payload.input_shapes))]

    def predict_batches(arrays: Iterator[Any]) -> Iterator[Any]:
        scoring = importlib.import_module("sparkdl.executor.scoring")
        batches = (
            pa.RecordBatch.from_arrays(list(a) if len(names) > 1 else [a], names=names)
            for a in arrays
        )
        yield from scoring.predict(payload, batches)

    arg = pa.Array if len(names) == 1 else tuple[pa.Array, ...]
    predict_batches.__annotations__ = {
        "arrays": Iterator[arg],  # type: ignore[valid-type]
        "return": Iterator[pa.Array],
    }
    return predict_batches


def evaluate_function(
    payload: ScoringPayload,
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function ``evaluate``'s ``mapInArrow`` runs: one row of
    :data:`EVALUATION_SCHEMA` per partition (:func:`sparkdl.executor.scoring.evaluate`)."""

    def evaluate_partition(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        scoring = importlib.import_module("sparkdl.executor.scoring")
        yield scoring.evaluate(payload, batches)

    return evaluate_partition


def result_rows(
    weights: list[np.ndarray],
    history: dict[str, list[float]],
    status: dict[str, Any],
    failures: dict[int, str],
    *,
    shard: int = 0,
    outer: tuple[list[np.ndarray], int] | None = None,
) -> list[pa.RecordBatch]:
    """The service's result as result rows: one JSON row, then the weights (``.npz``,
    no pickle; the outer optimizer's state after them) in chunks of
    :data:`CHUNK_BYTES`; a sharded service's hosts return one set per ``shard`` (its
    part of the weights)."""
    import pyarrow as pa

    buffer = io.BytesIO()
    arrays = [np.asarray(w) for w in weights] + ([np.asarray(a) for a in outer[0]] if outer else [])
    np.savez(buffer, *arrays)
    data = buffer.getvalue()
    chunks = [data[i : i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)] or [b""]
    result = json.dumps(
        {
            "history": history,
            "status": status,
            "failures": failures,
            "chunks": len(chunks),
            "shard": shard,
            "weights": len(weights),
            "outer_pushes": outer[1] if outer else None,
        },
        default=_plain,
    )
    rows = [
        pa.RecordBatch.from_pydict(
            {"worker": [RESULT_ROW], "report": [result], "blob": [None]}, schema=_result_schema()
        )
    ]
    rows += [
        pa.RecordBatch.from_pydict(
            {"worker": [WEIGHTS_ROW], "report": [f"{shard}:{i}"], "blob": [chunk]},
            schema=_result_schema(),
        )
        for i, chunk in enumerate(chunks)
    ]
    return rows


def service_result(rows: list[Any], layout: ShardLayout | None = None) -> dict[str, Any] | None:
    """The hosts' result from the job's rows: ``history``, ``status``, ``failures``
    (worker ids as ints), ``weights`` and ``outer`` (the outer optimizer's arrays and
    push count, or ``None``); ``None`` when no host row came back.

    Args:
        rows: The training job's rows.
        layout: The shards' layout, to join their parts (``None``: one service).

    Raises:
        RuntimeError: A shard's result or some of its weights are missing.
    """
    heads: dict[int, dict[str, Any]] = {}
    for row in rows:
        if row["worker"] == RESULT_ROW:
            head = json.loads(row["report"])
            heads[int(head.get("shard", 0))] = head
    if not heads:
        return None
    chunks: dict[int, list[tuple[int, bytes]]] = {}
    for row in rows:
        if row["worker"] == WEIGHTS_ROW:
            name, _, index = str(row["report"]).rpartition(":")
            chunks.setdefault(int(name or 0), []).append((int(index), bytes(row["blob"])))
    count = layout.count if layout is not None else 1
    if sorted(heads) != list(range(count)):
        raise RuntimeError(
            f"The service's result came back from shards {sorted(heads)} of {count}."
        )
    parts = []
    for shard in range(count):
        found = sorted(chunks.get(shard, []))
        if len(found) != heads[shard]["chunks"]:
            raise RuntimeError(
                f"The service's weights came back in {len(found)} of "
                f"{heads[shard]['chunks']} parts"
                f"{f' from shard {shard}' if count > 1 else ''}."
            )
        with np.load(io.BytesIO(b"".join(p for _, p in found)), allow_pickle=False) as arrays:
            parts.append([arrays[f"arr_{i}"] for i in range(len(arrays.files))])
    from sparkdl.sync.shards import join_outer, joined_status

    result = dict(heads[0])
    counts = [int(heads[j].get("weights", len(parts[j]))) for j in range(count)]
    weights = [part[:n] for part, n in zip(parts, counts, strict=True)]
    result["weights"] = layout.join(weights) if layout is not None else weights[0]
    result["outer"] = None
    if heads[0].get("outer_pushes") is not None:
        states = [(part[n:], 0) for part, n in zip(parts, counts, strict=True)]
        arrays = join_outer(layout, states) if layout is not None else states[0][0]
        result["outer"] = (arrays, int(heads[0]["outer_pushes"]))
    if layout is not None:
        result["status"] = joined_status([heads[j]["status"] for j in range(count)])
    failures: dict[int, str] = {}
    for shard in range(count):
        for worker, trace in heads[shard]["failures"].items():
            failures.setdefault(int(worker), trace)
    result["failures"] = failures
    return result


def _result_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema([("worker", pa.int32()), ("report", pa.string()), ("blob", pa.binary())])


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON: {type(value).__name__}")
