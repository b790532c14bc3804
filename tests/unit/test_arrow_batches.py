"""The fit's bound on Arrow record batches: rows per batch from a row's bytes, and the
session setting lowered for fits that overlap and put back after the last."""

from __future__ import annotations

import threading

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DoubleType,
    FloatType,
    IntegerType,
    StringType,
    StructField,
    StructType,
)

from sparkdl.driver.arrow_batches import (
    BATCH_BYTES,
    RECORDS_SETTING,
    bounded_batches,
    records_per_batch,
    row_bytes,
)

IMAGE = StructType(
    [
        StructField("origin", StringType()),
        StructField("height", IntegerType()),
        StructField("width", IntegerType()),
        StructField("nChannels", IntegerType()),
        StructField("mode", IntegerType()),
        StructField("data", BinaryType()),
    ]
)


class _Conf:
    """A session's runtime settings, as ``spark.conf`` answers them."""

    def __init__(self, value: str) -> None:
        self.values = {RECORDS_SETTING: value}
        self.history: list[str] = []

    def get(self, key: str) -> str:
        return self.values[key]

    def set(self, key: str, value: str) -> None:
        self.values[key] = value
        self.history.append(value)


class _Session:
    def __init__(self, value: str = "10000") -> None:
        self.conf = _Conf(value)


def test_a_row_counts_its_values_at_their_types_size() -> None:
    schema = StructType(
        [
            StructField("__sparkdl_features", IMAGE),
            StructField("__sparkdl_features_1", ArrayType(ArrayType(DoubleType()))),
            StructField("__sparkdl_label", FloatType()),
            StructField("__sparkdl_weight", DoubleType()),
        ]
    )
    assert row_bytes(schema, [3072, 10], [1]) == 3072 + 80 + 4 + 8
    # A sparse input's width is its vectors' size, not what its rows hold: one value.
    assert row_bytes(schema, [3072, 10], [1], sparse=[False, True]) == 3072 + 8 + 4 + 8


def test_rows_per_batch_hold_about_the_batch_bytes_and_never_more_than_the_session() -> None:
    assert records_per_batch(BATCH_BYTES // 100, 10_000) == 100
    assert records_per_batch(8, 10_000) == 10_000
    assert records_per_batch(8, 0) == BATCH_BYTES // 8  # 0: the session sets no limit
    assert records_per_batch(10 * BATCH_BYTES, 10_000) == 1


def test_overlapping_fits_share_the_smallest_and_the_last_puts_the_session_back() -> None:
    spark = _Session("10000")
    conf = spark.conf
    with bounded_batches(spark, BATCH_BYTES // 500) as first:
        assert first == 500 and conf.values[RECORDS_SETTING] == "500"
        with bounded_batches(spark, BATCH_BYTES // 200) as second:
            assert second == 200 and conf.values[RECORDS_SETTING] == "200"
        assert conf.values[RECORDS_SETTING] == "500"
        with bounded_batches(spark, BATCH_BYTES // 900):
            assert conf.values[RECORDS_SETTING] == "500"
    assert conf.values[RECORDS_SETTING] == "10000"
    assert conf.history == ["500", "200", "500", "500", "500", "10000"]


def test_narrow_rows_and_a_smaller_session_setting_leave_the_session_alone() -> None:
    spark = _Session("100")
    with bounded_batches(spark, 3_000) as records:
        assert records == 100
    with bounded_batches(_Session("10000"), 8):
        pass
    assert spark.conf.history == []


def test_fits_from_threads_end_with_the_session_value() -> None:
    spark = _Session("10000")
    barrier = threading.Barrier(4)

    def fit(width: int) -> None:
        with bounded_batches(spark, BATCH_BYTES // width):
            barrier.wait(timeout=10)

    threads = [threading.Thread(target=fit, args=(w,)) for w in (100, 200, 300, 400)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert spark.conf.values[RECORDS_SETTING] == "10000"
    assert "100" in spark.conf.history
