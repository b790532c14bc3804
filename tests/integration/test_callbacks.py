"""Keras callbacks on the driver: real Spark local[2], TensorFlow, the service."""

from __future__ import annotations

import csv
import glob
import importlib.util
import os
import time

import keras
import numpy as np
import pytest

from examples.digits import digits_model
from sparkdl import KerasEstimator

pytestmark = [pytest.mark.spark]


@pytest.mark.compat
def test_keras_callbacks_behave_as_in_model_fit(digits, tmp_path) -> None:
    train_df, _, _ = digits
    seen: list[tuple[int, float, list[np.ndarray]]] = []
    recorder = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: seen.append(
            (epoch, logs["loss"], [w.copy() for w in recorder.model.get_weights()])
        )
    )
    # The loss keeps falling, but by less than min_delta after a few epochs.
    stopper = keras.callbacks.EarlyStopping(
        monitor="loss", min_delta=0.25, patience=1, restore_best_weights=True
    )
    reducer = keras.callbacks.ReduceLROnPlateau(
        monitor="loss", factor=0.5, patience=0, min_delta=10.0, min_lr=1e-5
    )
    callbacks = [
        recorder,
        stopper,
        reducer,
        keras.callbacks.ModelCheckpoint(str(tmp_path / "ckpt-{epoch:02d}.keras")),
        keras.callbacks.CSVLogger(str(tmp_path / "log.csv")),
    ]
    # Keras's TensorBoard callback writes through TensorFlow's summary API, on any
    # backend, and that needs the tensorboard package (not one of TensorFlow 2.21's
    # requirements): a stack without them cannot run it, in model.fit or here.
    tensorboard = all(importlib.util.find_spec(p) for p in ("tensorflow", "tensorboard"))
    if tensorboard:
        callbacks.append(keras.callbacks.TensorBoard(log_dir=str(tmp_path / "tb")))
    fitted = KerasEstimator(
        model=digits_model(), callbacks=callbacks, num_workers=2, epochs=12, seed=0
    ).fit(train_df)

    epochs = len(fitted.history["loss"])
    assert epochs < 12 and stopper.stopped_epoch > 0  # stopped early
    # Synchronous workers wait for the driver's callbacks at each epoch's end, so the
    # fit stops right after the epoch EarlyStopping stopped at, as model.fit does.
    assert epochs == stopper.stopped_epoch + 1
    assert [e for e, _, _ in seen] == list(range(epochs))
    assert [round(loss, 6) for _, loss, _ in seen] == [round(v, 6) for v in fitted.history["loss"]]
    best = next(w for e, _, w in seen if e == stopper.best_epoch)
    for got, want in zip(fitted.get_model().get_weights(), best, strict=True):
        np.testing.assert_array_equal(got, want)  # restore_best_weights

    # ReduceLROnPlateau halved the rate after every epoch on the driver; the workers
    # trained with it.
    rates = {w["learning_rate"] for w in fitted.fit_report["workers"]}
    assert len(rates) == 1 and rates.pop() < 0.003 / 2

    assert len(glob.glob(str(tmp_path / "ckpt-*.keras"))) == epochs
    with open(tmp_path / "log.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == epochs and float(rows[0]["loss"]) == pytest.approx(seen[0][1], 1e-5)
    if not tensorboard:
        return
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = glob.glob(str(tmp_path / "tb" / "train" / "events.out.tfevents.*"))
    assert events
    acc = EventAccumulator(os.path.dirname(events[0]))
    acc.Reload()
    tags = acc.Tags()
    assert "epoch_loss" in tags["tensors"] or "epoch_loss" in tags["scalars"]


def test_stop_training_from_a_callback_ends_the_fit_normally(digits) -> None:
    train_df, _, _ = digits

    def stop_after_second(epoch, logs):  # type: ignore[no-untyped-def]
        if epoch == 1:
            stopper.model.stop_training = True

    stopper = keras.callbacks.LambdaCallback(on_epoch_end=stop_after_second)
    fitted = KerasEstimator(
        model=digits_model(),
        callbacks=[stopper],
        mode="asynchronous",
        num_workers=2,
        epochs=15,
        seed=0,
    ).fit(train_df)
    # Asynchronous workers run at most one epoch ahead of the callbacks: the stop
    # decided on epoch 1 ends the fit by the end of epoch 2.
    assert 2 <= len(fitted.history["loss"]) <= 3
    assert all(w["epochs_run"] <= 3 for w in fitted.fit_report["workers"])


def test_a_raising_callback_stops_the_fit_with_its_error(digits) -> None:
    train_df, _, _ = digits

    def explode(epoch, logs):  # type: ignore[no-untyped-def]
        raise RuntimeError("callback exploded on purpose")

    with pytest.raises(RuntimeError, match="callback exploded on purpose"):
        KerasEstimator(
            model=digits_model(),
            callbacks=[keras.callbacks.LambdaCallback(on_epoch_end=explode)],
            num_workers=2,
            epochs=30,
        ).fit(train_df)


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
@pytest.mark.compat
def test_checkpoints_resume_a_stopped_fit(digits, tmp_path) -> None:
    import json

    from examples.digits import accuracy

    train_df, _, (_, x_test, _, y_test) = digits
    ckpt = str(tmp_path / "checkpoints")
    first = KerasEstimator(
        model=digits_model(),
        num_workers=2,
        epochs=3,
        seed=0,
        checkpoint_dir=ckpt,
        checkpoint_keep=2,
    ).fit(train_df)
    assert sorted(os.listdir(ckpt)) == ["ckpt-000002", "ckpt-000003"]
    with open(os.path.join(ckpt, "ckpt-000003", "state.json")) as f:
        state = json.load(f)
    assert state["epoch"] == 3 and state["settings"]["epochs"] == 3
    assert state["history"]["loss"] == pytest.approx(first.history["loss"])
    # A driver that died while writing epoch 4 left only a temporary directory.
    crashed = os.path.join(ckpt, "ckpt-000004.tmp-crashed")
    os.makedirs(crashed)
    with open(os.path.join(crashed, "weights.sdlw"), "wb") as f:
        f.write(b"SDLW\x01 half written")

    resumed = KerasEstimator(
        model=digits_model(), num_workers=2, epochs=6, seed=0, checkpoint_dir=ckpt, resume=True
    ).fit(train_df)
    assert len(resumed.history["loss"]) == 6
    assert resumed.history["loss"][:3] == pytest.approx(first.history["loss"])
    assert resumed.history["loss"][3] < first.history["loss"][2]  # went on, not restarted
    assert "ckpt-000006" in os.listdir(ckpt)

    straight = KerasEstimator(model=digits_model(), num_workers=2, epochs=6, seed=0).fit(train_df)
    a = accuracy(resumed.get_model(), x_test, y_test)
    b = accuracy(straight.get_model(), x_test, y_test)
    assert abs(a - b) < 0.03 and a >= 0.9, (a, b)


@pytest.mark.slow  # MLflow's import and file store take most of its 10 s
def test_mlflow_run_logs_params_metrics_and_model(digits, tmp_path, monkeypatch) -> None:
    import mlflow
    import mlflow.keras

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # a local file store, as asked
    mlflow.set_tracking_uri(f"file://{tmp_path / 'mlruns'}")
    mlflow.set_experiment("sparkdl-tests")
    train_df, _, _ = digits
    fitted = KerasEstimator(
        model=digits_model(), num_workers=2, epochs=3, seed=0, mlflow_run="digits"
    ).fit(train_df)
    assert mlflow.active_run() is None  # the run sparkdl started is ended
    runs = mlflow.search_runs(experiment_names=["sparkdl-tests"], output_format="list")
    assert len(runs) == 1 and runs[0].info.run_name == "digits"
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.params["epochs"] == "3" and run.data.params["mode"] == "synchronous"
    client = mlflow.tracking.MlflowClient()
    losses = client.get_metric_history(run.info.run_id, "loss")
    # (The file store can list a point twice; what matters is one value per epoch.)
    points = sorted({(m.step, m.value) for m in losses})
    assert [step for step, _ in points] == [0, 1, 2]
    assert [value for _, value in points] == pytest.approx(fitted.history["loss"])
    logged = mlflow.keras.load_model(f"runs:/{run.info.run_id}/model")
    for got, want in zip(logged.get_weights(), fitted.get_model().get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


def _jobs_of_group(spark, group: str) -> list[str]:  # type: ignore[no-untyped-def]
    """Descriptions of the group's jobs, from Spark's status store (what the UI shows)."""
    jobs = spark.sparkContext._jsc.sc().statusStore().jobsList(None)
    found = []
    for i in range(jobs.size()):
        job = jobs.apply(i)
        if job.jobGroup().isDefined() and job.jobGroup().get() == group:
            found.append(job.description().get() if job.description().isDefined() else "")
    return found


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
@pytest.mark.parametrize("mode", ["synchronous", "asynchronous"])
def test_spark_ui_names_the_fit_and_each_epoch(digits, spark, mode) -> None:
    train_df, _, _ = digits
    fitted = KerasEstimator(model=digits_model(), mode=mode, num_workers=2, epochs=3, seed=0).fit(
        train_df
    )
    group = fitted.fit_report["job_group"]
    deadline = time.monotonic() + 10  # the listener bus delivers events asynchronously
    while True:
        names = _jobs_of_group(spark, group)
        if sum(": epoch " in name for name in names) >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    fit = f"sparkdl fit: {mode}/{'average' if mode == 'synchronous' else 'delta'}, 2 workers"
    assert sum(name.startswith(fit) and ": epoch " not in name for name in names) >= 1, names
    for epoch in (1, 2, 3):
        assert any(f"epoch {epoch}/3 done, loss " in name for name in names), names
