"""Hyper-parameter search three ways on one budget: one trial after another, sparkdl's
``Search`` (trials at once, ASHA pruning), and Hyperopt's ``SparkTrials``.

The space (the same for all three): the hidden units of the digits MLP (8 to 128, log)
and Adam's learning rate (3e-4 to 3e-2, log); batch 32, ``--epochs`` epochs; the
objective is the validation accuracy on the 360 held-out rows of scikit-learn's digits
(1,437 training rows). ``--trials`` trials each, on ``local[2]``:

* ``sequential``: ``Search`` with ``concurrency=1`` and no pruner: every trial a sparkdl
  fit of one worker to its last epoch, one after another;
* ``sparkdl Search``: ``Search`` with ASHA (the default) and ``concurrency=2``: two fits
  of one worker at once;
* ``SparkTrials``: Hyperopt's ``fmin`` with TPE and ``SparkTrials(parallelism=2)``:
  each trial a plain-Keras ``model.fit`` inside one Spark task (the way Hyperopt runs
  a trial: a task, never a distributed fit).

Figures per way: wall time of the search, the best validation accuracy found, the
seconds until the best-so-far came within 0.5 points of that way's final best, and the
epochs trained in all. ``--png`` plots best-so-far against time for the three.

Run:
    .venv/bin/python benchmarks/search.py
    .venv/bin/python benchmarks/search.py --trials 8 --epochs 6 --png /tmp/search.png
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

UNITS = (8, 128)
RATES = (3e-4, 3e-2)


def build(units: int, rate: float) -> Any:
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(units, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(
        keras.optimizers.Adam(rate), "sparse_categorical_crossentropy", metrics=["accuracy"]
    )
    return model


def space(trial: Any) -> dict[str, Any]:
    units = trial.suggest_int("units", *UNITS, log=True)
    rate = trial.suggest_float("learning_rate", *RATES, log=True)
    return {"model": build(units, rate), "batch_size": 32}


def run_search(args: argparse.Namespace, train: Any, test: Any, *, concurrent: bool) -> dict:
    from sparkdl import KerasEstimator
    from sparkdl.search import Search

    estimator = KerasEstimator(
        model=build(8, 1e-3),
        features_col="features",
        label_col="label",
        num_workers=1,
        epochs=args.epochs,
    )
    started = time.time()
    result = Search(
        estimator,
        space,
        objective="val_accuracy",
        trials=args.trials,
        concurrency=2 if concurrent else 1,
        pruner="asha" if concurrent else None,
        seed=args.seed,
        verbose=0,
    ).fit(train, validation_data=test)
    wall = time.time() - started
    trials = result.trials
    ends = [
        (row.started + row.seconds - started, row.value)
        for row in trials.itertuples()
        if row.state == "COMPLETE"
    ]
    # A pruned trial's best is its reported values; only complete trials count as found.
    return {
        "wall": wall,
        "best": result.best_value,
        "curve": _best_so_far(ends),
        "epochs": int(trials.epochs.fillna(0).sum()),
        "states": trials.state.value_counts().to_dict(),
    }


def run_spark_trials(args: argparse.Namespace, arrays: tuple) -> dict:
    from hyperopt import STATUS_OK, SparkTrials, fmin, hp, tpe

    x_train, x_test, y_train, y_test = arrays
    epochs = args.epochs

    def objective(params: dict) -> dict:
        model = build(int(params["units"]), float(params["learning_rate"]))
        model.fit(x_train, y_train, epochs=epochs, batch_size=32, verbose=0)
        accuracy = float(model.evaluate(x_test, y_test, verbose=0)[1])
        return {"loss": -accuracy, "status": STATUS_OK, "ended": time.time()}

    import numpy as np

    hyper_space = {
        "units": hp.qloguniform("units", np.log(UNITS[0]), np.log(UNITS[1]), 1),
        "learning_rate": hp.loguniform("learning_rate", np.log(RATES[0]), np.log(RATES[1])),
    }
    trials = SparkTrials(parallelism=2)
    started = time.time()
    fmin(
        objective,
        hyper_space,
        algo=tpe.suggest,
        max_evals=args.trials,
        trials=trials,
        rstate=np.random.default_rng(args.seed),
        show_progressbar=False,
    )
    wall = time.time() - started
    ends = [
        (r["ended"] - started, -r["loss"]) for r in trials.results if r.get("status") == STATUS_OK
    ]
    return {
        "wall": wall,
        "best": max(v for _, v in ends),
        "curve": _best_so_far(ends),
        "epochs": len(ends) * args.epochs,
        "states": {"COMPLETE": len(ends)},
    }


def _best_so_far(ends: list[tuple[float, float]]) -> list[tuple[float, float]]:
    curve, best = [], float("-inf")
    for at, value in sorted(ends):
        best = max(best, value)
        curve.append((at, best))
    return curve


def _within(curve: list[tuple[float, float]], best: float, points: float = 0.005) -> float:
    return next(at for at, value in curve if value >= best - points)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ways", nargs="+", default=["sequential", "search", "sparktrials"])
    parser.add_argument("--png", default=None, help="plot best-so-far against time")
    args = parser.parse_args()

    import optuna
    from pyspark.sql import SparkSession

    from examples.digits import digits_arrays, digits_frames

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    train, test = digits_frames(spark)
    train, test = train.cache(), test.cache()
    train.count(), test.count()
    runs: dict[str, dict] = {}
    names = {
        "sequential": "sequential (every trial to its end)",
        "search": "sparkdl Search (ASHA, 2 at once)",
        "sparktrials": "Hyperopt SparkTrials (parallelism 2)",
    }
    for way in args.ways:
        if way == "sparktrials":
            runs[way] = run_spark_trials(args, digits_arrays(0))
        else:
            runs[way] = run_search(args, train, test, concurrent=way == "search")
        print(f"{names[way]}: done in {runs[way]['wall']:.1f} s {runs[way]['states']}", flush=True)
    print(
        f"\n{args.trials} trials, {args.epochs} epochs, digits, local[2], seed {args.seed}\n\n"
        "| way | wall s | best val acc | s to within 0.5 pt of its best | epochs trained |\n"
        "|---|---:|---:|---:|---:|"
    )
    for way, got in runs.items():
        print(
            f"| {names[way]} | {got['wall']:.1f} | {got['best']:.4f} | "
            f"{_within(got['curve'], got['best']):.1f} | {got['epochs']} |"
        )
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, axes = plt.subplots(figsize=(6, 4))
        for way, got in runs.items():
            xs, ys = zip(*got["curve"], strict=True)
            axes.step(xs, ys, where="post", label=names[way])
        axes.set_xlabel("seconds since the search started")
        axes.set_ylabel("best validation accuracy so far")
        axes.legend(loc="lower right")
        figure.tight_layout()
        figure.savefig(args.png, dpi=120)
        print(f"\nplot: {args.png}")
    spark.stop()


if __name__ == "__main__":
    main()
