"""``weight_col`` and ``class_weight`` act as Keras's ``sample_weight`` and ``class_weight``.

Real Spark (local[2]) and TensorFlow, against plain Keras fed the same weights on the
same rows.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
from pyspark.sql import functions as F

from examples.digits import digits_arrays
from sparkdl import ConfigError, KerasEstimator, KerasModel, SchemaError

pytestmark = [pytest.mark.spark]

EPOCHS = 8
CLASS_WEIGHT = {0: 0.0, 3: 3.0}  # class 0 never pulls the loss; class 3 three times


def _model() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(
        keras.optimizers.Adam(0.003),
        "sparse_categorical_crossentropy",
        metrics=["accuracy"],
        weighted_metrics=["accuracy"],
    )
    return model


def _frame(spark, x, y, partitions=2):  # type: ignore[no-untyped-def]
    rows = [(v.tolist(), int(c), 2.0 if c == 3 else 1.0) for v, c in zip(x, y, strict=True)]
    return spark.createDataFrame(rows, "features array<float>, label long, w double").repartition(
        partitions
    )


def _recall(model: keras.Model, x: np.ndarray, y: np.ndarray, cls: int) -> float:
    pred = model.predict(x, verbose=0).argmax(axis=1)
    return float((pred[y == cls] == cls).mean())


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
@pytest.mark.compat  # class weights: PySpark 4 expressions with 3.5 shims
def test_class_weight_trains_as_in_keras(spark) -> None:
    x_train, x_test, y_train, y_test = digits_arrays()
    # One worker takes plain Keras's steps per epoch: the histories compare as two runs
    # of plain Keras with different shuffles do (issue 19 covers n workers' parity).
    fitted = KerasEstimator(
        model=_model(),
        mode="synchronous",
        num_workers=1,
        epochs=EPOCHS,
        batch_size=32,
        seed=0,
        class_weight=CLASS_WEIGHT,
    ).fit(_frame(spark, x_train, y_train))
    plain = _model()
    history = plain.fit(
        x_train, y_train, epochs=EPOCHS, batch_size=32, class_weight=CLASS_WEIGHT, verbose=0
    ).history
    ours = fitted.get_model()
    # Class 0 weighs nothing in either: neither learns it; the others are learned.
    assert _recall(ours, x_test, y_test, 0) < 0.3 and _recall(plain, x_test, y_test, 0) < 0.3
    assert _recall(ours, x_test, y_test, 3) > 0.85 and _recall(plain, x_test, y_test, 3) > 0.85
    # The logged (weighted) loss follows plain Keras's within training noise.
    spark_loss, keras_loss = fitted.history["loss"][-1], history["loss"][-1]
    assert abs(spark_loss - keras_loss) < 0.3 * keras_loss + 0.02, (spark_loss, keras_loss)
    assert fitted.history["loss"][-1] < fitted.history["loss"][0]


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_weight_col_weights_training_validation_and_evaluate(spark) -> None:
    x_train, x_test, y_train, y_test = digits_arrays()
    weights = np.where(y_test == 3, 2.0, 1.0)
    fitted = KerasEstimator(
        model=_model(),
        num_workers=2,
        epochs=EPOCHS,
        batch_size=32,
        seed=0,
        weight_col="w",
        validation_data=_frame(spark, x_test, y_test),
    ).fit(_frame(spark, x_train, y_train))
    history = fitted.history
    assert len(history["val_loss"]) == EPOCHS and "val_weighted_accuracy" in history
    model = fitted.get_model()
    keras_logs = model.evaluate(x_test, y_test, sample_weight=weights, verbose=0, return_dict=True)
    one_partition = _frame(spark, x_test, y_test, partitions=1)
    got = fitted.evaluate(one_partition, weight_col="w")
    assert set(got) == set(keras_logs)
    for key, value in keras_logs.items():
        assert abs(got[key] - float(value)) < 1e-4, (key, got[key], value)
    unweighted = fitted.evaluate(one_partition)
    assert abs(unweighted["loss"] - got["loss"]) > 1e-4  # the weights did count
    # The last epoch's validation loss is the weighted loss of the final model.
    assert abs(history["val_loss"][-1] - keras_logs["loss"]) < 0.05, history["val_loss"][-1]


def test_bad_weights_are_refused_before_training(spark) -> None:
    x_train, _, y_train, _ = digits_arrays()
    frame = _frame(spark, x_train[:200], y_train[:200])
    scorer = KerasModel.from_keras(_model())
    for bad in (F.lit(-1.0), F.lit(None).cast("double"), F.lit(float("nan"))):
        spoiled = frame.withColumn("w", F.when(F.col("label") == 5, bad).otherwise(F.col("w")))
        with pytest.raises(SchemaError, match=r"weight in weight_col 'w' is null, NaN, inf"):
            KerasEstimator(model=_model(), weight_col="w", num_workers=2).fit(spoiled)
        with pytest.raises(SchemaError, match=r"weight in weight_col 'w' is null, NaN, inf"):
            scorer.evaluate(spoiled, weight_col="w")
    with pytest.raises(SchemaError, match="nope"):
        KerasEstimator(model=_model(), weight_col="nope").fit(frame)
    with pytest.raises(SchemaError, match="numeric"):
        KerasEstimator(model=_model(), weight_col="label_text").fit(
            frame.withColumn("label_text", F.col("label").cast("string"))
        )
    with pytest.raises(ConfigError, match="class_weight and weight_col"):
        KerasEstimator(model=_model(), weight_col="w", class_weight={0: 1.0}).fit(frame)
    for bad_weights in ({-1: 1.0}, {0: -2.0}, {0: float("nan")}, {}, [1.0]):
        with pytest.raises(ConfigError, match="class_weight"):
            KerasEstimator(model=_model(), class_weight=bad_weights)


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_evaluate_merges_metric_states_exactly_over_partitions(spark) -> None:
    """AUC, precision and weighted metrics equal one evaluate over all rows."""
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(1)
    x = rng.normal(size=(600, 4)).astype(np.float32)
    y = (x[:, 0] + 0.8 * rng.normal(size=600) > 0).astype(np.int64)
    w = np.where(y == 1, 3.0, 1.0)
    keras.utils.set_random_seed(0)
    net = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])
    net.compile(
        "adam",
        "binary_crossentropy",
        metrics=[keras.metrics.AUC(name="auc"), keras.metrics.Precision(name="precision")],
        weighted_metrics=["accuracy"],
    )
    net.fit(x, y, epochs=2, verbose=0)
    rows = [(a.tolist(), int(b), float(c)) for a, b, c in zip(x, y, w, strict=True)]
    frame = spark.createDataFrame(rows, "features array<float>, label long, w double")
    scorer = KerasModel.from_keras(net)
    for partitions in (1, 5):
        got = scorer.evaluate(frame.repartition(partitions), weight_col="w")
        want = net.evaluate(x, y, sample_weight=w, verbose=0, return_dict=True)
        for key, value in want.items():
            assert abs(got[key] - float(value)) < 1e-4, (partitions, key, got[key], value)
        scores = net.predict(x, verbose=0)[:, 0]
        # Keras's AUC interpolates over 200 thresholds: within 1e-3 of the exact one.
        assert abs(got["auc"] - roc_auc_score(y, scores)) < 1e-3
