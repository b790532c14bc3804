"""Every input column type, and every bad input's clear error before training starts."""

from __future__ import annotations

import re
import socket
import time

import keras
import numpy as np
import pytest
from pyspark.ml.linalg import Vectors

from sparkdl import ClusterError, ConfigError, KerasEstimator, ModelError, SchemaError, WorkerError
from sparkdl.driver.data import ColumnTypeError

pytestmark = [pytest.mark.spark]

RNG = np.random.default_rng(0)
X = RNG.standard_normal((40, 3)).astype(np.float64)
Y = (X.sum(axis=1) > 0).astype(int)


def classifier(width: int = 3, loss: str = "sparse_categorical_crossentropy") -> keras.Model:
    model = keras.Sequential([keras.Input((width,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer="adam", loss=loss, metrics=["accuracy"])
    return model


def fit(df, model=None, **kw):  # type: ignore[no-untyped-def]
    kw.setdefault("num_workers", 2)
    kw.setdefault("epochs", 1)
    return KerasEstimator(model=model or classifier(), **kw).fit(df)


def frame(spark, features, label=None, schema=None):  # type: ignore[no-untyped-def]
    labels = label if label is not None else [int(v) for v in Y]
    rows = [(f, lab, f"r{i}") for i, (f, lab) in enumerate(zip(features, labels, strict=True))]
    return spark.createDataFrame(rows, schema or ["features", "label", "id"])


@pytest.mark.parametrize(
    "kind",
    ["array_float", "array_double", "dense_vector", "sparse_vector", "sparse_input", "columns"],
)
@pytest.mark.compat
def test_feature_column_types_train_and_transform(spark, kind) -> None:
    if kind == "array_float":
        df = frame(
            spark, [r.tolist() for r in X], schema="features array<float>, label long, id string"
        )
    elif kind == "array_double":
        df = frame(
            spark, [r.tolist() for r in X], schema="features array<double>, label long, id string"
        )
    elif kind == "dense_vector":
        df = frame(spark, [Vectors.dense(r) for r in X])
    elif kind in ("sparse_vector", "sparse_input"):
        df = frame(
            spark, [Vectors.sparse(3, {i: float(v) for i, v in enumerate(r) if i != 1}) for r in X]
        )
    else:
        rows = [(float(a), float(b), float(c), int(y)) for (a, b, c), y in zip(X, Y, strict=True)]
        df = spark.createDataFrame(rows, ["a", "b", "c", "label"])
    features = ["a", "b", "c"] if kind == "columns" else "features"
    model = None
    if kind == "sparse_input" and keras.backend.backend() == "torch":
        # Keras on torch has no sparse inputs: the model cannot be built (the sparse
        # rows feed a dense input there, the sparse_vector case).
        with pytest.raises(ValueError, match="sparse=True"):
            keras.Input((3,), sparse=True)
        return
    if kind == "sparse_input":  # fed the backend's sparse batches: SparseTensor, BCOO
        model = keras.Sequential(
            [keras.Input((3,), sparse=True), keras.layers.Dense(2, activation="softmax")]
        )
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    fitted = fit(df, model=model, features_col=features)
    scored = fitted.transform(df).collect()
    assert len(scored) == 40
    assert fitted.transform(df).columns == [*df.columns, "prediction"]
    expected_x = X.copy()
    if kind in ("sparse_vector", "sparse_input"):
        expected_x[:, 1] = 0.0
    got = np.array([r.prediction for r in scored], np.float32)
    # Row order of collect() matches the input rows here (no shuffle in transform).
    want = fitted.get_model().predict(expected_x.astype(np.float32), verbose=0)
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_array_label_with_categorical_loss_and_scalar_regression(spark) -> None:
    onehot = [[1.0, 0.0] if y == 0 else [0.0, 1.0] for y in Y]
    df = frame(spark, [r.tolist() for r in X], label=onehot)
    fitted = fit(df, model=classifier(loss="categorical_crossentropy"))
    assert "loss" in fitted.history

    reg = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    reg.compile(optimizer="sgd", loss="mse")
    df2 = frame(spark, [r.tolist() for r in X], label=[float(v) for v in X.sum(axis=1)])
    fitted2 = fit(df2, model=reg, epochs=2)
    out = fitted2.transform(df2)
    assert dict(out.dtypes)["prediction"] == "double"
    got = np.array([r.prediction for r in out.collect()])
    np.testing.assert_allclose(
        got, fitted2.get_model().predict(X.astype(np.float32), verbose=0)[:, 0], atol=1e-5
    )


def test_flat_features_fill_a_2d_input(spark) -> None:
    model = keras.Sequential(
        [keras.Input((2, 2)), keras.layers.Flatten(), keras.layers.Dense(2, activation="softmax")]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    x4 = np.concatenate([X, X[:, :1]], axis=1)
    fitted = fit(frame(spark, [r.tolist() for r in x4]), model=model)
    assert fitted.input_shape == (2, 2)


# ---------------------------------------------------------------- bad input
@pytest.fixture(scope="module")
def good(spark):  # type: ignore[no-untyped-def]
    return frame(
        spark, [r.tolist() for r in X], schema="features array<float>, label long, id string"
    )


def test_missing_column_names_available_ones(good) -> None:
    with pytest.raises(
        SchemaError, match=r"'feats'.*Available columns: \['features', 'id', 'label'\]"
    ):
        fit(good, features_col="feats")
    with pytest.raises(SchemaError, match="'y'"):
        fit(good, label_col="y")


def test_width_mismatch_names_both_shapes(good) -> None:
    with pytest.raises(SchemaError, match=r"input shape \(None, 5\).*rows of 3 values"):
        fit(good, model=classifier(width=5))


def test_uncompiled_model(good) -> None:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(ModelError, match="not compiled"):
        fit(good, model=model)


def test_nulls_and_nans_are_counted(spark) -> None:
    feats = [r.tolist() for r in X]
    feats[0] = None
    feats[1] = [float("nan"), 1.0, 2.0]
    labels = [int(v) for v in Y]
    labels[2] = None
    df = frame(spark, feats, label=labels, schema="features array<double>, label long, id string")
    with pytest.raises(
        SchemaError,
        match=r"1 row\(s\) with null features, 1 row\(s\) with NaN.*1 row\(s\) with a null label",
    ):
        fit(df)


def test_validate_false_skips_the_nan_scan_but_not_nulls(spark) -> None:
    feats = [r.tolist() for r in X]
    feats[1] = [float("nan"), 1.0, 2.0]
    df = frame(spark, feats, schema="features array<double>, label long, id string")
    with pytest.raises(SchemaError, match=r"1 row\(s\) with NaN"):
        fit(df)
    # Without the scan the NaN reaches training, where the loss names it.
    with pytest.raises(WorkerError, match=r"training diverged|NaN or infinite"):
        fit(df, validate=False)
    feats[0] = None  # nulls are still counted: a worker could not convert the row
    df = frame(spark, feats, schema="features array<double>, label long, id string")
    with pytest.raises(SchemaError, match=r"1 row\(s\) with null features"):
        fit(df, validate=False)


def test_empty_dataframe(good) -> None:
    with pytest.raises(SchemaError, match="empty"):
        fit(good.limit(0))


def test_non_numeric_features(spark) -> None:
    df = spark.createDataFrame([("a", 1)], ["features", "label"])
    with pytest.raises(ColumnTypeError, match="string"):
        fit(df)
    with pytest.raises(TypeError):
        fit(df)


def test_ragged_rows(spark) -> None:
    df = spark.createDataFrame(
        [([1.0, 2.0, 3.0], 0), ([1.0], 1)], "features array<double>, label long"
    )
    with pytest.raises(SchemaError, match="same number of features"):
        fit(df)


def test_label_out_of_range_for_sparse_loss(spark) -> None:
    df = frame(spark, [r.tolist() for r in X], label=[5] * 40)
    with pytest.raises(SchemaError, match=r"class ids in \[0, 1\]"):
        fit(df)


def test_too_many_workers_says_how_many_slots(good) -> None:
    with pytest.raises(ClusterError, match=r"num_workers=3.*2 task slot"):
        fit(good, num_workers=3)


def test_unknown_mode_frequency_and_setting() -> None:
    model = classifier()
    with pytest.raises(ConfigError, match="mode"):
        KerasEstimator(model=model, mode="fastest")
    with pytest.raises(ConfigError, match="frequency"):
        KerasEstimator(model=model, frequency="sometimes")
    with pytest.raises(ConfigError, match="Unknown setting"):
        KerasEstimator(model=model, epoch=3)


def _raising_loss(y_true, y_pred):  # type: ignore[no-untyped-def]
    raise ValueError("custom loss exploded on purpose")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def assert_port_released(port: int) -> None:
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2)
    with socket.socket() as s:
        # As a new service binds (SO_REUSEADDR): connections the service closed may
        # linger in TIME_WAIT, a listening socket still held would refuse the bind.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))  # raises if the service still held it


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_service_port_is_released_after_a_normal_fit(good) -> None:
    port = free_port()
    fitted = fit(good, port=port)
    assert fitted.fit_report["service"]["version"] >= 1
    assert_port_released(port)


def test_worker_exception_becomes_worker_error_and_service_stops(good) -> None:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer="adam", loss=_raising_loss)
    port = free_port()
    with pytest.raises(WorkerError, match="custom loss exploded on purpose") as err:
        fit(good, model=model, custom_objects={"_raising_loss": _raising_loss}, port=port)
    assert set(err.value.failures) <= {0, 1} and err.value.failures
    # Its first line names the worker, where it stood and the exception itself.
    assert re.match(
        r"[12] worker\(s\) failed during training: worker [01] \(epoch 1 of \d+, batch 1\): "
        r"ValueError: custom loss exploded on purpose",
        str(err.value).splitlines()[0],
    ), str(err.value)
    assert_port_released(port)


def test_a_taken_port_fails_the_fit_and_leaves_no_thread_building(good, monkeypatch) -> None:
    """The fit fails at its start, with the models it builds in daemon threads still
    loading (slowed down here, so that they surely are): it waits for them and for its
    warm-up's job, as a script that exits then would crash or hang with a thread inside
    TensorFlow or a Spark call."""
    import threading

    from sparkdl.contract import keras_io
    from sparkdl.errors import ServiceError

    load = keras_io.model_from_bytes

    def slow_load(*args, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(2)
        return load(*args, **kwargs)

    monkeypatch.setattr(keras_io, "model_from_bytes", slow_load)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(ServiceError, match=rf"Could not bind .*127\.0\.0\.1:{port}.*port="):
            fit(good, port=port, service_host="127.0.0.1")
    names = {"sparkdl-result-model", "sparkdl-metric-states", "sparkdl-warm-up", "sparkdl-cancel"}
    alive = [t.name for t in threading.enumerate() if t.name in names]
    assert not alive, alive


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_nan_loss_is_a_clear_error(spark) -> None:
    big = [[1e30, 1e30, 1e30]] * 40
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(1e10), loss="mse")
    df = frame(
        spark, big, label=[1e30] * 40, schema="features array<double>, label double, id string"
    )
    with pytest.raises(WorkerError, match=r"training diverged|NaN or infinite"):
        fit(df, model=model)


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_scoring_checks_row_widths_with_the_fits_messages(spark) -> None:
    """26 values per row into a 13-feature model: once two rows' predictions each."""
    from sparkdl import KerasModel
    from sparkdl.contract.keras_io import model_to_bytes

    model = classifier(width=13)
    scorer = KerasModel(model_bytes=model_to_bytes(model))
    # One partition each: a failed scoring task takes its Python worker with it, and a
    # new one imports TensorFlow again.
    wide = frame(spark, [[float(v)] * 26 for v in X[:, 0]]).coalesce(1)
    with pytest.raises(SchemaError) as fitting:
        fit(wide, classifier(width=13))
    message = "Expected 13 feature values per row to fit the model's input shape (None, 13)"
    assert message in str(fitting.value) and "Received rows of 26 values" in str(fitting.value)
    with pytest.raises(Exception, match=r"Received rows of 26 values") as scoring:
        scorer.transform(wide).collect()
    assert message in str(scoring.value)
    with pytest.raises(Exception, match=r"Received rows of 26 values"):
        scorer.evaluate(wide)
    ragged = frame(spark, [[1.0] * (13 if i % 2 else 12) for i in range(len(X))]).coalesce(1)
    for call in (lambda: scorer.transform(ragged).collect(), lambda: scorer.evaluate(ragged)):
        with pytest.raises(Exception, match="Received rows with between 12 and 13 values"):
            call()
    vectors = frame(spark, [Vectors.sparse(20, [0], [1.0]) for _ in range(len(X))]).coalesce(1)
    with pytest.raises(Exception, match="Received rows of 20 values"):
        scorer.transform(vectors).collect()
    good = frame(spark, [[float(v)] * 13 for v in X[:, 0]])
    assert scorer.transform(good).count() == len(X)
