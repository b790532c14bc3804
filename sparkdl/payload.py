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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

    from sparkdl.plan import FitPlan

__all__ = [
    "FEATURES",
    "LABEL",
    "RESULT_SCHEMA",
    "VALIDATION",
    "WEIGHT",
    "Column",
    "WorkerPayload",
    "cached_columns",
    "feature_name",
    "label_name",
    "train_function",
]

#: Names of the prepared columns that travel to the executors.
FEATURES = "__sparkdl_features"
LABEL = "__sparkdl_label"
#: A boolean column marking the rows of validation data travelling with a partition.
VALIDATION = "__sparkdl_validation"
#: The prepared column of per-row weights (``weight_col``, ``class_weight``).
WEIGHT = "__sparkdl_weight"
#: Schema of the one row each worker returns: its id and its report as JSON.
RESULT_SCHEMA = "worker int, report string"


def feature_name(index: int) -> str:
    """The prepared column of model input ``index``."""
    return FEATURES if index == 0 else f"{FEATURES}_{index}"


def label_name(index: int) -> str:
    """The prepared column of model output ``index``'s label."""
    return LABEL if index == 0 else f"{LABEL}_{index}"


@dataclass(frozen=True)
class Column:
    """How one prepared column is read and stored on an executor.

    Attributes:
        name: The prepared column (:func:`feature_name` / :func:`label_name`).
        kind: ``"dense"`` (float32 rows of ``width`` values), ``"int"`` or ``"float"``
            (one int32 or float32 value a row), or ``"sparse"`` (an ML vector of size
            ``width``, stored as CSR).
        width: Values per row (dense), the vector size (sparse), 1 (scalar).
    """

    name: str
    kind: str
    width: int

    @property
    def dtype(self) -> np.dtype[Any]:
        """The dtype of its values."""
        return np.dtype(np.int32 if self.kind == "int" else np.float32)


def cached_columns(
    input_shapes: Sequence[Sequence[int]],
    sparse: Sequence[bool],
    label_kinds: Sequence[str],
    label_widths: Sequence[int],
    weighted: bool,
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

    Returns:
        ``(inputs, outputs, weight)``; ``weight`` is ``None`` for an unweighted frame.
    """
    flags = list(sparse) or [False] * len(input_shapes)
    inputs = [
        Column(feature_name(i), "sparse" if s else "dense", int(np.prod(shape)))
        for i, (shape, s) in enumerate(zip(input_shapes, flags, strict=True))
    ]
    widths = list(label_widths) or [1] * len(label_kinds)
    outputs = [
        Column(label_name(j), "dense" if kind == "array" else kind, widths[j])
        for j, kind in enumerate(label_kinds)
    ]
    return inputs, outputs, (Column(WEIGHT, "float", 1) if weighted else None)


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
    sparse_inputs: list[bool] = field(default_factory=list)
    validation: bool = False
    tls_cert: bytes | None = None
    weighted: bool = False
    label_shapes: list[tuple[int, ...]] = field(default_factory=list)
    initial_steps: int = 0
    class_weighted: bool = False

    def columns(self) -> tuple[list[Column], list[Column], Column | None]:
        """How the feature, label and weight columns are cached
        (:func:`cached_columns`)."""
        return cached_columns(
            self.input_shapes,
            self.sparse_columns,
            self.label_kinds,
            self.label_widths,
            self.weighted,
        )

    def cached_columns(self) -> list[Column]:
        """Every column a worker caches: features, labels and weights."""
        inputs, outputs, weight = self.columns()
        return [*inputs, *outputs, *([weight] if weight else [])]


def train_function(
    payload: WorkerPayload,
) -> Callable[[Iterable[pa.RecordBatch]], Iterable[pa.RecordBatch]]:
    """The function ``mapInArrow`` runs on each partition (one worker each).

    It names the task entry by module, so the driver never imports the executor side:
    the task imports :mod:`sparkdl.executor.task` when it starts.
    """

    def train_partition(batches: Iterable[pa.RecordBatch]) -> Iterable[pa.RecordBatch]:
        task = importlib.import_module("sparkdl.executor.task")
        yield task.run(payload, batches)

    return train_partition
