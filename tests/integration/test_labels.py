"""Labels as Keras takes them: one-hot, multi-label, per-position class ids, labels of
any shape per output, several target columns; and string labels refused clearly.

Real Spark (local[2]): each fit's model is then evaluated by sparkdl on the executors
and by plain Keras on the same rows, which must agree (the labels reached the loss in
the same shape).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import pytest

from examples.digits import digits_arrays
from sparkdl import KerasEstimator, SchemaError
from sparkdl.driver.data import ColumnTypeError

pytestmark = [pytest.mark.spark]

RNG = np.random.default_rng(0)
T, V = 5, 7


def _fit_and_compare(spark, model, x, y, rows, schema, *, label_col="label", epochs=3) -> Any:  # type: ignore[no-untyped-def]
    frame = spark.createDataFrame(rows, schema).repartition(2)
    fitted = KerasEstimator(
        model=model, label_col=label_col, num_workers=2, epochs=epochs, seed=0
    ).fit(frame)
    assert fitted.history["loss"][-1] < fitted.history["loss"][0]
    ours = fitted.evaluate(frame.coalesce(1), label_col=label_col)
    keras_logs = fitted.get_model().evaluate(x, y, verbose=0, return_dict=True)
    for key, value in keras_logs.items():
        assert abs(ours[key] - float(value)) < 1e-4, (key, ours[key], value)
    return fitted


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_one_hot_labels_with_categorical_crossentropy(spark) -> None:
    x, _, y, _ = digits_arrays()
    onehot = np.eye(10, dtype=np.float32)[y]
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(32, "relu"), keras.layers.Dense(10, "softmax")]
    )
    model.compile("adam", "categorical_crossentropy", metrics=["accuracy"])
    rows = [(a.tolist(), b.tolist()) for a, b in zip(x, onehot, strict=True)]
    fitted = _fit_and_compare(
        spark, model, x, onehot, rows, "features array<float>, label array<float>", epochs=5
    )
    assert fitted.history["accuracy"][-1] > 0.7  # learning (Adam 1e-3, 5 epochs)


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_multi_label_sigmoid_outputs(spark) -> None:
    x = RNG.normal(size=(400, 8)).astype(np.float32)
    y = (x[:, :4] > 0).astype(np.float32)  # four independent yes/no labels
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, "sigmoid")])
    model.compile("adam", "binary_crossentropy", metrics=["binary_accuracy"])
    rows = [(a.tolist(), b.tolist()) for a, b in zip(x, y, strict=True)]
    _fit_and_compare(spark, model, x, y, rows, "features array<float>, label array<float>")


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_class_ids_per_position_for_a_sequence_model(spark) -> None:
    tokens = RNG.integers(0, V, (300, T))
    keras.utils.set_random_seed(0)
    inp = keras.Input((T,))
    out = keras.layers.Dense(V, "softmax")(keras.layers.Embedding(V, 8)(inp))
    model = keras.Model(inp, out)  # (None, T, V): a class per position
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    rows = [(t.astype(float).tolist(), t.tolist()) for t in tokens]
    _fit_and_compare(
        spark,
        model,
        tokens.astype(np.float32),
        tokens,
        rows,
        "features array<float>, label array<int>",
    )


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_labels_take_their_outputs_shape_flat_or_nested(spark) -> None:
    x = RNG.normal(size=(300, T)).astype(np.float32)
    y = np.stack([x, -x], axis=-1)  # (T, 2) per row
    keras.utils.set_random_seed(0)
    inp = keras.Input((T,))
    model = keras.Model(inp, keras.layers.Dense(2)(keras.layers.Reshape((T, 1))(inp)))
    model.compile("adam", "mse")
    nested = [(a.tolist(), b.tolist()) for a, b in zip(x, y, strict=True)]
    _fit_and_compare(spark, model, x, y, nested, "features array<float>, label array<array<float>>")
    flat = [(a.tolist(), b.reshape(-1).tolist()) for a, b in zip(x, y, strict=True)]
    frame = spark.createDataFrame(flat, "features array<float>, label array<float>")
    fitted = KerasEstimator(model=model, num_workers=2, epochs=1).fit(frame)
    assert fitted.evaluate(frame)["loss"] >= 0
    wrong = spark.createDataFrame(
        [(a.tolist(), b.reshape(-1)[:7].tolist()) for a, b in zip(x, y, strict=True)],
        "features array<float>, label array<float>",
    )
    with pytest.raises(SchemaError, match=r"Expected label arrays of 10 values .* \(None, 5, 2\)"):
        KerasEstimator(model=model, num_workers=2).fit(wrong)


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_several_target_columns_for_one_output(spark) -> None:
    x = RNG.normal(size=(300, 6)).astype(np.float32)
    y = np.stack([x[:, 0] + x[:, 1], x[:, 2] - x[:, 3]], axis=1)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(2)])
    model.compile("adam", "mse", metrics=["mae"])
    rows = [(a.tolist(), float(b[0]), float(b[1])) for a, b in zip(x, y, strict=True)]
    _fit_and_compare(
        spark,
        model,
        x,
        y,
        rows,
        "features array<float>, y1 double, y2 double",
        label_col=["y1", "y2"],
    )


def test_integer_labels_stored_as_strings_are_refused_naming_string_indexer(spark) -> None:
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3, "softmax")])
    model.compile("adam", "sparse_categorical_crossentropy")
    frame = spark.createDataFrame([([1.0, 2.0], "1"), ([0.0, 1.0], "2")], ["features", "label"])
    with pytest.raises(ColumnTypeError, match="StringIndexer"):
        KerasEstimator(model=model, num_workers=2).fit(frame)
