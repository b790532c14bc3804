"""Images: a small CNN on CIFAR-sized images from Spark's image struct and from nested
arrays, against plain Keras on the same numpy arrays, with worker memory.

The data: ``--rows`` synthetic 32 x 32 x 3 uint8 images whose class (of 10) is set by
a fixed random linear "teacher" over their pixels (``--seed``), written once under
``--workdir`` to Parquet in 16 files (Arrow arrays built from numpy buffers, no
per-row Python), in two tables: ``image`` (the struct of ``spark.read.format("image")``:
origin, height, width, nChannels, mode 16, data as bytes) and ``nested``
(``array<array<array<float>>>``, 32 x 32 x 3, the pixels / 255). Every fit reads its
table with ``spark.read.parquet``.

The model: Rescaling (images only), Conv2D 16 -> MaxPool -> Conv2D 32 -> MaxPool ->
Flatten -> Dense 10, Adam 1e-3, batch ``--batch-size``, ``--epochs``.

Rows of the table:

* ``plain Keras``: ``model.fit`` on the numpy arrays (uint8 images, or float32 / 255
  for the nested run), in this process, which may use every core;
* ``sparkdl image, W worker(s)`` / ``sparkdl nested, W worker(s)``: a fit of W workers
  on ``local[C]`` (C: the machine's cores) with ``spark.task.cpus`` C / W, so that
  every run has the cores plain Keras has: one worker gets all C as TensorFlow's
  threads (the same processes per core as plain Keras), two get C / 2 each;
  ``frequency="epoch"``.

Figures: ``samples/s`` (rows x epochs over the training seconds: plain Keras the wall
time of ``model.fit``, sparkdl ``fit_report``'s ``train_seconds``, the slowest
worker's loop), ``x Keras`` (sparkdl's samples/s over plain Keras's, measured in
turn: ``--repeats`` rounds of plain Keras then each sparkdl fit; the median of the
rounds' ratios and their range: plain Keras's own speed varied 1.8x between runs on
the 2-core machine), ``fit s`` (sparkdl's whole fit), and for sparkdl, the largest over
the rounds, the worker with the highest peak: its process's peak RSS,
the bytes of its cached partition (``data_bytes``: uint8 images are 1 byte a value,
nested arrays 4) and the peak's growth over an idle fit of the same model on
``--idle-rows`` rows (the same epochs: a fit's fixed costs include its epochs') in the
same session, per byte of partition (the target: at most 1.25).

Run:
    .venv/bin/python benchmarks/images.py                          # 50k images
    .venv/bin/python benchmarks/images.py --rows 10000 --epochs 1 --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import numpy as np

SIDE, CHANNELS, CLASSES = 32, 3, 10
FILES = 16
MB = 1 << 20


def images(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` uint8 images and their teacher classes."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(rows, SIDE, SIDE, CHANNELS), dtype=np.uint8)
    # A smooth teacher: class from a random projection of 4 x 4-pooled pixels.
    pooled = x.reshape(rows, 8, 4, 8, 4, CHANNELS).mean(axis=(2, 4)).reshape(rows, -1)
    w = np.random.default_rng([seed, 1]).standard_normal((pooled.shape[1], CLASSES))
    y = ((pooled - 127.5) @ w).argmax(axis=1).astype(np.int32)
    return x, y


def write_tables(
    workdir: str, rows: int, seed: int, kinds: tuple[str, ...] = ("image", "nested")
) -> dict[str, str]:
    """The Parquet tables of ``kinds`` (each reused when already written for these rows
    and seed)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = {kind: os.path.join(workdir, f"{kind}-{rows}-{seed}") for kind in kinds}
    marker = os.path.join(workdir, f"done-{'-'.join(kinds)}-{rows}-{seed}.json")
    if os.path.exists(marker):
        return paths
    x, y = images(rows, seed)
    for path in paths.values():
        os.makedirs(path, exist_ok=True)
    width = SIDE * SIDE * CHANNELS
    for part, lo in enumerate(range(0, rows, -(-rows // FILES))):
        hi = min(lo + -(-rows // FILES), rows)
        n = hi - lo
        flat = x[lo:hi].reshape(-1)
        offsets = pa.array(np.arange(n + 1, dtype=np.int32) * width)
        data = pa.BinaryArray.from_buffers(
            pa.binary(), n, [None, offsets.buffers()[1], pa.py_buffer(flat)]
        )
        struct = pa.StructArray.from_arrays(
            [
                pa.array([f"synthetic/{i}.png" for i in range(lo, hi)]),
                pa.array(np.full(n, SIDE, np.int32)),
                pa.array(np.full(n, SIDE, np.int32)),
                pa.array(np.full(n, CHANNELS, np.int32)),
                pa.array(np.full(n, 16, np.int32)),
                data,
            ],
            names=["origin", "height", "width", "nChannels", "mode", "data"],
        )
        label = pa.array(y[lo:hi])
        if "image" in paths:
            pq.write_table(
                pa.table({"image": struct, "label": label}),
                f"{paths['image']}/part-{part:03d}.parquet",
            )
        if "nested" not in paths:
            continue
        values = pa.array(flat.astype(np.float32) / 255.0)
        inner = pa.ListArray.from_arrays(
            pa.array(np.arange(n * SIDE * SIDE + 1, dtype=np.int32) * CHANNELS), values
        )
        middle = pa.ListArray.from_arrays(
            pa.array(np.arange(n * SIDE + 1, dtype=np.int32) * SIDE), inner
        )
        outer = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32) * SIDE), middle)
        pq.write_table(
            pa.table({"pixels": outer, "label": label}),
            f"{paths['nested']}/part-{part:03d}.parquet",
        )
    with open(marker, "w") as f:
        json.dump({"rows": rows, "seed": seed}, f)
    return paths


def cnn(rescale: bool, seed: int) -> Any:
    import keras

    keras.utils.set_random_seed(seed)
    layers: list[Any] = [keras.Input((SIDE, SIDE, CHANNELS))]
    if rescale:
        layers.append(keras.layers.Rescaling(1 / 255))
    layers += [
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(CLASSES, activation="softmax"),
    ]
    model = keras.Sequential(layers)
    model.compile(
        keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"]
    )
    return model


def plain_keras(args: argparse.Namespace, kind: str) -> dict[str, Any]:
    x, y = images(args.rows, args.seed)
    if kind == "nested":
        x = x.astype(np.float32) / 255.0
    model = cnn(kind == "image", args.seed)
    started = time.perf_counter()
    history = model.fit(x, y, epochs=args.epochs, batch_size=args.batch_size, verbose=0)
    seconds = time.perf_counter() - started
    return {
        "samples_s": args.rows * args.epochs / seconds,
        "accuracy": history.history["accuracy"][-1],
    }


def sparkdl_fit(
    spark: Any, path: str, kind: str, workers: int, args: argparse.Namespace
) -> dict[str, Any]:
    from sparkdl import KerasEstimator

    df = spark.read.parquet(path)
    column = "image" if kind == "image" else "pixels"

    def fit(frame: Any, epochs: int) -> Any:
        est = KerasEstimator(
            model=cnn(kind == "image", args.seed),
            features_col=column,
            label_col="label",
            num_workers=workers,
            epochs=epochs,
            batch_size=args.batch_size,
            seed=args.seed,
        )
        return est.fit(frame)

    idle = fit(df.limit(args.idle_rows), args.epochs).fit_report
    started = time.perf_counter()
    fitted = fit(df, args.epochs)
    wall = time.perf_counter() - started
    report = fitted.fit_report
    workers_reports = report["workers"]
    peak = max(workers_reports, key=lambda r: r["peak_rss_bytes"])
    idle_peak = max(r["peak_rss_bytes"] for r in idle["workers"])
    train = max(r["train_seconds"] for r in workers_reports)
    return {
        "samples_s": args.rows * args.epochs / train,
        "fit_s": wall,
        "accuracy": fitted.history["accuracy"][-1],
        "peak_mb": peak["peak_rss_bytes"] / MB,
        "data_mb": peak["data_bytes"] / MB,
        "growth_per_byte": (peak["peak_rss_bytes"] - idle_peak) / max(peak["data_bytes"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--kinds", nargs="+", default=["image", "nested"])
    parser.add_argument("--idle-rows", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default="/tmp/sparkdl-images")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    os.makedirs(args.workdir, exist_ok=True)
    started = time.perf_counter()
    paths = write_tables(args.workdir, args.rows, args.seed, tuple(args.kinds))
    print(f"tables ready in {time.perf_counter() - started:.1f} s under {args.workdir}", flush=True)
    print(
        f"\n{args.rows:,} images {SIDE}x{SIDE}x{CHANNELS}, {args.epochs} epoch(s), batch "
        f"{args.batch_size}, {os.cpu_count()} CPUs\n"
    )
    print(
        "| run | samples/s | x Keras | fit s | train acc | peak RSS MB | partition MB "
        "| growth / partition byte |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    warm = cnn(True, args.seed)  # Keras's first model in this process pays its start-up
    warm.fit(*images(256, args.seed), epochs=1, batch_size=args.batch_size, verbose=0)
    for kind in args.kinds:
        bases: list[dict[str, Any]] = []
        runs: dict[int, list[dict[str, Any]]] = {w: [] for w in args.workers}
        for _ in range(args.repeats):  # plain Keras, then each sparkdl fit: in turn
            bases.append(plain_keras(args, kind))
            for workers in args.workers:
                got = _in_session(paths[kind], kind, workers, args)
                got["ratio"] = got["samples_s"] / bases[-1]["samples_s"]
                runs[workers].append(got)
        print(
            f"| plain Keras, {kind} arrays | {_median(bases, 'samples_s'):,.0f} | 1.00 | | "
            f"{_median(bases, 'accuracy'):.3f} | | | |",
            flush=True,
        )
        for workers, got in runs.items():
            print(
                f"| sparkdl {kind}, {workers} worker(s) | {_median(got, 'samples_s'):,.0f} | "
                f"{_median(got, 'ratio'):.2f} ({min(g['ratio'] for g in got):.2f}-"
                f"{max(g['ratio'] for g in got):.2f}) | {_median(got, 'fit_s'):.1f} | "
                f"{_median(got, 'accuracy'):.3f} | {max(g['peak_mb'] for g in got):,.0f} | "
                f"{got[0]['data_mb']:,.0f} | {max(g['growth_per_byte'] for g in got):.2f} |",
                flush=True,
            )


def _in_session(path: str, kind: str, workers: int, args: argparse.Namespace) -> dict[str, Any]:
    """One sparkdl fit of ``workers`` workers in a session of its own (every core)."""
    from pyspark.sql import SparkSession

    cores = os.cpu_count() or 1
    if workers > cores or cores % workers:
        raise SystemExit(f"--workers {workers}: give a divisor of the {cores} cores")
    spark = (
        SparkSession.builder.master(f"local[{cores}]")
        .config("spark.task.cpus", str(cores // workers))
        # The JVM the first session starts serves every later one: room for the
        # nested arrays' Parquet reads (1 GB ran out once).
        .config("spark.driver.memory", "4g")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(workers))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        return sparkdl_fit(spark, path, kind, workers, args)
    finally:
        spark.stop()


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return float(np.median([r[key] for r in runs]))


if __name__ == "__main__":
    main()
