"""What the driver ships to each Spark task, and the function ``mapInArrow`` runs there.

The closure carries only plain data (:class:`WorkerPayload`: the resolved
:class:`~sparkdl.plan.FitPlan`, the service's address and token, the model's bytes as a
broadcast), never the SparkSession, the estimator or the service. This module imports
no Keras: the driver imports it. The task itself runs in :mod:`sparkdl.executor`, which
it starts importing (TensorFlow takes seconds to import) while the partition is read.

Example:
    >>> RESULT_SCHEMA
    'worker int, report string'
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark import TaskContext

from sparkdl import gpu
from sparkdl.data import to_numpy_multi
from sparkdl.errors import ServiceError
from sparkdl.plan import FitPlan
from sparkdl.reports import WorkerReport
from sparkdl.server.client import ServiceClient

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
        validation: A broadcast of ``(x, y)`` validation arrays, or ``None``; worker i
            evaluates rows ``i::num_workers``.
    """

    plan: FitPlan
    url: str
    token: str = field(repr=False)
    model_bytes: Any
    custom_objects: bytes | None
    input_shapes: list[tuple[int, ...]]
    label_kinds: list[str]
    validation: Any = None


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
    """Reads the partition, joins the service, trains; reports a failure to the service."""
    started, started_at = time.perf_counter(), time.time()
    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("sparkdl's train function runs only inside a Spark task.")
    worker = ctx.partitionId()
    gpu_ids = gpu.assign_gpus(ctx) or []  # before TensorFlow starts
    # Import TensorFlow and Keras (the executor modules) while the partition is read:
    # the import dominates a cold worker.
    importer = threading.Thread(target=_import_executor, name="sparkdl-import", daemon=True)
    importer.start()
    xs, ys = to_numpy_multi(list(batches), payload.input_shapes, payload.label_kinds)
    plan = payload.plan
    client = ServiceClient(
        payload.url,
        payload.token,
        worker=worker,
        timeout=plan.request_timeout,
        retries=plan.request_retries,
        # Spark numbers task attempts uniquely and in launch order within a
        # SparkContext, stage retries included: a newer attempt has a larger id.
        attempt=int(ctx.taskAttemptId()),
    )
    try:
        joined = client.join(len(xs[0]))
        importer.join()
        import_seconds = time.perf_counter() - started
        from sparkdl.executor.training import train

        report = train(payload, client, worker, xs, ys, joined)
    except BaseException as exc:
        client.report_failure(exc, fatal=not _transient(exc))
        raise
    finally:
        client.close()
    report.import_seconds = import_seconds
    report.gpu_ids = gpu_ids
    report.cuda_visible_devices = os.environ.get("CUDA_VISIBLE_DEVICES")
    report.attempt = client.attempt
    report.started_at, report.ended_at = started_at, time.time()
    report.task_seconds = time.perf_counter() - started
    return report


def _transient(exc: BaseException) -> bool:
    """Whether a retry of the task may succeed (else the fit stops at once).

    The service out of reach or a connection lost may pass; an error in the model, the
    loss, the data or a diverged loss would only happen again.
    """
    return isinstance(exc, (ServiceError, ConnectionError, TimeoutError, KeyboardInterrupt))


def _import_executor() -> None:
    import sparkdl.executor.training  # noqa: F401
