"""Typed reports of a fit: what each worker did and what the fit as a whole did.

A worker returns a :class:`WorkerReport` (as JSON, through Spark, in the one row its
task yields); the driver gathers them with the service's final status into a
:class:`FitReport`, which :class:`~sparkdl.KerasModel` keeps as ``fit_report`` (a plain
dict with the same keys, so it saves and loads as JSON).

Example:
    >>> report = WorkerReport(worker=1, rows=10, train_seconds=2.0, comm_seconds=0.5)
    >>> WorkerReport.from_json(report.to_json()) == report
    True
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SERVICE_KEYS", "FitReport", "WorkerReport"]

#: The keys of the service's status a fit report keeps.
SERVICE_KEYS: tuple[str, ...] = (
    "version",
    "samples_seen",
    "duplicates",
    "epochs_done",
    "initial_epochs",
    "workers",
    "restarts",
    "generation",
    "late_pushes",
    "timed_out_rounds",
    "failures",
    "full_answers",
    "planned_rows",
    "joined_rows",
    "traffic",
    "shards",
)


@dataclass
class WorkerReport:
    """What one worker task did (seconds are wall-clock on the executor).

    Attributes:
        worker: The worker id (Spark partition id).
        rows: Rows of its partition.
        validation_rows: Rows it scored as validation data (given apart, or its
            ``validation_split`` share).
        gpus: GPUs TensorFlow saw.
        import_seconds: From the task's start until TensorFlow was imported and the
            worker had joined.
        cache_seconds: From the task's start until its partition was cached (reading
            it, with any shuffle it waits for, and writing the cache).
        train_seconds: Seconds in the training loop.
        task_seconds: Seconds of the whole task.
        comm_seconds: Seconds in calls to the service while training.
        wait_seconds: Seconds training stood still waiting for the service.
        overlap: Whether pushes overlapped training.
        fast_weights: Whether weights were read and written with one op per variable.
        calls: Calls to the service while training.
        setup_comm_seconds: Seconds of the join and the first pull.
        syncs: Pushes made.
        push_bytes: Bytes of the push bodies it sent while training (with compression,
            the codec's arrays).
        answer_bytes: Bytes of the weights answers it read while training.
        whole_pushes: With compression, pushes sent whole (the fit's closing push,
            which carries what error feedback held back).
        whole_push_bytes: Their bytes (part of ``push_bytes``).
        epochs_run: The epoch it ended in (1-based).
        resumed_at: ``[epoch, batches]`` where a retried task resumed, or ``None``.
        delta_scale: The factor of its deltas (a merge with one), else ``None``.
        compute_dtypes: The compute dtypes of its model's layers (nested ones included).
        loss_scaled: Whether its optimizer scaled the loss (``mixed_precision``: a
            ``LossScaleOptimizer`` around the model's own).
        learning_rate: The optimizer's learning rate at the end.
        optimizer_steps: The optimizer's step count at the end (what a learning-rate
            schedule counts): its steps, resumes included.
        gpu_ids: GPU addresses Spark assigned.
        cuda_visible_devices: ``CUDA_VISIBLE_DEVICES`` as TensorFlow saw it.
        attempt: The task attempt id.
        cache_mode: Where the partition was cached: ``"memory"`` or ``"disk"``.
        data_bytes: Bytes of the cached partition (float32 features and labels, CSR
            for sparse features; validation rows included).
        record_batch_bytes: Bytes of the largest Arrow record batch the task received
            (:mod:`sparkdl.driver.arrow_batches` bounds them).
        peak_rss_bytes: Peak resident memory of the worker process during the task.
        started_at: ``time.time()`` at the task's start.
        ended_at: ``time.time()`` at its end.
    """

    worker: int
    rows: int = 0
    validation_rows: int = 0
    gpus: int = 0
    import_seconds: float = 0.0
    cache_seconds: float = 0.0
    train_seconds: float = 0.0
    task_seconds: float = 0.0
    comm_seconds: float = 0.0
    wait_seconds: float = 0.0
    overlap: bool = False
    fast_weights: bool = False
    calls: int = 0
    setup_comm_seconds: float = 0.0
    syncs: int = 0
    push_bytes: int = 0
    answer_bytes: int = 0
    whole_pushes: int = 0
    whole_push_bytes: int = 0
    epochs_run: int = 0
    resumed_at: list[int] | None = None
    delta_scale: float | None = None
    compute_dtypes: list[str] = field(default_factory=list)
    loss_scaled: bool = False
    learning_rate: float | None = None
    optimizer_steps: int = 0
    gpu_ids: list[str] = field(default_factory=list)
    cuda_visible_devices: str | None = None
    attempt: int = 0
    cache_mode: str = "memory"
    data_bytes: int = 0
    record_batch_bytes: int = 0
    peak_rss_bytes: int = 0
    started_at: float = 0.0
    ended_at: float = 0.0

    def to_json(self) -> str:
        """The report as a JSON object."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkerReport:
        """Reads :meth:`to_json`'s output."""
        return cls(**json.loads(text))


@dataclass
class FitReport:
    """What a fit did, as ``KerasModel.fit_report`` holds it.

    Attributes:
        seconds: Wall seconds of the fit on the driver.
        prepare_seconds: Seconds before the training job: the driver's checks of the
            model and the data (one Spark job) and the plan.
        data_seconds: Seconds the slowest worker spent reading and caching its
            partition (with the shuffle it waited for) before training.
        train_seconds: Seconds of the slowest worker's training loop.
        rows: Rows of the training data.
        job_group: The fit's Spark job group (its jobs in the Spark UI).
        workers: Each worker's :class:`WorkerReport`, in worker order.
        service: The service's final status (:data:`SERVICE_KEYS`).
        service_url: The address workers called (``https://`` when it spoke TLS).
        resolved: What the fit resolved from the settings, in words
            (:meth:`sparkdl.contract.plan.FitPlan.describe`: workers, mode and merge, the
            workers' learning rate against the compiled one and why, the merge's
            scale or alpha, compression, the data cache, the service).
    """

    seconds: float
    rows: int
    job_group: str
    workers: list[WorkerReport]
    service: dict[str, Any]
    prepare_seconds: float = 0.0
    service_url: str = ""
    resolved: dict[str, str] = field(default_factory=dict)

    @property
    def data_seconds(self) -> float:
        """Seconds the slowest worker spent caching its partition."""
        return max((r.cache_seconds for r in self.workers), default=0.0)

    @property
    def train_seconds(self) -> float:
        """Seconds of the slowest worker's training loop."""
        return max((r.train_seconds for r in self.workers), default=0.0)

    @property
    def communication_share(self) -> float:
        """Fraction of the workers' training time spent in calls to the service."""
        train = sum(r.train_seconds for r in self.workers)
        comm = sum(r.comm_seconds for r in self.workers)
        return comm / train if train > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The report as the JSON-serialisable dict ``fit_report`` is."""
        out = dataclasses.asdict(self)
        out["communication_share"] = self.communication_share
        out["data_seconds"] = self.data_seconds
        out["train_seconds"] = self.train_seconds
        return out
