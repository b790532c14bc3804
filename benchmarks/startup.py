"""The first fit of a session: sparkdl against plain Keras and Elephas, each in a fresh process.

A data scientist's first fit pays for what later fits find ready: Spark's first job,
Python workers started, TensorFlow imported in each. This benchmark runs every
contender in a new Python process with a new ``local[2]`` SparkSession, so every run
is a first fit, on digits with the demo's settings (MLP 64-64-10, Adam 0.003, 20
epochs, batch 32, 2 workers, seed 0):

* ``keras``: plain ``model.fit`` on the driver's arrays (no Spark).
* ``sparkdl``: ``KerasEstimator(...).fit(df)`` as a script would call it (the fit starts
  the warm-up of the Python workers itself).
* ``sparkdl, warm_up first``: as the demo and a notebook's first cell do,
  ``sparkdl.warm_up(spark)`` right after the session starts; the fit comes after the
  DataFrames are built.
* ``sparkdl, after warm_up(spark, wait=True)``: a notebook whose first cell warmed
  the workers a while before the fit's cell runs (the warm-up finished first).
* ``elephas 7.3, <mode>``: Elephas's ``AsynchronousSparkModel(..., mode="asynchronous",
  frequency="epoch").fit(rdd)`` and its synchronous ``SparkModel(...).fit(rdd)`` (one
  Spark job per epoch), the RDD from ``to_simple_rdd``, when ``--elephas-path`` names a
  directory holding the ``elephas`` package
  (``pip install --no-deps --target DIR elephas==7.3.0``; it runs with this project's
  TensorFlow, Keras and Spark, newer than its metadata asks for).

``fit s`` is the fit call alone (the session, the data and the compiled model exist
before it, as in a notebook); ``from start s`` runs from the process's start (imports,
session, data, model, fit). The contenders run in turn, ``--repeats`` times, and each
row prints the median and the range: the machine is shared and noisy.

Run:
    .venv/bin/python benchmarks/startup.py --repeats 3
    .venv/bin/python benchmarks/startup.py --elephas-path /tmp/elephas --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

STARTED = time.perf_counter()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

EPOCHS, BATCH_SIZE, WORKERS = 20, 32, 2
CONTENDERS = [
    "keras",
    "sparkdl",
    "sparkdl-nowarm",
    "sparkdl-warm",
    "sparkdl-ready",
    "elephas-asynchronous",
    "elephas-synchronous",
]
LABELS = {
    "keras": "plain Keras (1 process)",
    "sparkdl": "sparkdl, synchronous",
    "sparkdl-nowarm": "sparkdl, synchronous, fit's own warm-up off",
    "sparkdl-warm": "sparkdl, synchronous, warm_up(spark) first",
    "sparkdl-ready": "sparkdl, synchronous, after warm_up(spark, wait=True)",
    "elephas-asynchronous": "elephas 7.3, asynchronous",
    "elephas-synchronous": "elephas 7.3, synchronous",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--elephas-path", default=None, help="directory holding elephas")
    parser.add_argument("--only", nargs="*", default=None, choices=CONTENDERS)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child)), flush=True)
        return

    names = args.only or [n for n in CONTENDERS if args.elephas_path or "elephas" not in n]
    runs: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for repeat in range(args.repeats):
        for name in names:
            result = run_child(name, args.elephas_path)
            runs[name].append(result)
            parts = "".join(
                f", {part} {result[part]:.2f}" for part in BREAKDOWN_PARTS if part in result
            )
            print(
                f"[{repeat + 1}/{args.repeats}] {name}: fit {result['fit']:.2f} s, from start "
                f"{result['total']:.2f} s, accuracy {result['accuracy']:.3f}{parts}",
                file=sys.stderr,
                flush=True,
            )
    report(runs)


def run_child(name: str, elephas_path: str | None) -> dict[str, float]:
    """Runs one contender in a fresh interpreter; its figures."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3"))
    if elephas_path and name.startswith("elephas"):
        env["PYTHONPATH"] = os.pathsep.join([elephas_path, env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", name],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[len("RESULT ") :]))
    raise RuntimeError(f"{name} failed ({done.returncode}):\n{done.stderr[-4000:]}")


def child(name: str) -> dict[str, float]:
    """One contender's first fit in this (fresh) process."""
    from examples.digits import accuracy, digits_arrays, digits_model

    x_train, x_test, y_train, y_test = digits_arrays()
    if name == "keras":
        model = digits_model(seed=0)
        start = time.perf_counter()
        model.fit(x_train, y_train, epochs=EPOCHS, batch_size=BATCH_SIZE, verbose=0)
        fit = time.perf_counter() - start
        return figures(fit, accuracy(model, x_test, y_test))

    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(f"local[{WORKERS}]")
        .appName(f"startup-{name}")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        if name.startswith("sparkdl"):
            warm = {"sparkdl-warm": "start", "sparkdl-ready": "wait"}.get(name)
            if name == "sparkdl-nowarm":
                import sparkdl.estimator

                sparkdl.estimator.warm_up = lambda spark, **settings: None  # type: ignore
            fit, trained = sparkdl_fit(spark, warm=warm)
        else:
            fit, trained = elephas_fit(spark, name.split("-")[1], x_train, y_train)
        return figures(fit, accuracy(trained, x_test, y_test))
    finally:
        spark.stop()


def sparkdl_fit(spark: Any, *, warm: str | None) -> tuple[float, Any]:
    """The demo's fit; ``warm``: ``sparkdl.warm_up`` right after the session starts
    (``"start"``), or run to its end (``"wait"``)."""
    import sparkdl
    from examples.digits import digits_frames, digits_model

    if warm:
        sparkdl.warm_up(spark, wait=warm == "wait")
    train_df, _ = digits_frames(spark, partitions=WORKERS)
    estimator = sparkdl.KerasEstimator(
        model=digits_model(seed=0),
        features_col="features",
        label_col="label",
        mode="synchronous",
        frequency="epoch",
        num_workers=WORKERS,
        epochs=EPOCHS,
        batch_size=BATCH_SIZE,
        seed=0,
    )
    start, wall = time.perf_counter(), time.time()
    fitted = estimator.fit(train_df)
    seconds = time.perf_counter() - start
    report = fitted.fit_report
    workers = report["workers"]
    BREAKDOWN.update(
        prepare=report["prepare_seconds"],
        task_start=min(w["started_at"] for w in workers) - wall,
        imported=max(w["import_seconds"] for w in workers),
        train=report["train_seconds"],
        after=seconds - (max(w["ended_at"] for w in workers) - wall),
    )
    return seconds, fitted.get_model()


def elephas_fit(spark: Any, mode: str, x: Any, y: Any) -> tuple[float, Any]:
    """Elephas 7.3's fit of the same model at epoch frequency: ``SparkModel`` (one Spark
    job per epoch, averaged) or ``AsynchronousSparkModel`` (its HTTP parameter server)."""
    import socket

    from elephas.spark_model import AsynchronousSparkModel, SparkModel
    from elephas.utils.rdd_utils import to_simple_rdd

    from examples.digits import digits_model

    rdd = to_simple_rdd(spark.sparkContext, x, y).repartition(WORKERS)
    if mode == "synchronous":
        model = SparkModel(digits_model(seed=0), num_workers=WORKERS)
    else:
        with socket.socket() as probe:  # a free port for its parameter server
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        model = AsynchronousSparkModel(
            digits_model(seed=0), num_workers=WORKERS, mode=mode, frequency="epoch", port=port
        )
    start = time.perf_counter()
    model.fit(rdd, epochs=EPOCHS, batch_size=BATCH_SIZE, verbose=0, validation_split=0.0)
    return time.perf_counter() - start, model.master_network


#: Where a sparkdl fit's seconds went (from its fit report).
BREAKDOWN: dict[str, float] = {}
#: Its parts, in the order printed.
BREAKDOWN_PARTS = ("prepare", "task_start", "imported", "train", "after")


def figures(fit: float, acc: float) -> dict[str, float]:
    return {"fit": fit, "total": time.perf_counter() - STARTED, "accuracy": acc, **BREAKDOWN}


def report(runs: dict[str, list[dict[str, float]]]) -> None:
    """Prints one row per contender: medians, ranges, ratio to plain Keras."""

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    def spread(name: str, key: str) -> str:
        values = [r[key] for r in runs[name]]
        return f"{median(name, key):.2f} ({min(values):.2f}-{max(values):.2f})"

    keras_fit = median("keras", "fit") if runs.get("keras") else None
    print(f"{'contender':<46} {'fit s':>20} {'vs Keras':>9} {'from start s':>20} {'acc':>6}")
    for name, results in runs.items():
        if not results:
            continue
        ratio = f"{median(name, 'fit') / keras_fit:.2f}x" if keras_fit else "-"
        print(
            f"{LABELS[name]:<46} {spread(name, 'fit'):>20} {ratio:>9} "
            f"{spread(name, 'total'):>20} {median(name, 'accuracy'):>6.3f}"
        )
    print(
        "\nsparkdl's fit seconds (medians): prepare = the driver's checks and plan; "
        "task_start = the fit's start to its first training task's; imported = a task's "
        "start to TensorFlow imported and joined (slowest worker); train = the training "
        "loop (slowest); after = the last task's end to the fit's return"
    )
    for name, results in runs.items():
        if results and "prepare" in results[0]:
            medians = (f"{p} {median(name, p):.2f}" for p in BREAKDOWN_PARTS)
            print(f"{LABELS[name]:<46} " + ", ".join(medians))


if __name__ == "__main__":
    main()
