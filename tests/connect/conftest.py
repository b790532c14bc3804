"""One Spark Connect session for these tests: ``remote("local[3]")``, a Connect server
that PySpark starts in this process's JVM, with the client talking to it over gRPC.

These tests run in a pytest process of their own (``bash scripts/test.sh`` runs
``pytest tests/connect`` after the main suite): a Connect session marks the whole
process as a Connect client (``SPARK_CONNECT_MODE_ENABLED``), which PySpark ML's
classic code paths then refuse. ``tests/conftest.py`` leaves this directory out of
any other run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.remote("local[3]")
        .appName("sparkdl-connect-tests")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def digits(spark):  # type: ignore[no-untyped-def]
    from examples.digits import digits_arrays, digits_frames

    train_df, test_df = digits_frames(spark, partitions=2)
    return train_df.cache(), test_df.cache(), digits_arrays()
