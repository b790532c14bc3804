"""Shape tests of the Spark internals :mod:`sparkdl.compat.spark` relies on.

Each runs the compat function against the real local[2] session (and, for the failure
parsers, the text of real failed jobs), and fails naming PySpark's version and the
module to update when Spark changes shape.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import pyspark
import pytest
from py4j.protocol import Py4JError

from sparkdl.compat.spark import (
    failure_summary,
    hadoop_filesystem,
    is_unsupported_barrier_chain,
    quiet_task_failures,
    read_all_bytes,
    retries_ran_out,
    run_empty_job,
    session_key,
    stage_tasks,
    status_store,
    task_slots,
)

pytestmark = [pytest.mark.spark]

MODULE = "sparkdl/compat/spark.py"


def changed(what: str) -> str:
    return f"pyspark {pyspark.__version__} changed {what}; update {MODULE}"


def local_cores(master: str) -> int:
    match = re.fullmatch(r"local\[(\d+)(?:,\s*\d+)?\]", master)
    assert match, f"these tests expect a local[N] master, got {master!r}"
    return int(match.group(1))


def failed_job(run: Any) -> BaseException:
    """The exception a job that must fail raised."""
    try:
        run()
    except Exception as exc:
        return exc
    pytest.fail("the job was meant to fail but succeeded")


@pytest.fixture(scope="module")
def python_error(spark) -> BaseException:  # type: ignore[no-untyped-def]
    """A mapInArrow job (as fit runs) whose task for partition 1 raises ValueError."""

    def boom(batches: Any) -> Any:
        from pyspark import TaskContext

        if TaskContext.get().partitionId() == 1:  # type: ignore[union-attr]
            raise ValueError("boom-123")
        yield from batches

    frame = spark.range(0, 4, numPartitions=2)
    return failed_job(lambda: frame.mapInArrow(boom, "id long").collect())


@pytest.fixture(scope="module")
def worker_crash(spark) -> BaseException:  # type: ignore[no-untyped-def]
    """A mapInArrow job whose Python worker for partition 1 dies (as when OOM-killed)."""

    def crash(batches: Any) -> Any:
        import os

        from pyspark import TaskContext

        if TaskContext.get().partitionId() == 1:  # type: ignore[union-attr]
            os._exit(3)
        yield from batches

    frame = spark.range(0, 4, numPartitions=2)
    return failed_job(lambda: frame.mapInArrow(crash, "id long").collect())


def test_task_slots_is_the_local_core_count(spark) -> None:
    sc = spark.sparkContext
    try:
        jsc = sc._jsc.sc()
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        slots = int(jsc.maxNumConcurrentTasks(profile))
    except Py4JError as exc:
        pytest.fail(
            changed(
                "SparkContext.resourceProfileManager().defaultResourceProfile() / "
                f"maxNumConcurrentTasks(profile) ({type(exc).__name__}: {exc})"
            )
        )
    cores = local_cores(sc.master)
    assert slots == cores, changed(f"maxNumConcurrentTasks: {slots} on {sc.master}")
    assert task_slots(sc) == cores


def test_session_key_names_the_jvm_session_whatever_wraps_it(spark) -> None:
    """Two Python wrappers of one session share its key; another session has its own."""
    from pyspark.sql import SparkSession

    key = session_key(spark)
    assert key.startswith("jvm:"), changed(f"SparkSession._jsparkSession (key {key!r})")
    again = SparkSession(spark.sparkContext, spark._jsparkSession)  # another wrapper
    assert session_key(again) == key, changed("the JVM session's hashCode")
    assert session_key(spark.newSession()) != key


def test_run_empty_job_adds_a_job_to_the_current_group(spark) -> None:
    sc = spark.sparkContext
    tracker = sc.statusTracker()
    group = f"sparkdl-compat-{uuid.uuid4().hex[:8]}"
    sc.setJobGroup(group, "compat shape test")
    try:
        before = set(tracker.getJobIdsForGroup(group))
        try:
            run_empty_job(sc)
        except Py4JError as exc:
            pytest.fail(changed(f"JavaSparkContext.emptyRDD().count() ({exc})"))
        deadline = time.monotonic() + 10  # the status store hears of jobs asynchronously
        new: set[int] = set()
        while not new and time.monotonic() < deadline:
            new = set(tracker.getJobIdsForGroup(group)) - before
            if not new:
                time.sleep(0.05)
    finally:
        sc.setJobDescription(None)  # type: ignore[arg-type]
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    assert len(new) == 1, changed(f"emptyRDD().count(): {len(new)} new jobs in the job group")
    job = new.pop()
    info = tracker.getJobInfo(job)
    # The job ran (count() returned); the status store may still say RUNNING for a while.
    while info is not None and info.status == "RUNNING" and time.monotonic() < deadline + 10:
        time.sleep(0.05)
        info = tracker.getJobInfo(job)
    assert info is not None and info.status == "SUCCEEDED", changed(f"empty job: {info}")


def test_hadoop_filesystem_writes_and_reads_back(spark, tmp_path) -> None:
    sc = spark.sparkContext
    path = tmp_path / "stage" / "blob.bin"
    data = bytes(range(256)) * 40
    try:
        fs, target = hadoop_filesystem(sc, str(path))
        out = fs.create(target, True)
        try:
            out.write(data)
        finally:
            out.close()
        assert bool(fs.exists(target))
        stream = fs.open(target)
        try:
            got = read_all_bytes(sc, stream)
        finally:
            stream.close()
    except Py4JError as exc:
        pytest.fail(changed(f"the Hadoop FileSystem through sc._jvm / sc._jsc ({exc})"))
    assert got == data
    assert path.read_bytes() == data
    missing = hadoop_filesystem(sc, f"file://{tmp_path}/absent")
    assert not bool(missing[0].exists(missing[1]))


def test_failure_summary_of_a_python_exception(python_error) -> None:
    trace, last = failure_summary(python_error)
    assert "ValueError: boom-123" in last, changed(
        f"the text of a failed Python task ({type(python_error).__name__}): {python_error}"
    )
    assert trace.startswith("Traceback (most recent call last):")
    assert "boom" in trace


def test_python_exception_text_names_no_retries(python_error) -> None:
    # PySpark turns a Python error into a PythonException that keeps the worker's
    # traceback only, not Spark's "Task 1 in stage 4.0 failed 1 times": retries are
    # detected on the other failures (a crashed or lost worker, a failed stage).
    assert retries_ran_out(str(python_error)) is None, changed(
        f"PythonException now names Spark's retries: {python_error}"
    )


def test_failure_summary_and_retries_of_a_crashed_worker(spark, worker_crash) -> None:
    text = str(worker_crash)
    trace, last = failure_summary(worker_crash)
    assert last.startswith("Python worker exited unexpectedly"), changed(
        f"the text of a crashed Python worker: {text[:2000]}"
    )
    assert trace
    # local[N] runs each task once (spark.task.maxFailures does not apply), so Spark says
    # "Task 1 in stage S failed 1 times".
    got = retries_ran_out(text)
    assert got == (1, 1, "spark.task.maxFailures"), changed(
        f"the text of a job whose retries ran out: {got} from {text[:2000]}"
    )


def test_unsupported_barrier_chain_is_recognised(spark) -> None:
    """A barrier stage over union() fails at submission (no task runs)."""
    sc = spark.sparkContext

    def same(batches: Any) -> Any:
        yield from batches

    rdd = sc.parallelize([(1,)], 1).union(sc.parallelize([(2,)], 1))
    frame = spark.createDataFrame(rdd, "id long")
    exc = failed_job(
        lambda: frame.mapInArrow(same, "id long", barrier=True).repartition(1).collect()
    )
    assert is_unsupported_barrier_chain(exc), changed(
        f"the text of a refused barrier stage: {str(exc)[:2000]}"
    )
    assert not is_unsupported_barrier_chain(ValueError("boom-123"))


def test_status_store_lists_the_tasks_of_a_job_group(spark) -> None:
    """What :class:`sparkdl.server.web.attempts.SparkAttempts` reads: each task's id,
    partition and status, per stage attempt of the job group's stages."""
    sc = spark.sparkContext
    store = status_store(sc)
    assert store is not None, changed("SparkContext.statusStore() (not reachable)")
    tracker = sc.statusTracker()
    group = f"sparkdl-compat-{uuid.uuid4().hex[:8]}"
    sc.setJobGroup(group, "compat shape test")
    try:
        sc.parallelize(range(4), 2).map(lambda x: x).count()
    finally:
        sc.setJobDescription(None)  # type: ignore[arg-type]
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    deadline = time.monotonic() + 10  # the status store hears of tasks asynchronously
    tasks: list[tuple[int, int, str]] = []
    while time.monotonic() < deadline:
        tasks = []
        for job_id in tracker.getJobIdsForGroup(group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job else ():
                stage = tracker.getStageInfo(stage_id)
                assert stage is not None
                for attempt in range(stage.currentAttemptId + 1):
                    try:
                        tasks += stage_tasks(store, stage_id, attempt, 100)
                    except Py4JError as exc:
                        pytest.fail(changed(f"AppStatusStore.taskList / TaskData ({exc})"))
        if len(tasks) == 2 and all(status == "SUCCESS" for _, _, status in tasks):
            break
        time.sleep(0.05)
    assert sorted(partition for _, partition, _ in tasks) == [0, 1], changed(
        f"AppStatusStore.taskList: {tasks}"
    )
    assert all(isinstance(task_id, int) for task_id, _, _ in tasks)
    assert len({task_id for task_id, _, _ in tasks}) == 2
    assert {status for _, _, status in tasks} == {"SUCCESS"}, changed(f"TaskData.status: {tasks}")


def test_task_failure_traces_are_quiet_while_a_fit_runs_and_levels_come_back(spark) -> None:
    from sparkdl.compat import spark as compat_spark

    sc = spark.sparkContext
    names = list(compat_spark._TASK_FAILURE_LOGGERS)
    before = {name: compat_spark._log_level(sc, name) for name in names}
    own_before = {name: compat_spark._own_level(sc, name) for name in names}
    with quiet_task_failures(sc):
        with quiet_task_failures(sc):  # a second fit at once
            inside = {name: compat_spark._log_level(sc, name) for name in names}
        still = {name: compat_spark._log_level(sc, name) for name in names}
    after = {name: compat_spark._log_level(sc, name) for name in names}
    assert inside == compat_spark._TASK_FAILURE_LOGGERS, changed(
        f"log4j's Configurator.setLevel / LogManager.getLogger: {inside}"
    )
    assert still == inside  # the first fit still runs
    assert after == before
    # Each logger has again only the configuration it had (none: it inherits, and the
    # root's level, which sc.setLogLevel sets, reaches it again).
    assert {name: compat_spark._own_level(sc, name) for name in names} == own_before
    sc.setLogLevel("INFO")
    try:
        inherited = [n for n in names if own_before[n] is None]
        assert all(compat_spark._log_level(sc, n) == "INFO" for n in inherited)
    finally:
        sc.setLogLevel("ERROR")
