"""Hyper-parameter search: trials as concurrent distributed fits on real Spark (local[2],
TensorFlow, the real service), pruned at epoch ends, failed trials recorded, a stored
study resumed; CrossValidator's parallel fits overlap."""

from __future__ import annotations

import os
import threading
import time

import keras
import numpy as np
import pytest

from benchmarks.search import build as _mlp  # the digits MLP of units and Adam's rate
from sparkdl import KerasEstimator
from sparkdl.search import Search

pytestmark = [pytest.mark.spark, pytest.mark.slow]

optuna = pytest.importorskip("optuna")

EPOCHS = 6


def space(trial):  # type: ignore[no-untyped-def]
    units = trial.suggest_int("units", 4, 64, log=True)
    rate = trial.suggest_float("learning_rate", 3e-4, 3e-2, log=True)
    if trial.number == 3:
        raise ValueError("a space that fails for this trial")
    return {"model": _mlp(units, rate), "batch_size": 32}


def _estimator() -> KerasEstimator:
    return KerasEstimator(
        model=_mlp(8, 1e-3), features_col="features", label_col="label", epochs=EPOCHS
    )


@pytest.fixture
def scans(monkeypatch) -> list[int]:  # type: ignore[no-untyped-def]
    """One entry per data scan a fit ran (a spy: the real scan runs)."""
    from sparkdl.driver import data

    found: list[int] = []
    real = data.summarize

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        found.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(data, "summarize", counted)
    return found


def _overlap(trials) -> bool:  # type: ignore[no-untyped-def]
    spans = [
        (row.started, row.started + row.seconds)
        for row in trials.itertuples()
        if row.started is not None and row.seconds is not None and row.state != "FAIL"
    ]
    return any(a[0] < b[1] and b[0] < a[1] for i, a in enumerate(spans) for b in spans[i + 1 :])


def _last_job(spark) -> int:  # type: ignore[no-untyped-def]
    """The id of a job run now, in a job group of its own (jobs are numbered in order)."""
    sc = spark.sparkContext
    sc.setJobGroup("test-search-marker", "the search test's marker job")
    try:
        spark.range(1).count()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)
    return max(sc.statusTracker().getJobIdsForGroup("test-search-marker"))  # a job or two


def _failed_jobs(spark, first: int) -> list[int]:  # type: ignore[no-untyped-def]
    """Jobs from ``first`` on that failed or were cancelled (ids until 50 unknown); the
    search runs alone in the session meanwhile."""
    tracker = spark.sparkContext.statusTracker()
    failed, job, unknown = [], first, 0
    while unknown < 50:
        info = tracker.getJobInfo(job)
        unknown = unknown + 1 if info is None else 0
        if info is not None and info.status == "FAILED":
            failed.append(job)
        job += 1
    return failed


def test_a_search_runs_trials_at_once_prunes_records_failures_and_resumes(
    spark, digits, tmp_path
) -> None:
    train_df, test_df, (_, x_test, _, y_test) = digits
    storage = f"sqlite:///{tmp_path}/study.db"

    def search(trials: int):  # type: ignore[no-untyped-def]
        """The same search on the same stored study, to hold ``trials`` trials."""
        return Search(
            _estimator(),
            space,
            objective="val_accuracy",
            trials=trials,
            concurrency=2,
            seed=0,
            storage=storage,
            study_name="digits",
        ).fit(train_df, validation_data=test_df)

    first_job = _last_job(spark) + 1
    result = search(8)
    trials = result.trials
    assert len(trials) == 8 and result.concurrency == 2 and result.workers == 1
    states = trials.state.value_counts().to_dict()
    assert states.get("FAIL") == 1, trials
    failed = trials[trials.state == "FAIL"].iloc[0]
    assert failed.number == 3 and "a space that fails" in failed.error
    assert states.get("PRUNED", 0) >= 1, trials
    pruned = trials[trials.state == "PRUNED"]
    assert (pruned.epochs < EPOCHS).all()  # stopped before their last epoch
    # Stopped, not aborted: no job failed, so every task's Python worker was kept.
    assert _failed_jobs(spark, first_job) == []
    assert _overlap(trials), trials  # two trials trained at the same time
    assert result.best_value >= 0.9
    assert set(result.best_params) == {"units", "learning_rate"}
    predicted = result.best_model.get_model().predict(x_test, verbose=0).argmax(axis=1)
    assert float((predicted == y_test).mean()) == pytest.approx(result.best_value, abs=0.01)
    # Run again with the same storage and name: only the 2 trials still missing run.
    again = search(10)
    assert len(again.trials) == 10
    before = trials.set_index("number")
    after = again.trials.set_index("number")
    assert (after.loc[before.index, "state"] == before.state).all()  # kept as they were
    assert after.loc[[8, 9], "state"].isin(["COMPLETE", "PRUNED"]).all()


