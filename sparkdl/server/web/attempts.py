"""Task attempts the service takes only when Spark confirms them.

Every request of a worker carries its Spark task attempt id (``taskAttemptId``, unique
within the SparkContext); a newer attempt of a worker fences the older one out, which
is how a retried task takes over from a zombie. A client that holds the token could
therefore claim a huge attempt id and fence out the live task. So the first request of
an attempt newer than any the service saw for that worker is checked against Spark's
own record, on the driver: :class:`SparkAttempts` looks through the stages of the fit's
job group for a task with that id, for that partition (the worker id: a task's
``partitionId``, not its index in a resubmitted task set), that is running. Spark's
status store learns of a task start from its listener bus, a little after the task
starts, so the check asks again for up to :data:`CONFIRM_SECONDS`.

It reads the driver's ``AppStatusStore`` through Py4J (``taskList``), the store behind
Spark's UI and ``statusTracker``, by :func:`sparkdl.compat.spark.status_store` and
:func:`~sparkdl.compat.spark.stage_tasks`; where that is not reachable (Spark Connect), no
attempt can be checked, and the fit runs without the check (a warning says so).

Example:
    >>> accept_all = lambda worker, attempt: True
    >>> accept_all(0, 17)
    True
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from sparkdl.compat.spark import stage_tasks, status_store

__all__ = ["CONFIRM_SECONDS", "AttemptCheck", "SparkAttempts"]

#: How long a claimed attempt is looked for in Spark's status store.
CONFIRM_SECONDS = 10.0
_POLL_SECONDS = 0.1
#: How long one look at Spark's status store answers every request.
_SNAPSHOT_SECONDS = 0.1
#: Tasks read per stage attempt (the newest first): every worker's attempts fit.
_TASKS_PER_STAGE = 10_000

#: ``check(worker, attempt)``: whether the attempt is a live task of the fit.
AttemptCheck = Callable[[int, int], bool]

_log = logging.getLogger(__name__)


class SparkAttempts:
    """Confirms task attempts against Spark's status store (driver side).

    One look at the store (every task of the fit's stages: id, partition, status) is
    shared by every request for :data:`_SNAPSHOT_SECONDS`, so the workers' first joins
    together cost a few Py4J round trips per task, not per worker and task.

    Args:
        sc: The driver's SparkContext.
        job_group: The fit's job group: only its stages count.
        timeout: Seconds to wait for Spark to record a task start.

    Example:
        >>> SparkAttempts(None, "group").available  # no SparkContext: no check
        False
    """

    def __init__(self, sc: Any, job_group: str, *, timeout: float = CONFIRM_SECONDS) -> None:
        self._sc = sc
        self._group = job_group
        self._timeout = timeout
        self._store: Any = status_store(sc) if sc is not None else None
        self._lock = threading.Lock()
        self._tasks: dict[int, tuple[int, str]] = {}
        self._taken_at = -1.0
        if sc is not None and self._store is None:
            _log.warning(
                "Spark's status store is not reachable from this driver: the parameter "
                "service takes the task attempts workers claim without checking them."
            )

    @property
    def available(self) -> bool:
        """Whether Spark's status store can be read here."""
        return self._store is not None

    def __call__(self, worker: int, attempt: int) -> bool:
        """Whether ``attempt`` is a running task of the fit for partition ``worker``."""
        if self._store is None:
            return True  # nothing to check against (warned at start)
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                found = self._snapshot().get(attempt)
            except Exception as exc:  # Py4J trouble: do not refuse a live task for it
                _log.warning("could not check attempt %d in Spark; taken: %s", attempt, exc)
                return True
            if found is not None and found[1] == "RUNNING":
                return found[0] == worker
            if found is not None or time.monotonic() >= deadline:
                return False  # finished, failed, or never seen
            time.sleep(_POLL_SECONDS)

    def _snapshot(self) -> dict[int, tuple[int, str]]:
        """``{task id: (partition, status)}`` of the group's stages, at most
        :data:`_SNAPSHOT_SECONDS` old."""
        with self._lock:
            if time.monotonic() - self._taken_at < _SNAPSHOT_SECONDS:
                return self._tasks
            tasks: dict[int, tuple[int, str]] = {}
            store, tracker = self._store, self._sc.statusTracker()
            assert store is not None
            for job_id in tracker.getJobIdsForGroup(self._group):
                job = tracker.getJobInfo(job_id)
                for stage_id in job.stageIds if job else ():
                    stage = tracker.getStageInfo(stage_id)
                    if stage is None:
                        continue
                    for stage_attempt in range(stage.currentAttemptId + 1):
                        listed = stage_tasks(store, stage_id, stage_attempt, _TASKS_PER_STAGE)
                        for task_id, partition, status in listed:
                            tasks[task_id] = (partition, status)
            self._tasks, self._taken_at = tasks, time.monotonic()
            return tasks
