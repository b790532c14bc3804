"""One Spark Connect session for these tests: ``remote("local[3]")``, a Connect server
that PySpark starts in this process's JVM, with the client talking to it over gRPC.

These tests run in a pytest process of their own (``bash scripts/test.sh`` runs
``pytest tests/connect`` after the main suite): a Connect session marks the whole
process as a Connect client (``SPARK_CONNECT_MODE_ENABLED``), which PySpark ML's
classic code paths then refuse. ``tests/conftest.py`` leaves this directory out of
any other run. The builder, the digits frames and the saved stages' expected figures
are the integration tests' own.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.integration.conftest import digits, spark_builder  # noqa: F401  (a fixture)
from tests.integration.test_saved_stages import expected  # noqa: F401  (a fixture)


def clean_env() -> dict[str, str]:
    """This process's environment less what its Connect session set in it, for a
    process of its own (a classic driver, another Connect client or server): with
    ``SPARK_CONNECT_MODE_ENABLED`` a classic session refuses to start, and with
    ``SPARK_CONNECT_AUTHENTICATE_TOKEN`` a client speaks TLS with this session's token
    and a server asks for it."""
    leaked = ("SPARK_CONNECT", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE", "PYSPARK_REMOTE_INIT_CONF")
    return {k: v for k, v in os.environ.items() if not k.startswith(leaked)}


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    session = spark_builder("local[3]", remote=True).appName("sparkdl-connect-tests").getOrCreate()
    yield session
    session.stop()
