"""sparkdl.compat.spark_versions: one behaviour on PySpark 3.5, 4.0 and 4.1.

Each test states the results the PySpark 4 expression gives; in the oldest stack of the
matrix (PySpark 3.5, ``bash scripts/matrix.sh oldest``) the 3.5 path must give the same.
"""

from __future__ import annotations

import math

import pyarrow as pa
import pytest

from sparkdl.compat.spark_versions import (
    array_argmax,
    frame_from_arrow,
    inheritable_thread,
    spark_version,
    try_int,
)

pytestmark = [pytest.mark.spark, pytest.mark.compat]


def test_try_int_is_null_where_an_int_does_not_fit(spark) -> None:
    from pyspark.sql import functions as F

    values = [0.0, -3.0, 2.0**31 - 1, 2.0**31, -(2.0**31), -(2.0**31) - 1, math.nan, None]
    frame = spark.createDataFrame([(v,) for v in values], "x double")
    got = [r.i for r in frame.select(try_int(F.col("x")).alias("i")).collect()]
    assert got == [0, -3, 2**31 - 1, None, -(2**31), None, None, None]


def test_array_argmax_finds_the_first_largest_value(spark) -> None:
    from pyspark.sql import functions as F

    rows = [[0.1, 0.7, 0.2], [3.0, 3.0, 1.0], [-1.0, -2.0], [5.0], [], None]
    frame = spark.createDataFrame([(r,) for r in rows], "a array<double>")
    got = [r.i for r in frame.select(array_argmax(F.col("a")).alias("i")).collect()]
    assert got == [1, 0, 0, 0, None, None]


def test_frame_from_arrow_keeps_the_rows_and_types(spark) -> None:
    table = pa.table(
        {
            "features": pa.array([[1.0, 2.0], [3.0, 4.0]], pa.list_(pa.float32())),
            "label": pa.array([0, 1], pa.int64()),
        }
    )
    frame = frame_from_arrow(spark, table)
    assert frame.schema.simpleString() == "struct<features:array<float>,label:bigint>"
    assert [(r.features, r.label) for r in frame.collect()] == [([1.0, 2.0], 0), ([3.0, 4.0], 1)]


def test_an_inheritable_thread_carries_the_job_group(spark) -> None:
    sc = spark.sparkContext
    sc.setJobGroup("sparkdl-test-group", "inherited")
    seen: list[str | None] = []
    thread = inheritable_thread(
        lambda: seen.append(sc.getLocalProperty("spark.jobGroup.id")), name="t", session=spark
    )
    thread.start()
    thread.join(30)
    sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    assert seen == ["sparkdl-test-group"] and spark_version() >= (3, 5)
