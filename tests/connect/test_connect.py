"""The public paths over a Spark Connect session (``remote("local[3]")``): fit in every
mode x merge, callbacks, the progress bar, checkpoints and resume, transform, evaluate,
save / load, a Pipeline with a registered custom layer, a CrossValidator, warm-up. Real
Spark Connect, real TensorFlow, the real service over real sockets on 127.0.0.1."""

from __future__ import annotations

import os

import keras
import numpy as np
import pytest

from examples.digits import accuracy, digits_model
from sparkdl import KerasEstimator, KerasModel, warm_up

pytestmark = [pytest.mark.spark]


def test_the_session_is_a_connect_client(spark) -> None:
    from sparkdl.compat.sessions import is_connect, session_tools

    assert is_connect(spark)
    tools = session_tools(spark)
    assert tools.connect and tools.master == "local[3]" and tools.slots() == 3
    assert tools.spark_context() is None
    with pytest.raises(Exception, match="sparkContext"):
        spark.sparkContext  # noqa: B018  (what the first fit used to fail on)
    handle = warm_up(spark, wait=True)
    assert handle.done and handle._ok


def test_synchronous_fit_scores_evaluates_saves_and_loads(digits, tmp_path, capsys) -> None:
    train_df, test_df, (_, x_test, _, y_test) = digits
    fitted = KerasEstimator(
        model=digits_model(),
        mode="synchronous",
        frequency=4,
        num_workers=2,
        epochs=20,
        batch_size=32,
        seed=0,
        verbose=1,
        service_tls=True,
    ).fit(train_df)
    bar = capsys.readouterr().err
    assert "Epoch 20/20" in bar and "samples/s" in bar  # the progress bar moved
    # auto on Connect: the service ran beside worker 0, followed by the relay's jobs.
    assert "in the cluster" in fitted.fit_report["resolved"]["service"]
    assert fitted.fit_report["service_url"].startswith("https://127.0.0.1:")
    assert len(fitted.history["loss"]) == 20
    model = fitted.get_model()
    assert accuracy(model, x_test, y_test) >= 0.95
    rows = fitted.transform(test_df).collect()
    x = np.array([r.features for r in rows], np.float32)
    predictions = np.array([r.prediction for r in rows], np.float32)
    np.testing.assert_allclose(predictions, model.predict(x, verbose=0), atol=1e-5)
    scores = fitted.evaluate(test_df)
    assert scores["accuracy"] == pytest.approx(accuracy(model, x_test, y_test), abs=1e-6)

    path = str(tmp_path / "model")
    fitted.write().save(path)
    with pytest.raises(Exception, match="already exists"):
        fitted.write().save(path)  # no overwrite asked
    fitted.write().overwrite().save(path)
    loaded = KerasModel.load(path)
    assert loaded.history == fitted.history
    again = np.array([r.prediction for r in loaded.transform(test_df).collect()], np.float32)
    np.testing.assert_allclose(again, predictions, atol=1e-6)


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_callbacks_stop_the_fit_and_checkpoints_resume_it(digits, tmp_path) -> None:
    train_df, _, _ = digits
    seen: list[int] = []

    def stop_after_third(epoch, logs):  # type: ignore[no-untyped-def]
        seen.append(epoch)
        if epoch == 2:
            stopper.model.stop_training = True

    stopper = keras.callbacks.LambdaCallback(on_epoch_end=stop_after_third)
    checkpoints = str(tmp_path / "checkpoints")
    first = KerasEstimator(
        model=digits_model(),
        callbacks=[stopper],
        mode="asynchronous",
        merge="delta",
        num_workers=2,
        epochs=40,
        seed=0,
        checkpoint_dir=checkpoints,
    ).fit(train_df)
    # Asynchronous workers run at most one epoch ahead of the driver's callbacks, which
    # the relay's jobs (the service runs in the cluster) reach a poll later: the stop
    # decided on epoch 2 ends the fit by the end of epoch 3 however short the epochs.
    done = len(first.history["loss"])
    assert seen[:3] == [0, 1, 2] and 3 <= done <= 4
    assert min(w["epochs_run"] for w in first.fit_report["workers"]) < 40
    resumed = KerasEstimator(
        model=digits_model(),
        mode="asynchronous",
        num_workers=2,
        epochs=done + 2,
        seed=0,
        checkpoint_dir=checkpoints,
        resume=True,
    ).fit(train_df)
    assert len(resumed.history["loss"]) == done + 2
    assert resumed.history["loss"][:done] == pytest.approx(first.history["loss"])


