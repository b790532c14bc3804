"""sparkdl against plain Keras at the user's own settings: a grid of models, optimizers
(at Keras's default learning rate and at 3x) and worker counts, over several seeds.

Each cell trains the same compiled model (same seed, same initial weights) twice: with
``model.fit`` in this process, and with ``KerasEstimator(...).fit`` at sparkdl's
defaults (nothing but ``num_workers``, ``epochs``, ``batch_size`` and ``seed`` given,
plus what ``--set`` adds), on the same training rows; both are scored on the same
held-out rows. It prints, per cell, the mean of each over the seeds and the gap
(sparkdl minus Keras: accuracy points for classifiers, percent of Keras's MAE for the
regression, where lower is better), and whether the gap is within the target: 0.5
points (3% MAE) with 2 workers, 1 point with more.

Data (nothing is downloaded): scikit-learn's digits (1,437 / 360 rows, 64 pixels) for
the classifiers and its diabetes set (331 / 111 rows, 10 features) for the regression.

Models: ``mlp`` (64-64-10), ``cnn`` (a 3x3 convolution over the 8x8 image, then a
dense layer), ``bn`` (dense, BatchNormalization, Dropout), ``regression`` (32-1, MSE).

Run (a cell is two fits per seed; the whole default grid is hundreds of fits):
    .venv/bin/python benchmarks/parity.py --models mlp --optimizers adam --workers 2
    .venv/bin/python benchmarks/parity.py --seeds 5 --out parity.json
    .venv/bin/python benchmarks/parity.py --models mlp --set lr_scaling=linear
    .venv/bin/python benchmarks/parity.py --models bn --workers 8 --large-batch

``--large-batch`` adds a third run per seed: plain Keras with ``workers`` times the
batch and times the learning rate (the linear rule sparkdl's synchronous default
takes), the one-process equivalent of a synchronous fit that syncs every batch. Where
sparkdl's gap to plain Keras is that run's gap too, the cause is the larger global
batch (fewer, larger steps in the same epochs), not how sparkdl merges.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.backend import BACKEND  # sets KERAS_BACKEND: before Keras
from examples.digits import arrow_frame, digits_arrays

MODELS = ("mlp", "cnn", "bn", "regression")
OPTIMIZERS = ("sgd", "adam", "rmsprop")


def build(kind: str, optimizer: str, scale: float, seed: int) -> Any:
    """A compiled model of ``kind`` with ``optimizer`` at ``scale`` x Keras's default
    learning rate, its weights drawn from ``seed``."""
    import keras

    keras.utils.set_random_seed(seed)
    layers = keras.layers
    if kind == "regression":
        body = [keras.Input((10,)), layers.Dense(32, activation="relu"), layers.Dense(1)]
    elif kind == "cnn":
        body = [
            keras.Input((8, 8, 1)),
            layers.Conv2D(16, 3, activation="relu"),
            layers.Flatten(),
            layers.Dense(10, activation="softmax"),
        ]
    elif kind == "bn":
        body = [
            keras.Input((64,)),
            layers.Dense(64),
            layers.BatchNormalization(),
            layers.Activation("relu"),
            layers.Dropout(0.2),
            layers.Dense(10, activation="softmax"),
        ]
    else:
        body = [
            keras.Input((64,)),
            layers.Dense(64, activation="relu"),
            layers.Dense(10, activation="softmax"),
        ]
    model = keras.Sequential(body)
    made = keras.optimizers.get(optimizer)
    made.learning_rate = float(made.learning_rate) * scale
    if kind == "regression":
        model.compile(optimizer=made, loss="mse", metrics=["mae"])
    else:
        model.compile(optimizer=made, loss="sparse_categorical_crossentropy")
    return model


def data(kind: str, test_size: float = 0.2) -> tuple[Any, Any, Any, Any]:
    """``(x_train, x_test, y_train, y_test)`` for a model kind."""
    import numpy as np
    from sklearn.model_selection import train_test_split

    if kind != "regression":
        if test_size == 0.2:
            return digits_arrays(0)
        from sklearn.datasets import load_digits

        x, y = load_digits(return_X_y=True)
        x = (x / 16.0).astype(np.float32)
        return train_test_split(x, y, test_size=test_size, random_state=0, stratify=y)
    from sklearn.datasets import load_diabetes

    x, y = load_diabetes(return_X_y=True)
    x = ((x - x.mean(0)) / x.std(0)).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0)
    return x_train, x_test, y_train.astype(np.float32), y_test.astype(np.float32)


def score(kind: str, model: Any, x: Any, y: Any) -> float:
    """Test accuracy, or test MAE for the regression."""
    import numpy as np

    predicted = model.predict(x, verbose=0, batch_size=1024)
    if kind == "regression":
        return float(np.mean(np.abs(predicted[:, 0] - y)))
    return float(np.mean(np.argmax(predicted, axis=1) == y))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--optimizers", nargs="+", choices=OPTIMIZERS, default=list(OPTIMIZERS))
    parser.add_argument("--scales", nargs="+", type=float, default=[1.0, 3.0])
    parser.add_argument("--workers", nargs="+", type=int, default=[2])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--test-size", type=float, default=0.2, help="digits' held-out share")
    parser.add_argument(
        "--regression-epochs", type=int, default=100, help="epochs of the regression cells"
    )
    parser.add_argument("--set", nargs="*", default=[], help="sparkdl settings, key=value")
    parser.add_argument("--large-batch", action="store_true", help="see the docstring")
    parser.add_argument("--out", default=None, help="write the cells as JSON here")
    args = parser.parse_args()
    settings = {k: _value(v) for k, v in (item.split("=", 1) for item in args.set)}

    import keras
    from pyspark.sql import SparkSession

    from sparkdl import KerasEstimator

    spark = (
        SparkSession.builder.master(f"local[{max(args.workers)}]")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    cells = []
    for kind in args.models:
        x_train, x_test, y_train, y_test = data(kind, args.test_size)
        frame = _frame(spark, kind, x_train, y_train)
        for optimizer in args.optimizers:
            for scale in args.scales:
                for workers in args.workers:
                    cell = _cell(
                        kind,
                        optimizer,
                        scale,
                        workers,
                        args,
                        settings,
                        frame,
                        KerasEstimator,
                        (x_train, x_test, y_train, y_test),
                    )
                    cells.append(cell)
                    print(_row(cell), flush=True)
    spark.stop()
    print(
        f"\n{args.seeds} seeds, {args.epochs} epochs, batch {args.batch_size}, Keras "
        f"{keras.__version__} on {BACKEND}, sparkdl settings {settings or 'defaults'}\n"
    )
    _table(cells, args.large_batch)
    if args.out:
        with open(args.out, "w") as out:
            json.dump({"settings": settings, "args": vars(args), "cells": cells}, out, indent=1)


def _cell(
    kind: str,
    optimizer: str,
    scale: float,
    workers: int,
    args: Any,
    settings: dict[str, Any],
    frame: Any,
    estimator: Any,
    arrays: tuple[Any, Any, Any, Any],
) -> dict[str, Any]:
    """One cell: plain Keras and sparkdl over the seeds."""
    x_train, x_test, _, y_test = arrays
    shape = (-1, 8, 8, 1) if kind == "cnn" else (len(x_train), -1)
    plain, ours, seconds, large = [], [], [], []
    resolved = ""
    epochs = args.regression_epochs if kind == "regression" else args.epochs
    for seed in range(args.seeds):
        plain.append(_plain(kind, optimizer, scale, seed, epochs, args.batch_size, arrays))
        if args.large_batch:  # workers x the batch at workers x the rate
            bigger = (scale * workers, seed, epochs, args.batch_size * workers, arrays)
            large.append(_plain(kind, optimizer, *bigger))
        started = time.perf_counter()
        try:
            fitted = estimator(
                model=build(kind, optimizer, scale, seed),
                num_workers=workers,
                epochs=epochs,
                batch_size=args.batch_size,
                seed=seed,
                **settings,
            ).fit(frame)
        except Exception as exc:  # a diverged fit (the loss became NaN) is a result too
            print(f"{kind} {optimizer} {scale}x seed {seed}: {exc}"[:300], file=sys.stderr)
            ours.append(float("nan"))
            continue
        seconds.append(time.perf_counter() - started)
        test = x_test.reshape((len(x_test), *shape[1:]))
        ours.append(score(kind, fitted.get_model(), test, y_test))
        resolved = fitted.fit_report.get("resolved", {}).get("learning rate", "")
    keras_mean, ours_mean = statistics.mean(plain), statistics.mean(ours)
    gap, within = _gap(kind, workers, keras_mean, ours_mean)
    return {
        "model": kind,
        "optimizer": optimizer,
        "scale": scale,
        "workers": workers,
        "keras": keras_mean,
        "sparkdl": ours_mean,
        "keras_runs": plain,
        "sparkdl_runs": ours,
        "gap": gap,
        "within": within,
        "fit_seconds": statistics.median(seconds) if seconds else None,
        "large_batch": statistics.mean(large) if large else None,
        "large_batch_runs": large,
        "resolved_rate": resolved,
    }


def _frame(spark: Any, kind: str, x_train: Any, y_train: Any) -> Any:
    """The training rows as a cached DataFrame of 2 partitions."""
    if kind == "regression":  # a float target (arrow_frame's label is a class id)
        rows = [(r.tolist(), float(t)) for r, t in zip(x_train, y_train, strict=True)]
        frame = spark.createDataFrame(rows, "features array<float>, label double")
        frame = frame.repartition(2)
    else:
        frame = arrow_frame(spark, x_train, y_train, 2)
    frame = frame.cache()
    frame.count()
    return frame


def _plain(
    kind: str,
    optimizer: str,
    scale: float,
    seed: int,
    epochs: int,
    batch_size: int,
    arrays: tuple[Any, Any, Any, Any],
) -> float:
    """Plain Keras's ``model.fit`` of one seed, scored on the held-out rows."""
    x_train, x_test, y_train, y_test = arrays
    shape = (-1, 8, 8, 1) if kind == "cnn" else (len(x_train), -1)
    model = build(kind, optimizer, scale, seed)
    model.fit(x_train.reshape(shape), y_train, epochs=epochs, batch_size=batch_size, verbose=0)
    return score(kind, model, x_test.reshape((len(x_test), *shape[1:])), y_test)


