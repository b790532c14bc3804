"""What planning each worker's rows costs a fit: the scan by partition, and no coalesce.

The fit's one scan of the data (:func:`sparkdl.driver.data_scan.summarize`) runs its aggregates
grouped by partition, so that the driver knows each partition's rows; and ordinary tasks
over a multiple of ``num_workers`` partitions are dealt round robin (a shuffle) instead
of coalesced, since which partitions a coalesce groups is Spark's choice at run time.
On ``--rows`` rows of 64 float32 features (and an int label) in 8 Parquet files (a file
a partition), ``local[2]``, medians of ``--repeats`` runs after one warm-up:

* the scan: the same aggregates over the whole frame (as before) and grouped by
  partition (``summarize`` now);
* the training job's read: 2 tasks that stream their rows into Python (``mapInArrow``,
  as a worker fills its cache), over ``coalesce(2)`` and over ``repartition(2)``.

Run:
    .venv/bin/python benchmarks/partitioning.py
    .venv/bin/python benchmarks/partitioning.py --rows 200000 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _count(batches: Iterator) -> Iterator:  # type: ignore[type-arg]
    import pyarrow as pa

    yield pa.RecordBatch.from_pydict({"n": [sum(b.num_rows for b in batches)]})


def _median(run: Callable[[], object], repeats: int) -> float:
    run()  # warm-up
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import functions as F

    from sparkdl.contract.payload import feature_name, label_name
    from sparkdl.driver.data_scan import _summary_aggregates, summarize
    from tests.integration.conftest import spark_builder

    spark = spark_builder("local[2]").config("spark.sql.files.openCostInBytes", "1g").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory() as root:
        features = F.array(*[F.rand(i).cast("float") for i in range(64)])
        spark.range(args.rows, numPartitions=8).select(
            features.alias(feature_name(0)), (F.rand(99) * 10).cast("int").alias(label_name(0))
        ).write.parquet(root + "/table")
        table = spark.read.parquet(root + "/table")
        assert table.rdd.getNumPartitions() == 8
        aggs = _summary_aggregates(["int"], 1, True, [False])
        figures = {
            "scan, whole frame": lambda: table.agg(*aggs).first(),
            "scan, by partition": lambda: summarize(table, ["int"], 1),
            "read, coalesce(2)": lambda: table.coalesce(2).mapInArrow(_count, "n long").collect(),
            "read, repartition(2)": lambda: (
                table.repartition(2).mapInArrow(_count, "n long").collect()
            ),
        }
        print(f"{args.rows:,} rows x 64 float32, 8 Parquet files, local[2]")
        for name, run in figures.items():
            print(f"{name:<22} {_median(run, args.repeats):6.2f} s")
    spark.stop()


if __name__ == "__main__":
    main()
