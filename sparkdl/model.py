"""KerasModel: the fitted Spark ML Model that holds a trained Keras model.

Example:
    >>> import keras
    >>> from sparkdl.contract.keras_io import model_to_bytes
    >>> net = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> fitted = KerasModel(model_bytes=model_to_bytes(net), features_col="x",
    ...                     input_shapes=[(2,)])
    >>> fitted.get_model().count_params(), fitted.getOrDefault("featuresCol")
    (3, 'x')
"""

from __future__ import annotations

import io
import math
import os
import zipfile
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pyspark.ml import Model
from pyspark.ml.param import Param, TypeConverters
from pyspark.ml.util import MLReadable, MLWritable
from pyspark.sql import DataFrame

from sparkdl.compat.arrow import require_pyarrow
from sparkdl.compat.sessions import Inline, SessionTools, session_tools
from sparkdl.compat.spark import param_parent
from sparkdl.contract import custom_objects as custom_objects_module
from sparkdl.contract import payload
from sparkdl.contract.keras_io import model_from_bytes
from sparkdl.driver import arrow_batches, data, data_scan
from sparkdl.driver.warmup import tensorflow_logs
from sparkdl.errors import ConfigError, ModelError
from sparkdl.ml import persistence, predict
from sparkdl.ml.params import ColumnParams, split_settings

if TYPE_CHECKING:
    import keras

__all__ = ["PREDICT_BATCH", "KerasModel"]

# pyarrow 26 beside numpy 1.x (what pip resolves for a TensorFlow 2.16 stack) cannot
# load: importing the estimator or the model fails at once, naming the pip line.
require_pyarrow()

#: Rows per model call in ``transform`` and ``evaluate`` unless told otherwise.
PREDICT_BATCH = 1024


