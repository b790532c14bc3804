"""Scoring throughput of ``KerasModel.transform`` against collect-and-predict, in one run.

200k rows x 64 features, a 64-256-256-10 MLP, ``local[2]`` (2 workers). Three figures:

* ``transform()``: rows/s of ``fitted.transform(df)`` written to a no-op sink (every
  prediction computed, nothing collected), the DataFrame cached beforehand;
* ``collect + predict``: collecting the same cached rows to the driver as numpy and
  calling ``model.predict`` once;
* ``transform() + collect``: transform and collect the predictions to the driver;
* ``transform(), pandas_udf``: ``transform()`` as PySpark 3.5 and 4.0 run it (they have
  no ``arrow_udf``: a ``pandas_udf`` whose Series are turned back into Arrow,
  :mod:`sparkdl.compat.spark_versions`), forced here on this PySpark for a side-by-side
  figure.

Run:
    .venv/bin/python benchmarks/transform.py [--rows 200000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import keras
    from pyspark.sql import SparkSession

    from sparkdl import KerasModel
    from sparkdl.contract.keras_io import model_to_bytes

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    fitted = KerasModel(model_bytes=model_to_bytes(model), input_shapes=[(64,)])
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "4g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    x = np.random.default_rng(0).random((args.rows, 64), dtype=np.float32)
    df = (
        spark.createDataFrame([(row.tolist(),) for row in x], "features array<float>")
        .repartition(2)
        .cache()
    )
    df.count()

    def scored_to_noop() -> None:
        fitted.transform(df).write.format("noop").mode("overwrite").save()

    def collect_and_predict() -> None:
        rows = np.array(df.toArrow().column("features").to_pylist(), np.float32)
        model.predict(rows, batch_size=1024, verbose=0)

    def transform_and_collect() -> None:
        fitted.transform(df).select("prediction").toArrow()

    def scored_through_pandas() -> None:
        from sparkdl.compat import spark_versions

        real = spark_versions.has_arrow_udf
        spark_versions.has_arrow_udf = lambda: False  # the PySpark < 4.1 path
        try:
            scored_to_noop()
        finally:
            spark_versions.has_arrow_udf = real

    results = []
    for name, run in [
        ("transform()", scored_to_noop),
        ("collect + predict", collect_and_predict),
        ("transform() + collect", transform_and_collect),
        ("transform(), pandas_udf", scored_through_pandas),
    ]:
        run()  # warm up: Python workers, model load, tracing
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        best = min(times)
        results.append((name, args.rows / best, best))
    spark.stop()
    base = results[1][1]
    print(
        f"\n{args.rows} rows x 64 features, 64-256-256-10 MLP, local[2], best of {args.repeats}\n"
    )
    print("| run | rows/s | seconds | x collect + predict |")
    print("|---|---:|---:|---:|")
    for name, rate, seconds in results:
        print(f"| {name} | {rate:,.0f} | {seconds:.2f} | {rate / base:.2f} |")


if __name__ == "__main__":
    main()
