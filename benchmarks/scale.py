"""Data at scale: throughput and worker memory of ``data_cache="memory"`` and ``"disk"``.

The data is a synthetic "teacher" table: 100 float32 features (standard normal), and as
label the arg-max of a fixed random network (100-64 tanh-10, numpy, seeded) over them.
It is written to Parquet under ``--workdir`` as an ``array<float>`` column ``features``
and an ``int`` column ``label``, in 16 files (a multiple of 16 for large tables, at most
``--chunk-rows`` rows each, written one file at a time), with row groups of 16k rows, as
a user's table would be. A table already written with the same rows and seed is reused
(delete the work dir to free the disk). Test accuracy is measured on 10k held-out rows
of the same teacher. Every fit reads the table with ``spark.read.parquet`` (nothing
cached by Spark): each worker reads and caches its share itself.

Two sections (``--only scale|memory``; both by default):

* scale (``--rows``, total rows): for each row count, single-process Keras (``model.fit``
  on numpy arrays of the same rows in this process; skipped above ``--keras-max-rows``)
  and sparkdl fits with ``data_cache="memory"`` and ``"disk"``: MLP 100-512-512-10,
  Adam 1e-3, ``--epochs``, ``--batch-size``, ``--workers`` workers on ``--master``.
  Figures per run:

  - ``samples/s``: rows x epochs over the training seconds (sparkdl: ``fit_report``'s
    ``train_seconds``, the slowest worker's training loop; Keras: the wall time of
    ``model.fit``); ``x Keras``: its ratio to Keras's samples/s;
  - ``fit s``: the whole fit (sparkdl: ``fit_report["seconds"]``);
  - ``peak RSS``, ``partition``, ``RSS / data``: of the worker with the highest peak:
    its process's peak resident memory during its task (``peak_rss_bytes``), the bytes
    of its cached partition (``data_bytes``) and their ratio (this includes TensorFlow,
    about 0.5-1 GB, so it falls towards 1 as partitions grow in memory mode);
  - ``prepare s``: the driver's checks before the training job (``prepare_seconds``);
    ``data s``: the slowest worker reading and caching its partition (``data_seconds``).

* memory (``--memory-rows``, rows PER WORKER; ``--memory-epochs``): for each size and
  cache mode, a fresh Spark session runs an "idle" fit (the same model on
  ``--idle-rows`` rows per worker, same cache mode), the fit on the full table, and
  the idle fit again. ``growth`` is a worker's peak RSS in the full fit less the idle
  fits' peak (the mean over the idle workers of both), for the worker that grew most;
  ``partition`` is that worker's rows x 101 x 4 bytes (float32 features and label).
  The idle fits bracket the measured one because a worker's memory drifts up by a few
  MB with every model it fits, whatever the data: plain Keras does it too (8 fresh
  models of 100-512-10 fitted in turn in one process grew its RSS by ~5 MB each, with
  ``keras.backend.clear_session()`` between them). Targets:

  - memory mode: ``growth / partition`` <= 1.25 (the partition costs its own bytes);
  - disk mode: ``growth`` <= 300 MB whatever the size (memory does not grow with data);
  - disk-mode samples/s >= 90% of memory mode's on the same data.

  Growth includes fixed costs (record batches in flight, TensorFlow's buffers for a
  larger dataset), some tens of MB, so ``growth / partition`` is only meaningful for
  partitions of hundreds of MB and more; at small test sizes it reads far above 1.25.

Each sparkdl measurement runs in its own Spark session (a fresh pair of Python workers),
so memory a worker kept from an earlier, larger fit never hides or inflates a peak; the
idle fit also warms the workers (TensorFlow imported) before the measured fit. The
machine may be shared and the figures are of one run each.

``--backend jax`` runs Keras on JAX; ``benchmarks/backends.py --bench scale`` runs it once
per backend, side by side.

Run (the full benchmark: roughly 1.5-2.5 hours on 2 cores, most of it the fits of 4M rows
per worker, which need ~2 x 1.6 GB of memory; the tables take ~6 GB of disk.
``--memory-hidden 64`` makes the memory section several times faster):
    .venv/bin/python benchmarks/scale.py
    .venv/bin/python benchmarks/scale.py --only memory --memory-rows 100000,1000000
    .venv/bin/python benchmarks/scale.py --rows 20000 --epochs 1 --memory-rows 5000,20000
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import importlib
import json
import math
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Spark's Python workers must run this interpreter (the one with sparkdl installed).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from benchmarks.backend import BACKEND, BACKENDS  # sets KERAS_BACKEND: before Keras
from benchmarks.digits import add_set_argument, parse_settings

if TYPE_CHECKING:
    import keras
    from pyspark.sql import SparkSession

#: Feature columns and classes of the teacher data.
FEATURES = 100
CLASSES = 10
#: Hidden units of the teacher network.
TEACHER_HIDDEN = 64
#: Bytes a row costs in a worker's cache: float32 features and a 4-byte label.
ROW_BYTES = (FEATURES + 1) * 4
#: Files of a table come in multiples of this (input partitions divide among workers).
FILES_STEP = 16
#: Rows per Parquet row group.
ROW_GROUP_ROWS = 16_384
#: Version of the generator; a table written by another version is rewritten.
DATA_VERSION = 1
#: The marker file of a complete table (Spark skips names starting with "_").
MARKER = "_teacher.json"
#: Random streams of the teacher's weights, the table's files and the test rows.
TEACHER_STREAM, TABLE_STREAM, TEST_STREAM = 0, 1, 2
#: Cache modes compared.
CACHES = ("memory", "disk")
MB = 1 << 20


# ---------------------------------------------------------------- the data


def teacher_weights(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The teacher network's two weight matrices (100 x 64, 64 x 10)."""
    rng = np.random.default_rng([seed, TEACHER_STREAM])
    w1 = rng.standard_normal((FEATURES, TEACHER_HIDDEN), dtype=np.float32)
    w2 = rng.standard_normal((TEACHER_HIDDEN, CLASSES), dtype=np.float32)
    return w1 / np.sqrt(FEATURES), w2 / np.sqrt(TEACHER_HIDDEN)


