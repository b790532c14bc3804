"""The warm-up of Spark's Python workers (:mod:`sparkdl.driver.warmup`) on the local[2] session.

The warm-up job runs ``mapInArrow`` tasks, so the workers it warms are those the fit's
own ``mapInArrow`` tasks run in: a later ``mapInArrow`` task finds the executor modules
imported in its worker.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from sparkdl.contract.backends import training_backend
from sparkdl.contract.tf_logs import TensorFlowLogs
from sparkdl.driver import warmup
from sparkdl.driver.warmup import WarmUp, warm_up
from sparkdl.executor import imports
from sparkdl.executor import warmup as worker_warmup

#: A standard-library module with no side effects that no other code imports.
SENTINEL = "pydoc_data.topics"


def test_the_executor_import_leaves_out_the_packages_workers_never_use(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module imported by ``import_executor`` finds the packages of
    ``UNUSED_ON_WORKERS`` missing (as Keras's optional imports of scikit-learn and
    matplotlib do), and they import as usual after it."""
    import sys

    (tmp_path / "unused_pkg").mkdir()
    (tmp_path / "unused_pkg" / "__init__.py").write_text("")
    (tmp_path / "unused_pkg" / "pyplot.py").write_text("")
    (tmp_path / "unused_mod.py").write_text("")
    (tmp_path / "optional_user.py").write_text(
        "try:\n    import unused_mod\nexcept ImportError:\n    unused_mod = None\n"
        "try:\n    import unused_pkg.pyplot as plt\nexcept ImportError:\n    plt = None\n"
        "import json\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(imports, "UNUSED_ON_WORKERS", ("unused_mod", "unused_pkg"))
    imports.import_executor("optional_user")
    user = sys.modules["optional_user"]
    assert user.unused_mod is None and user.plt is None and user.json is not None
    assert "unused_mod" not in sys.modules and "unused_pkg" not in sys.modules
    import unused_mod  # nothing left marked missing
    import unused_pkg.pyplot

    assert unused_mod is not None and unused_pkg.pyplot is not None
    imports.import_executor("optional_user")  # imported already: nothing happens
    assert sys.modules["optional_user"] is user
    for name in ("optional_user", "unused_mod", "unused_pkg", "unused_pkg.pyplot"):
        monkeypatch.delitem(sys.modules, name)
    assert warmup._EXECUTOR_MODULE == imports.EXECUTOR_MODULE  # the warm-up's import is the task's


@pytest.mark.parametrize("filtered", [False, True])
def test_a_background_import_holds_back_other_threads_imports(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture, filtered: bool
) -> None:
    """While the warm-up thread imports, another thread's import of a new module waits
    for it (no two imports interleave: TensorFlow and Keras import each other); with
    the filter on (a local master), the import's TensorFlow lines are dropped under the
    import lock and its other lines still reach stderr."""
    import sys
    import threading

    (tmp_path / "slow_sentinel.py").write_text(
        "import os, time\nstarted = time.monotonic()\n"
        "os.write(2, b'I0000 00:00:17.5    21 port.cc:153] oneDNN custom operations\\n')\n"
        "os.write(2, b'a line of the module\\n')\n"
        "time.sleep(0.5)\nended = time.monotonic()\n"
    )
    (tmp_path / "other_sentinel.py").write_text("import time\nloaded = time.monotonic()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(worker_warmup, "_importer", None)
    monkeypatch.setattr(worker_warmup, "_imported", {})
    for name in ("slow_sentinel", "other_sentinel"):  # imported anew by each case
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")  # restored after the test
    if filtered:  # as in a fresh worker, where TensorFlow is not loaded yet
        monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    logs = TensorFlowLogs("3", filtered=True) if filtered else TensorFlowLogs()
    importer = worker_warmup._start_import("slow_sentinel", logs, training_backend())
    time.sleep(0.1)  # the slow import is under way
    loaded: dict[str, float] = {}
    other = threading.Thread(target=lambda: loaded.update(t=_load("other_sentinel")))
    other.start()
    other.join(10)
    importer.join(10)
    slow = sys.modules["slow_sentinel"]
    assert worker_warmup._imported["slow_sentinel"] is True
    assert loaded["t"] >= slow.ended > slow.started
    # imported once per process
    assert worker_warmup._start_import("slow_sentinel", logs, training_backend()) is importer
    err = capfd.readouterr().err
    assert "a line of the module" in err
    assert ("oneDNN" in err) is not filtered, err


def _load(name: str) -> float:
    import importlib

    return float(importlib.import_module(name).loaded)


@pytest.mark.spark
def test_warm_up_imports_the_executor_in_the_workers_mapInArrow_uses(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(warmup, "_handles", {})  # as if no warm-up ran in this session
    # Earlier tests' fits imported the executor modules in these workers already: the
    # warm-up imports a module nothing else imports, so only it can have loaded it.
    monkeypatch.setattr(warmup, "_EXECUTOR_MODULE", SENTINEL)
    assert _seen(spark) == [False, False]
    sc = spark.sparkContext
    sc.setJobGroup("caller-group", "caller's job")
    try:
        handle = warm_up(spark)
        assert isinstance(handle, WarmUp)
        assert handle.wait(60), "the warm-up job did not finish within 60 s"
        assert handle.done
        # The warm-up job ran in the caller's group, and left the caller's properties.
        # Without wait on a local master, the query engine's warm-up is left out.
        assert len(sc.statusTracker().getJobIdsForGroup("caller-group")) == 1
        assert sc.getLocalProperty("spark.jobGroup.id") == "caller-group"
        assert sc.getLocalProperty("spark.job.description") == "caller's job"
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setJobDescription(None)

    started = time.perf_counter()
    assert warm_up(spark) is handle  # a second call reuses the first's result
    assert time.perf_counter() - started < 1.0

    assert _seen(spark) == [True, True]

    # A warm-up that ended long ago (Spark may have stopped its workers) runs again.
    handle._finished_at -= warmup.REWARM_AFTER + 1
    sc.setJobGroup("waiting-group", "caller's wait")
    try:
        again = warm_up(spark, wait=True)
        assert again is not handle and again.done
        # Every task reported its import done (read from the worker's own record), so
        # the next call, the fit's own included, reuses it instead of a new job.
        assert again._ok
        assert warm_up(spark) is again and warm_up(spark, wait=True) is again
        # With wait, the data checks' aggregate ran too (the engine's warm-up): its
        # failure would be swallowed, so the jobs are counted.
        assert len(sc.statusTracker().getJobIdsForGroup("waiting-group")) >= 2
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setJobDescription(None)


def _seen(spark: Any) -> list[bool]:
    """Whether each of two mapInArrow workers has the sentinel module imported."""
    rows = spark.range(2, numPartitions=2).mapInArrow(_sees_sentinel, "seen boolean").collect()
    return sorted(row.seen for row in rows)


def _sees_sentinel(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    import sys

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"seen": [SENTINEL in sys.modules]})
