"""KerasEstimator: trains a compiled Keras model on a Spark DataFrame.

Example:
    >>> import keras
    >>> net = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    >>> net.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    >>> est = KerasEstimator(model=net, features_col="features", label_col="label", epochs=2)
    >>> est.config.epochs, est.config.mode, est.getOrDefault("batchSize")
    (2, 'synchronous', 32)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pyspark.ml import Estimator
from pyspark.ml.util import MLReadable, MLWritable
from pyspark.sql import DataFrame

from sparkdl.config import TrainConfig
from sparkdl.contract import custom_objects, keras_io
from sparkdl.driver import data
from sparkdl.driver.background import SETTLE_SECONDS
from sparkdl.driver.fit import Fit
from sparkdl.driver.shared_scans import SharingFits
from sparkdl.driver.warmup import warm_up
from sparkdl.errors import ConfigError
from sparkdl.ml import persistence
from sparkdl.ml.params import TrainingParams, split_settings
from sparkdl.model import KerasModel
from sparkdl.server.state import checkpoints

if TYPE_CHECKING:
    import keras

__all__ = ["KerasEstimator"]


class KerasEstimator(Estimator, TrainingParams, persistence.Persistable, MLWritable, MLReadable):
    """Spark ML Estimator that trains a compiled Keras model on Spark executors.

    ``fit(df)`` validates the columns, the model and the settings on the driver, starts
    the parameter service, runs one Spark job in which every worker trains on its
    partition and syncs through the service, and returns a :class:`KerasModel`. The
    model passed in is not modified.

    Every setting is also a Spark ML Param (camelCase: ``batch_size`` is ``batchSize``),
    so the estimator works in a ``Pipeline``, under ``ParamGridBuilder`` /
    ``CrossValidator``, and saves and loads with ``save(path)`` / ``load(path)``.

    Args:
        model: A compiled ``keras.Model``.
        features_col: Feature column (``array<float|double>``, nested arrays of any
            rank for a shaped input, Spark's image struct for an image input, ML
            ``Vector`` dense or sparse, or a numeric column), or a list of numeric
            column names. For a model with several inputs: a list of such columns,
            one per input in the order the inputs were written, or a dict from input
            name to column.
        label_col: Label column: integer/float, ``array<numeric>`` (nested arrays too:
            a target per position) or a Vector. For a model with several outputs: a
            list (one per output) or a dict from output name to column.
        prediction_col: Output column of the fitted model's ``transform``.
        class_col: If set, the fitted model's ``transform`` also adds the arg-max class
            as a ``double`` column of this name.
        weight_col: If set, a numeric column of per-row weights (Spark ML's
            ``weightCol``): the loss and ``weighted_metrics`` are weighted by it, as
            ``model.fit(sample_weight=...)``, on training rows and on validation rows
            (``validation_data`` must have it too). Weights must be finite and >= 0;
            a null, NaN or negative one is refused before training.
        sequence_padding: Token sequences (``array<int>`` rows of varying length) are
            made the model input's length as ``keras.utils.pad_sequences`` does:
            ``"pre"`` or ``"post"`` (padding and truncating there, with 0), or a dict
            of ``padding``, ``truncating``, ``value`` and ``length`` (``length``
            defaults to the input's; an input of open length takes the longest row).
            ``None`` (the default): such rows are refused with an error that says
            how. The fitted model's ``transform`` pads the same way.
        learning_rate: If set, overrides the learning rate of the model's optimizer.
        validation_data: A DataFrame with the same columns; ``val_loss`` and ``val_*``
            metrics are computed on it on the executors every epoch. Its rows travel
            with the training rows in the one training job (marked, then shuffled to
            the workers): each worker caches its share apart and scores it, and nothing
            is collected to the driver, so it may be as large as the training data.
            For a held-out fraction of the training rows instead, set
            ``validation_split``.
        callbacks: Keras callbacks, run on the driver against a master model that holds
            the service's weights after each epoch (EarlyStopping, ModelCheckpoint,
            TensorBoard, CSVLogger, ReduceLROnPlateau, LambdaCallback...; see
            :mod:`sparkdl.driver.callbacks`). Not saved with the estimator.
        custom_objects: Custom layers, losses and metrics by name (cloudpickled to the
            executors).
        **settings: The training settings, snake_case or as their camelCase Param
            names: every keyword of :class:`sparkdl.config.TrainConfig` (``mode``,
            ``merge``, ``frequency``, ``num_workers``, ``epochs``, ``batch_size``,
            ``lr_scaling``...). Each is described once, in TrainConfig's docstring and
            the settings reference of the docs (``docs/reference/settings.rst``).

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
        features_col: str | Sequence[str] | dict[str, str] = "features",
        label_col: str | Sequence[str] | dict[str, str] = "label",
        prediction_col: str = "prediction",
        class_col: str = "",
        weight_col: str = "",
        sequence_padding: str | dict[str, Any] | None = None,
        learning_rate: float | None = None,
        validation_data: DataFrame | None = None,
        callbacks: Sequence[Any] | None = None,
        custom_objects: dict[str, Any] | None = None,
        **settings: Any,
    ) -> None:
        super().__init__()
        self._set_training_defaults()
        features = features_col if isinstance(features_col, (str, dict)) else list(features_col)
        given: dict[str, Any] = {
            "featuresCol": features,
            "labelCol": label_col,
            "predictionCol": prediction_col,
            "classCol": class_col,
            "weightCol": weight_col,
            "sequencePadding": sequence_padding,
        }
        if learning_rate is not None:
            given["learningRate"] = learning_rate
        allowed = {p.name for p in self.params}
        given.update(split_settings(settings, allowed))
        self._set(**given)
        self.train_config()  # validate now, not at fit time
        self.sequence_padding  # noqa: B018 (validates the setting)
        self.model = model
        self.validation_data = validation_data
        self.callbacks = list(callbacks or [])
        self.custom_objects = dict(custom_objects or {})

    @property
    def config(self) -> TrainConfig:
        """The training settings as a validated :class:`TrainConfig`."""
        return self.train_config()

    @property
    def features_col(self) -> Any:
        """The feature column(s)."""
        return self.getOrDefault("featuresCol")

    @property
    def weight_col(self) -> str:
        """The column of per-row weights; empty for none."""
        return str(self.getOrDefault("weightCol") or "")

    @property
    def label_col(self) -> Any:
        """The label column (a list or dict of columns for several outputs)."""
        return self.getOrDefault("labelCol")

    def setParams(self, **kwargs: Any) -> KerasEstimator:
        """Sets Params by camelCase or snake_case name; returns ``self``."""
        self._set(**split_settings(kwargs, {p.name for p in self.params}))
        self.train_config()
        self.sequence_padding  # noqa: B018 (validates the setting)
        return self

    def fitMultiple(self, dataset: DataFrame, paramMaps: Sequence[dict[Any, Any]]) -> SharingFits:
        """Fits one model per param map, as Spark ML's tuners ask (``CrossValidator``,
        ``TrainValidationSplit``, from ``parallelism`` threads at once): the fits of
        one DataFrame share its data scan.

        Args:
            dataset: The training rows.
            paramMaps: One param map per model.

        Returns:
            A thread-safe iterator of ``(index, model)`` pairs, in any order.

        Example:
            >>> import keras
            >>> net = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
            >>> net.compile(loss="mse")
            >>> list(KerasEstimator(model=net).fitMultiple(None, []))  # no param map
            []
        """
        return SharingFits(super().fitMultiple(dataset, paramMaps), len(paramMaps))

    def _fit(self, dataset: DataFrame) -> KerasModel:
        # Executors import TensorFlow while the driver checks the data (at once if
        # warm_up(spark) ran earlier in the session).
        config = self.train_config()
        warming = warm_up(dataset.sparkSession, workers=config.num_workers, engine=False)
        try:
            return self._fit_with(dataset, config)
        finally:
            # Its job's thread ends before this call does (a fit that fails at once
            # would leave it in a Spark call as a script exits: sparkdl.driver.background).
            warming.wait(SETTLE_SECONDS)

    def _fit_with(self, dataset: DataFrame, config: TrainConfig) -> KerasModel:
        """Fits as :meth:`_fit` says, the executors' warm-up started."""
        found = _checkpoint_to_resume(config)
        model = self._model_to_train(found.weights if found else None)
        keras_io.check_training_settings(model)
        # Every custom object the model names, registered or not, for the executors.
        custom = custom_objects.collect(model, self.custom_objects)
        initial_epoch, history = (found.epoch, found.history) if found else (0, None)
        prepared, validation = self._prepare(dataset, model, config)
        result = Fit(  # (its MLflow run too: sparkdl.driver.tracking)
            prepared,
            model,
            config,
            custom_objects=custom or None,
            validation=validation,
            callbacks=self.callbacks,
            initial_epoch=initial_epoch,
            history=history,
            outer_state=found.outer if found else None,
        ).run()
        fitted = KerasModel(
            model_bytes=result.model_bytes,
            features_col=self.features_col,
            prediction_col=str(self.getOrDefault("predictionCol")),
            class_col=str(self.getOrDefault("classCol")),
            label_col=self.getOrDefault("labelCol"),
            sequence_padding=prepared.padding.to_setting() if prepared.padding else None,
            input_shapes=list(result.input_shapes),
            history=result.history,
            custom_objects=custom_objects.dumps(custom),
            fit_report=result.report.to_dict(),
        )
        return fitted

    def _prepare(
        self, dataset: DataFrame, model: keras.Model, config: TrainConfig
    ) -> tuple[data.Prepared, data.Prepared | None]:
        """The training data and the validation data (or ``None``), prepared and
        checked for ``model``."""
        if config.class_weight and self.weight_col:
            raise ConfigError(
                "class_weight and weight_col were both given; Keras's fit takes one of "
                "class_weight and sample_weight. Fold the class weights into the weight "
                "column, or pass one of them."
            )
        # An input of open length takes the training rows' longest sequence, once.
        padding = data.resolve_padding(dataset, model, self.features_col, self.sequence_padding)
        prepared = data.prepare(
            dataset,
            model,
            self.features_col,
            self.label_col,
            validate=config.validate,
            weight_col=self.weight_col or None,
            class_weight=config.class_weight,
            padding=padding,
        )
        validation = None
        if self.validation_data is not None:
            validation = data.prepare(
                self.validation_data,
                model,
                self.features_col,
                self.label_col,
                validate=config.validate,
                sparse=prepared.sparse,  # the training data's choice: the rows travel together
                weight_col=self.weight_col or None,  # class weights are for training only
                weighted=prepared.weighted,
                padding=padding,
            )
        return prepared, validation

    def _model_to_train(self, weights: list[Any] | None = None) -> keras.Model:
        """The model, or one copy of it with ``learningRate`` and/or resumed ``weights``
        applied (the original is kept)."""
        rate = self.getOrDefault("learningRate")
        if rate is None and weights is None:
            return self.model
        if rate is not None and (
            isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate <= 0
        ):
            raise ConfigError(f"Expected learningRate to be a number > 0. Received: {rate!r}")
        keras_io.check_compiled(self.model)
        copy = keras_io.copy_model(
            self.model, custom_objects.collect(self.model, self.custom_objects) or None
        )
        if rate is not None:
            copy.optimizer.learning_rate = float(rate)
        if weights is not None:
            copy.set_weights(weights)
        return copy

    # ------------------------------------------------------------- persistence
    def _persisted_files(self) -> dict[str, bytes | None]:
        return {
            "model": keras_io.model_to_bytes(self.model),
            "state": None,
            "custom_objects": custom_objects.dumps_for_saving(
                custom_objects.collect(self.model, self.custom_objects)
            ),
        }

    @classmethod
    def _from_persisted(
        cls, files: dict[str, bytes | None], loading: persistence.Loading, path: str
    ) -> KerasEstimator:
        model_bytes = files.get("model")
        if model_bytes is None:
            raise FileNotFoundError("The saved KerasEstimator has no model.keras file.")
        pickled = files.get("custom_objects")
        custom = loading.custom(pickled)  # unpickled once, outside safe mode only
        model = loading.load_model(model_bytes, custom, pickled, path)
        return cls(model=model, custom_objects=custom)


