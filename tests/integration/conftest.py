"""One local[2] SparkSession for the integration tests, bound to 127.0.0.1."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


def spark_builder(master: str, *, remote: bool = False):  # type: ignore[no-untyped-def]
    """A builder of ``master``; a Spark Connect client of it with ``remote`` or
    ``SPARKDL_TEST_REMOTE=1`` (which the driver scripts the tests start inherit)."""
    from pyspark.sql import SparkSession

    remote = remote or os.environ.get("SPARKDL_TEST_REMOTE") == "1"
    builder = SparkSession.builder.remote(master) if remote else SparkSession.builder.master(master)
    return (
        builder.appName("sparkdl-tests")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
    )


def set_log_level(session, level: str) -> None:  # type: ignore[no-untyped-def]
    """Spark's log level, where the session has a SparkContext (not over Connect)."""
    from sparkdl.compat.sessions import is_connect

    if not is_connect(session):
        session.sparkContext.setLogLevel(level)


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """``local[2]``; with ``SPARKDL_TEST_REMOTE=1`` a Spark Connect client of a
    ``local[3]`` server instead (``bash scripts/test.sh`` runs the compatibility subset
    so, in a process of its own): the service then runs in the cluster, and its relay
    takes the third slot beside the two workers."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    remote = os.environ.get("SPARKDL_TEST_REMOTE") == "1"
    session = spark_builder("local[3]" if remote else "local[2]").getOrCreate()
    set_log_level(session, "ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def digits(spark):  # type: ignore[no-untyped-def]
    from examples.digits import digits_arrays, digits_frames

    train_df, test_df = digits_frames(spark, partitions=2)
    return train_df.cache(), test_df.cache(), digits_arrays()