@keras.saving.register_keras_serializable(package="sparkdl_connect_tests")
class Scale(keras.layers.Layer):
    """A registered custom layer: executors and a later load find it by name."""

    def __init__(self, factor: float = 1.0, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(**kwargs)
        self.factor = factor

    def call(self, inputs):  # type: ignore[no-untyped-def]
        return inputs * self.factor

    def get_config(self) -> dict:  # type: ignore[type-arg]
        return {**super().get_config(), "factor": self.factor}


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_a_pipeline_with_a_custom_layer_saves_and_loads(digits, tmp_path) -> None:
    from pyspark.ml import Pipeline, PipelineModel

    train_df, test_df, _ = digits
    model = keras.Sequential(
        [
            keras.Input((64,)),
            Scale(1.0 / 16.0),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    estimator = KerasEstimator(model=model, class_col="class", num_workers=2, epochs=3, seed=0)
    fitted = Pipeline(stages=[estimator]).fit(train_df)
    path = str(tmp_path / "pipeline")
    fitted.write().save(path)
    assert sorted(os.listdir(path)) == ["metadata", "stages"]
    loaded = PipelineModel.load(path)
    stage = loaded.stages[0]
    assert isinstance(stage, KerasModel)
    assert isinstance(stage.get_model().layers[0], Scale)
    before = [r["class"] for r in fitted.transform(test_df).orderBy("label").collect()]
    after = [r["class"] for r in loaded.transform(test_df).orderBy("label").collect()]
    assert before == after


@pytest.mark.slow  # six fits
def test_a_cross_validator_picks_the_better_learning_rate(digits) -> None:
    from tests.integration.test_spark_ml import check_cross_validator

    check_cross_validator(digits[0])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "merge"),
    [
        ("synchronous", "average"),
        ("synchronous", "elastic"),
        ("asynchronous", "average"),
        ("asynchronous", "elastic"),
        ("hogwild", "delta"),
        ("hogwild", "average"),
        ("hogwild", "elastic"),
    ],
)
def test_every_mode_and_merge_reaches_accuracy(digits, mode, merge) -> None:
    """The pairs the fast tests leave out (synchronous/delta, asynchronous/delta)."""
    train_df, _, (_, x_test, _, y_test) = digits
    fitted = KerasEstimator(
        model=digits_model(),
        mode=mode,
        merge=merge,
        num_workers=2,
        epochs=20,
        seed=0,
    ).fit(train_df)
    assert accuracy(fitted.get_model(), x_test, y_test) >= 0.95


def test_synchronous_delta_reaches_accuracy(digits) -> None:
    train_df, _, (_, x_test, _, y_test) = digits
    fitted = KerasEstimator(
        model=digits_model(), mode="synchronous", merge="delta", num_workers=2, epochs=20, seed=0
    ).fit(train_df)
    assert accuracy(fitted.get_model(), x_test, y_test) >= 0.95


@pytest.mark.slow
def test_a_sharded_service_in_the_cluster_with_tls_callbacks_and_the_bar(
    digits, tmp_path, capsys
) -> None:
    """Two shards beside workers 0 and 1, each with its own certificate; the relay's
    polls reach both (the bar, the callbacks' weights joined from the shards)."""
    from sparkdl.server.state import checkpoints

    train_df, _, (_, x_test, _, y_test) = digits
    seen: list[int] = []
    recorder = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: seen.append(epoch))
    directory = str(tmp_path / "checkpoints")
    fitted = KerasEstimator(
        model=digits_model(),
        mode="synchronous",
        frequency=4,
        num_workers=2,
        epochs=12,
        seed=0,
        verbose=1,
        service_tls=True,
        service_shards=2,
        callbacks=[recorder],
        checkpoint_dir=directory,
    ).fit(train_df)
    assert "Epoch 12/12" in capsys.readouterr().err
    assert seen == list(range(12))
    service = fitted.fit_report["service"]
    assert [s["shard"] for s in service["shards"]] == [0, 1]
    assert all(s["epochs_done"] == 12 for s in service["shards"])
    model = fitted.get_model()
    assert accuracy(model, x_test, y_test) >= 0.93
    # The callbacks' last epoch (the shards' parts joined) is the fitted model.
    last = checkpoints.latest(directory)
    assert last is not None and last.epoch == 12
    for a, b in zip(last.weights, model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow  # four fits
def test_a_search_runs_its_trials_over_connect(digits) -> None:
    """sparkdl.search over a Connect session: the trials' fits (their services in the
    cluster, whose relay takes a slot: one trial at a time on local[3]) complete, and
    the best model scores."""
    pytest.importorskip("optuna")
    from benchmarks.search import build
    from sparkdl.search import Search

    train_df, test_df, (_, x_test, _, y_test) = digits

    def space(trial):  # type: ignore[no-untyped-def]
        units = trial.suggest_int("units", 8, 32, log=True)
        return {"model": build(units, trial.suggest_float("rate", 1e-3, 1e-2, log=True))}

    estimator = KerasEstimator(model=build(8, 1e-3), features_col="features", epochs=4)
    result = Search(
        estimator, space, objective="val_accuracy", trials=4, concurrency=2, pruner=None, seed=0
    ).fit(train_df, validation_data=test_df)
    assert list(result.trials.state) == ["COMPLETE"] * 4
    assert result.concurrency == 1  # 3 slots: a worker and the relay per trial
    assert result.best_value is not None and result.best_value >= 0.8
    assert accuracy(result.best_model.get_model(), x_test, y_test) >= 0.8
    scored = result.best_model.transform(test_df).limit(5).collect()
    assert len(scored) == 5