def _checkpoint_to_resume(config: TrainConfig) -> checkpoints.Checkpoint | None:
    """The newest checkpoint of ``checkpoint_dir`` when ``resume`` asks for it.

    Raises:
        ConfigError: It is already at (or past) ``epochs``, or it holds another outer
            optimizer's state than this fit's.
    """
    if not (config.resume and config.checkpoint_dir):
        return None
    found = checkpoints.latest(config.checkpoint_dir)
    if found is not None and found.epoch >= config.epochs:
        raise ConfigError(
            f"The newest checkpoint ({found.path}) is at epoch {found.epoch}, not "
            f"before epochs={config.epochs}: raise epochs to train further."
        )
    # The model's optimizer state and momentum cannot stand in for each other (a fit
    # without an outer optimizer goes on without the state, as the fit logs; a
    # checkpoint that does not name its optimizer is checked by its state's shapes).
    written = found.settings.get("outer_optimizer") if found is not None else None
    now = config.outer_optimizer
    if (
        found is not None
        and found.outer is not None
        and None not in (written, now)
        and written != now
        and "model" in (written, now)
    ):
        raise ConfigError(
            f"The newest checkpoint ({found.path}) holds the state of "
            f"outer_optimizer={written!r}, and this fit has "
            f"outer_optimizer={now!r}: resume with "
            f"outer_optimizer={written!r}, the setting it was written with, or start "
            "afresh in another checkpoint_dir."
        )
    return found