def teacher_rows(
    weights: tuple[np.ndarray, np.ndarray], rng: np.random.Generator, rows: int
) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` standard-normal feature rows and the teacher's class for each."""
    x = rng.standard_normal((rows, FEATURES), dtype=np.float32)
    logits = np.tanh(x @ weights[0]) @ weights[1]
    return x, logits.argmax(axis=1).astype(np.int32)


def test_rows(seed: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Held-out rows of the same teacher (a random stream no table file uses)."""
    return teacher_rows(teacher_weights(seed), np.random.default_rng([seed, TEST_STREAM]), rows)


def teacher_table(workdir: str, rows: int, seed: int, chunk_rows: int) -> str:
    """The directory of the Parquet table of ``rows`` teacher rows, written if missing.

    The files are written one at a time into a scratch directory that is renamed into
    place when complete, so an interrupted run never leaves a table that looks whole.
    """
    path = os.path.join(workdir, f"teacher-{rows}-seed{seed}")
    meta = {"rows": rows, "seed": seed, "features": FEATURES, "version": DATA_VERSION}
    marker = os.path.join(path, MARKER)
    if os.path.exists(marker):
        with open(marker) as f:
            if json.load(f) == meta:
                return path
    shutil.rmtree(path, ignore_errors=True)
    started = time.perf_counter()
    scratch = f"{path}.partial-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    weights = teacher_weights(seed)
    files = FILES_STEP * max(1, math.ceil(rows / (FILES_STEP * chunk_rows)))
    bounds = np.linspace(0, rows, files + 1).astype(np.int64)
    for i in range(files):
        n = int(bounds[i + 1] - bounds[i])
        rng = np.random.default_rng([seed, TABLE_STREAM, i])
        x, y = teacher_rows(weights, rng, n)
        offsets = pa.array(np.arange(0, (n + 1) * FEATURES, FEATURES, dtype=np.int32))
        table = pa.table(
            {
                "features": pa.ListArray.from_arrays(offsets, pa.array(x.reshape(-1))),
                "label": pa.array(y),
            }
        )
        pq.write_table(
            table, os.path.join(scratch, f"part-{i:05d}.parquet"), row_group_size=ROW_GROUP_ROWS
        )
        del x, y, table
    with open(os.path.join(scratch, MARKER), "w") as f:
        json.dump(meta, f)
    os.rename(scratch, path)
    log(
        f"wrote {rows:,} rows in {files} files to {path} "
        f"({table_bytes(path) / MB:,.0f} MB, {time.perf_counter() - started:.1f} s)"
    )
    return path


def table_bytes(path: str) -> int:
    """Bytes of a table's Parquet files."""
    return sum(
        os.path.getsize(os.path.join(path, name))
        for name in os.listdir(path)
        if name.endswith(".parquet")
    )


def table_arrays(path: str, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """A table's rows as numpy arrays (for single-process Keras), read file by file."""
    x = np.empty((rows, FEATURES), np.float32)
    y = np.empty(rows, np.int32)
    at = 0
    for name in sorted(n for n in os.listdir(path) if n.endswith(".parquet")):
        table = pq.read_table(os.path.join(path, name))
        n = table.num_rows
        x[at : at + n] = pc.list_flatten(table.column("features")).to_numpy().reshape(n, -1)
        y[at : at + n] = table.column("label").to_numpy()
        at += n
    if at != rows:
        raise RuntimeError(f"Expected {rows} rows in {path}. Received: {at} rows.")
    return x, y


# ---------------------------------------------------------------- the runs


@dataclass
class Run:
    """One fit's figures."""

    rows: int
    run: str
    cache: str
    epochs: int
    fit_seconds: float
    train_seconds: float
    accuracy: float | None = None
    prepare_seconds: float | None = None
    data_seconds: float | None = None
    workers: list[dict[str, Any]] = field(default_factory=list)
    idle: list[dict[str, Any]] = field(default_factory=list)

    @property
    def samples_per_second(self) -> float:
        return self.rows * self.epochs / self.train_seconds if self.train_seconds > 0 else 0.0

    @property
    def peak_worker(self) -> dict[str, Any]:
        """The report of the worker with the highest peak RSS."""
        return max(self.workers, key=lambda w: w["peak_rss_bytes"])

    @property
    def idle_rss(self) -> float:
        """Mean peak RSS of the idle fit's workers."""
        return statistics.mean(w["peak_rss_bytes"] for w in self.idle)

    @property
    def growth(self) -> tuple[float, int]:
        """The largest growth of a worker's peak RSS over the idle workers', and that
        worker's rows."""
        worker = max(self.workers, key=lambda w: w["peak_rss_bytes"])
        return worker["peak_rss_bytes"] - self.idle_rss, int(worker["rows"])

    @property
    def rows_per_worker(self) -> str:
        rows = [int(w["rows"]) for w in self.workers]
        low, high = min(rows), max(rows)
        return f"{low:,}" if low == high else f"{low:,}-{high:,}"


def build_model(hidden: Sequence[int], seed: int) -> keras.Model:
    """The MLP 100-hidden...-10 (relu, softmax), Adam 1e-3, compiled."""
    import keras

    keras.utils.set_random_seed(seed)
    layers: list[Any] = [keras.Input((FEATURES,))]
    layers += [keras.layers.Dense(units, activation="relu") for units in hidden]
    layers.append(keras.layers.Dense(CLASSES, activation="softmax"))
    model = keras.Sequential(layers)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def accuracy(model: keras.Model, test: tuple[np.ndarray, np.ndarray]) -> float:
    """Test accuracy of ``model`` on ``test``."""
    predicted = model.predict(test[0], batch_size=4096, verbose=0).argmax(axis=1)
    return float((predicted == test[1]).mean())


def keras_fit(
    path: str, rows: int, args: argparse.Namespace, test: tuple[np.ndarray, np.ndarray]
) -> Run:
    """Single-process Keras on the table's rows, in this process."""
    x, y = table_arrays(path, rows)
    model = build_model(args.hidden, args.seed)
    started = time.perf_counter()
    model.fit(x, y, epochs=args.epochs, batch_size=args.batch_size, verbose=0)
    seconds = time.perf_counter() - started
    run = Run(rows, "Keras (1 process)", "", args.epochs, seconds, seconds, accuracy(model, test))
    del x, y, model
    gc.collect()
    return run


@contextlib.contextmanager
def spark_session(args: argparse.Namespace) -> Iterator[SparkSession]:
    """A Spark session for one measurement, stopped (its Python workers with it) after.

    ``spark.driver.memory`` takes effect when the first session starts the JVM.
    """
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    spark = (
        (builder.remote(args.master) if args.connect else builder.master(args.master))
        .appName("sparkdl-scale")
        .config("spark.driver.memory", args.driver_memory)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    if not args.connect:
        spark.sparkContext.setLogLevel("ERROR")
    try:
        yield spark
    finally:
        spark.stop()


def sparkdl_fit(
    spark: SparkSession,
    path: str,
    cache: str,
    hidden: Sequence[int],
    epochs: int,
    args: argparse.Namespace,
    test: tuple[np.ndarray, np.ndarray] | None = None,
) -> Run:
    """One sparkdl fit on the Parquet table at ``path``."""
    from sparkdl import KerasEstimator

    frequency: str | int = int(args.frequency) if args.frequency.isdigit() else args.frequency
    estimator = KerasEstimator(
        model=build_model(hidden, args.seed),
        features_col="features",
        label_col="label",
        epochs=epochs,
        batch_size=args.batch_size,
        num_workers=args.workers,
        mode=args.mode,
        frequency=frequency,
        data_cache=cache,
        seed=args.seed,
        **args.settings,
    )
    fitted = estimator.fit(spark.read.parquet(path))
    report = fitted.fit_report
    return Run(
        rows=int(report["rows"]),
        run="sparkdl",
        cache=cache,
        epochs=epochs,
        fit_seconds=float(report["seconds"]),
        train_seconds=float(report["train_seconds"]),
        accuracy=accuracy(fitted.get_model(), test) if test is not None else None,
        prepare_seconds=float(report["prepare_seconds"]),
        data_seconds=float(report["data_seconds"]),
        workers=list(report["workers"]),
    )


def measured_fit(
    args: argparse.Namespace,
    path: str,
    idle_path: str,
    cache: str,
    hidden: Sequence[int],
    epochs: int,
    test: tuple[np.ndarray, np.ndarray] | None = None,
) -> Run:
    """In a fresh session: an idle fit on ``idle_path``, the fit on ``path``, and another
    idle fit (the idle fits bracket the measured one: see the module docstring)."""
    with spark_session(args) as spark:
        before = sparkdl_fit(spark, idle_path, cache, hidden, epochs, args)
        run = sparkdl_fit(spark, path, cache, hidden, epochs, args, test)
        after = sparkdl_fit(spark, idle_path, cache, hidden, epochs, args)
    run.idle = before.workers + after.workers
    return run


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def describe(run: Run) -> str:
    text = (
        f"{run.run} {run.cache or ''} {run.rows:,} rows: {run.samples_per_second:,.0f} "
        f"samples/s, fit {run.fit_seconds:.1f} s"
    )
    if run.workers:
        worker = run.peak_worker
        text += (
            f", rows/worker {run.rows_per_worker}, peak RSS "
            f"{worker['peak_rss_bytes'] / MB:,.0f} MB, data {worker['data_bytes'] / MB:,.0f} MB"
            f" ({worker['cache_mode']})"
        )
    if run.idle:
        text += f", idle RSS {run.idle_rss / MB:,.0f} MB"
    if run.accuracy is not None:
        text += f", acc {run.accuracy:.4f}"
    return text


# ---------------------------------------------------------------- the sections


def scale_section(
    args: argparse.Namespace, idle_path: str, test: tuple[np.ndarray, np.ndarray]
) -> list[Run | str]:
    """Keras, memory and disk fits for each row count (a str: a Keras run skipped)."""
    runs: list[Run | str] = []
    for rows in args.rows:
        path = teacher_table(args.workdir, rows, args.seed, args.chunk_rows)
        if rows > args.keras_max_rows:
            gb = rows * FEATURES * 4 / (1 << 30)
            note = (
                f"Keras skipped at {rows:,} rows: {gb:.1f} GB of features in one process "
                f"(> --keras-max-rows {args.keras_max_rows:,})"
            )
            log(note)
            runs.append(note)
        else:
            baseline = keras_fit(path, rows, args, test)
            log(describe(baseline))
            runs.append(baseline)
        for cache in CACHES:
            run = measured_fit(args, path, idle_path, cache, args.hidden, args.epochs, test)
            log(describe(run))
            runs.append(run)
    return runs


def memory_section(args: argparse.Namespace, idle_path: str) -> list[tuple[Run, Run]]:
    """(memory run, disk run) for each size in rows per worker."""
    pairs = []
    for per_worker in args.memory_rows:
        path = teacher_table(args.workdir, per_worker * args.workers, args.seed, args.chunk_rows)
        runs = []
        for cache in CACHES:
            runs.append(
                measured_fit(args, path, idle_path, cache, args.memory_hidden, args.memory_epochs)
            )
            log(describe(runs[-1]))
        pairs.append((runs[0], runs[1]))
    return pairs


def print_scale(runs: list[Run | str], args: argparse.Namespace) -> None:
    print(
        f"\nScale: MLP {mlp(args.hidden)}, {args.epochs} epochs, batch {args.batch_size}, "
        f"{args.workers} workers ({args.mode}, frequency={args.frequency}), {args.master}\n"
    )
    print(
        "| rows | run | samples/s | x Keras | fit s | rows / worker | peak RSS MB | "
        "partition MB | RSS / data | prepare s | data s | test acc |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    keras_rate: float | None = None
    notes = []
    for run in runs:
        if isinstance(run, str):
            keras_rate = None
            notes.append(run)
            continue
        if not run.workers:
            keras_rate = run.samples_per_second
            print(
                f"| {run.rows:,} | {run.run} | {run.samples_per_second:,.0f} | 1.00 | "
                f"{run.fit_seconds:.1f} |  |  |  |  |  |  | {run.accuracy:.4f} |"
            )
            continue
        worker = run.peak_worker
        ratio = f"{run.samples_per_second / keras_rate:.2f}" if keras_rate else ""
        rss, data = worker["peak_rss_bytes"], worker["data_bytes"]
        print(
            f"| {run.rows:,} | sparkdl, {run.cache} | {run.samples_per_second:,.0f} | {ratio} | "
            f"{run.fit_seconds:.1f} | {run.rows_per_worker} | {rss / MB:,.0f} | "
            f"{data / MB:,.0f} | {rss / data if data else 0:.2f} | "
            f"{run.prepare_seconds:.1f} | {run.data_seconds:.1f} | {run.accuracy:.4f} |"
        )
    for note in notes:
        print(f"\n{note}.")


def print_memory(pairs: list[tuple[Run, Run]], args: argparse.Namespace) -> None:
    print(
        f"\nMemory: growth of a worker's peak RSS over an idle worker (same model on "
        f"{args.idle_rows:,} rows per worker, same session and cache mode); MLP "
        f"{mlp(args.memory_hidden)}, {args.memory_epochs} epoch(s), batch {args.batch_size}, "
        f"{args.workers} workers ({args.mode}, frequency={args.frequency}), {args.master}\n"
    )
    print(
        "| rows / worker | partition MB | idle RSS MB | memory: growth MB | "
        "growth / partition (<= 1.25) | disk: growth MB (<= 300) | memory samples/s | "
        "disk samples/s | disk / memory (>= 90%) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    missed = []
    for memory, disk in pairs:
        grown, rows = memory.growth
        partition = rows * ROW_BYTES
        disk_grown, _ = disk.growth
        share = disk.samples_per_second / memory.samples_per_second
        per_worker = memory.rows_per_worker
        print(
            f"| {per_worker} | {partition / MB:,.0f} | {memory.idle_rss / MB:,.0f} | "
            f"{grown / MB:,.0f} | {grown / partition:.2f} | {disk_grown / MB:,.0f} | "
            f"{memory.samples_per_second:,.0f} | {disk.samples_per_second:,.0f} | {share:.0%} |"
        )
        if grown / partition > 1.25:
            missed.append(f"{per_worker} rows/worker: memory growth {grown / partition:.2f}x")
        if disk_grown > 300 * MB:
            missed.append(f"{per_worker} rows/worker: disk growth {disk_grown / MB:,.0f} MB")
        if share < 0.9:
            missed.append(f"{per_worker} rows/worker: disk at {share:.0%} of memory")
    print("\nTargets missed: " + ("; ".join(missed) if missed else "none") + ".")


def mlp(hidden: Sequence[int]) -> str:
    return "-".join(str(n) for n in [FEATURES, *hidden, CLASSES])


def print_run_line(args: argparse.Namespace) -> None:
    import keras
    import pyspark

    backend = importlib.import_module(BACKEND)  # tensorflow, jax or torch
    command = shlex.join([".venv/bin/python", "benchmarks/scale.py", *sys.argv[1:]])
    print(
        f"\nRun: `{command}` on {os.cpu_count()} cores, Spark master {args.master} "
        f"({args.workers} workers), Spark {pyspark.__version__}, Keras {keras.__version__} "
        f"on {BACKEND} {backend.__version__}, {datetime.date.today().isoformat()}; data in "
        f"{args.workdir}."
    )


def int_list(text: str) -> list[int]:
    return [int(part.replace("_", "")) for part in text.split(",") if part.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int_list, default=[200_000, 2_000_000], help="total rows")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--hidden", type=int_list, default=[512, 512], help="hidden units")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--mode", default="asynchronous")
    parser.add_argument("--frequency", default="epoch", help="epoch, batch or N batches")
    parser.add_argument(
        "--memory-rows",
        type=int_list,
        default=[100_000, 1_000_000, 4_000_000],
        help="rows PER WORKER of the memory section",
    )
    parser.add_argument("--memory-epochs", type=int, default=1)
    parser.add_argument("--memory-hidden", type=int_list, default=None, help="default: --hidden")
    parser.add_argument("--idle-rows", type=int, default=2_000, help="rows per idle worker")
    parser.add_argument("--keras-max-rows", type=int, default=4_000_000)
    parser.add_argument("--test-rows", type=int, default=10_000)
    parser.add_argument("--only", choices=["scale", "memory"], default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chunk-rows", type=int, default=200_000, help="rows per file at most")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "sparkdl-scale"))
    parser.add_argument("--backend", choices=BACKENDS, default=BACKEND, help="Keras backend")
    parser.add_argument("--connect", action="store_true", help="a Spark Connect session")
    add_set_argument(
        parser, "estimator settings for every sparkdl fit (e.g. service_placement=cluster)"
    )
    args = parser.parse_args()
    fixed = {"epochs", "batch_size", "num_workers", "mode", "frequency", "data_cache", "seed"}
    args.settings = parse_settings(parser, args.set, fixed | {"features_col", "label_col"})
    if args.memory_hidden is None:
        args.memory_hidden = args.hidden
    os.makedirs(args.workdir, exist_ok=True)
    if BACKEND == "tensorflow":
        import tensorflow as tf

        tf.get_logger().setLevel("ERROR")  # predict's retracing warnings, one per model

    idle_path = teacher_table(args.workdir, args.idle_rows * args.workers, args.seed, 10**9)
    scale: list[Run | str] = []
    memory: list[tuple[Run, Run]] = []
    if args.only in (None, "scale"):
        test = test_rows(args.seed, args.test_rows)
        scale = scale_section(args, idle_path, test)
    if args.only in (None, "memory"):
        memory = memory_section(args, idle_path)
    if scale:
        print_scale(scale, args)
    if memory:
        print_memory(memory, args)
    print_run_line(args)


if __name__ == "__main__":
    main()
