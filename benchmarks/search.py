"""Hyper-parameter search three ways on one budget: one trial after another, sparkdl's
``Search`` (trials at once, ASHA pruning), and Hyperopt's ``SparkTrials``.

The space (the same for all three): the hidden units of an MLP (8 to 128, log) and
Adam's learning rate (3e-4 to 3e-2, log); ``--epochs`` epochs; the objective is the
validation accuracy on held-out rows. ``--workload digits`` (the default): scikit-learn's
digits, 1,437 training and 360 held-out rows, batch 32; ``--workload teacher``: rows of
``benchmarks/scale.py``'s fixed teacher network (100 features, 10 classes; ``--rows``
training rows, a fifth as many held out), batch 128. ``--trials`` trials each, on
``local[2]``:

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
    .venv/bin/python benchmarks/search.py --workload teacher --rows 20000 --epochs 6
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


def build(units: int, rate: float, features: int = 64) -> Any:
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((features,)),
            keras.layers.Dense(units, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(
        keras.optimizers.Adam(rate), "sparse_categorical_crossentropy", metrics=["accuracy"]
    )
    return model


def make_space(features: int, batch: int) -> Any:
    """The search space over models of ``features`` inputs, with batches of ``batch``."""

    def space(trial: Any) -> dict[str, Any]:
        units = trial.suggest_int("units", *UNITS, log=True)
        rate = trial.suggest_float("learning_rate", *RATES, log=True)
        return {"model": build(units, rate, features), "batch_size": batch}

    return space


space = make_space(64, 32)  # digits


def run_search(args: argparse.Namespace, train: Any, test: Any, *, concurrent: bool) -> dict:
    from sparkdl import KerasEstimator
    from sparkdl.search import Search

    estimator = KerasEstimator(
        model=build(8, 1e-3, args.features),
        features_col="features",
        label_col="label",
        num_workers=1,
        epochs=args.epochs,
    )
    started = time.time()
    result = Search(
        estimator,
        make_space(args.features, args.batch),
        objective="val_accuracy",
        trials=args.trials,
        concurrency=2 if concurrent else 1,
        pruner=_pruner(args) if concurrent else None,
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


def _pruner(args: argparse.Namespace) -> Any:
    """The Search way's pruner: a name, or ASHA with the rungs given."""
    if args.min_resource is None and args.reduction is None:
        return args.pruner
    if args.pruner != "asha":
        raise SystemExit("--min-resource and --reduction set ASHA's rungs: drop --pruner")
    import optuna

    return optuna.pruners.SuccessiveHalvingPruner(
        min_resource=args.min_resource or "auto", reduction_factor=args.reduction or 4
    )


def _pruner_name(args: argparse.Namespace) -> str:
    if args.min_resource is None and args.reduction is None:
        return "ASHA" if args.pruner == "asha" else args.pruner
    return f"ASHA, min_resource {args.min_resource or 'auto'}, reduction {args.reduction or 4}"


def run_spark_trials(args: argparse.Namespace, arrays: tuple) -> dict:
    from hyperopt import STATUS_OK, SparkTrials, fmin, hp, tpe

    x_train, x_test, y_train, y_test = arrays
    epochs, features, batch = args.epochs, args.features, args.batch

    def objective(params: dict) -> dict:
        model = build(int(params["units"]), float(params["learning_rate"]), features)
        model.fit(x_train, y_train, epochs=epochs, batch_size=batch, verbose=0)
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


def teacher_arrays(args: argparse.Namespace) -> tuple:
    """Training and held-out rows of scale.py's teacher: (x_train, x_test, y_train, y_test)."""
    import numpy as np

    from benchmarks.scale import teacher_rows, teacher_weights

    weights = teacher_weights(args.seed)
    x_train, y_train = teacher_rows(weights, np.random.default_rng([args.seed, 1]), args.rows)
    x_test, y_test = teacher_rows(weights, np.random.default_rng([args.seed, 2]), args.rows // 5)
    return x_train, x_test, y_train, y_test


def frames(spark: Any, arrays: tuple) -> tuple[Any, Any]:
    """The training and held-out rows as DataFrames of ``features`` and ``label``."""
    import pandas as pd

    x_train, x_test, y_train, y_test = arrays

    def frame(x: Any, y: Any) -> Any:
        rows = pd.DataFrame({"features": list(x.astype("float32")), "label": y.astype("int64")})
        return spark.createDataFrame(rows, "features array<float>, label long").repartition(2)

    return frame(x_train, y_train), frame(x_test, y_test)


def _best_so_far(ends: list[tuple[float, float]]) -> list[tuple[float, float]]:
    curve, best = [], float("-inf")
    for at, value in sorted(ends):
        best = max(best, value)
        curve.append((at, best))
    return curve


def _within(curve: list[tuple[float, float]], best: float, points: float = 0.005) -> float:
    """Seconds until a finished trial came within ``points`` of ``best`` (inf: never)."""
    return next((at for at, value in curve if value >= best - points), float("inf"))


def _print_table(args: argparse.Namespace, runs: dict[str, dict], names: dict[str, str]) -> None:
    """The ways' figures as a markdown table."""
    print(
        f"\n{args.trials} trials, {args.epochs} epochs, {args.workload}, local[2], "
        f"seed {args.seed}\n\n"
        "| way | wall s | best val acc | s to within 0.5 pt of its best "
        "| s to within 0.5 pt of the sequential best | epochs trained |\n"
        "|---|---:|---:|---:|---:|---:|"
    )
    target = runs["sequential"]["best"] if "sequential" in runs else None
    for way, got in runs.items():
        versus = "" if target is None else f"{_within(got['curve'], target):.1f}"
        print(
            f"| {names[way]} | {got['wall']:.1f} | {got['best']:.4f} | "
            f"{_within(got['curve'], got['best']):.1f} | {versus} | {got['epochs']} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ways", nargs="+", default=["sequential", "search", "sparktrials"])
    parser.add_argument("--png", default=None, help="plot best-so-far against time")
    parser.add_argument("--workload", choices=["digits", "teacher"], default="digits")
    parser.add_argument("--rows", type=int, default=20_000, help="teacher: training rows")
    parser.add_argument("--pruner", default="asha", help="the Search way's pruner: asha, median")
    parser.add_argument("--min-resource", type=int, default=None, help="ASHA's first rung")
    parser.add_argument("--reduction", type=int, default=None, help="ASHA's reduction factor")
    args = parser.parse_args()
    args.features, args.batch = (64, 32) if args.workload == "digits" else (100, 128)

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
    arrays = digits_arrays(0) if args.workload == "digits" else teacher_arrays(args)
    train, test = digits_frames(spark) if args.workload == "digits" else frames(spark, arrays)
    train, test = train.cache(), test.cache()
    train.count(), test.count()
    runs: dict[str, dict] = {}
    names = {
        "sequential": "sequential (every trial to its end)",
        "search": f"sparkdl Search ({_pruner_name(args)}, 2 at once)",
        "sparktrials": "Hyperopt SparkTrials (parallelism 2)",
    }
    for way in args.ways:
        if way == "sparktrials":
            runs[way] = run_spark_trials(args, arrays)
        else:
            runs[way] = run_search(args, train, test, concurrent=way == "search")
        print(f"{names[way]}: done in {runs[way]['wall']:.1f} s {runs[way]['states']}", flush=True)
    _print_table(args, runs, names)
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
