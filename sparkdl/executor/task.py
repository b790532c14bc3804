"""The task entry: what a Spark task of a fit runs on its partition.

:func:`sparkdl.contract.payload.train_function` names :func:`run` by module, so the driver never
imports this side. The task streams its partition into the worker's cache
(:mod:`sparkdl.executor.cache`), one record batch at a time, while a thread imports
TensorFlow and Keras (seconds, on a cold worker: :func:`sparkdl.executor.imports.import_executor`);
then it joins the parameter service and trains (:mod:`sparkdl.executor.training`).
Importing this module imports no Keras, no TensorFlow and no ``pyspark.ml``.

Example:
    >>> _transient(ConnectionError("reset"), "train"), _transient(ValueError(), "train")
    (True, False)
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import BarrierTaskContext, TaskContext

from sparkdl.contract.payload import RESULT_SCHEMA, VALIDATION, Column, WorkerPayload
from sparkdl.contract.reports import WorkerReport
from sparkdl.errors import ServiceError
from sparkdl.executor.backends import backend_for
from sparkdl.executor.backends import devices as gpu
from sparkdl.executor.cache import PartitionCache
from sparkdl.executor.channel import Channel, open_channel
from sparkdl.executor.hosting import Hosted
from sparkdl.executor.imports import import_executor
from sparkdl.executor.spool import Budget

__all__ = ["RESULT_SCHEMA", "run"]


def run(payload: WorkerPayload, batches: Iterable[pa.RecordBatch]) -> list[pa.RecordBatch]:
    """Trains one partition: the task's result rows (:data:`RESULT_SCHEMA`).

    Args:
        payload: What the driver sent.
        batches: The partition's record batches (the prepared columns).

    Returns:
        The worker's id and its :class:`~sparkdl.contract.reports.WorkerReport` as JSON; when
        this worker hosted the service, the service's result rows after it
        (:mod:`sparkdl.executor.hosting`).
    """
    report, hosted = _train_task(payload, batches)
    row = pa.RecordBatch.from_pydict(
        {"worker": [report.worker], "report": [report.to_json()], "blob": [None]},
        schema=pa.schema([("worker", pa.int32()), ("report", pa.string()), ("blob", pa.binary())]),
    )
    return [row, *hosted]


def _train_task(
    payload: WorkerPayload, batches: Iterable[pa.RecordBatch]
) -> tuple[WorkerReport, list[pa.RecordBatch]]:
    """Caches the partition, joins the service (first hosting it among the workers when
    the payload says so), trains; reports a failure to the service.

    The cache (memory or files) is released when the task ends, failed or not.
    """
    started, started_at = time.perf_counter(), time.time()
    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("sparkdl's train function runs only inside a Spark task.")
    _reset_peak_rss()
    worker = ctx.partitionId()
    gpu_ids = gpu.assign_gpus(ctx) or []  # before TensorFlow starts
    backend_for(payload.plan.backend).prepare()  # a worker without it fails here
    importer = _import_in_background(payload)
    progress = _Progress(started, worker, attempt=int(ctx.taskAttemptId()))
    if payload.hosting is None:
        progress.channel = open_channel(payload, worker, progress.attempt)
    try:
        report, hosted_rows = _cache_and_train(payload, batches, importer, progress)
    except BaseException as exc:
        # Spark reuses this process for its next task, which must not import
        # TensorFlow while this task's import thread still does (see warmup).
        importer.join()
        if progress.channel is not None:
            progress.channel.report_failure(exc, fatal=not _transient(exc, progress.phase))
        raise
    finally:
        if progress.channel is not None:
            progress.channel.close()
    report.peak_rss_bytes = _peak_rss()
    report.gpu_ids = gpu_ids
    report.cuda_visible_devices = os.environ.get("CUDA_VISIBLE_DEVICES")
    report.attempt = progress.attempt
    report.started_at, report.ended_at = started_at, time.time()
    report.task_seconds = time.perf_counter() - started
    return report, hosted_rows


@dataclasses.dataclass
class _Progress:
    """Where a task stands: what it is doing (``phase``, which says whether a failure
    is transient: :func:`_transient`) and its channel to the service once open (where
    a failure is reported)."""

    started: float
    worker: int
    attempt: int
    phase: str = "cache"
    channel: Channel | None = None


def _import_in_background(payload: WorkerPayload) -> threading.Thread:
    """Imports TensorFlow and Keras (the executor modules) in a thread, while the
    partition is read: the import dominates a cold worker."""
    importer = threading.Thread(
        target=backend_for(payload.plan.backend).load,
        args=(payload.plan.tf_logs, import_executor),
        name="sparkdl-import",
        daemon=True,
    )
    importer.start()
    return importer


def _cache_and_train(
    payload: WorkerPayload,
    batches: Iterable[pa.RecordBatch],
    importer: threading.Thread,
    progress: _Progress,
) -> tuple[WorkerReport, list[pa.RecordBatch]]:
    """Caches the partition, hosts the service among the workers when the payload says
    so, joins it and trains; the caches are released on return."""
    hosted_rows: list[pa.RecordBatch] = []
    with contextlib.ExitStack() as caches:
        data, held_out = _open_caches(caches, payload, payload.cached_columns())
        batch_bytes = _cache(batches, data, held_out, progress)
        cache_seconds = time.perf_counter() - progress.started
        progress.phase = "train"
        hosted = None
        if payload.hosting is not None:
            hosted = caches.enter_context(
                Hosted(payload, BarrierTaskContext.get(), progress.worker, importer.join)
            )
            payload = hosted.payload
            progress.channel = open_channel(payload, progress.worker, progress.attempt)
        channel = progress.channel
        assert channel is not None
        joined = channel.join(data.rows)
        importer.join()
        import_seconds = time.perf_counter() - progress.started
        from sparkdl.executor.training import train

        report = train(payload, channel, progress.worker, data, held_out, joined)
        report.cache_mode = data.mode
        report.record_batch_bytes = batch_bytes
        report.data_bytes = data.data_bytes + (held_out.data_bytes if held_out else 0)
        if hosted is not None:
            channel.leave()
            hosted_rows = hosted.finish()
    report.cache_seconds = cache_seconds
    report.import_seconds = import_seconds
    return report, hosted_rows


def _cache(
    batches: Iterable[pa.RecordBatch],
    data: PartitionCache,
    held_out: PartitionCache | None,
    progress: _Progress,
) -> int:
    """Caches the partition, one record batch in Python at a time (``progress.phase``
    tells Spark's input stream failing from the cache failing); returns the largest
    batch's bytes."""
    stream = iter(batches)
    largest = 0
    while True:
        progress.phase = "read"
        batch = next(stream, None)
        if batch is None:
            return largest
        progress.phase = "cache"
        largest = max(largest, batch.nbytes)
        _append(batch, data, held_out)


def _open_caches(
    stack: contextlib.ExitStack, payload: WorkerPayload, columns: list[Column]
) -> tuple[PartitionCache, PartitionCache | None]:
    """The partition's cache and, with validation data given apart, its own cache."""
    plan = payload.plan
    budget = Budget(plan.cache_budget)  # shared: training and validation rows together

    def cache() -> PartitionCache:
        return stack.enter_context(PartitionCache(columns, mode=plan.data_cache, budget=budget))

    return cache(), (cache() if payload.validation else None)


def _append(batch: pa.RecordBatch, data: PartitionCache, held_out: PartitionCache | None) -> None:
    """Caches one record batch; rows marked as validation go to ``held_out``."""
    if held_out is None or VALIDATION not in batch.schema.names:
        data.append(batch)
        return
    marked = batch.column(VALIDATION)
    data.append(batch.filter(pc.invert(marked)))
    held_out.append(batch.filter(marked))


def _transient(exc: BaseException, phase: str = "train") -> bool:
    """Whether a retry of the task may succeed (else the fit stops at once).

    ``phase`` is what the task was doing: ``"read"`` (Spark's input stream failed: a
    lost shuffle block or executor, which Spark's own retry decides), ``"cache"`` (a
    local disk or memory that ran out may pass on another executor; a row of another
    width would fail again) or ``"train"`` (the service out of reach or a connection
    lost may pass; an error in the model, the loss, the data or a diverged loss would
    only happen again).
    """
    if phase == "read":
        return True
    if phase == "cache" and isinstance(exc, (OSError, MemoryError)):
        return True
    return isinstance(exc, (ServiceError, ConnectionError, TimeoutError, KeyboardInterrupt))


def _reset_peak_rss() -> None:
    """Resets the process's peak resident memory (Linux), so that the peak this task
    reports is its own: Spark reuses a Python worker process for many tasks."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


def _peak_rss() -> int:
    """Peak resident memory of this process in bytes (since :func:`_reset_peak_rss`)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