def test_concurrency_is_sized_from_the_task_slots_and_objectives_are_checked(
    spark, digits, scans, tmp_path
) -> None:
    train_df, _, _ = digits
    two_workers = KerasEstimator(
        model=_mlp(8, 1e-3),
        features_col="features",
        epochs=1,
        num_workers=2,
        checkpoint_dir=str(tmp_path / "checkpoints"),
    )
    result = Search(
        two_workers,
        lambda t: {"batch_size": t.suggest_categorical("b", [32, 64])},
        objective="loss",
        trials=2,
        concurrency=4,
        pruner=None,
    ).fit(train_df)
    assert result.concurrency == 1 and result.workers == 2  # local[2]: one fit at a time
    assert (result.trials.state == "COMPLETE").all()
    assert len(scans) == 1  # the trials prepare the same columns: one data scan
    # each trial checkpoints in a folder of its own (a retry resumes from it)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["trial-0", "trial-1"]
    with pytest.raises(Exception, match="validation_data="):
        Search(two_workers, lambda t: {}, objective="val_loss", trials=1).fit(train_df)


def test_cross_validator_fits_its_models_at_once(spark, digits, scans) -> None:
    """Its fits overlap in time, and the fits of one fold share that fold's data scan."""
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.tuning import CrossValidator, ParamGridBuilder

    train_df, _, _ = digits
    spans: list[tuple[float, float]] = []
    lock = threading.Lock()

    begun: dict[int, float] = {}

    class Span(keras.callbacks.Callback):
        """Shared by the fits CrossValidator runs at once (its copies share callbacks):
        each fit's callbacks run in a driver thread of their own."""

        def on_train_begin(self, logs=None):  # type: ignore[no-untyped-def]
            begun[threading.get_ident()] = time.time()

        def on_train_end(self, logs=None):  # type: ignore[no-untyped-def]
            with lock:
                spans.append((begun[threading.get_ident()], time.time()))

    est = KerasEstimator(
        model=_mlp(16, 3e-3),
        features_col="features",
        label_col="label",
        epochs=8,
        num_workers=1,
        class_col="class",
        callbacks=[Span()],
    )
    grid = ParamGridBuilder().addGrid(est.getParam("batchSize"), [32, 64]).build()
    evaluator = MulticlassClassificationEvaluator(labelCol="label", predictionCol="class")
    cv = CrossValidator(
        estimator=est, estimatorParamMaps=grid, evaluator=evaluator, numFolds=2, parallelism=2
    )
    model = cv.fit(train_df)
    assert len(model.avgMetrics) == 2 and np.all(np.array(model.avgMetrics) > 0.6)
    assert any(a[0] < b[1] and b[0] < a[1] for i, a in enumerate(spans) for b in spans[i + 1 :])
    # 2 folds x 2 param maps: one scan per fold, then the final refit on all rows.
    assert len(scans) == 3, scans


