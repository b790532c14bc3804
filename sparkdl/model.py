"""KerasModel: the fitted Spark ML Model that holds a trained Keras model.

Example:
    >>> import keras
    >>> from sparkdl.keras_io import model_to_bytes
    >>> net = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> fitted = KerasModel(model_bytes=model_to_bytes(net), features_col="x",
    ...                     input_shape=(2,))
    >>> fitted.get_model().count_params()
    3
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pyspark.ml import Model
from pyspark.sql import DataFrame

from sparkdl import data, predict
from sparkdl.keras_io import model_from_bytes

if TYPE_CHECKING:
    import keras

__all__ = ["KerasModel"]


class KerasModel(Model):
    """A trained Keras model as a Spark ML Transformer.

    ``transform(df)`` adds ``prediction_col`` with the model's output for every row
    (``array<float>``, or ``double`` for a single-unit output) and keeps every input
    column and row.

    Args:
        model_bytes: The model as a ``.keras`` archive.
        features_col: Feature column or list of numeric columns, as in training.
        prediction_col: Name of the output column.
        input_shape: Per-sample input shape (without the batch axis).
        history: Per-epoch logs of the fit, like ``keras.callbacks.History.history``.
        custom_objects: cloudpickled ``custom_objects``, or ``None``.
        fit_report: Figures of the fit (seconds, rows, per-worker timings).
        batch_size: Rows per prediction call in ``transform``.

    Example:
        >>> import keras
        >>> from sparkdl.keras_io import model_to_bytes
        >>> net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> KerasModel(model_bytes=model_to_bytes(net), input_shape=(3,)).history
        {}
    """

    def __init__(
        self,
        *,
        model_bytes: bytes,
        features_col: str | Sequence[str] = "features",
        prediction_col: str = "prediction",
        input_shape: tuple[int, ...] | None = None,
        history: dict[str, list[float]] | None = None,
        custom_objects: bytes | None = None,
        fit_report: dict[str, Any] | None = None,
        batch_size: int = 1024,
    ) -> None:
        super().__init__()
        self.model_bytes = model_bytes
        self.features_col = features_col if isinstance(features_col, str) else list(features_col)
        self.prediction_col = prediction_col
        self.history: dict[str, list[float]] = dict(history or {})
        self.custom_objects = custom_objects
        self.fit_report: dict[str, Any] = dict(fit_report or {})
        self.batch_size = batch_size
        self._model: keras.Model | None = None
        self._broadcasts: dict[int, Any] = {}
        self._digest = predict.model_digest(model_bytes)
        self._input_shape = tuple(input_shape) if input_shape else None

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Per-sample input shape the model takes."""
        if self._input_shape is None:
            shape = self.get_model().inputs[0].shape[1:]
            self._input_shape = tuple(int(d) for d in shape)
        return self._input_shape

    def get_model(self) -> keras.Model:
        """Returns the trained ``keras.Model`` (loaded once, then cached).

        Example:
            >>> import keras
            >>> from sparkdl.keras_io import model_to_bytes
            >>> net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
            >>> KerasModel(model_bytes=model_to_bytes(net)).get_model().output_shape
            (None, 2)
        """
        if self._model is None:
            import cloudpickle

            custom = cloudpickle.loads(self.custom_objects) if self.custom_objects else None
            self._model = model_from_bytes(self.model_bytes, custom)
        return self._model

    def _transform(self, dataset: DataFrame) -> DataFrame:
        features = data.feature_column(dataset, self.features_col)
        model = self.get_model()
        output = model.outputs[0].shape if getattr(model, "outputs", None) else (None, 2)
        scalar = len(output) == 2 and output[-1] == 1
        sc = dataset.sparkSession.sparkContext
        key = id(sc)
        if key not in self._broadcasts:
            self._broadcasts[key] = sc.broadcast(self.model_bytes)
        udf = predict.predict_udf(
            self._broadcasts[key],
            self._digest,
            self.input_shape,
            scalar_output=scalar,
            batch_size=self.batch_size,
            custom_objects=self.custom_objects,
        )
        return dataset.withColumn(self.prediction_col, udf(features))
