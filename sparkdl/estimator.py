"""KerasEstimator: trains a compiled Keras model on a Spark DataFrame.

Example:
    >>> import keras
    >>> net = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    >>> net.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    >>> est = KerasEstimator(model=net, features_col="features", label_col="label", epochs=2)
    >>> est.config.epochs, est.config.mode
    (2, 'synchronous')
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import cloudpickle
from pyspark.ml import Estimator
from pyspark.sql import DataFrame

from sparkdl import driver
from sparkdl.config import TrainConfig
from sparkdl.errors import ConfigError
from sparkdl.model import KerasModel

if TYPE_CHECKING:
    import keras

__all__ = ["KerasEstimator"]


class KerasEstimator(Estimator):
    """Spark ML Estimator that trains a compiled Keras model on Spark executors.

    ``fit(df)`` validates the columns, the model and the settings on the driver, starts
    the parameter service, runs one Spark job in which every worker trains on its
    partition and syncs through the service, and returns a :class:`KerasModel`. The
    model passed in is not modified.

    Args:
        model: A compiled ``keras.Model``.
        features_col: Feature column (``array<float|double>``, ML ``Vector`` dense or
            sparse, or a numeric column), or a list of numeric column names.
        label_col: Label column: integer/float, ``array<numeric>`` or a Vector.
        prediction_col: Output column of the fitted model's ``transform``.
        custom_objects: Custom layers, losses and metrics by name (cloudpickled to the
            executors).
        **settings: Training settings of :class:`sparkdl.config.TrainConfig`: ``mode``,
            ``merge``, ``frequency``, ``num_workers``, ``epochs``, ``batch_size``,
            ``seed``, ``verbose``, ``shuffle``, ``service_host``, ``port``,
            ``request_timeout``, ``round_timeout``, ``request_retries``,
            ``threads_per_worker``, ``slot_wait_timeout``.

    Raises:
        ConfigError: An unknown or invalid setting.

    Example:
        >>> import keras
        >>> net = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> net.compile(optimizer="sgd", loss="mse")
        >>> KerasEstimator(model=net, features_col="x", label_col="y", frequency=4).config.frequency
        4
    """

    def __init__(
        self,
        *,
        model: keras.Model,
        features_col: str | Sequence[str] = "features",
        label_col: str = "label",
        prediction_col: str = "prediction",
        custom_objects: dict[str, Any] | None = None,
        **settings: Any,
    ) -> None:
        super().__init__()
        unknown = set(settings) - {f for f in TrainConfig.__dataclass_fields__}
        if unknown:
            raise ConfigError(
                f"Unknown setting(s) {sorted(unknown)}. Expected some of "
                f"{sorted(TrainConfig.__dataclass_fields__)}."
            )
        self.config = TrainConfig(**settings)
        self.model = model
        self.features_col = features_col if isinstance(features_col, str) else list(features_col)
        self.label_col = label_col
        self.prediction_col = prediction_col
        self.custom_objects = dict(custom_objects or {})

    def _fit(self, dataset: DataFrame) -> KerasModel:
        prepared = driver.prepare(dataset, self.model, self.features_col, self.label_col)
        result = driver.run_fit(
            prepared, self.model, self.config, custom_objects=self.custom_objects or None
        )
        custom = self.custom_objects or None
        return KerasModel(
            model_bytes=result.model_bytes,
            features_col=self.features_col,
            prediction_col=self.prediction_col,
            input_shape=result.input_shape,
            history=result.history,
            custom_objects=cloudpickle.dumps(custom) if custom else None,
            fit_report={
                "seconds": result.seconds,
                "rows": result.rows,
                "communication_share": result.communication_share,
                "workers": result.reports,
                "service": {
                    key: result.status.get(key)
                    for key in ("version", "samples_seen", "duplicates", "epochs_done", "workers")
                },
            },
        )