def test_mlflow_gets_a_parent_run_and_a_nested_run_per_trial(
    spark, digits, tmp_path, monkeypatch
) -> None:
    """With mlflow_run on the estimator: the search's parent run holds its settings and
    best value; each trial's run is nested under it, with the trial's parameters, its
    state and the metrics and model its fit logged (the trials run in threads of their
    own, each with its own active run)."""
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3.x asks for it
    mlflow.set_tracking_uri(f"file://{tmp_path / 'mlruns'}")
    mlflow.set_experiment("sparkdl-search")
    train_df, test_df, _ = digits

    def small(trial):  # type: ignore[no-untyped-def]
        units = trial.suggest_int("units", 4, 32, log=True)
        if trial.number == 2:
            raise ValueError("a space that fails for this trial")
        return {"model": _mlp(units, 3e-3), "batch_size": 64}

    estimator = KerasEstimator(
        model=_mlp(8, 1e-3), features_col="features", epochs=2, mlflow_run="digits-search"
    )
    result = Search(
        estimator, small, objective="val_accuracy", trials=3, concurrency=2, pruner=None, seed=0
    ).fit(train_df, validation_data=test_df)
    assert mlflow.active_run() is None  # the parent run the search started is ended
    runs = mlflow.search_runs(experiment_names=["sparkdl-search"], output_format="list")
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert [p.info.run_name for p in parents] == ["digits-search"]
    parent = parents[0]
    assert parent.data.params["search.objective"] == "val_accuracy"
    assert parent.data.params["search.concurrency"] == "2"
    assert parent.data.params["best.units"] == str(result.best_params["units"])
    assert parent.data.metrics["best_val_accuracy"] == pytest.approx(result.best_value)
    children = sorted(
        (r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id),
        key=lambda r: int(r.data.tags["optuna.trial"]),
    )
    assert [c.data.tags["optuna.state"] for c in children] == ["COMPLETE", "COMPLETE", "FAIL"]
    assert [c.info.status for c in children] == ["FINISHED", "FINISHED", "FAILED"]
    for child in children[:2]:
        assert "trial.units" in child.data.params and "val_accuracy" in child.data.metrics
        assert child.data.params["epochs"] == "2"  # the trial's fit logged into its run


def test_a_trial_whose_worker_process_dies_runs_again_and_completes(
    spark, digits, tmp_path
) -> None:
    """A cluster failure, for real: the trial's Python worker exits mid-fit (as a lost
    executor's would, with no report) in every attempt Spark makes of the training stage
    (spark.stage.maxConsecutiveAttempts, 4 by default), so the fit fails; the search runs the trial
    again, and that fit, whose process lives, completes."""
    from tests.integration.failure_fit import _loss_with_hook

    train_df, test_df, _ = digits
    marker = tmp_path / "deaths"
    attempts = int(spark.conf.get("spark.stage.maxConsecutiveAttempts", "4"))

    def die_four_times() -> None:
        deaths = marker.read_text().count("\n") if marker.exists() else 0
        if deaths < attempts:
            with open(marker, "a") as out:
                out.write("died\n")
            os._exit(1)

    loss = _loss_with_hook("dying_loss", 0, die_four_times)

    def dying(trial):  # type: ignore[no-untyped-def]
        units = trial.suggest_int("units", 8, 16)
        model = _mlp(units, 3e-3)
        model.compile(
            keras.optimizers.Adam(3e-3), loss=loss, metrics=["accuracy"], jit_compile=False
        )
        return {"model": model, "custom_objects": {loss.__name__: loss}, "batch_size": 64}

    estimator = KerasEstimator(
        model=_mlp(8, 1e-3), features_col="features", epochs=2, num_workers=1
    )
    result = Search(
        estimator, dying, objective="val_accuracy", trials=1, concurrency=1, pruner=None
    ).fit(train_df, validation_data=test_df)
    assert marker.read_text().count("\n") == attempts  # every stage attempt's died
    assert list(result.trials.state) == ["COMPLETE"]
    assert result.study.trials[0].user_attrs["retries"] == 1
