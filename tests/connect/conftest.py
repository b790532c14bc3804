"""One Spark Connect session for these tests: ``remote("local[3]")``, a Connect server
that PySpark starts in this process's JVM, with the client talking to it over gRPC.

These tests run in a pytest process of their own (``bash scripts/test.sh`` runs
``pytest tests/connect`` after the main suite): a Connect session marks the whole
process as a Connect client (``SPARK_CONNECT_MODE_ENABLED``), which PySpark ML's
classic code paths then refuse. ``tests/conftest.py`` leaves this directory out of
any other run. The builder and the digits frames are the integration tests' own.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.integration.conftest import digits, spark_builder  # noqa: F401  (a fixture)


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    session = spark_builder("local[3]", remote=True).appName("sparkdl-connect-tests").getOrCreate()
    yield session
    session.stop()
