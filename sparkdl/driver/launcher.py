"""The fit's one Spark job: partitioning, a barrier or plain stage, and its failures.

:class:`JobLauncher` runs the training job on a driver thread in the fit's job group
(:func:`~sparkdl.driver.interrupt.run_job`: Ctrl-C cancels this fit's jobs only). It
deals the rows out to ``num_workers`` partitions the driver can bound by its scan
(:func:`partitioned`), gives the service that plan of rows per worker, runs a barrier
stage (synchronous modes, a service in the cluster) that Spark may retry when a worker
is lost (:func:`run_barrier_job`), or ordinary tasks, and turns a failed job into
:class:`~sparkdl.errors.WorkerError` with each failed worker's traceback
(:func:`worker_error`).

Example:
    >>> worker_error(RuntimeError("boom"), {1: "Traceback...\\nValueError: bad"}).args[0]
    '1 worker(s) failed during training: worker 1: ValueError: bad'
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparkdl.compat.spark import failure_summary, is_unsupported_barrier_chain, retries_ran_out
from sparkdl.contract.payload import RESULT_SCHEMA, VALIDATION, WorkerPayload, train_function
from sparkdl.contract.reports import WorkerReport
from sparkdl.driver.arrow_batches import bounded_batches
from sparkdl.driver.interrupt import run_job
from sparkdl.errors import SparkDLError, WorkerError
from sparkdl.protocol.failures import headline

if TYPE_CHECKING:
    from sparkdl.compat.sessions import SessionTools
    from sparkdl.driver.data_scan import DataSummary
    from sparkdl.driver.service import FitService

__all__ = ["JobLauncher", "partitioned", "run_barrier_job", "worker_error"]

_log = logging.getLogger(__name__)


class JobLauncher:
    """Runs a fit's training job and translates its failures.

    Args:
        tools: The session's tools.
        group: The fit's job group (or tag).
        name: The job's description (the Spark UI's name of the fit).
        frame: The training rows.
        validation: The validation rows (prepared like the training rows), or ``None``.
        summary: The scan of the training rows (rows per partition).
        bytes_per_row: About how many bytes a row of ``frame`` takes in Arrow (the job's
            record batches are bounded by it: :mod:`sparkdl.driver.arrow_batches`).
    """

    def __init__(
        self,
        tools: SessionTools,
        group: str,
        name: str,
        frame: DataFrame,
        validation: DataFrame | None,
        summary: DataSummary,
        bytes_per_row: int = 0,
    ) -> None:
        self.tools = tools
        self.group = group
        self.name = name
        self._frame = frame
        self._validation = validation
        self._summary = summary
        self._bytes_per_row = bytes_per_row

    def run(
        self,
        payload: WorkerPayload,
        service: FitService,
        *,
        on_failure: Callable[[], BaseException | None],
    ) -> tuple[list[WorkerReport], list[Any]]:
        """Runs the job; returns the workers' reports in worker order and the job's rows.

        Args:
            payload: What every task receives.
            service: The fit's service (told the plan of rows; aborted on Ctrl-C).
            on_failure: Called first when the job fails; an exception it returns (a
                driver callback's) is raised instead of the job's.

        Raises:
            WorkerError: The job failed (each failed worker's traceback inside).
            KeyboardInterrupt: Ctrl-C: the fit's jobs were cancelled.
        """
        with (
            self.tools.quiet_task_failures(),  # the WorkerError says it, traces inside
            bounded_batches(self.tools.spark, self._bytes_per_row),
        ):
            reports, rows = run_job(
                self.tools,
                self.group,
                self.name,
                lambda: self._launch(payload, service, on_failure),
                on_interrupt=lambda: service.events.abort(
                    "the fit was interrupted (KeyboardInterrupt)"
                ),
            )
        return reports, rows

    def frame(self) -> DataFrame:
        """The training rows, and the validation rows marked in
        :data:`~sparkdl.contract.payload.VALIDATION`, as one frame (every worker gets its
        share of both, and none holds more than its share)."""
        if self._validation is None:
            return self._frame
        train = self._frame.withColumn(VALIDATION, F.lit(False))
        held_out = self._validation.withColumn(VALIDATION, F.lit(True))
        return train.unionByName(held_out)

    def _launch(
        self,
        payload: WorkerPayload,
        service: FitService,
        on_failure: Callable[[], BaseException | None],
    ) -> tuple[list[WorkerReport], list[Any]]:
        """On the job's thread: the job itself (:meth:`run`).

        Before the job starts, the service learns the most rows each worker may join
        with, from the scan's rows per partition and how the job partitions the frame
        (:meth:`~sparkdl.driver.data_scan.DataSummary.planned_rows`).
        """
        plan = payload.plan
        workers, summary = plan.num_workers, self._summary
        frame = self.frame()
        # Validation rows come as partitions of their own: shuffle to share them out.
        split = (
            frame.repartition(workers)
            if self._validation is not None
            else partitioned(frame, workers, self.tools.num_partitions(frame))
        )
        payload = service.plan_rows(
            payload, summary.planned_rows(workers, shuffled=split is not frame)
        )
        try:
            if plan.mode.barrier or plan.hosted:
                rows = run_barrier_job(
                    split,
                    payload,
                    replan=lambda: service.plan_rows(
                        payload, summary.planned_rows(workers, shuffled=True)
                    ),
                )
            else:  # ordinary tasks: none waits for another, Spark may queue them
                rows = split.mapInArrow(train_function(payload), RESULT_SCHEMA).collect()
        except Exception as exc:
            error = on_failure()
            if error is not None:  # a driver callback stopped the fit by raising
                raise error from None
            raise worker_error(exc, service.events.failures()) from None
        reports = (WorkerReport.from_json(r["report"]) for r in rows if r["worker"] >= 0)
        return sorted(reports, key=lambda r: r.worker), rows


def partitioned(frame: DataFrame, workers: int, partitions: int | None) -> DataFrame:
    """``frame`` in ``workers`` partitions: itself when it has that many
    (``partitions``; ``None``: unknown, as on Spark Connect), else dealt round robin
    (``repartition``: a shuffle).

    Each worker then holds rows the driver can bound from its scan: a partition of
    ``frame`` exactly, or at most its share of each partition rounded up
    (:meth:`~sparkdl.driver.data_scan.DataSummary.planned_rows`). A ``coalesce`` would save
    the shuffle over a multiple of ``workers`` partitions, but which partitions it
    groups is Spark's choice at run time (by where cached blocks live), so the driver
    could not bound a worker's rows by its plan.
    """
    if partitions == workers:
        return frame
    return frame.repartition(workers)


def run_barrier_job(
    frame: DataFrame, payload: WorkerPayload, replan: Callable[[], WorkerPayload]
) -> list[Any]:
    """Runs the barrier stage so that Spark retries it when a worker is lost.

    Spark never retries a failed barrier *result* stage ("Could not recover from a
    failed barrier ResultStage"), but it does retry a barrier stage whose output feeds
    a shuffle, up to ``spark.stage.maxConsecutiveAttempts`` times; the workers of the
    new attempt rejoin the service at the last completed round. Hence the
    ``repartition(1)`` of the workers' one-row reports.

    Spark also refuses a barrier stage over a chain whose ancestors have another
    partition count (``union``, ``coalesce``...). That check fails at submission,
    before any task runs, so retrying over ``repartition(num_workers)`` loses nothing;
    ``replan`` gives the service the rows that shuffle plans for each worker first
    (and returns the payload to run with).
    """
    train = train_function(payload)
    try:
        return frame.mapInArrow(train, RESULT_SCHEMA, barrier=True).repartition(1).collect()
    except Exception as exc:
        if not is_unsupported_barrier_chain(exc):
            raise
    _log.info("barrier stage needs a shuffle for this DataFrame; repartitioning")
    payload = replan()
    frame = frame.repartition(payload.plan.num_workers)
    train = train_function(payload)
    return frame.mapInArrow(train, RESULT_SCHEMA, barrier=True).repartition(1).collect()


def worker_error(exc: Exception, failures: dict[int, str]) -> SparkDLError:
    """The error a failed training job raises on the driver, with the workers' traces."""
    ran_out = retries_ran_out(str(exc))
    if failures and ran_out is None:  # a fatal error a worker reported
        worker, text = next(iter(failures.items()))
        where, line = headline(text)
        at = f"worker {worker}" + (f" ({where})" if where else "")
        return WorkerError(
            f"{len(failures)} worker(s) failed during training: {at}: {line}",
            failures,
            reported=True,
        )
    trace, last = failure_summary(exc)
    if ran_out is None:
        return WorkerError(f"The training job failed: {last}", {-1: trace})
    worker, times, setting = ran_out
    traces = dict(failures)
    traces.setdefault(worker, trace)
    return WorkerError(
        f"Worker {worker} failed {times} times, the last time with: {last}. Spark's "
        f"retries ran out ({setting}); each retry rejoined where training stood, so "
        "the failure repeats. Check the executor logs for what kills the process "
        "(memory limits, pre-emption) or raise the retry setting.",
        traces,
    )
