"""Spark ML Params of :class:`~sparkdl.KerasEstimator` and :class:`~sparkdl.KerasModel`.

Spark ML tools (``Pipeline``, ``ParamGridBuilder``, ``CrossValidator``, persistence)
work on Params. Every training setting of :class:`~sparkdl.config.TrainConfig` is a
Param named in Spark's camelCase (``batch_size`` -> ``batchSize``), next to the column
Params and ``learningRate``; the snake_case constructor arguments set the same Params.
Those Params are made here from the settings' declarations
(:func:`~sparkdl.config.setting_fields`: name, default and description), never
listed by hand, so a new setting is a Param, with its default and its doc, at once.

Example:
    >>> param_name("batch_size"), param_name("epochs")
    ('batchSize', 'epochs')
"""

from __future__ import annotations

from typing import Any

from pyspark.ml.param import Param, Params, TypeConverters

from sparkdl.compat.spark import param_parent
from sparkdl.config import TrainConfig, setting_docs, setting_fields
from sparkdl.driver.tensors import SequencePadding
from sparkdl.errors import ConfigError

__all__ = [
    "SETTING_PARAMS",
    "ColumnParams",
    "TrainingParams",
    "param_name",
    "split_settings",
]


def param_name(field: str) -> str:
    """The camelCase Param name of a snake_case setting."""
    head, *rest = field.split("_")
    return head + "".join(part.title() for part in rest)


#: TrainConfig field -> Param name.
SETTING_PARAMS: dict[str, str] = {f.name: param_name(f.name) for f in setting_fields()}

_COLUMN_ARGS = {
    "features_col": "featuresCol",
    "label_col": "labelCol",
    "prediction_col": "predictionCol",
    "class_col": "classCol",
    "weight_col": "weightCol",
    "sequence_padding": "sequencePadding",
}


def split_settings(kwargs: dict[str, Any], allowed: set[str]) -> dict[str, Any]:
    """Maps snake_case or camelCase keyword arguments to Param names.

    Raises:
        ConfigError: An argument names no known Param.
    """
    known = {**SETTING_PARAMS, **_COLUMN_ARGS, "learning_rate": "learningRate"}
    out: dict[str, Any] = {}
    for key, value in kwargs.items():
        name = known.get(key, key)
        if name not in allowed:
            choices = sorted({k for k, v in known.items() if v in allowed})
            raise ConfigError(f"Unknown setting {key!r}. Expected some of {choices}.")
        out[name] = value
    return out


class ColumnParams(Params):
    """Column Params shared by the estimator and the model."""

    featuresCol: Param[Any] = Param(
        param_parent(),
        "featuresCol",
        "feature column: an array or Vector column, a numeric column, or a list of numeric columns",
        typeConverter=TypeConverters.identity,
    )
    predictionCol: Param[str] = Param(
        param_parent(),
        "predictionCol",
        "output column of transform(): the model's output",
        typeConverter=TypeConverters.toString,
    )
    classCol: Param[str] = Param(
        param_parent(),
        "classCol",
        "if not empty, transform() also adds the arg-max class of the model's output "
        "as a double column of this name, as Spark's classifiers do",
        typeConverter=TypeConverters.toString,
    )
    labelCol: Param[Any] = Param(
        param_parent(),
        "labelCol",
        "label column: a numeric column, a numeric array or a Vector; a list or dict of "
        "them for a model with several outputs",
        typeConverter=TypeConverters.identity,
    )

    sequencePadding: Param[Any] = Param(
        param_parent(),
        "sequencePadding",
        "if set, token sequences (array columns) of varying length are padded or cut to "
        "the model input's length as keras.utils.pad_sequences does: 'pre', 'post', or a "
        "dict of padding, truncating, value and length; unset, such rows are refused",
        typeConverter=lambda v: v.to_setting() if isinstance(v, SequencePadding) else v,
    )

    def _set_column_defaults(self) -> None:
        self._setDefault(
            featuresCol="features",
            predictionCol="prediction",
            classCol="",
            labelCol="label",
            sequencePadding=None,
        )

    @property
    def sequence_padding(self) -> SequencePadding | None:
        """How token sequences of varying length are made one length (``None``: they
        are refused).

        Raises:
            ConfigError: The Param holds no valid padding.
        """
        return SequencePadding.of(self.getOrDefault("sequencePadding"))


class TrainingParams(ColumnParams):
    """The label column, every TrainConfig setting, and ``learningRate``."""

    weightCol: Param[str] = Param(
        param_parent(),
        "weightCol",
        "if not empty, a numeric column of per-row weights (>= 0) for the loss and "
        "weighted metrics, as model.fit(sample_weight=...), on training and validation",
        typeConverter=TypeConverters.toString,
    )
    learningRate: Param[Any] = Param(
        param_parent(),
        "learningRate",
        "if set, overrides the learning rate of the compiled model's optimizer",
        typeConverter=TypeConverters.identity,
    )

    def _set_training_defaults(self) -> None:
        self._set_column_defaults()
        defaults = {SETTING_PARAMS[f.name]: f.default for f in setting_fields()}
        self._setDefault(weightCol="", learningRate=None, **defaults)

    def train_config(self) -> TrainConfig:
        """The :class:`TrainConfig` of the current Param values (validated)."""
        values = {field: self.getOrDefault(name) for field, name in SETTING_PARAMS.items()}
        return TrainConfig(**values)


_DOCS = setting_docs()
for _field in setting_fields():
    setattr(
        TrainingParams,
        SETTING_PARAMS[_field.name],
        Param(
            param_parent(),
            SETTING_PARAMS[_field.name],
            f"{_field.name}: {_DOCS[_field.name]}",
            typeConverter=TypeConverters.identity,
        ),
    )
