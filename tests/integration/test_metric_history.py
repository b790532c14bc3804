"""The per-epoch history merges the workers' metric states exactly.

A learning rate of zero keeps every worker's model the initial one, so the epoch's
training metrics must equal one ``model.evaluate`` of that model over every training
row, and the validation metrics one over every validation row: AUC, precision and
weighted accuracy included, which no average of the workers' results gives when the
workers' rows differ (here the partitions are split by the feature that decides the
label). Real Spark (local[2]) and TensorFlow.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

from sparkdl import KerasEstimator

pytestmark = [pytest.mark.spark]


def _data(seed: int, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 4)).astype(np.float32)
    y = (x[:, 0] + 0.8 * rng.normal(size=rows) > 0).astype(np.int64)
    return x, y, np.where(y == 1, 3.0, 1.0)


def _model() -> keras.Model:
    keras.utils.set_random_seed(0)
    net = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])
    # A model that ranks well overall: within either half of x0 it ranks worse.
    net.set_weights([np.array([[2.0], [0.3], [0.0], [0.0]], np.float32), np.zeros(1, np.float32)])
    net.compile(
        keras.optimizers.SGD(0.0),  # the model never changes: its metrics are known
        "binary_crossentropy",
        metrics=[keras.metrics.AUC(name="auc"), keras.metrics.Precision(name="precision")],
        weighted_metrics=["accuracy"],
    )
    return net


def _frame(spark, x, y, w):  # type: ignore[no-untyped-def]
    rows = [(a.tolist(), int(b), float(c), float(a[0])) for a, b, c in zip(x, y, w, strict=True)]
    return spark.createDataFrame(rows, "features array<float>, label long, w double, k double")


def _check(got: dict[str, list[float]], want: dict[str, float], prefix: str) -> None:
    for key, value in want.items():
        values = got[prefix + key]
        for epoch, merged in enumerate(values):
            assert abs(merged - value) < 1e-4, (prefix + key, epoch, merged, value)


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
@pytest.mark.parametrize("mode", ["synchronous", "asynchronous"])
def test_training_metrics_are_exact_over_skewed_partitions(spark, mode: str) -> None:
    """Each worker holds one side of the label's deciding feature: averaging the
    workers' AUCs would be far from the AUC over all rows."""
    from sklearn.metrics import roc_auc_score

    x, y, w = _data(1, 800)
    frame = _frame(spark, x, y, w).repartitionByRange(2, "k")  # skewed, kept as is
    net = _model()
    fitted = KerasEstimator(
        model=net, num_workers=2, epochs=2, batch_size=32, seed=0, mode=mode, weight_col="w"
    ).fit(frame)
    want = net.evaluate(x, y, sample_weight=w, verbose=0, return_dict=True)
    _check(fitted.history, {k: float(v) for k, v in want.items()}, "")
    scores = net.predict(x, verbose=0)[:, 0]
    # Keras's AUC interpolates over 200 thresholds: within 1e-3 of the exact one.
    assert abs(fitted.history["auc"][-1] - roc_auc_score(y, scores)) < 1e-3
    halves = [x[:, 0] < np.median(x[:, 0]), x[:, 0] >= np.median(x[:, 0])]
    averaged = np.mean([roc_auc_score(y[h], scores[h]) for h in halves])
    assert abs(averaged - fitted.history["auc"][-1]) > 0.02  # the test can tell


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_validation_metrics_are_exact(spark) -> None:
    x, y, w = _data(2, 600)
    xv, yv, wv = _data(3, 400)
    net = _model()
    fitted = KerasEstimator(
        model=net,
        num_workers=2,
        epochs=2,
        batch_size=32,
        seed=0,
        weight_col="w",
        validation_data=_frame(spark, xv, yv, wv),
    ).fit(_frame(spark, x, y, w))
    train = net.evaluate(x, y, sample_weight=w, verbose=0, return_dict=True)
    val = net.evaluate(xv, yv, sample_weight=wv, verbose=0, return_dict=True)
    _check(fitted.history, {k: float(v) for k, v in train.items()}, "")
    _check(fitted.history, {k: float(v) for k, v in val.items()}, "val_")
