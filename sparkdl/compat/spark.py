"""Every use sparkdl makes of PySpark's and Spark's private internals.

PySpark has no public API for a few things sparkdl needs, so this module reaches
through the Py4J handles of the ``SparkContext`` (``sc._jsc``, the JVM
``JavaSparkContext``, and ``sc._jvm``, the JVM's packages):

* :func:`task_slots`: how many tasks the cluster can run at once, which a barrier
  stage needs up front (Scala ``SparkContext.maxNumConcurrentTasks``);
* :func:`run_empty_job`: a job with no task, which Spark records (with the thread's job
  group and description) without queueing it behind the training job's tasks;
* :func:`hadoop_filesystem` and :func:`read_all_bytes`: Hadoop's ``FileSystem`` for a
  path, through which a saved model reaches any store Spark can write to;
* :func:`status_store` and :func:`stage_tasks`: the driver's ``AppStatusStore`` (behind
  Spark's UI), whose task list tells the parameter service which task attempts run;
* :func:`quiet_task_failures`: the level of the log4j loggers that print a failed
  task's Java stack trace on the driver, raised while a fit's job runs;
* :func:`session_key`: a classic session's JVM ``SparkSession`` (``spark._jsparkSession``),
  which names the session whose runtime settings a fit lowers.

Two private members of PySpark's ``Params``, which every third-party stage uses because
PySpark offers nothing public for them: :func:`param_parent` (``Params._dummy()``, the
placeholder parent of a ``Param`` declared on a class) and :func:`reset_uid`
(``Params._resetUid``, which a reader calls to give a loaded stage its saved uid).

A failed Spark job reaches Python as a ``Py4JJavaError`` (or one of PySpark's captured
exceptions) whose only structured content is its text: the Java message, with the
Python worker's traceback inside it. :func:`failure_summary`, :func:`retries_ran_out`
and :func:`is_unsupported_barrier_chain` parse that text.

``tests/integration/test_compat_spark.py`` checks each of these against a real
SparkSession and fails with a message naming PySpark's version and this module when
Spark changes shape.

Example:
    >>> retries_ran_out("Task 1 in stage 4.0 failed 4 times, most recent failure")
    (1, 4, 'spark.task.maxFailures')
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark import SparkContext

__all__ = [
    "failure_summary",
    "hadoop_filesystem",
    "is_unsupported_barrier_chain",
    "param_parent",
    "params_metadata",
    "quiet_task_failures",
    "read_all_bytes",
    "reset_uid",
    "retries_ran_out",
    "run_empty_job",
    "session_key",
    "stage_tasks",
    "status_store",
    "task_slots",
]

_log = logging.getLogger(__name__)


def session_key(spark: Any) -> str:
    """Names one session's runtime settings (``spark.conf``).

    A Spark Connect session by its public ``session_id``. A classic session by its JVM
    ``SparkSession`` (Py4J handle ``spark._jsparkSession``, its ``hashCode``: the JVM's
    identity hash): PySpark may wrap one session in several Python objects
    (``SparkSession.getActiveSession`` on PySpark 3.5 makes a new wrapper), and classic
    PySpark has no public id of a session. Without the handle it falls back to the
    object's Python identity; two fits through two wrappers of one session are then
    taken for two sessions, and the later to end may put back the other's lowered
    value (:func:`sparkdl.driver.arrow_batches.bounded_batches`).

    Example:
        >>> session_key(object()).startswith("python:")
        True
    """
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        return f"connect:{spark.session_id}"
    jsession = getattr(spark, "_jsparkSession", None)
    if jsession is not None:
        return f"jvm:{jsession.hashCode()}"
    return f"python:{id(spark)}"


def task_slots(sc: SparkContext) -> int:
    """Number of tasks the cluster can run at once with the default resource profile.

    Falls back to ``sc.defaultParallelism`` when the JVM methods are not there.

    Args:
        sc: The SparkContext.

    Returns:
        The task slots of the executors registered now.

    Example:
        >>> task_slots(spark.sparkContext)  # doctest: +SKIP
        2
    """
    try:
        jsc = sc._jsc.sc()
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile))
    except Exception:
        return int(sc.defaultParallelism)


def run_empty_job(sc: SparkContext) -> None:
    """Runs a job over an empty RDD: no partition, so no task.

    Spark records the job (started and succeeded at once) under the calling thread's
    job group and description, and runs no task, so it never waits for a slot.

    Args:
        sc: The SparkContext.

    Example:
        >>> sc.setJobDescription("epoch 3/20 done")  # doctest: +SKIP
        >>> run_empty_job(sc)  # doctest: +SKIP
    """
    jsc: Any = sc._jsc
    jsc.emptyRDD().count()  # a job with no task: recorded, never queued


#: Loggers that print a failed task's whole Java stack trace (the Python traceback
#: inside) on the driver, and the level they get while a fit's job runs: the fit raises
#: a WorkerError that names the cause first and holds each worker's traceback.
_TASK_FAILURE_LOGGERS = {
    "org.apache.spark.scheduler.TaskSetManager": "ERROR",  # WARN "Lost task ..." + trace
    "org.apache.spark.executor.Executor": "FATAL",  # local mode: "Exception in task" + trace
}
_quiet_lock = threading.Lock()
_quiet_users = 0
_quiet_saved: dict[str, Any] = {}


@contextlib.contextmanager
def quiet_task_failures(sc: SparkContext) -> Iterator[None]:
    """While inside, a failed task's Java stack trace is not logged on the driver.

    Reaches log4j 2's ``LogManager`` and ``Configurator`` through ``sc._jvm``: PySpark's
    only public handle, ``sc.setLogLevel``, sets the root level for everything. The
    levels of :data:`_TASK_FAILURE_LOGGERS` are raised by the first fit to enter and put
    back by the last to leave (fits may overlap); a failure to reach log4j changes
    nothing (the traces then show, as before).
    """
    global _quiet_users
    with _quiet_lock:
        if _quiet_users == 0:
            _quiet_saved.clear()
            with contextlib.suppress(Exception):
                for name, level in _TASK_FAILURE_LOGGERS.items():
                    _quiet_saved[name] = _own_level(sc, name)
                    _set_log_level(sc, name, level)
        _quiet_users += 1
    try:
        yield
    finally:
        with _quiet_lock:
            _quiet_users -= 1
            if _quiet_users == 0:
                with contextlib.suppress(Exception):
                    for name, level in _quiet_saved.items():
                        _restore_log_level(sc, name, level)


def _log_level(sc: SparkContext, name: str) -> str:
    """A log4j logger's effective level (its own, or the one it inherits)."""
    jvm: Any = sc._jvm
    return str(jvm.org.apache.logging.log4j.LogManager.getLogger(name).getLevel().name())


