"""The examples of the home page, the getting-started guide and the README run as pasted.

Each page's ```` ```python ```` blocks run in order in one namespace, as a reader pastes
them into one session: the first block builds its own SparkSession (``getOrCreate``
returns the test session, bound to 127.0.0.1) and its own DataFrame, so a page whose
example stops running, or starts to need something it does not build, fails here.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGES = [
    "docs/index.md",
    "docs/getting-started.md",
    "docs/guides/images-and-sequences.md",
    "README.md",
]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def python_blocks(page: str) -> list[str]:
    """The page's ```` ```python ```` blocks, in order."""
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        return BLOCK.findall(f.read())


@contextlib.contextmanager
def spark_working_directory(spark: Any, path: str) -> Iterator[None]:
    """Spark resolves a relative path (``write.parquet("predictions/")``) against its
    local file system's working directory, the JVM's, which ``chdir`` does not move:
    that is set to ``path`` for the block (Spark Connect's server is left alone)."""
    from sparkdl.compat.sessions import is_connect

    if is_connect(spark):
        yield
        return
    jvm = spark.sparkContext._jvm
    local = jvm.org.apache.hadoop.fs.FileSystem.getLocal(
        spark.sparkContext._jsc.hadoopConfiguration()
    )
    before = local.getWorkingDirectory()
    local.setWorkingDirectory(jvm.org.apache.hadoop.fs.Path(path))
    try:
        yield
    finally:
        local.setWorkingDirectory(before)


@pytest.mark.parametrize("page", PAGES)
def test_page_examples_run_as_pasted(page, spark, tmp_path, monkeypatch) -> None:
    blocks = python_blocks(page)
    assert blocks, f"{page} has no python example"
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__main__"}
    with spark_working_directory(spark, str(tmp_path)):
        for number, code in enumerate(blocks, 1):
            exec(compile(code, f"{page} (python block {number})", "exec"), namespace)
    # The page's relative paths went to the test's directory, not the checkout's.
    from sparkdl.compat.sessions import is_connect

    if page == "docs/guides/images-and-sequences.md" and not is_connect(spark):
        assert (tmp_path / "predictions" / "_SUCCESS").exists()
    fitted = namespace.get("fitted")
    assert fitted is not None, f"{page}'s example fits no model named fitted"
    assert fitted.history["accuracy"][-1] > 0.8, fitted.history
