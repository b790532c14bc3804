"""A task attempt is taken only when Spark confirms it: a made-up one fences nothing."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from sparkdl.server.state.store import WeightStore
from sparkdl.server.web.app import create_app
from sparkdl.server.web.attempts import SparkAttempts
from sparkdl.sync.merges import Delta
from tests.stores import joined

FORGED = 2**62 - 1


def test_the_service_refuses_an_attempt_its_check_does_not_confirm() -> None:
    store = joined(
        WeightStore([np.zeros(2, np.float32)], num_workers=2, merge=Delta(), mode="asynchronous")
    )
    client = create_app(store, "t", attempts=lambda worker, attempt: attempt < 100).test_client()
    auth = {"Authorization": "Bearer t"}
    forged = client.post("/join", json={"worker": 0, "rows": 10, "attempt": FORGED}, headers=auth)
    assert forged.status_code == 409 and "not a running task" in forged.get_json()["error"]
    failed = client.post(
        "/fail",
        json={"worker": 1, "traceback": "x", "attempt": FORGED, "fatal": True},
        headers=auth,
    )
    assert failed.status_code == 409 and store.status()["aborted"] is None
    left = client.post("/leave", json={"worker": 1, "attempt": FORGED}, headers=auth)
    assert left.status_code == 409 and store.status()["left"] == []
    assert store.newest_attempt(0) == 0  # nothing fenced
    honest = client.post("/join", json={"worker": 0, "rows": 10, "attempt": 7}, headers=auth)
    assert honest.status_code == 200 and store.newest_attempt(0) == 7


def _hold(marker_dir: str, seconds: float) -> Any:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        for _ in batches:
            pass
        ctx = TaskContext.get()
        assert ctx is not None
        name = os.path.join(marker_dir, f"{ctx.partitionId()}-{ctx.taskAttemptId()}")
        with open(name, "w"):
            pass
        time.sleep(seconds)
        yield pa.RecordBatch.from_pydict({"ok": [True]})

    return run


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
@pytest.mark.spark
def test_spark_confirms_only_a_running_task_of_the_groups_job(spark: Any, tmp_path: Any) -> None:
    sc = spark.sparkContext
    group = "sparkdl-test-attempts"
    done: list[Any] = []

    def job() -> None:
        sc.setJobGroup(group, "held tasks")
        try:
            frame = spark.range(2, numPartitions=2)
            done.extend(frame.mapInArrow(_hold(str(tmp_path), 6.0), "ok boolean").collect())
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)

    thread = threading.Thread(target=job)
    thread.start()
    deadline = time.monotonic() + 60
    while len(os.listdir(tmp_path)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    tasks = sorted(tuple(int(p) for p in n.split("-")) for n in os.listdir(tmp_path))
    assert [partition for partition, _ in tasks] == [0, 1]
    check = SparkAttempts(sc, group, timeout=3.0)
    other = SparkAttempts(sc, "another-group", timeout=0.5)
    try:
        assert check.available
        for partition, attempt in tasks:
            assert check(partition, attempt)  # a running task of the group's job
        (p0, a0), (_, a1) = tasks
        assert not check(p0, a1)  # another partition's task
        assert not check(p0, FORGED)  # no such task
        assert not other(p0, a0)  # not this group's job
    finally:
        thread.join(60)
    assert len(done) == 2
    assert not SparkAttempts(sc, group, timeout=0.5)(p0, a0)  # no longer running
