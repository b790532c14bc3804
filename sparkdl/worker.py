"""What the driver ships to each Spark task, and the function ``mapInArrow`` runs there.

The closure carries only plain data (:class:`WorkerPayload`: the resolved
:class:`~sparkdl.plan.FitPlan`, the service's address and token, the model's bytes as a
broadcast), never the SparkSession, the estimator or the service. This module imports
no Keras: the driver imports it. The task itself runs in :mod:`sparkdl.executor`, which
it starts importing (TensorFlow takes seconds to import) while the partition streams
into the worker's cache (:mod:`sparkdl.executor.cache`), one record batch at a time.

Example:
    >>> RESULT_SCHEMA
    'worker int, report string'
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext

from sparkdl import gpu
from sparkdl.data import VALIDATION, WEIGHT, feature_name, label_name
from sparkdl.errors import ServiceError
from sparkdl.executor.cache import Budget, Column, PartitionCache
from sparkdl.plan import FitPlan
from sparkdl.reports import WorkerReport
from sparkdl.server.client import ServiceClient
from sparkdl.warmup import import_executor

__all__ = ["RESULT_SCHEMA", "WorkerPayload", "make_train_function"]

#: Schema of the one row each worker returns: its id and its report as JSON.
RESULT_SCHEMA = "worker int, report string"


@dataclass(frozen=True)
class WorkerPayload:
    """Everything a worker needs, as plain values.

    Attributes:
        plan: The fit's resolved plan.
        url: The parameter service's URL.
        token: The fit's secret (never shown by ``repr``).
        model_bytes: A Spark broadcast of the ``.keras`` archive bytes.
        custom_objects: cloudpickled ``custom_objects`` dict, or ``None``.
        input_shapes: Per-sample shape of each model input.
        label_kinds: ``"int"``, ``"float"`` or ``"array"``, per model output.
        label_widths: Values per label, per model output.
        sparse_columns: Whether each feature column arrives as ML vectors (kept sparse)
            rather than float arrays.
        sparse_inputs: Whether each model input takes a ``tf.SparseTensor``.
        tls_cert: The service's certificate (PEM) when it speaks HTTPS.
        validation: Whether the partition carries validation rows (marked in the
            :data:`~sparkdl.data.VALIDATION` column), cached apart from the rest.
        weighted: Whether rows carry a weight (:data:`~sparkdl.data.WEIGHT`), fed to
            Keras as ``sample_weight``.
        label_shapes: Per-sample shape of each output's label (array labels are
            reshaped to it; ``()`` for a scalar).
        initial_steps: The step count the model's optimizer arrived with (a schedule
            goes on from it).
        class_weighted: The weights are ``class_weight``'s, which Keras does not apply
            to validation rows.
    """

    plan: FitPlan
    url: str
    token: str = field(repr=False)
    model_bytes: Any
    custom_objects: bytes | None
    input_shapes: list[tuple[int, ...]]
    label_kinds: list[str]
    label_widths: list[int] = field(default_factory=list)
    sparse_columns: list[bool] = field(default_factory=list)
    sparse_inputs: list[bool] = field(default_factory=list)
    validation: bool = False
    tls_cert: bytes | None = None
    weighted: bool = False
    label_shapes: list[tuple[int, ...]] = field(default_factory=list)
    initial_steps: int = 0
    class_weighted: bool = False

    def columns(self) -> tuple[list[Column], list[Column]]:
        """How the feature and the label columns are cached."""
        inputs = [
            Column(feature_name(i), "sparse" if sparse else "dense", int(np.prod(shape)))
            for i, (shape, sparse) in enumerate(
                zip(
                    self.input_shapes,
                    self.sparse_columns or [False] * len(self.input_shapes),
                    strict=True,
                )
            )
        ]
        widths = self.label_widths or [1] * len(self.label_kinds)
        outputs = [
            Column(label_name(j), "dense" if kind == "array" else kind, widths[j])
            for j, kind in enumerate(self.label_kinds)
        ]
        return inputs, outputs

    def weight_column(self) -> Column | None:
        """How the rows' weights are cached, for a weighted fit."""
        return Column(WEIGHT, "float", 1) if self.weighted else None

    def cached_columns(self) -> list[Column]:
        """Every column a worker caches: features, labels and weights."""
        inputs, outputs = self.columns()
        weight = self.weight_column()
        return [*inputs, *outputs, *([weight] if weight else [])]


def make_train_function(
    payload: WorkerPayload,
) -> Callable[[Iterable[pa.RecordBatch]], Iterable[pa.RecordBatch]]:
    """Returns the function ``mapInArrow`` runs on each partition (one worker each)."""

    def train_partition(batches: Iterable[pa.RecordBatch]) -> Iterable[pa.RecordBatch]:
        report = _run_task(payload, batches)
        yield pa.RecordBatch.from_pydict(
            {"worker": [report.worker], "report": [report.to_json()]},
            schema=pa.schema([("worker", pa.int32()), ("report", pa.string())]),
        )

    return train_partition


def _run_task(payload: WorkerPayload, batches: Iterable[pa.RecordBatch]) -> WorkerReport:
    """Caches the partition, joins the service, trains; reports a failure to the service.

    The cache (memory or files) is released when the task ends, failed or not.
    """
    started, started_at = time.perf_counter(), time.time()
    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("sparkdl's train function runs only inside a Spark task.")
    _reset_peak_rss()
    worker = ctx.partitionId()
    gpu_ids = gpu.assign_gpus(ctx) or []  # before TensorFlow starts
    plan = payload.plan
    # Import TensorFlow and Keras (the executor modules) while the partition is read:
    # the import dominates a cold worker.
    importer = threading.Thread(
        target=plan.tf_logs.load, args=(import_executor,), name="sparkdl-import", daemon=True
    )
    importer.start()
    client = ServiceClient(
        payload.url,
        payload.token,
        worker=worker,
        timeout=plan.request_timeout,
        retries=plan.request_retries,
        # Spark numbers task attempts uniquely and in launch order within a
        # SparkContext, stage retries included: a newer attempt has a larger id.
        attempt=int(ctx.taskAttemptId()),
        tls_cert=payload.tls_cert,
    )
    phase = "cache"
    try:
        with contextlib.ExitStack() as caches:
            data, held_out = _open_caches(caches, payload, payload.cached_columns())
            stream = iter(batches)
            while True:  # one record batch in Python at a time
                phase = "read"
                batch = next(stream, None)
                if batch is None:
                    break
                phase = "cache"
                _append(batch, data, held_out)
            cache_seconds = time.perf_counter() - started
            phase = "train"
            joined = client.join(data.rows)
            importer.join()
            import_seconds = time.perf_counter() - started
            from sparkdl.executor.training import train

            report = train(payload, client, worker, data, held_out, joined)
            report.cache_mode = data.mode
            report.data_bytes = data.data_bytes + (held_out.data_bytes if held_out else 0)
    except BaseException as exc:
        # Spark reuses this process for its next task, which must not import
        # TensorFlow while this task's import thread still does (see warmup).
        importer.join()
        client.report_failure(exc, fatal=not _transient(exc, phase))
        raise
    finally:
        client.close()
    report.cache_seconds = cache_seconds
    report.peak_rss_bytes = _peak_rss()
    report.import_seconds = import_seconds
    report.gpu_ids = gpu_ids
    report.cuda_visible_devices = os.environ.get("CUDA_VISIBLE_DEVICES")
    report.attempt = client.attempt
    report.started_at, report.ended_at = started_at, time.time()
    report.task_seconds = time.perf_counter() - started
    return report


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
