"""Warms Spark's Python workers: TensorFlow imported, and quiet, before the fit needs it.

A fit's first task spends seconds importing TensorFlow and Keras in a cold Python
worker. Spark keeps a Python worker alive between tasks
(``spark.python.worker.reuse``, on by default), so a module imported by one task is
there for the next task in that process. :func:`warm_up` uses this: one small
``mapInArrow`` job, one task per task slot, started from a driver thread, whose tasks
import :mod:`sparkdl.executor.training` in their worker. The caller goes on at once
(the driver's own preparation overlaps the imports); the fit's tasks then find the
modules loaded, or loading.

A task does not hold its slot while its worker imports: it starts the import in a
background thread of the worker and returns (:mod:`sparkdl.executor.warmup`, named by
:func:`sparkdl.contract.warmup_task.warm_function`), so the fit's own first Spark job (the data
checks, a JVM job) runs beside the imports instead of queueing behind them. The thread
holds Python's global import lock (:func:`sparkdl.compat.imports.global_import_lock`)
for the whole import, so every other thread of that worker that imports a module not
yet loaded waits until it is done. Without that, a later task importing TensorFlow by another way in
(``import keras`` in a pandas UDF, while ``sparkdl.executor.training`` is still
loading) would race it: TensorFlow and Keras import each other in cycles, and Python
then raises ``_DeadlockError``, or ``AttributeError`` on a partially initialized
module, in both threads. With the lock, the next task of that worker (the fit's
training task, or anyone's) simply starts when the import is done.

The job is a ``mapInArrow`` over ``spark.range`` on purpose: an executor keeps one pool
of Python workers per set of worker environment variables, and an RDD job
(``rdd.mapPartitions``) sets other ones than a DataFrame's Python functions
(``mapInArrow``, barrier or not, and pandas UDFs share their pool), so an RDD job would
warm workers the fit never uses. Spark stops the idle Python workers of a pool that saw
no activity for a minute, so a warm-up helps a fit that starts soon after it.

The import leaves out what Keras would load for features a worker never runs
(:func:`sparkdl.executor.imports.import_executor`), and :func:`warm_up` called by the
user (not a fit's own)
may also run one small aggregate on the driver, so that the fit's data checks find
Spark's query engine compiled (the ``engine`` argument).

A worker loads the driver's Keras backend
(:func:`sparkdl.contract.backends.training_backend`, set up by
:mod:`sparkdl.executor.backends`) as :func:`tensorflow_logs` decided on the driver
(:mod:`sparkdl.contract.tf_logs`): on a ``local[...]`` master, where its stderr is the driver's,
with TensorFlow's log lines kept off it.

Example:
    >>> gpus_requested({"spark.task.resource.gpu.amount": "1"})
    True
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from sparkdl.compat.spark_versions import inheritable_thread
from sparkdl.contract.backends import training_backend
from sparkdl.contract.tf_logs import TensorFlowLogs
from sparkdl.contract.warmup_task import WARMUP_SCHEMA, warm_function

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from sparkdl.compat.sessions import SessionTools

__all__ = [
    "JOB_DESCRIPTION",
    "REWARM_AFTER",
    "WarmUp",
    "gpus_requested",
    "tensorflow_logs",
    "warm_up",
]

#: Seconds after which a finished warm-up is run again: Spark stops Python workers
#: that stayed idle for 60 s (``PythonWorkerFactory``'s idle timeout).
REWARM_AFTER = 45.0

#: The warm-up job's description in the Spark UI.
JOB_DESCRIPTION = "sparkdl warm-up"

#: :data:`sparkdl.executor.imports.EXECUTOR_MODULE`, named here, not imported: the driver
#: does not import the executor side.
_EXECUTOR_MODULE = "sparkdl.executor.training"

_log = logging.getLogger(__name__)


class WarmUp:
    """The handle :func:`warm_up` returns: whether its Spark job has finished.

    The job finishes when every task has started its worker's import (with
    ``wait=True``: when every import is done). A failed job (or import) counts as
    finished: the warm-up never fails a fit.
    """

    def __init__(self) -> None:
        self._finished = threading.Event()
        self._ok = False
        self._finished_at = 0.0
        self._blocking = False  # whether its tasks waited for their imports
        self._tasks = 0  # workers it warmed

    @property
    def done(self) -> bool:
        """Whether the warm-up job has finished (or failed, or was skipped)."""
        return self._finished.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Waits for the warm-up job to finish.

        Args:
            timeout: Seconds to wait at most; ``None`` waits for as long as it takes.

        Returns:
            ``True`` if the job has finished, ``False`` if ``timeout`` ran out first.
        """
        return self._finished.wait(timeout)

    def _finish(self, ok: bool) -> None:
        self._ok = ok
        self._finished_at = time.monotonic()
        self._finished.set()

    def _stale(self) -> bool:
        """Whether a new warm-up job should replace this one: it failed, or it ended
        so long ago that Spark may have stopped the workers it warmed."""
        if not self.done:
            return False
        return not self._ok or time.monotonic() - self._finished_at > REWARM_AFTER


