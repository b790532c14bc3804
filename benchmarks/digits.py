"""Plain Keras vs every sparkdl mode x merge on digits, side by side in one process and run.

Same split, same model, 20 epochs, batch 32, 2 workers on ``local[2]``. Prints fit
seconds (SparkSession start excluded), the ratio to plain Keras, test accuracy, updates
per second (pushes of both workers together over the training time, startup excluded)
and two communication shares of the workers' training time:

* ``in calls``: time spent in calls to the parameter service (waiting for other
  workers included), as the SC'17 EASGD paper reports it. With ``overlap`` (the
  default in asynchronous modes) the calls run beside training, so this can pass
  what training lost to them.
* ``waited``: time training stood still for the service; the cost of communicating.

The first sparkdl fit in a session is "cold" (Spark starts Python workers, which import
TensorFlow); it is run first and printed on its own row. Every other row is warm.

The machine is shared and noisy, so the whole set (plain Keras included) runs
``--repeats`` times in turn, and each row shows the median of its runs (accuracy: the
mean, the range and the mean's distance to plain Keras's in points). Repeat r seeds
everything with r (the model's initial weights, plain Keras's and each worker's sample
order), so an accuracy is judged over seeds, not on one lucky or unlucky
initialisation; plain Keras gets the same seeds.

``--backend jax`` runs Keras on JAX (the driver and, after it, the executors);
``benchmarks/backends.py`` runs this once per backend, side by side. ``--connect`` runs
the sparkdl rows on a Spark Connect session (``remote("local[2]")``) instead of a
classic one; ``benchmarks/sessions.py`` runs both, side by side.

Run:
    .venv/bin/python benchmarks/digits.py
    .venv/bin/python benchmarks/digits.py --frequencies epoch --only hogwild/delta
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Spark's Python workers must run this interpreter (the one with sparkdl installed).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.backend import BACKEND, BACKENDS  # sets KERAS_BACKEND: before Keras
from examples.digits import accuracy, digits_arrays, digits_frames, digits_model

#: (mode, merge, extra settings) of every combination.
COMBINATIONS: list[tuple[str, str, dict[str, Any]]] = [
    ("synchronous", "average", {}),
    ("synchronous", "delta", {}),
    ("synchronous", "elastic", {}),
    ("asynchronous", "average", {}),
    ("asynchronous", "delta", {}),
    ("asynchronous", "delta", {"staleness": "inverse"}),
    ("asynchronous", "elastic", {}),
    ("hogwild", "average", {}),
    ("hogwild", "delta", {}),
    ("hogwild", "elastic", {}),
]


def keras_version() -> str:
    import keras

    return str(keras.__version__)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--frequencies", nargs="+", default=["epoch", "batch"])
    parser.add_argument("--only", nargs="*", default=None, help="mode/merge names to run")
    parser.add_argument("--alpha", type=float, default=None, help="elastic_alpha")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each row (median)")
    parser.add_argument("--optimizer", choices=["adam", "sgd", "momentum"], default="adam")
    parser.add_argument("--learning-rate", type=float, default=0.003)
    add_set_argument(parser, "estimator settings for every sparkdl row (e.g. lr_scaling=linear)")
    parser.add_argument("--no-cold", action="store_true", help="skip the cold row")
    parser.add_argument("--backend", choices=BACKENDS, default=BACKEND, help="Keras backend")
    parser.add_argument("--connect", action="store_true", help="a Spark Connect session")
    args = parser.parse_args()
    fixed = {"mode", "merge", "frequency", "num_workers", "epochs", "batch_size", "seed"}
    settings = parse_settings(parser, args.set, fixed)

    def model(seed: int) -> Any:
        return digits_model(seed=seed, learning_rate=args.learning_rate, optimizer=args.optimizer)

    from pyspark.sql import SparkSession

    from sparkdl import KerasEstimator

    x_train, x_test, y_train, y_test = digits_arrays()
    runs: dict[str, list[tuple[float, float, float | None, float | None, float | None]]] = {}

    def plain_keras(seed: int) -> None:
        model = digits_model(seed=seed, learning_rate=args.learning_rate, optimizer=args.optimizer)
        start = time.perf_counter()
        model.fit(x_train, y_train, epochs=args.epochs, batch_size=args.batch_size, verbose=0)
        seconds = time.perf_counter() - start
        acc = accuracy(model, x_test, y_test)
        record("plain Keras (1 process)", seconds, acc, None, None, None)

    def record(name: str, *figures: Any) -> None:
        runs.setdefault(name, []).append(figures)
        print(f"{name}: {figures[0]:.2f} s, acc {figures[1]:.4f}", file=sys.stderr, flush=True)

    plain_keras(0)

    builder = SparkSession.builder
    spark = (
        (builder.remote("local[2]") if args.connect else builder.master("local[2]"))
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    if not args.connect:
        spark.sparkContext.setLogLevel("ERROR")
    train_df, _ = digits_frames(spark, partitions=2)
    train_df = train_df.cache()
    train_df.count()

    def run(mode: str, merge: str, frequency: str | int, extra: dict[str, Any], seed: int) -> tuple:
        if merge == "elastic" and args.alpha is not None:
            extra = {**extra, "elastic_alpha": args.alpha}
        est = KerasEstimator(
            model=model(seed),
            mode=mode,
            merge=merge,
            frequency=frequency,
            num_workers=2,
            epochs=args.epochs,
            batch_size=args.batch_size,
            seed=seed,
            **{**settings, **extra},
        )
        start = time.perf_counter()
        fitted = est.fit(train_df)
        seconds = time.perf_counter() - start
        report = fitted.fit_report
        pushes = sum(w["syncs"] for w in report["workers"])
        train = max(w["train_seconds"] for w in report["workers"])
        trained = sum(w["train_seconds"] for w in report["workers"])
        waited = sum(w["wait_seconds"] for w in report["workers"])
        return (
            seconds,
            accuracy(fitted.get_model(), x_test, y_test),
            pushes / train if train > 0 else None,
            report["communication_share"],
            waited / trained if trained > 0 else None,
        )

    if not args.no_cold:
        cold = run("synchronous", "average", "epoch", {}, 0)
        record("synchronous/average, frequency=epoch (cold)", *cold)
    for repeat in range(args.repeats):
        if repeat:
            plain_keras(repeat)
        for frequency in args.frequencies:
            freq: str | int = int(frequency) if frequency.isdigit() else frequency
            for mode, merge, extra in COMBINATIONS:
                if args.only and f"{mode}/{merge}" not in args.only:
                    continue
                name = f"{mode}/{merge}" + "".join(f", {k}={v}" for k, v in extra.items())
                figures = run(mode, merge, freq, extra, repeat)
                record(f"{name}, frequency={frequency}", *figures)
    spark.stop()

    print(
        f"\ndigits: {len(x_train)} train / {len(x_test)} test rows, {args.epochs} epochs, "
        f"batch {args.batch_size}, {args.optimizer} {args.learning_rate}, 2 workers, local[2], "
        f"{args.repeats} runs, seeds 0-{args.repeats - 1} (fit s: median; accuracy: mean); "
        f"Keras {keras_version()} on {BACKEND}; "
        f"settings {settings}\n"
    )
    keras_seconds = statistics.median(r[0] for r in runs["plain Keras (1 process)"])
    keras_acc = statistics.mean(r[1] for r in runs["plain Keras (1 process)"])
    print(
        "| run | fit s | x Keras | mean test acc (range) | vs Keras, pt | updates/s "
        "| in calls | waited |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, figures in runs.items():
        seconds = statistics.median(f[0] for f in figures)
        accs = [f[1] for f in figures]
        spread = f" ({min(accs):.4f}-{max(accs):.4f})" if len(accs) > 1 else ""
        rates = [f[2] for f in figures if f[2] is not None]
        updates = f"{statistics.median(rates):.0f}" if rates else ""
        mean = statistics.mean(accs)
        print(
            f"| {name} | {seconds:.2f} | {seconds / keras_seconds:.2f} | "
            f"{mean:.4f}{spread} | {100 * (mean - keras_acc):+.2f} | {updates} | "
            f"{_share(figures, 3)} | {_share(figures, 4)} |"
        )


def add_set_argument(parser: argparse.ArgumentParser, help: str) -> None:
    """``--set KEY=VALUE ...``, repeatable (read with :func:`parse_settings`)."""
    parser.add_argument(
        "--set", nargs="*", action="extend", default=[], metavar="KEY=VALUE", help=help
    )


def parse_settings(
    parser: argparse.ArgumentParser, items: list[str], fixed: set[str]
) -> dict[str, Any]:
    """``--set KEY=VALUE`` items as estimator settings, checked before any training:
    each must have ``=``, name a setting of ``KerasEstimator`` and not one the
    benchmark sets itself (``fixed``)."""
    from sparkdl.config import setting_fields

    known = {f.name for f in setting_fields()} - fixed
    settings = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in known:
            parser.error(f"--set takes KEY=VALUE with KEY among {sorted(known)}; received {item!r}")
        settings[key] = _value(value)
    return settings


def _value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    words = {"None": None, "true": True, "True": True, "false": False, "False": False}
    return words.get(text, text)


def _share(figures: list[tuple[Any, ...]], index: int) -> str:
    values = [f[index] for f in figures if f[index] is not None]
    return f"{statistics.median(values):.1%}" if values else ""


if __name__ == "__main__":
    main()
