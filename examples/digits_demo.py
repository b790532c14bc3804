"""Demo: train a Keras MLP on scikit-learn's digits with sparkdl, synchronous, 2 workers.

Run:  bash scripts/demo.sh   (or: python examples/digits_demo.py)
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Spark's Python workers must run this interpreter (the one with sparkdl installed).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import SparkSession

import sparkdl
from examples.digits import accuracy, digits_arrays, digits_frames, digits_model
from sparkdl import KerasEstimator


def main() -> None:
    spark = (
        SparkSession.builder.master("local[*]")
        .appName("sparkdl-digits-demo")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    sparkdl.warm_up(spark)  # workers import TensorFlow while this script loads the data
    # This process imports it too, after the warm-up has started (so the two overlap),
    # with TensorFlow's start-up log lines kept off the terminal.
    with sparkdl.quiet_tensorflow():
        import keras  # noqa: F401  (the examples use it)
    train_df, test_df = digits_frames(spark)
    _, x_test, _, y_test = digits_arrays()
    estimator = KerasEstimator(
        model=digits_model(),
        features_col="features",
        label_col="label",
        mode="synchronous",
        frequency="epoch",
        num_workers=2,
        epochs=20,
        batch_size=32,
        seed=0,
        verbose=1,
    )
    start = time.perf_counter()
    fitted = estimator.fit(train_df)
    seconds = time.perf_counter() - start
    rows = train_df.count()
    acc = accuracy(fitted.get_model(), x_test, y_test)
    scored = fitted.transform(test_df).limit(3).collect()
    print(f"test accuracy:   {acc:.4f}")
    print(f"fit seconds:     {seconds:.2f}")
    print(f"samples/second:  {rows * 20 / seconds:,.0f}")
    print(f"communication:   {fitted.fit_report['communication_share']:.1%} of worker time")
    print(
        "first predictions:", [int(max(range(10), key=lambda i: r.prediction[i])) for r in scored]
    )
    spark.stop()


if __name__ == "__main__":
    main()