def warm_up(
    spark: SparkSession,
    *,
    workers: int | None = None,
    wait: bool = False,
    engine: bool | None = None,
) -> WarmUp:
    """Imports TensorFlow and Keras in every Python worker, from a driver thread.

    Runs one ``mapInArrow`` job of ``workers`` tasks (default: one per task slot,
    the default parallelism) from a daemon thread of the driver, described as
    :data:`JOB_DESCRIPTION` in the Spark UI; each task starts the import in its
    worker's background (holding Python's import lock, so that the worker's next task
    waits for it) and ends. The caller's job group and other local properties are
    inherited, never changed. A second call in the same SparkContext returns the first
    call's handle unless that job failed, warmed fewer workers, or ended more than
    :data:`REWARM_AFTER` seconds ago (Spark stops a Python worker idle for a minute; a
    warm-up of workers that are still warm costs one short job). Errors are logged at
    debug level and swallowed.

    Args:
        spark: The active SparkSession.
        workers: Python workers to warm: pass the fit's ``num_workers`` (each one
            holds TensorFlow, about 0.7 GB, so a machine of many slots need not warm
            them all).
        wait: Whether to return only when every task's worker has imported the
            executor modules (the tasks then wait for their imports).
        engine: Whether the same thread then runs one small aggregate shaped as a
            fit's data checks (64 generated rows), so that the fit's checks find
            Spark's query engine warm: the session's first aggregate took 3.8-5 s on
            digits, later ones about 1 s (2-core machine; a JVM loads and compiles its
            query classes at first use). ``None``: with ``wait``, or when the driver
            does not share its machine with the executors (a master other than
            ``local``). Without ``wait`` on a local master it would take the cores
            the workers' imports need (the demo's first fit measured 3.5 s slower on
            2 cores). A fit's own warm-up leaves it out (its checks run at once).

    Returns:
        A :class:`WarmUp` handle.

    Example:
        >>> handle = warm_up(spark)  # doctest: +SKIP
        >>> handle.wait(60)  # doctest: +SKIP
        True
    """
    from sparkdl.compat.sessions import session_tools
    from sparkdl.driver.cluster import parse_local_master  # driver side only

    try:
        tools = session_tools(spark)
        app_id = tools.key()
        with _lock:
            handle = _handles.get(app_id)
            tasks = _tasks(tools, workers)
            if (
                handle is None
                or handle._stale()
                or (wait and not handle._blocking)
                or handle._tasks < tasks
            ):
                if engine is None:
                    engine = wait or not parse_local_master(tools.master)
                handle = _start(tools, tasks, wait=wait, engine=engine)
                _handles[app_id] = handle
    except Exception as exc:  # a stopped session fails
        _log.debug("sparkdl warm-up skipped: %s", exc)
        return _finished(ok=False)
    if wait:
        handle.wait()
    return handle