def _own_level(sc: SparkContext, name: str) -> str | None:
    """The level of the logger's own configuration; ``None`` when it has none (it
    inherits, and ``sc.setLogLevel`` on the root reaches it)."""
    jvm: Any = sc._jvm
    config = jvm.org.apache.logging.log4j.LogManager.getContext(False).getConfiguration()
    own = config.getLoggerConfig(name)
    return str(own.getLevel().name()) if str(own.getName()) == name else None


def _set_log_level(sc: SparkContext, name: str, level: str) -> None:
    jvm: Any = sc._jvm
    log4j = jvm.org.apache.logging.log4j
    log4j.core.config.Configurator.setLevel(name, log4j.Level.toLevel(level))


def _restore_log_level(sc: SparkContext, name: str, level: str | None) -> None:
    """Puts back what :func:`_own_level` read: the logger's own level, or no
    configuration of its own (so that it inherits again)."""
    if level is not None:
        _set_log_level(sc, name, level)
        return
    jvm: Any = sc._jvm
    context = jvm.org.apache.logging.log4j.LogManager.getContext(False)
    context.getConfiguration().removeLogger(name)
    context.updateLoggers()


def hadoop_filesystem(sc: SparkContext, path: str) -> tuple[Any, Any]:
    """Hadoop's FileSystem for ``path`` and the path as a Hadoop ``Path``.

    Args:
        sc: The SparkContext (its Hadoop configuration picks the FileSystem).
        path: Any path or URI Spark can write (local, ``file://``, ``hdfs://``...).

    Returns:
        ``(fs, hadoop_path)``: Py4J handles on ``org.apache.hadoop.fs.FileSystem`` and
        ``org.apache.hadoop.fs.Path``.

    Example:
        >>> fs, target = hadoop_filesystem(sc, "/tmp/model/state.json")  # doctest: +SKIP
        >>> bool(fs.exists(target))  # doctest: +SKIP
        False
    """
    jvm: Any = sc._jvm
    target = jvm.org.apache.hadoop.fs.Path(path)
    jsc: Any = sc._jsc
    return target.getFileSystem(jsc.hadoopConfiguration()), target


