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
    frame = spark.createDataFrame([(v, v) for v in values], "x double, f float")
    got = [r.i for r in frame.select(try_int(F.col("x")).alias("i")).collect()]
    assert got == [0, -3, 2**31 - 1, None, -(2**31), None, None, None]
    floats = [r.i for r in frame.select(try_int(F.col("f")).alias("i")).collect()]
    assert floats[3] is None and floats[6] is None  # 2^31 as a float: out of range


def test_array_argmax_finds_the_first_largest_value(spark) -> None:
    from pyspark.sql import functions as F

    rows = [[0.1, 0.7, 0.2], [3.0, 3.0, 1.0], [-1.0, -2.0], [5.0], [], None]
    rows += [[None, 0.2, 0.8], [None, None], [0.1, math.nan, 0.3]]  # NaN sorts above all
    frame = spark.createDataFrame([(r,) for r in rows], "a array<double>")
    got = [r.i for r in frame.select(array_argmax(F.col("a")).alias("i")).collect()]
    assert got == [1, 0, 0, 0, None, None, 2, None, 1]


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
    from sparkdl.compat.sessions import is_connect

    if is_connect(spark):  # a Connect client has job tags, per thread, instead
        spark.addTag("sparkdl-test-tag")
        seen_tags: list[set[str]] = []
        thread = inheritable_thread(
            lambda: seen_tags.append(spark.getTags()), name="t", session=spark
        )
        thread.start()
        thread.join(30)
        spark.removeTag("sparkdl-test-tag")
        assert seen_tags == [{"sparkdl-test-tag"}]
        return
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


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_a_row_with_a_null_feature_gets_a_null_prediction_of_several_outputs(spark) -> None:
    """A struct prediction (two outputs) is null for a row with a null feature on every
    PySpark (before 4.1 a pandas UDF cannot return a null struct by itself)."""
    import keras

    from sparkdl import KerasModel
    from sparkdl.contract.keras_io import model_to_bytes

    inputs = keras.Input((3,))
    model = keras.Model(
        inputs,
        [keras.layers.Dense(2, name="a")(inputs), keras.layers.Dense(1, name="b")(inputs)],
    )
    fitted = KerasModel(model_bytes=model_to_bytes(model), input_shapes=[(3,)])
    frame = spark.createDataFrame(
        [([1.0, 2.0, 3.0],), (None,), ([0.0, 0.5, 1.0],)], "features array<float>"
    )
    rows = fitted.transform(frame).collect()
    assert rows[1].prediction is None
    assert rows[0].prediction is not None and len(rows[0].prediction.a) == 2
    expected = model.predict(np_rows([rows[0].features, rows[2].features]), verbose=0)
    assert abs(rows[2].prediction.b - float(expected[1][1][0])) < 1e-5


def np_rows(rows: list[list[float]]):  # type: ignore[no-untyped-def]
    import numpy as np

    return np.array(rows, np.float32)
