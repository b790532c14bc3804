"""What the service knows about each worker: contacts, pushes, attempts, position.

The ledger spots repeated pushes (a sequence number already used: a retry after a lost
answer) and records where each worker's last applied push left it, so a retried task
resumes there. Its snapshot is the ``workers`` part of ``GET /status`` and of
``fit_report["service"]``.

Example:
    >>> ledger = WorkerLedger()
    >>> record, duplicate = ledger.admit(0, seq=1, attempt=0)
    >>> ledger.record_push(record, seq=1, samples=32, meta={"epoch": 0, "step": 1})
    >>> ledger.admit(0, seq=1, attempt=0)[1], record.position, ledger.samples
    (True, (0, 1), 32)
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["WorkerLedger", "WorkerRecord"]


@dataclass
class WorkerRecord:
    """What the service knows about one worker (times are ``time.time()`` seconds)."""

    first_contact: float = 0.0
    last_contact: float = 0.0
    #: ``time.monotonic()`` of the last contact: how long a worker has been silent.
    last_seen: float = 0.0
    first_push: float = 0.0
    last_push: float = 0.0
    last_loss: float | None = None
    samples: int = 0
    pushes: int = 0
    seq: int = 0
    attempt: int = 0
    duplicates: int = 0
    epoch: int = 0
    comm_seconds: float = 0.0
    #: (epoch, batches done in it) after the last applied push: where a retry resumes.
    position: tuple[int, int] | None = None
    #: Attempts that joined; restarts = attempts - 1.
    attempts: int = 0
    joined_attempt: int = -1
    attempt_joined: float = 0.0
    attempt_first_push: float = 0.0
    #: Synchronous pushes that arrived after their round closed (dropped).
    late: int = 0
    late_samples: int = 0

    def snapshot(self, now: float) -> dict[str, Any]:
        """The record as JSON-serialisable values, with ``seconds_since_contact``."""
        out = dataclasses.asdict(self)
        del out["last_seen"]  # this process's monotonic clock: seconds_since_contact says it
        out["position"] = list(self.position) if self.position else None
        out["seconds_since_contact"] = now - self.last_contact
        return out


class WorkerLedger:
    """Every worker's :class:`WorkerRecord`. Not thread-safe: the store holds its lock."""

    def __init__(self) -> None:
        self.records: dict[int, WorkerRecord] = {}
        #: Samples of every applied push.
        self.samples = 0

    def newest_attempt(self, worker: int) -> int:
        """The newest task attempt seen for ``worker`` (0 before any)."""
        record = self.records.get(worker)
        return record.attempt if record is not None else 0

    def last_seq(self, worker: int) -> int:
        """The sequence number of ``worker``'s last recorded push (0 before any)."""
        record = self.records.get(worker)
        return record.seq if record is not None else 0

    def admit(self, worker: int, seq: int | None, attempt: int) -> tuple[WorkerRecord, bool]:
        """Notes a contact; returns the record and whether ``seq`` was used already.

        Call after the attempt passed the fence (:meth:`Rounds.check_fenced`).
        """
        record = self.records.setdefault(worker, WorkerRecord())
        record.attempt = attempt
        record.last_contact = time.time()
        record.last_seen = time.monotonic()
        record.first_contact = record.first_contact or record.last_contact
        duplicate = seq is not None and seq <= record.seq
        if duplicate:
            record.duplicates += 1
        return record, duplicate

    def joined(self, record: WorkerRecord, attempt: int, first_time: bool) -> None:
        """Counts a new attempt of a worker joining (a task retry, or its first join)."""
        if attempt > record.joined_attempt or first_time:
            record.attempts += 1
            record.attempt_joined = time.time()
            record.attempt_first_push = 0.0
            record.joined_attempt = attempt

    def record_push(
        self,
        record: WorkerRecord,
        *,
        seq: int,
        samples: int,
        meta: dict[str, Any],
        applied: bool = True,
    ) -> None:
        """Records a push: applied (its samples count), or dropped as late."""
        record.seq = seq
        record.last_push = time.time()
        record.first_push = record.first_push or record.last_push
        record.attempt_first_push = record.attempt_first_push or record.last_push
        if applied:
            record.pushes += 1
            record.samples += samples
            self.samples += samples
        else:
            record.late += 1
            record.late_samples += samples
        epoch, step = meta.get("epoch"), meta.get("step")
        if isinstance(epoch, int) and isinstance(step, int) and epoch >= 0 and step >= 0:
            record.position = (epoch, step)
        loss = meta.get("loss")
        if isinstance(loss, (int, float)):
            record.last_loss = float(loss)
        comm = meta.get("comm_seconds")
        if isinstance(comm, (int, float)):
            record.comm_seconds = float(comm)

    def status(self) -> dict[str, dict[str, Any]]:
        """``{worker id as str: record snapshot}``, in worker order."""
        now = time.time()
        return {str(w): r.snapshot(now) for w, r in sorted(self.records.items())}

    def total(self, name: str) -> int:
        """The sum of one counter (``duplicates``, ``late``) over every worker."""
        return sum(int(getattr(r, name)) for r in self.records.values())

    @property
    def restarts(self) -> int:
        """Task attempts beyond each worker's first."""
        return sum(max(r.attempts - 1, 0) for r in self.records.values())