def read_all_bytes(sc: SparkContext, stream: Any) -> bytes:
    """Reads a JVM ``InputStream`` (e.g. ``fs.open(path)``) to its end.

    Uses ``org.apache.commons.io.IOUtils``, which Spark ships. The caller closes the
    stream.

    Args:
        sc: The SparkContext.
        stream: A Py4J handle on a ``java.io.InputStream``.

    Returns:
        The stream's bytes.

    Example:
        >>> fs, source = hadoop_filesystem(sc, "/tmp/model/state.json")  # doctest: +SKIP
        >>> read_all_bytes(sc, fs.open(source))  # doctest: +SKIP
        b'{}'
    """
    jvm: Any = sc._jvm
    return bytes(jvm.org.apache.commons.io.IOUtils.toByteArray(stream))


def status_store(sc: SparkContext) -> Any | None:
    """The driver's ``AppStatusStore``, or ``None`` where it cannot be reached.

    PySpark's ``StatusTracker`` lists jobs and stages but not their tasks, so this
    reaches the Scala ``SparkContext.statusStore()`` (``private[spark]`` in Scala, public
    in the bytecode) through ``sc._jsc.sc()``. Where that fails (Spark Connect, a Spark
    without it), ``None``: the caller then runs without what it would have read.

    Args:
        sc: The SparkContext.

    Returns:
        A Py4J handle on ``org.apache.spark.status.AppStatusStore``, or ``None``.

    Example:
        >>> status_store(spark.sparkContext) is not None  # doctest: +SKIP
        True
    """
    try:
        return sc._jsc.sc().statusStore()
    except Exception as exc:  # Spark Connect, or a Spark without it
        _log.debug("Spark's status store is not reachable: %s", exc)
        return None


def stage_tasks(
    store: Any, stage_id: int, stage_attempt: int, limit: int
) -> list[tuple[int, int, str]]:
    """The tasks of one stage attempt in the status store, newest first.

    Reads ``AppStatusStore.taskList(stageId, stageAttemptId, maxTasks)``, a Scala
    ``Seq`` of ``TaskData`` (``taskId``, ``partitionId``, ``status``).

    Args:
        store: What :func:`status_store` returned (not ``None``).
        stage_id: The stage.
        stage_attempt: The stage's attempt number.
        limit: At most this many tasks.

    Returns:
        ``(task id, partition, status)`` per task, status as Spark's UI writes it
        (``"RUNNING"``, ``"SUCCESS"``, ``"FAILED"``...).

    Raises:
        py4j.protocol.Py4JError: The store has changed shape (the caller handles it as
            any Py4J trouble).

    Example:
        >>> stage_tasks(status_store(sc), 0, 0, 100)  # doctest: +SKIP
        [(1, 1, 'SUCCESS'), (0, 0, 'SUCCESS')]
    """
    listed = store.taskList(stage_id, stage_attempt, limit)
    tasks = []
    for i in range(listed.length()):
        task = listed.apply(i)
        tasks.append((int(task.taskId()), int(task.partitionId()), str(task.status())))
    return tasks


