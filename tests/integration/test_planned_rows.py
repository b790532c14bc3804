"""Each worker's rows come from the driver's plan (issue 35): real fits on local[2].

The fit's one scan counts each partition's rows; before the training job starts the
driver tells the service the most training rows each worker can hold, for the job's
partitioning (the DataFrame's own partitions, or a round-robin ``repartition``), and a
worker joining with more is refused.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from sparkdl import KerasEstimator
from sparkdl.errors import WorkerError

pytestmark = [pytest.mark.spark]

#: Rows of each Parquet file of the table (a file a partition): uneven on purpose.
FILES = [31, 50, 70, 89]


def _model():  # type: ignore[no-untyped-def]
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def _rows(count: int, seed: int) -> list[tuple[list[float], int]]:
    x = np.random.default_rng(seed).standard_normal((count, 4)).astype(np.float32)
    return [(r.tolist(), int(r.sum() > 0)) for r in x]


@pytest.fixture(scope="module")
def table(spark, tmp_path_factory):  # type: ignore[no-untyped-def]
    """Reads ``FILES[:n]`` back as a table of ``n`` partitions of those sizes (a file a
    partition while the module's tests run: Spark splits files anew for every job)."""
    root = tmp_path_factory.mktemp("planned")
    for i, count in enumerate(FILES):
        df = spark.createDataFrame(_rows(count, i), "features array<float>, label long")
        df.coalesce(1).write.parquet(str(root / f"part{i}"))

    def read(n: int):  # type: ignore[no-untyped-def]
        frame = spark.read.parquet(*[str(root / f"part{i}") for i in range(n)])
        assert frame.rdd.getNumPartitions() == n
        return frame

    spark.conf.set("spark.sql.files.openCostInBytes", str(1 << 30))
    yield read
    spark.conf.unset("spark.sql.files.openCostInBytes")


@pytest.mark.parametrize(
    ("mode", "partitions"),
    [
        ("synchronous", 2),  # the table's own partitions
        ("synchronous", 4),  # dealt round robin (a barrier stage shuffles)
        ("asynchronous", 2),
        ("asynchronous", 4),  # dealt round robin: no coalesce, whose grouping is Spark's
        ("asynchronous", 3),
    ],
)
def test_workers_join_with_rows_the_driver_planned(table, mode: str, partitions: int) -> None:
    counts = FILES[:partitions]
    fitted = KerasEstimator(
        model=_model(), mode=mode, num_workers=2, epochs=2, batch_size=16, seed=0
    ).fit(table(partitions))
    report = fitted.fit_report
    planned = report["service"]["planned_rows"]
    if partitions == 2:  # each worker's rows exactly (Spark orders the files by size)
        assert sorted(planned) == counts
        assert planned == [w["rows"] for w in sorted(report["workers"], key=lambda w: w["worker"])]
    else:  # at most a partition's share rounded up, from each
        assert planned == [sum(math.ceil(n / 2) for n in counts)] * 2
    workers = report["workers"]
    assert sum(w["rows"] for w in workers) == sum(counts)
    assert all(0 < w["rows"] <= planned[w["worker"]] for w in workers), (planned, workers)
    assert report["service"]["joined_rows"] == {str(w["worker"]): w["rows"] for w in workers}
    assert len(fitted.history["loss"]) == 2


@pytest.mark.parametrize("mode", ["synchronous", "asynchronous"])
def test_validation_rows_are_not_planned_as_training_rows(spark, table, mode: str) -> None:
    validation = spark.createDataFrame(_rows(40, 9), "features array<float>, label long")
    fitted = KerasEstimator(
        model=_model(),
        mode=mode,
        num_workers=2,
        epochs=1,
        batch_size=16,
        seed=0,
        validation_data=validation,
    ).fit(table(2))
    report = fitted.fit_report
    planned = report["service"]["planned_rows"]
    assert planned == [math.ceil(31 / 2) + math.ceil(50 / 2)] * 2  # dealt round robin
    workers = report["workers"]
    assert sum(w["validation_rows"] for w in workers) == 40
    assert all(w["rows"] <= planned[w["worker"]] for w in workers), (planned, workers)
    assert "val_loss" in fitted.history


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_a_partition_that_grows_after_the_scan_stops_the_fit(spark, tmp_path) -> None:
    """A DataFrame whose partitions hold more rows at each evaluation: the training job's
    workers hold more than the scan counted, and the fit stops naming the cause."""
    marks = str(tmp_path)

    def grow(index: int, _):  # type: ignore[no-untyped-def]
        mark = os.path.join(marks, str(index))
        with open(mark, "a") as f:
            f.write("x")
        times = os.path.getsize(mark)
        yield from _rows(10 * times, index)

    rdd = spark.sparkContext.parallelize(range(2), 2).mapPartitionsWithIndex(grow)
    frame = spark.createDataFrame(rdd, "features array<float>, label long")
    estimator = KerasEstimator(model=_model(), mode="asynchronous", num_workers=2, epochs=1)
    with pytest.raises(WorkerError, match="cannot raise its row count"):
        estimator.fit(frame)
