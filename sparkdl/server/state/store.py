"""The service's training state of one fit, behind one lock: the thread-safe API.

The state and the steps a push goes through live in
:class:`~sparkdl.server.state.training.TrainingState` (its parts, each a small class of its own
module: the center, rounds, the ledger, the history, the control channel); this class
adds what the routes call for the workers (what the driver's threads read and decide is
:class:`~sparkdl.server.state.store_events.StoreEvents`, its base), each method taking the
lock itself. A push is
the policy of the fit's mode to run (:mod:`sparkdl.server.state.policies`). Nothing here knows
about HTTP: a refused request raises :class:`StoreError` with the status to answer.

Every push carries the worker's id, a sequence number and its task attempt: a push
whose sequence number the worker already used (a retry after a lost answer) is
acknowledged without being applied again; a push from an attempt older than the
worker's newest one (a zombie task) is refused. A push is checked whole before it
changes anything (:meth:`~sparkdl.server.state.training.TrainingState.screen`).

A retried task rejoins under the same id and learns where training stands (the last
sequence number applied, the version, its own position), so it continues there with
the current weights. The rows it joins with are bounded by the driver's plan
(:meth:`WeightStore.plan_rows`), not by what it says: a push's samples are bounded by
the rows its worker joined with.

The driver's threads (callbacks, progress, Spark UI marks) read it through
:class:`sparkdl.server.state.events.FitEvents`, which its base
:class:`~sparkdl.server.state.store_events.StoreEvents` implements.

Example:
    >>> import numpy as np
    >>> from sparkdl.sync.merges import Average
    >>> store = WeightStore([np.zeros(2, np.float32)], num_workers=1, merge=Average())
    >>> store.join(0, rows=4, wait=0.0)["rows"]
    [4]
    >>> store.push(0, seq=1, attempt=0, base_version=0, arrays=[np.ones(2, np.float32)],
    ...            samples=4, meta={})
    1
    >>> weights, version = store.pull(1)
    >>> version, weights[0].tolist()
    (1, [1.0, 1.0])
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from sparkdl.server.state.errors import StoreError
from sparkdl.server.state.meta import check_push_meta
from sparkdl.server.state.store_events import StoreEvents
from sparkdl.server.state.training import SEQ_WINDOW, SILENT_SECONDS
from sparkdl.sync.merges import Update

if TYPE_CHECKING:
    from sparkdl.contract.plan import FitPlan

__all__ = ["SEQ_WINDOW", "StoreError", "WeightStore"]


class WeightStore(StoreEvents):
    """Center weights plus the bookkeeping of one fit, thread-safe.

    Every method defined here takes the lock itself: the workers' requests (join, push,
    pull, leave, failures) and the driver's plan of rows; what the driver's threads read
    and decide comes from :class:`~sparkdl.server.state.store_events.StoreEvents`. It
    takes the arguments of :class:`~sparkdl.server.state.training.TrainingState`, whose
    steps (what a policy runs for a push) assume the lock held.
    """

    @classmethod
    def for_plan(
        cls,
        plan: FitPlan,
        weights: Sequence[np.ndarray],
        *,
        history: dict[str, list[float]] | None,
        gate_epochs: bool,
        metric_merge: Callable[[Sequence[Any]], dict[str, float]] | None,
        outer_state: tuple[Sequence[np.ndarray], int] | None = None,
        keep_epoch_copies: bool = False,
    ) -> WeightStore:
        """The store of a fit resolved as ``plan``, starting from ``weights``: the one
        place a fit's store is built, in the driver or beside a worker
        (:mod:`sparkdl.executor.hosting`).

        Args:
            plan: The fit's plan.
            weights: The center to start from.
            history: Logs of the epochs done before.
            gate_epochs: Synchronous workers wait at each epoch's end for the
                driver's callbacks (:meth:`release`).
            metric_merge: Merges the workers' metric states into an epoch's logs.
            outer_state: The outer optimizer's state to start from (a resumed fit).
            keep_epoch_copies: Keep the center as each epoch ends, for snapshots
                (:meth:`take_epoch_copies`).
        """
        return cls(
            weights,
            num_workers=plan.num_workers,
            merge=plan.merge,
            mode=plan.mode,
            round_timeout=plan.round_timeout,
            history=history,
            backup_workers=plan.backup_workers,
            epochs=plan.epochs,
            gate_epochs=gate_epochs,
            metric_merge=metric_merge,
            compression=plan.compression,
            outer=plan.outer,
            outer_state=outer_state,
            keep_epoch_copies=keep_epoch_copies,
        )

    # ------------------------------------------------------------------ reads
    @property
    def version(self) -> int:
        """Number of completed rounds (synchronous) or applied updates."""
        return self.center.version

    def pull(self, min_version: int = 0, wait: float = 0.0) -> tuple[list[np.ndarray], int] | None:
        """Returns ``(weights, version)`` once ``version >= min_version``.

        Waits up to ``wait`` seconds; returns ``None`` if the version is still older.

        Raises:
            StoreError: 409 when training was aborted.
        """
        deadline = time.monotonic() + wait
        with self.lock:
            while True:
                self.control.check_aborted()
                if self.control.visible(self.center.version) >= min_version:
                    return self.center.weights, self.center.version
                self._close_overdue_round()
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.lock.wait(min(left, 1.0))

    def encoded(self, min_version: int = 0, wait: float = 0.0) -> tuple[list[Any], int] | None:
        """Like :meth:`pull`, but returns the weights as wire-format chunks.

        Returns:
            ``(chunks, version)`` with ``version >= min_version``, or ``None`` after
            ``wait`` seconds.
        """
        if self.pull(min_version, wait) is None:
            return None
        with self.lock:
            chunks = self.center.encoded(self.control.answer_meta, live=self.policy.live_center)
            return chunks, self.center.version

    def snapshot(
        self, min_version: int = 0, wait: float = 0.0
    ) -> tuple[list[np.ndarray], int, dict[str, Any]] | None:
        """Like :meth:`pull`, with the answer's metadata; the arrays never change
        afterwards (a hogwild center is copied)."""
        if self.pull(min_version, wait) is None:
            return None
        with self.lock:
            weights = self.center.weights
            if self.policy.live_center:
                weights = [np.array(w, copy=True) for w in weights]
            meta = self.center.answer_meta(self.control.answer_meta, live=self.policy.live_center)
            return weights, self.center.version, meta

    def weights(self) -> list[np.ndarray]:
        """Returns the current center weights (do not modify them)."""
        with self.lock:
            return self.center.weights

    def newest_attempt(self, worker: int) -> int:
        """The newest task attempt the store took from ``worker`` (0 before any)."""
        with self.lock:
            return self.ledger.newest_attempt(worker)

    def wait_callbacks(self, worker: int, wait: float) -> None:
        """Asynchronous modes with driver callbacks: waits up to ``wait`` seconds until
        ``worker``, which just ended an epoch (the one its pushes recorded, not a number
        it sends), may go on: the callbacks ran on the epoch
        :data:`~sparkdl.server.state.training.CALLBACK_LAG` before, or stopped the fit.

        A no-op otherwise, and while a worker has not joined yet (its task is queued
        behind the others: its epochs could not close) or once any worker failed or
        was retried (a retry may take long), including during the wait; past ``wait``
        the worker goes on. Nor does it wait while every worker that has yet to end the
        callbacks' epoch has been silent for :data:`~sparkdl.server.state.training.SILENT_SECONDS`:
        a lost executor's task that Spark reschedules only once a slot frees (the
        survivors' own) would otherwise slow them to one epoch per ``wait``."""
        if self.control.callback_lag is None:
            return
        with self.lock:
            record = self.ledger.records.get(worker)
            if (
                record is None
                or len(self._rows) < self.num_workers
                or self._failures
                or self.ledger.restarts
            ):
                return
            epoch = record.epoch - 1
            restarts = self.ledger.restarts
            self._wait_until(
                lambda: (
                    bool(self._failures)
                    or self.ledger.restarts != restarts  # a task retried meanwhile
                    or self.control.callbacks_caught_up(epoch)
                    or self._held_up_by_silent_workers(epoch)
                ),
                wait,
            )
            # The wait is no silence of this worker's: it counts from now.
            record.last_seen = time.monotonic()

    def _held_up_by_silent_workers(self, epoch: int) -> bool:
        """With the lock held: whether the epoch the callbacks must have run on before
        a worker that ended ``epoch`` goes on is still open, held up only by workers
        silent for :data:`~sparkdl.server.state.training.SILENT_SECONDS` or longer (a worker
        that never ended an epoch holds every one open)."""
        needed = epoch - int(self.control.callback_lag or 0)
        if self._history.done > needed:
            return False  # closed: the wait is for the driver's callbacks
        now, held = time.monotonic(), False
        for record in self.ledger.records.values():
            if record.epoch <= needed:  # has not ended the needed epoch
                if now - record.last_seen < SILENT_SECONDS:
                    return False
                held = True
        return held

    # ----------------------------------------------------------------- writes
    def plan_rows(self, rows: Sequence[int]) -> None:
        """Sets the driver's plan of training rows per worker, from its scan of the data
        and the training job's partitioning
        (:meth:`sparkdl.driver.data_scan.DataSummary.planned_rows`), before the job starts.

        Its total bounds the workers' joined rows together: a join that would exceed it
        is refused (:meth:`join`), so a push's samples, bounded by the rows its worker
        joined with, stay within the plan too. (Which rows a task reads may change
        between Spark jobs; how many there are may not.)

        Raises:
            ValueError: Not one non-negative count per worker.
        """
        planned = [int(n) for n in rows]
        if len(planned) != self.num_workers or min(planned, default=0) < 0:
            raise ValueError(
                f"Expected {self.num_workers} row counts >= 0, one per worker. Received: "
                f"{planned[:10]}"
            )
        with self.lock:
            self.planned_rows = planned

    def push(
        self,
        worker: int,
        *,
        seq: int,
        attempt: int,
        base_version: int,
        arrays: Sequence[np.ndarray],
        samples: int,
        meta: dict[str, Any],
    ) -> int:
        """Takes one push (the mode's policy runs it); returns the version that answers it.

        ``base_version`` is the center version the push was computed against (the open
        round in synchronous mode). Answer with :meth:`encoded` of the returned version
        (a synchronous round may still be open).

        Raises:
            StoreError: 400 for a bad worker id, shapes, values, samples, sequence
                number, metadata or a version from the future, or values that would
                overflow the center; 409 for a worker that has not joined, a round
                from the future, a superseded attempt, or when training was aborted.
                Nothing changed.
        """
        self.check_worker(worker)
        magnitudes = self.center.check(arrays)
        check_push_meta(meta, rows=self._rows.get(worker))
        update = Update(
            worker=worker,
            arrays=list(arrays),
            samples=samples,
            base_version=base_version,
            meta=meta,
            magnitudes=magnitudes,
        )
        return self.policy.push(self, update, seq=seq, attempt=attempt)

    def join(self, worker: int, rows: int, wait: float, attempt: int = 0) -> dict[str, Any] | None:
        """Registers (or re-registers) a worker and its row count (its training rows, at
        most what the driver's plan leaves it beside the other workers' rows).

        A retried task joins again under the same id with a higher ``attempt``: from
        then on pushes of older attempts are refused, and the answer tells the new
        attempt the last sequence number applied, so it continues the numbering.

        Returns:
            ``{"rows": [...], "seq": s, "version": v, "position": [e, b] | None,
            "generation": g}``. In synchronous mode it waits until every worker joined
            and ``rows`` holds every worker's row count (the workers agree on the
            rounds per epoch from it); returns ``None`` if that takes longer than
            ``wait`` seconds (ask again). Otherwise it answers at once.

        Raises:
            StoreError: 400 for a bad worker id or more rows than the driver's plan leaves
                for the worker (:meth:`plan_rows`); 409 for a superseded attempt or
                when training was aborted. A refused join changes nothing.
        """
        self.check_worker(worker)
        deadline = time.monotonic() + wait
        with self.lock:
            self.control.check_aborted()
            self.check_rows(worker, rows)
            self.policy.rejoin(self, worker, attempt)
            record, _ = self.admit(worker, None, attempt)
            self.ledger.joined(record, attempt, first_time=worker not in self.rounds.joined)
            self.rounds.joined.add(worker)
            self._rows[worker] = rows
            self.lock.notify_all()
            while not self.policy.join_complete(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.lock.wait(min(left, 1.0))
                self.control.check_aborted()
                self.rounds.check_fenced(worker, attempt, self.ledger.newest_attempt(worker))
            return {
                "rows": [self._rows.get(w, 0) for w in range(self.num_workers)],
                "seq": record.seq,
                "version": self.center.version,
                "position": list(record.position) if record.position else None,
                "generation": self.rounds.generation,
            }

    def leave(self, worker: int, attempt: int = 0) -> None:
        """Worker ``worker`` finished training (its last push answered).

        A service in the cluster (:mod:`sparkdl.executor.hosting`) stops only once
        every worker left; a Spark barrier would cost each waiting worker up to a
        second (Spark polls a barrier once a second).

        Raises:
            StoreError: 400 for a bad worker id; 409 for a worker that never joined,
                an attempt that is not the worker's newest, or an aborted fit. A
                refused leave changes nothing.
        """
        self.check_worker(worker)
        with self.lock:
            self.control.check_aborted()
            newest = self.ledger.newest_attempt(worker)
            if worker not in self.rounds.joined or attempt != newest:
                raise StoreError(
                    409,
                    f"Expected a leave from worker {worker}'s joined attempt {newest}. "
                    f"Received: attempt={attempt}"
                    + ("" if worker in self.rounds.joined else " (the worker never joined)"),
                )
            self._left.add(worker)
            self.lock.notify_all()

    def wait_left(self, wait: float) -> bool:
        """Waits until every worker left.

        Args:
            wait: Seconds to wait at most (``math.inf``: until then).

        Returns:
            Whether every worker left (``False`` also once the fit was aborted).
        """
        with self.lock:
            self._wait_until(lambda: len(self._left) >= self.num_workers, wait)
            return len(self._left) >= self.num_workers

    def report_failure(
        self, worker: int, trace: str, *, attempt: int = 0, fatal: bool = True
    ) -> None:
        """Records a worker's traceback; a fatal failure aborts the fit.

        A fatal failure (an error a retry would meet again: the user's code, the data,
        a diverged loss) aborts training, so waiting workers stop and Spark's retries
        fail at once. A transient one (the service unreachable) is only recorded:
        Spark retries the task, which rejoins. Reports of superseded attempts are
        refused.

        Raises:
            StoreError: 400 for a bad worker id; 409 for a superseded attempt.
        """
        self.check_worker(worker)
        with self.lock:
            if self.control.aborted is not None:
                return  # a consequence of the first fatal failure; keep that one
            self.admit(worker, None, attempt)
            self._failures[worker] = trace[-20_000:]
            if fatal:
                self.control.abort(f"worker {worker} failed")
            self.lock.notify_all()  # (an epoch end waiting on the callbacks goes on)