def _gap(kind: str, workers: int, keras: float, ours: float) -> tuple[float, bool]:
    """sparkdl's gap to plain Keras, and whether it is within the target."""
    if kind == "regression":
        gap = 100 * (ours - keras) / keras  # % of Keras's MAE (lower: better)
        return gap, gap <= (3.0 if workers == 2 else 6.0)
    gap = 100 * (ours - keras)  # accuracy points
    return gap, gap >= (-0.5 if workers == 2 else -1.0)


def _table(cells: list[dict[str, Any]], large_batch: bool) -> None:
    """The cells as a Markdown table."""
    header = "| model | optimizer | lr | workers | Keras | sparkdl | gap | within |"
    rule = "|---|---|---:|---:|---:|---:|---:|---|"
    if large_batch:
        header += " Keras, batch and rate x workers | its gap |"
        rule += "---:|---:|"
    print(header)
    print(rule)
    for cell in cells:
        print(_row(cell))


def _row(cell: dict[str, Any]) -> str:
    unit = "% MAE" if cell["model"] == "regression" else " pt"
    large = cell.get("large_batch")
    extra = ""
    if large is not None:  # the large-batch run and its gap to plain Keras
        keras = cell["keras"]
        gap = 100 * (large - keras)
        if cell["model"] == "regression":  # % of Keras's MAE
            gap /= keras
        extra = f" {large:.4f} | {gap:+.2f}{unit} |"
    return (
        f"| {cell['model']} | {cell['optimizer']} | {cell['scale']:g}x | {cell['workers']} | "
        f"{cell['keras']:.4f} | {cell['sparkdl']:.4f} | {cell['gap']:+.2f}{unit} | "
        f"{'yes' if cell['within'] else 'NO'} |{extra}"
    )


def _value(text: str) -> Any:
    """A ``--set`` value: JSON where it parses (numbers, true, null), else the text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


if __name__ == "__main__":
    main()