def param_parent() -> Any:
    """The placeholder parent of a ``Param`` declared on a class: ``Params._dummy()``.

    PySpark's own stages declare their Params with it, and ``Params`` copies each to
    the instance (with the instance as parent) when it is built; there is no public
    spelling.

    Returns:
        PySpark's dummy ``Params`` instance.

    Raises:
        AttributeError: PySpark no longer has ``Params._dummy`` (with a message naming
            this module).

    Example:
        >>> from pyspark.ml.param import Param
        >>> Param(param_parent(), "featuresCol", "the features").parent
        'undefined'
    """
    from pyspark.ml.param import Params

    dummy = getattr(Params, "_dummy", None)
    if dummy is None:
        raise AttributeError(
            "pyspark.ml.param.Params._dummy is gone in this PySpark; sparkdl's Params need "
            "sparkdl/compat/spark.py updated."
        )
    return dummy()


def params_metadata(stage: Any, spark: Any) -> str:
    """The JSON line of Spark ML's Params metadata for ``stage`` (what
    ``DefaultParamsWriter.saveMetadata`` writes), for a writer that must choose the
    save mode itself: ``saveMetadata`` writes without one, so it cannot overwrite over
    Spark Connect. Reaches the private ``DefaultParamsWriter._get_metadata_to_save``.

    Example:
        >>> params_metadata(stage, spark)  # doctest: +SKIP
        '{"class": "sparkdl.model.KerasModel", ...}'
    """
    from pyspark.ml.util import DefaultParamsWriter

    return str(DefaultParamsWriter._get_metadata_to_save(stage, spark))


def reset_uid(stage: Any, uid: str) -> None:
    """Gives a loaded stage (and its Params) the uid it was saved with:
    ``Params._resetUid``, what PySpark's own ``DefaultParamsReader`` calls.

    It also re-keys the stage's param maps (a ``Param`` hashes by its parent's uid),
    which no public method does; so there is no fallback.

    Args:
        stage: A ``pyspark.ml.param.Params``.
        uid: The saved uid.

    Raises:
        AttributeError: PySpark no longer has ``Params._resetUid`` (with a message naming
            this module).

    Example:
        >>> from pyspark.ml.param.shared import HasInputCol
        >>> stage = HasInputCol()
        >>> reset_uid(stage, "Stage_saved")
        >>> stage.uid, stage.inputCol.parent
        ('Stage_saved', 'Stage_saved')
    """
    method = getattr(stage, "_resetUid", None)
    if method is None:
        raise AttributeError(
            f"{type(stage).__name__} has no _resetUid in this PySpark; loading sparkdl's "
            "stages needs sparkdl/compat/spark.py updated."
        )
    method(uid)


def retries_ran_out(text: str) -> tuple[int, int, str] | None:
    """``(worker, attempts, the setting)`` when Spark gave up retrying a task or stage.

    Args:
        text: The text of the failed job's exception.

    Returns:
        The failing task's partition (``-1`` when a stage failed with no barrier task
        named), how many times it failed, and the Spark setting that bounds the
        retries; ``None`` when the text names no exhausted retries.

    Example:
        >>> retries_ran_out("Task 1 in stage 4.0 failed 4 times, most recent failure")
        (1, 4, 'spark.task.maxFailures')
        >>> retries_ran_out(
        ...     "ResultStage 3 has failed the maximum allowable number of times: 4. "
        ...     "Most recent failure reason: barrier task ResultTask(3, 1) failed"
        ... )
        (1, 4, 'spark.stage.maxConsecutiveAttempts')
        >>> retries_ran_out("Could not recover from a failed barrier ResultStage") is None
        True
    """
    task = re.search(r"Task (\d+) in stage [\d.]+ failed (\d+) times", text)
    if task:
        return int(task.group(1)), int(task.group(2)), "spark.task.maxFailures"
    stage = re.search(r"has failed the maximum allowable number of times: (\d+)", text)
    if stage:
        barrier = re.search(r"barrier task \w+\(\d+, (\d+)\)", text)
        worker = int(barrier.group(1)) if barrier else -1
        return worker, int(stage.group(1)), "spark.stage.maxConsecutiveAttempts"
    return None