def tensorflow_logs(tools: SessionTools) -> TensorFlowLogs:
    """How quietly this session's workers load Keras (:mod:`sparkdl.contract.tf_logs`),
    decided on the driver from its environment, the master and whether tasks get GPUs
    (a local master's executors share its terminal, the Connect server's too)."""
    from sparkdl.driver.cluster import runs_in_driver_jvm  # driver side only

    local = runs_in_driver_jvm(tools.master)
    gpus = gpus_requested({key: tools.conf(key) for key in _GPU_KEYS})
    return TensorFlowLogs.resolve(local=local, gpus=gpus)


def gpus_requested(conf: Any) -> bool:
    """Whether a SparkConf gives executors or tasks GPUs
    (``spark.{executor,task}.resource.gpu.amount``).

    Example:
        >>> gpus_requested({"spark.task.resource.gpu.amount": "1"})
        True
    """
    for key in _GPU_KEYS:
        try:
            if float(conf.get(key) or 0) > 0:
                return True
        except ValueError:
            continue
    return False


_GPU_KEYS = ("spark.task.resource.gpu.amount", "spark.executor.resource.gpu.amount")

# Driver side: one handle per SparkContext (by application id) or Connect session.
_lock = threading.Lock()
_handles: dict[str, WarmUp] = {}


def _finished(*, ok: bool) -> WarmUp:
    handle = WarmUp()
    handle._finish(ok)
    return handle


def _tasks(tools: SessionTools, workers: int | None) -> int:
    slots = max(1, tools.parallelism())
    return slots if workers is None else max(1, min(int(workers), slots))


def _start(tools: SessionTools, tasks: int, *, wait: bool, engine: bool) -> WarmUp:
    """Runs the warm-up job (and :func:`_warm_engine`) from an inheritable daemon
    thread; returns its handle."""
    spark = tools.spark
    if (tools.conf("spark.python.worker.reuse", "true") or "true").lower() != "true":
        _log.debug("sparkdl warm-up skipped: spark.python.worker.reuse is false")
        return _finished(ok=True)  # nothing a warm-up could do in this SparkContext
    handle = WarmUp()
    handle._blocking = block = wait
    handle._tasks = tasks
    logs = tensorflow_logs(tools)
    backend = training_backend()

    def run() -> None:
        ok = False
        try:
            # Local properties are per thread: this sets the description of this
            # thread's jobs only, under the job group inherited from the caller.
            tools.describe(JOB_DESCRIPTION)
            frame = spark.range(tasks, numPartitions=tasks)
            warm = warm_function(logs, backend, _EXECUTOR_MODULE, block=block)
            rows = frame.mapInArrow(warm, WARMUP_SCHEMA).collect()
            ok = all(row.ok for row in rows)
            _log.debug("sparkdl warm-up of workers %s: ok=%s", [row.pid for row in rows], ok)
            if engine:
                _warm_engine(spark, tasks)
        except Exception as exc:
            _log.debug("sparkdl warm-up failed (ignored): %s", exc, exc_info=True)
        finally:
            handle._finish(ok)

    thread = inheritable_thread(run, name="sparkdl-warm-up", session=spark)
    thread.start()
    return handle


def _warm_engine(spark: SparkSession, partitions: int) -> None:
    """Runs a fit's data checks (:func:`sparkdl.driver.data_scan.summarize`) on 64 generated rows of
    the common shape (``array<float>`` features, an integer label) behind a shuffle: the
    driver's JVM loads and compiles what the fit's own checks will use."""
    from pyspark.sql import functions as F

    from sparkdl.contract.payload import feature_name, label_name
    from sparkdl.driver import data_scan

    rows = spark.range(64, numPartitions=min(partitions, 2)).select(
        F.array(F.rand(0).cast("float")).alias(feature_name(0)),
        (F.col("id") % 2).cast("int").alias(label_name(0)),
    )
    data_scan.summarize(rows.repartition(min(partitions, 2)), ["int"], 1)
