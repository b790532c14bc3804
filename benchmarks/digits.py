"""Plain Keras vs sparkdl synchronous on digits, side by side in one process and run.

Same split, same model, 20 epochs, batch 32. Prints fit seconds (SparkSession start
excluded), test accuracy, the ratio to plain Keras, and the communication share (the
fraction of worker training time spent in calls to the parameter service).

The first sparkdl fit in a session is "cold" (Spark starts Python workers, which import
TensorFlow); later fits reuse the Python workers ("warm"). Both are printed.

Run:  .venv/bin/python benchmarks/digits.py [--epochs 20] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Spark's Python workers must run this interpreter (the one with sparkdl installed).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from examples.digits import accuracy, digits_arrays, digits_frames, digits_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--repeats", type=int, default=2, help="warm sparkdl fits after the cold one"
    )
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    from sparkdl import KerasEstimator

    x_train, x_test, y_train, y_test = digits_arrays()
    rows = []

    model = digits_model(seed=0)
    start = time.perf_counter()
    model.fit(x_train, y_train, epochs=args.epochs, batch_size=args.batch_size, verbose=0)
    keras_seconds = time.perf_counter() - start
    rows.append(("plain Keras (1 process)", keras_seconds, accuracy(model, x_test, y_test), None))

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    train_df, _ = digits_frames(spark, partitions=2)
    train_df = train_df.cache()
    train_df.count()

    for frequency in ["epoch", 4]:
        for attempt in range(1 + args.repeats):
            est = KerasEstimator(
                model=digits_model(seed=0),
                mode="synchronous",
                frequency=frequency,
                num_workers=2,
                epochs=args.epochs,
                batch_size=args.batch_size,
                seed=0,
            )
            start = time.perf_counter()
            fitted = est.fit(train_df)
            seconds = time.perf_counter() - start
            cold = "cold" if frequency == "epoch" and attempt == 0 else "warm"
            rows.append(
                (
                    f"sparkdl sync, frequency={frequency}, 2 workers ({cold})",
                    seconds,
                    accuracy(fitted.get_model(), x_test, y_test),
                    fitted.fit_report["communication_share"],
                )
            )
    spark.stop()

    print(
        f"\ndigits: {len(x_train)} train / {len(x_test)} test rows, {args.epochs} epochs, "
        f"batch {args.batch_size}, local[2]\n"
    )
    print(f"| {'run':<48} | fit s | x Keras | test acc | comm share |")
    print(f"|{'-' * 50}|------:|--------:|---------:|-----------:|")
    for name, seconds, acc, comm in rows:
        share = "" if comm is None else f"{comm:.1%}"
        print(
            f"| {name:<48} | {seconds:5.2f} | {seconds / keras_seconds:7.2f} "
            f"| {acc:8.4f} | {share:>10} |"
        )


if __name__ == "__main__":
    main()
