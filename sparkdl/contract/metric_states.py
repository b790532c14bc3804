"""Keras metric states: read on a worker, summed and read out on the driver.

A Keras metric is a state (its variables: a total and a count, an AUC's confusion
counts per threshold, precision's true and false positives) and a result computed
from it. Averaging the workers' results by rows is exact only for means over rows
(the loss, accuracy); AUC, precision, recall, F-scores and every metric weighted by
``sample_weight`` come out wrong. Summing the workers' states and reading the result
of the sum is what one ``model.fit`` or ``model.evaluate`` over all rows computes, as
the states of Keras's metrics are sums and counts. (A custom metric whose state is not
a sum, a running maximum say, is merged as if it were.)

The worker half, :meth:`MetricStates.read`, turns a model's metric variables into
plain lists of numbers (JSON: nothing is unpickled on the driver); the driver half,
:meth:`MetricStates.results`, loads its own copy of the model once, builds its metrics
with one eager step on a zero row, puts the summed states in and reads the results.
Used by the fit's per-epoch history (:mod:`sparkdl.server.state.history`) and by
``KerasModel.evaluate`` (:mod:`sparkdl.ml.evaluation`).

Example:
    >>> import keras, numpy as np
    >>> def compiled():
    ...     net = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, "sigmoid")])
    ...     net.compile("sgd", "binary_crossentropy", metrics=[keras.metrics.AUC(name="auc")])
    ...     return net
    >>> worker = compiled()
    >>> x, y = np.array([[0, 1], [1, 0]], np.float32), np.array([0, 1], np.float32)
    >>> _ = worker.evaluate(x, y, verbose=0)
    >>> part = MetricStates.read(worker)
    >>> merged = MetricStates(compiled, [(2,)], ["float"], [()]).results([part, part])
    >>> merged["auc"] == float(worker.get_metrics_result()["auc"])
    True
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    import keras

__all__ = ["MAX_STATE_VALUES", "MetricStates"]


class Threads(Protocol):
    """Runs work in a thread its owner waits for
    (:class:`sparkdl.driver.background.Background` on the driver)."""

    def run(self, work: Callable[[], None], name: str) -> Any: ...


_log = logging.getLogger(__name__)

#: The most numbers a worker's metric states may hold to travel (an AUC holds
#: 4 x 200); larger ones (a confusion matrix of thousands of classes) are not sent and
#: that epoch's metrics are averaged by rows.
MAX_STATE_VALUES = 1 << 17

#: One worker's metric states: each metric variable's values, flattened.
Part = Sequence[Sequence[float]]


class MetricStates:
    """A compiled model's metrics, summed over workers.

    Args:
        load: Returns the driver's own compiled copy of the model (called once, on
            first use; :meth:`prefetch` calls it early in a thread).
        input_shapes: Per-sample shape of each input.
        label_kinds: Each output's label kind (``"int"``, ``"float"``, ``"array"``).
        label_shapes: Each output's per-sample label shape.
    """

    def __init__(
        self,
        load: Callable[[], keras.Model],
        input_shapes: Sequence[tuple[int, ...]],
        label_kinds: Sequence[str],
        label_shapes: Sequence[tuple[int, ...]],
    ) -> None:
        self._load = load
        self.input_shapes = [tuple(s) for s in input_shapes]
        self.label_kinds = list(label_kinds)
        self.label_shapes = [tuple(s) for s in label_shapes] or [()] * len(self.label_kinds)
        self._lock = threading.Lock()
        self._model: keras.Model | None = None
        self._error: BaseException | None = None

    # ------------------------------------------------------------ worker half
    @staticmethod
    def read(model: keras.Model) -> list[list[float]] | None:
        """The model's metric states as lists of numbers, or ``None`` when they cannot
        travel (a non-finite value, more than :data:`MAX_STATE_VALUES` numbers)."""
        values = [np.asarray(v, dtype=np.float64).ravel() for v in model.metrics_variables]
        if sum(v.size for v in values) > MAX_STATE_VALUES:
            return None
        if not all(np.isfinite(v).all() for v in values):
            return None
        return [v.tolist() for v in values]

    # ------------------------------------------------------------ driver half
    def prefetch(self, background: Threads) -> None:
        """Loads and builds the driver's copy in a thread of ``background`` (whose
        owner waits for it to end); :meth:`results` waits for it, and raises its
        error."""

        def build() -> None:
            with self._lock, contextlib.suppress(BaseException):  # results() re-raises
                self._built()

        background.run(build, name="sparkdl-metric-states")

    def results(self, parts: Sequence[Part]) -> dict[str, float]:
        """The metrics' results over the sum of ``parts`` (each a worker's
        :meth:`read`); scalar, finite results only.

        Raises:
            ValueError: The parts do not fit the model's metric variables.
            Exception: The driver's copy could not be loaded or built.
        """
        with self._lock:
            model = self._built()
            variables = list(model.metrics_variables)
            for part in parts:
                if len(part) != len(variables):
                    raise ValueError(
                        f"a worker sent {len(part)} metric variables, the model has "
                        f"{len(variables)}"
                    )
            for i, variable in enumerate(variables):
                shape = tuple(int(d) for d in variable.shape)
                total = np.zeros(math.prod(shape), np.float64)
                for part in parts:
                    values = np.asarray(part[i], dtype=np.float64)
                    if values.shape != total.shape:
                        raise ValueError(
                            f"metric variable {variable.path} has {total.size} values, "
                            f"a worker sent {values.size}"
                        )
                    total += values
                variable.assign(total.reshape(shape).astype(_dtype(variable)))
            out = {}
            for name, value in model.get_metrics_result().items():
                number = np.asarray(value, dtype=np.float64)
                if number.size == 1 and np.isfinite(number).all():
                    out[str(name)] = float(number.reshape(()))
            model.reset_metrics()
            return out

    def _built(self) -> keras.Model:
        """The driver's copy with its metrics built (loaded once)."""
        if self._model is None and self._error is None:
            try:
                self._model = self._build(self._load())
            except BaseException as exc:  # every later call raises it at once
                self._error = exc
        if self._error is not None:
            raise self._error
        assert self._model is not None
        return self._model

    def _build(self, model: keras.Model) -> keras.Model:
        """Builds ``model``'s metrics by one eager step on a zero row (an
        ``evaluate`` when the model computes its metrics its own way)."""
        xs = [np.zeros((1, *shape), np.float32) for shape in self.input_shapes]
        ys = [
            np.zeros((1, *shape), np.int32 if kind == "int" else np.float32)
            for kind, shape in zip(self.label_kinds, self.label_shapes, strict=True)
        ]
        from sparkdl.contract.keras_io import input_structure
        from sparkdl.contract.payload import pack_inputs

        x = pack_inputs(input_structure(model), xs)  # a dict of inputs as a dict
        y = ys[0] if len(ys) == 1 else ys
        weight = np.ones(1, np.float32)
        try:
            y_pred = model(x, training=False)
            model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=weight)
            model.compute_metrics(x, y, y_pred, sample_weight=weight)
        except Exception as exc:  # a model with its own test_step: the slow way
            _log.debug("metric states: eager build failed (%s); evaluating a zero row", exc)
            model.evaluate(x, y, sample_weight=weight, verbose=0)
        model.reset_metrics()
        return model


def _dtype(variable: Any) -> str:
    import keras

    return keras.backend.standardize_dtype(variable.dtype)