class KerasModel(Model, ColumnParams, persistence.Persistable, MLWritable, MLReadable):
    """A trained Keras model as a Spark ML Transformer.

    ``transform(df)`` adds ``predictionCol`` with the model's output for every row
    (``array<float>``, or ``double`` for a single-unit output), and with ``classCol``
    set also the arg-max class as a ``double`` (as Spark's classifiers do). Every input
    column and row is kept. ``save(path)`` / ``KerasModel.load(path)`` persist it (also
    inside a ``PipelineModel``).

    Args:
        model_bytes: The model as a ``.keras`` archive.
        features_col: Feature column or list of numeric columns, as in training.
        prediction_col: Name of the output column.
        label_col: The label column(s) :meth:`evaluate` reads unless told otherwise:
            the estimator's ``label_col`` for a fitted model.
        class_col: Name of the arg-max class column; empty for none.
        sequence_padding: How token sequences of varying length are made the input's
            length (the estimator's ``sequence_padding`` for a fitted model).
        input_shapes: Per-sample shape of each input (without the batch axis); read
            from the model when not given.
        history: Per-epoch logs of the fit, like ``keras.callbacks.History.history``.
        custom_objects: cloudpickled ``custom_objects``, or ``None``.
        fit_report: Figures of the fit (seconds, rows, per-worker timings).
        batch_size: Rows per prediction call in ``transform``.

    Example:
        >>> import keras
        >>> from sparkdl.contract.keras_io import model_to_bytes
        >>> net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> KerasModel(model_bytes=model_to_bytes(net), input_shapes=[(3,)]).history
        {}
    """

    predictBatchSize: Param[int] = Param(
        param_parent(),
        "predictBatchSize",
        "rows per prediction call in transform()",
        typeConverter=TypeConverters.toInt,
    )

    def __init__(
        self,
        *,
        model_bytes: bytes,
        features_col: str | Sequence[str] | dict[str, str] = "features",
        prediction_col: str = "prediction",
        class_col: str = "",
        label_col: Any = "label",
        sequence_padding: Any = None,
        input_shapes: Sequence[tuple[int, ...]] | None = None,
        history: dict[str, list[float]] | None = None,
        custom_objects: bytes | None = None,
        fit_report: dict[str, Any] | None = None,
        batch_size: int = PREDICT_BATCH,
        safe_mode: bool = False,
    ) -> None:
        super().__init__()
        self._set_column_defaults()
        self._setDefault(predictBatchSize=PREDICT_BATCH)
        features = features_col if isinstance(features_col, (str, dict)) else list(features_col)
        labels = label_col if isinstance(label_col, (str, dict)) else list(label_col)
        columns = {"features_col": features, "prediction_col": prediction_col, "label_col": labels}
        self._set(**split_settings(columns, {"featuresCol", "predictionCol", "labelCol"}))
        self._set(classCol=class_col, predictBatchSize=batch_size, sequencePadding=sequence_padding)
        self.sequence_padding  # noqa: B018 (validates the setting)
        self.model_bytes = model_bytes
        self.history: dict[str, list[float]] = dict(history or {})
        self.custom_objects = custom_objects
        self.fit_report: dict[str, Any] = dict(fit_report or {})
        self._model: keras.Model | None = None
        self._broadcasts: dict[int, Any] = {}
        self._digest = predict.model_digest(model_bytes)
        self._input_shapes = [tuple(s) for s in input_shapes] if input_shapes else None
        #: Keras's safe mode for every load of the model, here and on the executors
        #: (on for a stage loaded from a directory: :meth:`load`).
        self.safe_mode = safe_mode

    @classmethod
    def from_keras(
        cls,
        model: keras.Model | str | os.PathLike[str],
        *,
        features_col: str | Sequence[str] | dict[str, str] = "features",
        prediction_col: str = "prediction",
        class_col: str = "",
        custom_objects: dict[str, Any] | None = None,
        safe_mode: bool | None = None,
        batch_size: int = PREDICT_BATCH,
        sequence_padding: Any = None,
    ) -> KerasModel:
        """Wraps a model trained elsewhere for ``transform``, ``evaluate`` and Pipelines.

        Args:
            model: A ``keras.Model`` (compiled or not: ``evaluate`` needs a compiled
                loss), or the path of a saved ``.keras`` file.
            features_col: Feature column, list of numeric columns, or a dict of input
                name to column, as in training.
            prediction_col: Name of the output column.
            class_col: Name of the arg-max class column; empty for none.
            custom_objects: Custom classes and functions by plain or registered name.
                Those the model names are also found on their own (Keras's registry,
                the live model), and travel to the executors.
            safe_mode: Keras's safe mode for every load of the model, here and on the
                executors. ``None``: on for a file (a ``Lambda`` in it is refused),
                off for a live model (it is the caller's own).
            batch_size: Rows per prediction call in ``transform``.
            sequence_padding: How token sequences of varying length are made the
                input's length, as the estimator's setting of that name.

        Returns:
            A :class:`KerasModel`; ``get_model()`` returns a copy of ``model``.

        Raises:
            FileNotFoundError: No file at the path.
            ModelError: The file is no ``.keras`` archive, or safe mode refused it.

        Example:
            >>> import keras
            >>> net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
            >>> KerasModel.from_keras(net, features_col="x").input_shapes
            [(3,)]
        """
        from sparkdl.contract import keras_io

        if isinstance(model, (str, os.PathLike)):
            with open(model, "rb") as file:
                model_bytes = file.read()
            if not zipfile.is_zipfile(io.BytesIO(model_bytes)):
                raise ModelError(
                    f"{os.fspath(model)!r} is not a .keras archive. Save the model with "
                    "model.save('model.keras'), or pass the keras.Model itself."
                )
            safe = True if safe_mode is None else safe_mode
            live = keras_io.model_from_bytes(model_bytes, custom_objects, safe_mode=safe)
        else:
            model_bytes = keras_io.model_to_bytes(model)
            safe = False if safe_mode is None else safe_mode
            # The live model names its own custom objects (a __main__ layer included).
            custom_objects = custom_objects_module.collect(model, custom_objects)
            live = keras_io.model_from_bytes(model_bytes, custom_objects, safe_mode=safe)
        stage = cls(
            model_bytes=model_bytes,
            features_col=features_col,
            prediction_col=prediction_col,
            class_col=class_col,
            custom_objects=custom_objects_module.dumps(
                custom_objects_module.collect(live, custom_objects)
            ),
            batch_size=batch_size,
            safe_mode=safe,
            sequence_padding=sequence_padding,
        )
        stage._model = live
        return stage

    @property
    def features_col(self) -> Any:
        """The feature column(s) ``transform`` reads."""
        return self.getOrDefault("featuresCol")

    @property
    def prediction_col(self) -> str:
        """The output column ``transform`` adds."""
        return str(self.getOrDefault("predictionCol"))

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Per-sample input shape the model takes (its first input)."""
        return self.input_shapes[0]

    @property
    def input_shapes(self) -> list[tuple[int, ...]]:
        """Per-sample shape of each model input (a token input of open length: the
        length ``sequence_padding`` makes its rows).

        Raises:
            ConfigError: An input leaves a length open that no setting fixes.
        """
        if self._input_shapes is None:
            self._input_shapes = _scored_shapes(self.get_model(), self.sequence_padding)
        return self._input_shapes

    def get_model(self) -> keras.Model:
        """Returns the trained ``keras.Model`` (loaded once, then cached).

        Example:
            >>> import keras
            >>> from sparkdl.contract.keras_io import model_to_bytes
            >>> net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
            >>> KerasModel(model_bytes=model_to_bytes(net)).get_model().output_shape
            (None, 2)
        """
        if self._model is None:
            import cloudpickle

            custom = cloudpickle.loads(self.custom_objects) if self.custom_objects else None
            self._model = model_from_bytes(self.model_bytes, custom, safe_mode=self.safe_mode)
        return self._model

    def evaluate(
        self,
        dataset: DataFrame,
        *,
        label_col: Any = None,
        features_col: Any = None,
        batch_size: int | None = None,
        weight_col: str | None = None,
    ) -> dict[str, float]:
        """Keras's ``evaluate`` over a DataFrame, run on the executors.

        Args:
            dataset: Rows with the feature column(s) and the label column(s).
            label_col: The label column (a list or dict of columns for several
                outputs); default: the model's ``labelCol``, which a fit sets to the
                estimator's ``label_col`` (``"label"`` for :meth:`from_keras`).
            features_col: The feature column(s); default: the model's ``featuresCol``
                (the estimator's for a fitted model).
            batch_size: Rows per evaluation step (default: ``predictBatchSize``).
            weight_col: A numeric column of per-row weights (finite, >= 0): Keras's
                ``evaluate(sample_weight=...)``, for the loss and ``weighted_metrics``.

        Returns:
            ``{"loss": ..., <metric>: ...}``: the metrics' states (totals, counts,
            AUC's confusion counts) summed over the partitions, so each equals one
            ``model.evaluate`` over all rows; a model whose metrics cannot be built on
            the driver falls back to each partition's values weighted by its rows
            (:mod:`sparkdl.ml.evaluation`).

        Raises:
            SchemaError: A column is missing or has a wrong type.
            ModelError: The model was saved without a compiled loss.
        """
        from sparkdl.contract import keras_io
        from sparkdl.ml import evaluation

        model = self.get_model()
        keras_io.check_compiled(model)
        label_col = self.getOrDefault("labelCol") if label_col is None else label_col
        features, kinds = self._features(dataset, model, features_col)
        labels = data.label_columns(dataset, label_col, keras_io.output_names(model))
        weight = data.weight_column(dataset, labels, weight_col, None)
        frame = dataset.select(
            *[f.alias(payload.feature_name(i)) for i, f in enumerate(features)],
            *[y.alias(payload.label_name(j)) for j, (y, _) in enumerate(labels)],
            *([weight.alias(payload.WEIGHT)] if weight is not None else []),
        )
        if weight is not None:
            data_scan.check_weights(frame, str(weight_col))
        scoring = self._scoring(
            dataset,
            model,
            kinds,
            batch_size=int(batch_size or self.getOrDefault("predictBatchSize")),
            label_kinds=[kind for _, kind in labels],
            weighted=weight is not None,
        )
        widths = [math.prod(shape) for shape in scoring.input_shapes]
        row = arrow_batches.row_bytes(frame.schema, widths, sparse=scoring.sparse_columns)
        with arrow_batches.bounded_batches(dataset.sparkSession, row):
            # The driver's model merges the partitions' metric states (reset by Keras anyway).
            return evaluation.evaluate_frame(frame, scoring, model=model)

    def copy(self, extra: dict[Any, Any] | None = None) -> KerasModel:
        """A copy with ``extra`` Params set; it shares the (immutable) model bytes."""
        that: KerasModel = super().copy(extra)
        that._broadcasts = {}
        return that

    def _transform(self, dataset: DataFrame) -> DataFrame:
        from sparkdl.contract import keras_io

        model = self.get_model()
        features, kinds = self._features(dataset, model)
        shapes = keras_io.output_shapes(model, self.input_shapes)
        names = keras_io.output_names(model)
        if len(names) != len(shapes):  # a subclassed model's outputs are unnamed
            names = [f"output_{i}" for i in range(len(shapes))]
        outputs = [
            (name, len(shape) == 1 and shape[-1] == 1)
            for name, shape in zip(names, shapes, strict=True)
        ]
        scoring = self._scoring(
            dataset,
            model,
            kinds,
            batch_size=int(self.getOrDefault("predictBatchSize")),
            outputs=outputs,
        )
        scored = predict.transform_frame(dataset, self.prediction_col, features, scoring)
        class_col = str(self.getOrDefault("classCol"))
        if class_col and len(outputs) == 1:
            classes = predict.arg_max(self.prediction_col, scalar=outputs[0][1])
            scored = scored.withColumn(class_col, classes)
        return scored

    def _features(
        self, dataset: DataFrame, model: Any, features_col: Any = None
    ) -> tuple[list[Any], list[str]]:
        """The feature expressions for ``model`` (from ``features_col``, default the
        model's ``featuresCol``) and their kinds (as in
        :func:`sparkdl.driver.data.prepare`, without its look at the rows: scoring
        densifies one batch at a time, so it needs no Spark job to choose). A nested
        array or image row that does not have the input's shape raises when scored."""
        columns = self.features_col if features_col is None else features_col
        layouts = data.model_features(
            dataset, model, columns, sample=False, padding=self.sequence_padding
        )
        names = data.input_columns(model, columns)
        return [f.guarded(repr(n)) for f, n in zip(layouts, names, strict=True)], [
            f.kind for f in layouts
        ]

    def _scoring(
        self, dataset: DataFrame, model: Any, kinds: list[str], **fields: Any
    ) -> payload.ScoringPayload:
        """What the scoring tasks get: the model as a broadcast, how to read the rows
        and how Keras loads on the executors; ``fields``: the call's own."""
        from sparkdl.contract import keras_io
        from sparkdl.contract.backends import training_backend

        tools = session_tools(dataset.sparkSession)
        return payload.ScoringPayload(
            model_bytes=self._broadcast(tools),
            digest=self._digest,
            custom_objects=self.custom_objects,
            input_shapes=self.input_shapes,
            sparse_columns=[k == "sparse" for k in kinds],
            byte_columns=[k == "bytes" for k in kinds],
            input_labels=[keras_io.input_label(model, i) for i in range(len(self.input_shapes))],
            safe_mode=self.safe_mode,
            tf_logs=tensorflow_logs(tools),
            backend=training_backend(),
            input_structure=keras_io.input_structure(model),
            **fields,
        )

    def _broadcast(self, tools: SessionTools) -> Any:
        """The model bytes as a broadcast of the session's SparkContext (made once), or
        in the scoring tasks' closure on Spark Connect (which has no broadcast)."""
        sc = tools.spark_context()
        if sc is None:
            return Inline(self.model_bytes)
        key = id(sc)
        if key not in self._broadcasts:
            self._broadcasts[key] = sc.broadcast(self.model_bytes)
        return self._broadcasts[key]

    # ------------------------------------------------------------- persistence
    def _persisted_files(self) -> dict[str, bytes | None]:
        state = {
            "history": self.history,
            "fit_report": self.fit_report,
            "input_shapes": [list(t) for t in self._input_shapes] if self._input_shapes else None,
        }
        return {
            "model": self.model_bytes,
            "state": persistence.dump_state(state),
            "custom_objects": custom_objects_module.for_saving(self.custom_objects),
        }

    @classmethod
    def _from_persisted(
        cls, files: dict[str, bytes | None], loading: persistence.Loading, path: str
    ) -> KerasModel:

        state = persistence.load_state(files.get("state"))
        shapes = state.get("input_shapes")
        model_bytes = files["model"]
        if model_bytes is None:
            raise FileNotFoundError("The saved KerasModel has no model.keras file.")
        pickled = files.get("custom_objects")
        custom = loading.custom(pickled)
        stage = cls(
            model_bytes=model_bytes,
            input_shapes=[tuple(t) for t in shapes] if shapes else None,
            history=state.get("history"),
            fit_report=state.get("fit_report"),
            safe_mode=loading.safe_mode,
        )
        # Loaded here, so that what safe mode refuses fails the load, not a later call.
        stage._model = loading.load_model(model_bytes, custom, pickled, path)
        # The executors that score get every custom object the model names, registered
        # here or given: they have neither this session's registry nor its __main__.
        stage.custom_objects = custom_objects_module.dumps(
            custom_objects_module.collect(stage._model, custom)
        )
        return stage


def _scored_shapes(model: Any, padding: Any) -> list[tuple[int, ...]]:
    """Per input of ``model``, the per-sample shape its rows are scored in: a token
    input of open length takes the length ``padding`` makes.

    Raises:
        ConfigError: An input leaves a length open that no setting fixes.
    """
    shapes = []
    for t in model.inputs:
        shape = tuple(t.shape[1:])
        if shape == (None,) and padding is not None and padding.length:
            shape = (padding.length,)
        if any(d is None for d in shape):
            raise ConfigError(
                f"The model's input {t.name!r} has the shape {(None, *shape)}, with a length "
                "left open: scoring needs rows of one shape. For token sequences give "
                "sequence_padding a length (e.g. {'padding': 'post', 'length': 100}); else "
                "build the model with that length fixed."
            )
        shapes.append(tuple(int(d) for d in shape))
    return shapes