def failure_summary(exc: BaseException) -> tuple[str, str]:
    """The Python traceback inside a failed Spark job's exception, and its last line.

    When the text holds a Python traceback, that is the trace and its last line the
    summary. Otherwise the trace is the first lines of the text that are not Java stack
    frames, and the summary the first line saying a Python worker crashed, else the
    first ``...Exception`` / ``...Error`` line, else the first line. A summary naming
    ``ModuleNotFoundError`` gets a hint about ``PYSPARK_PYTHON`` appended.

    Args:
        exc: The exception ``collect()`` raised.

    Returns:
        ``(trace, last)``: the traceback text and its last meaningful line.

    Example:
        >>> text = (
        ...     "An error occurred while calling o81.collectToPython.\\n"
        ...     "Traceback (most recent call last):\\n"
        ...     '  File "train.py", line 3, in boom\\n'
        ...     "ValueError: boom-123\\n"
        ...     "\\n\\tat org.apache.spark.api.python.BasePythonRunner.read(...)"
        ... )
        >>> trace, last = failure_summary(RuntimeError(text))
        >>> last
        'ValueError: boom-123'
        >>> trace.splitlines()[0]
        'Traceback (most recent call last):'
        >>> failure_summary(RuntimeError(text.replace("\\n\\n", "\\n SQLSTATE: 38000\\n")))[1]
        'ValueError: boom-123'
        >>> failure_summary(RuntimeError(
        ...     "Job aborted due to stage failure: Task 0 in stage 1.0 failed 1 times\\n"
        ...     ": org.apache.spark.SparkException: Python worker exited unexpectedly "
        ...     "(crashed)\\n\\tat org.apache.spark.api.python.BasePythonRunner"
        ... ))[1]
        'Python worker exited unexpectedly (crashed)'
        >>> failure_summary(RuntimeError())
        ('RuntimeError', 'RuntimeError')
    """
    text = str(exc)
    match = re.search(
        r"Traceback \(most recent call last\):.*?(?=\n\tat |\n\s*at org\.|\Z)", text, re.S
    )
    if match:
        # PySpark 4.3 ends a Python exception's message with its SQL state line.
        trace = re.sub(r"\n[ \t]*SQLSTATE: \w+[ \t]*(?=\n|$)", "", match.group(0)).rstrip()
        last = trace.strip().splitlines()[-1]
    else:
        lines = [
            ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("\tat ")
        ]
        trace = "\n".join(lines[:6]) or type(exc).__name__
        causes = [ln for ln in lines if re.search(r"^:?\s*[\w.$]+(Exception|Error)\b", ln)]
        crashed = [ln for ln in lines if "Python worker exited unexpectedly" in ln]
        last = (crashed or causes or lines or [type(exc).__name__])[0].lstrip(": ")
        last = re.sub(r"^.*?(?=Python worker exited)", "", last)
    if "ModuleNotFoundError" in last:
        last += (
            ". Spark's Python workers run another Python than the driver's; set the "
            "environment variable PYSPARK_PYTHON (or spark.pyspark.python) to a Python "
            "that has sparkdl installed before the SparkSession starts"
        )
    return trace, last


def is_unsupported_barrier_chain(exc: BaseException) -> bool:
    """Whether Spark refused a barrier stage over this RDD chain at submission.

    Spark refuses a barrier stage whose ancestors in the same stage have another
    partition count (``union``, ``coalesce``...), before any task runs
    (``BarrierJobUnsupportedRDDChainRunningException``).

    Args:
        exc: The exception the barrier job's ``collect()`` raised.

    Returns:
        True when the job failed for that reason (a repartition fixes it).

    Example:
        >>> is_unsupported_barrier_chain(RuntimeError(
        ...     "org.apache.spark.scheduler.BarrierJobUnsupportedRDDChainRunningException: "
        ...     "[SPARK-24820][SPARK-24821]: Barrier execution mode does not allow ..."
        ... ))
        True
        >>> is_unsupported_barrier_chain(ValueError("boom"))
        False
    """
    return "BarrierJobUnsupportedRDDChain" in str(exc)
