"""The fit's bound on Arrow record batches: rows per batch from a row's bytes, and the
session setting lowered for fits that overlap and put back after the last, whatever
happens inside, and never a failed fit for a session that refuses the setting."""

from __future__ import annotations

import threading

import pytest
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

from sparkdl.driver import arrow_batches
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
    """A session's runtime settings as ``spark.conf`` answers them (``None``: not set),
    refusing to show or change them when told to."""

    def __init__(self, value: str | None, *, refuse: tuple[str, ...] = ()) -> None:
        self.values: dict[str, str] = {} if value is None else {RECORDS_SETTING: value}
        self.history: list[str | None] = []
        self.refuse = refuse

    def get(self, key: str, default: str | None = None) -> str | None:
        if "get" in self.refuse:
            raise RuntimeError("CONFIG_NOT_AVAILABLE")
        return self.values.get(key, default)

    def set(self, key: str, value: str) -> None:
        if "set" in self.refuse:
            raise RuntimeError("CANNOT_MODIFY_CONFIG")
        self.values[key] = value
        self.history.append(value)

    def unset(self, key: str) -> None:
        if "unset" in self.refuse:
            raise RuntimeError("CANNOT_MODIFY_CONFIG")
        self.values.pop(key, None)
        self.history.append(None)


class _Session:
    def __init__(self, value: str | None = None, *, refuse: tuple[str, ...] = ()) -> None:
        self.conf = _Conf(value, refuse=refuse)


def _value(spark: _Session) -> str | None:
    return spark.conf.values.get(RECORDS_SETTING)


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
    assert records_per_batch(8, -1) == BATCH_BYTES // 8
    assert records_per_batch(10 * BATCH_BYTES, 10_000) == 1


def test_overlapping_fits_share_the_smallest_and_the_last_puts_the_session_back() -> None:
    spark = _Session(None)  # not set: Spark's 10,000 rows
    with bounded_batches(spark, BATCH_BYTES // 500) as first:
        assert first == 500 and _value(spark) == "500"
        with bounded_batches(spark, BATCH_BYTES // 200) as second:
            assert second == 200 and _value(spark) == "200"
        assert _value(spark) == "500"
        with bounded_batches(spark, BATCH_BYTES // 900) as third:
            assert third == 900 and _value(spark) == "500"
    assert RECORDS_SETTING not in spark.conf.values  # unset again, not set to 10000
    assert spark.conf.history == ["500", "200", "500", "500", "500", None]
    assert arrow_batches._lowered == {}


def test_narrow_rows_and_a_smaller_session_setting_leave_the_session_alone() -> None:
    small, narrow = _Session("100"), _Session("10000")
    with bounded_batches(small, 3_000) as records:
        assert records == 100
    with bounded_batches(narrow, 8) as records:
        assert records == 10_000
    assert small.conf.history == [] and narrow.conf.history == []


@pytest.mark.parametrize("own", ["0", "-1", " 5000 "])
def test_no_limit_is_lowered_and_a_spaced_number_is_read(own: str) -> None:
    spark = _Session(own)
    with bounded_batches(spark, BATCH_BYTES // 4_096) as records:
        assert records == 4_096 and _value(spark) == "4096"
    assert _value(spark) == own


def test_an_error_inside_puts_the_session_back() -> None:
    spark = _Session("10000")
    with pytest.raises(KeyboardInterrupt), bounded_batches(spark, BATCH_BYTES // 50):
        assert _value(spark) == "50"
        raise KeyboardInterrupt
    assert _value(spark) == "10000" and arrow_batches._lowered == {}


@pytest.mark.parametrize("refuse", ["get", "set"])
def test_a_session_that_refuses_the_setting_keeps_its_batches_and_the_fit_goes_on(
    refuse: str,
) -> None:
    spark = _Session("10000", refuse=(refuse,))
    with bounded_batches(spark, BATCH_BYTES // 50) as records:
        assert records == 10_000
    assert _value(spark) == "10000" and arrow_batches._lowered == {}


def test_fits_from_threads_end_in_any_order_with_the_session_value() -> None:
    """A enters, B enters (asks for fewer), A leaves (B's value stays), B leaves."""
    spark = _Session("10000")
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, str | None] = {}

    def a() -> None:
        with bounded_batches(spark, BATCH_BYTES // 300):
            a_in.set()
            assert b_in.wait(10)
        a_out.set()

    def b() -> None:
        assert a_in.wait(10)
        with bounded_batches(spark, BATCH_BYTES // 100):
            seen["both"] = _value(spark)
            b_in.set()
            assert a_out.wait(10)
            seen["b alone"] = _value(spark)

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert not any(t.is_alive() for t in threads)
    assert seen == {"both": "100", "b alone": "100"}
    assert _value(spark) == "10000" and arrow_batches._lowered == {}


class _JvmSession:
    """The JVM session behind PySpark's wrappers (its Py4J ``hashCode``)."""

    def hashCode(self) -> int:  # Java's name
        return 42


class _Wrapper:
    """A Python wrapper of a classic session: two may wrap one JVM session."""

    def __init__(self, jsession: _JvmSession, conf: _Conf) -> None:
        self._jsparkSession = jsession
        self.conf = conf


def test_two_wrappers_of_one_session_share_its_lowering() -> None:
    """A enters through one wrapper, B through another, A leaves, B leaves: B must not
    take A's lowered value for the session's own."""
    conf, jvm = _Conf(None), _JvmSession()
    a = bounded_batches(_Wrapper(jvm, conf), BATCH_BYTES // 500)
    b = bounded_batches(_Wrapper(jvm, conf), BATCH_BYTES // 800)
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)
    assert conf.values[RECORDS_SETTING] == "800"
    b.__exit__(None, None, None)
    assert RECORDS_SETTING not in conf.values and arrow_batches._lowered == {}


def test_a_refused_restore_keeps_the_session_value_for_the_next_fit() -> None:
    spark = _Session(None, refuse=("unset",))
    with bounded_batches(spark, BATCH_BYTES // 500):
        pass
    assert _value(spark) == "500"  # the session refused to take it back
    spark.conf.refuse = ()
    with bounded_batches(spark, BATCH_BYTES // 700) as records:
        assert records == 700 and _value(spark) == "700"
    assert RECORDS_SETTING not in spark.conf.values and arrow_batches._lowered == {}
