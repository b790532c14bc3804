"""The service's training state of one fit, behind one lock.

The state is split by job, each part a small class of its own module:
:class:`~sparkdl.server.center.Center` (weights and versions),
:class:`~sparkdl.server.rounds.Rounds` (synchronous rounds, generations, fencing),
:class:`~sparkdl.server.ledger.WorkerLedger` (what is known of each worker),
:class:`~sparkdl.server.history.EpochHistory` (per-epoch logs) and
:class:`~sparkdl.server.control.ControlChannel` (stop, learning rate, epoch gate,
abort). The store owns the lock, the fit's :class:`~sparkdl.sync.merges.Merge` and the
policy of its :class:`~sparkdl.sync.modes.Mode` (:mod:`sparkdl.server.policies`); a push
is the policy's to run. Nothing here knows
about HTTP: a refused request raises :class:`StoreError` with the status to answer.

Every push carries the worker's id, a sequence number and its task attempt: a push
whose sequence number the worker already used (a retry after a lost answer) is
acknowledged without being applied again; a push from an attempt older than the
worker's newest one (a zombie task) is refused. A push is checked whole before it
changes anything (:meth:`WeightStore.screen`): the worker joined, its samples are at
most the rows it joined with, its sequence number lies within :data:`SEQ_WINDOW` of
the last one applied (a number far ahead would make every later honest push look like
a repeat), its metadata can be recorded (:mod:`sparkdl.server.meta`) and the center
cannot overflow (:meth:`~sparkdl.server.center.Center.reserve`).

A retried task rejoins under the same id and learns where training stands (the last
sequence number applied, the version, its own position), so it continues there with
the current weights.

The driver's threads (callbacks, progress, Spark UI marks) read it through
:class:`sparkdl.server.events.FitEvents`.

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

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from sparkdl.server.center import Center
from sparkdl.server.control import ControlChannel
from sparkdl.server.errors import StoreError
from sparkdl.server.history import EpochHistory
from sparkdl.server.ledger import WorkerLedger, WorkerRecord
from sparkdl.server.meta import check_push_meta
from sparkdl.server.policies import PushPolicy, policy_for
from sparkdl.server.replicas import Replicas
from sparkdl.server.rounds import DEFAULT_ROUND_TIMEOUT, Rounds
from sparkdl.sync.codecs import Compression
from sparkdl.sync.merges import Merge, Update
from sparkdl.sync.modes import Mode, Synchronous, mode_class

__all__ = ["SEQ_WINDOW", "StoreError", "WeightStore"]

MAX_WORKERS = 100_000
#: How far past the last applied sequence number a worker's next push may be
#: numbered (workers number their pushes 1, 2, 3...; retries repeat a number).
SEQ_WINDOW = 16

_log = logging.getLogger(__name__)


class WeightStore:
    """Center weights plus the bookkeeping of one fit. Every method is thread-safe.

    Args:
        weights: Initial center weights (the model's weights on the driver).
        num_workers: Workers of the fit.
        merge: The merge rule.
        mode: The mode (or its name).
        round_timeout: Seconds a synchronous round waits for missing workers before
            it closes with the pushes present (a warning is logged).
        history: Per-epoch logs of epochs done before (a resumed fit); the workers'
            epoch numbers continue after them.
        backup_workers: A synchronous round closes once ``num_workers - backup_workers``
            workers pushed; later pushes for it are dropped. Epochs close on the same
            quorum, and once ``epochs`` epochs closed every answer says stop.
        epochs: The epoch count the fit ends at (with ``backup_workers``).
        gate_epochs: Synchronous mode with driver callbacks: the answer to the round
            that closes an epoch waits until :meth:`release`.
        metric_merge: Reads exact per-epoch metrics from the workers' summed metric
            states (:meth:`sparkdl.metric_states.MetricStates.results`); ``None``:
            metrics averaged by rows.
        compression: Updates travel compressed both ways (:mod:`sparkdl.sync.codecs`);
            the store then keeps each worker's copy of the center (:attr:`replicas`).
    """

    def __init__(
        self,
        weights: Sequence[np.ndarray],
        *,
        num_workers: int,
        merge: Merge,
        mode: Mode | str = Synchronous.name,
        round_timeout: float = DEFAULT_ROUND_TIMEOUT,
        history: dict[str, list[float]] | None = None,
        backup_workers: int = 0,
        epochs: int | None = None,
        gate_epochs: bool = False,
        metric_merge: Callable[[Sequence[Any]], dict[str, float]] | None = None,
        compression: Compression | None = None,
    ) -> None:
        self.mode: Mode = mode_class(mode)() if isinstance(mode, str) else mode
        #: The mode's service half: how pushes are taken.
        self.policy: PushPolicy = policy_for(self.mode)
        self.merge = merge
        self.num_workers = num_workers
        self.epochs = epochs
        self.lock = threading.Condition()
        self.center = Center(weights)
        #: Each worker's copy of the center when updates are compressed, else None.
        self.replicas = (
            Replicas(compression, merge, self.center.weights, newest_attempt=self.newest_attempt)
            if compression
            else None
        )
        self.rounds = Rounds(quorum=max(num_workers - backup_workers, 1), timeout=round_timeout)
        self.ledger = WorkerLedger()
        self.control = ControlChannel(gate_epochs=gate_epochs and self.mode.barrier)
        self._history = EpochHistory(history, metric_merge)
        self._failures: dict[int, str] = {}
        self._rows: dict[int, int] = {}
        #: Summed magnitudes of hogwild steps admitted but not yet added in.
        self.in_flight = [0.0] * len(self.center.weights)
        self.started = time.time()

    # ------------------------------------------------------------------ reads
    @property
    def version(self) -> int:
        """Number of completed rounds (synchronous) or applied updates."""
        return self.center.version

    @property
    def aborted_event(self) -> threading.Event:
        """Set when training is aborted (the driver then cancels the Spark job)."""
        return self.control.aborted_event

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

    def history(self) -> dict[str, list[float]]:
        """Per-epoch logs over all workers (metrics merged from their states)."""
        with self.lock:
            return self._history.logs()

    def newest_attempt(self, worker: int) -> int:
        """The newest task attempt the store took from ``worker`` (0 before any)."""
        with self.lock:
            return self.ledger.newest_attempt(worker)

    def failures(self) -> dict[int, str]:
        """``{worker: traceback}`` of every failure a worker reported."""
        with self.lock:
            return dict(self._failures)

    def status(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot: version, round, samples, workers, history."""
        with self.lock:
            ledger, control = self.ledger, self.control
            return {
                "mode": self.mode.name,
                "merge": self.merge.name,
                "version": self.center.version,
                "round": self.center.version,
                "round_pushed": self.rounds.pushed(),
                "num_workers": self.num_workers,
                "samples_seen": ledger.samples,
                "duplicates": ledger.total("duplicates"),
                "epochs_done": self._history.done,
                "elapsed": time.time() - self.started,
                "workers": ledger.status(),
                "history": self._history.logs(),
                "failures": {str(k): v for k, v in self._failures.items()},
                "aborted": control.aborted,
                "generation": self.rounds.generation,
                "restarts": ledger.restarts,
                "late_pushes": ledger.total("late"),
                "timed_out_rounds": self.rounds.timed_out_rounds,
                "finished": control.finished,
                "stop_requested": control.stop_requested,
                "learning_rate": control.learning_rate,
                "full_answers": self.replicas.full_answers() if self.replicas else None,
            }

    # ------------------------------------------------------ the driver's events
    def epoch_weights(self, epoch: int, wait: float) -> list[np.ndarray]:
        """The weights as epoch ``epoch`` ended (gated: once its last round merged)."""
        deadline = time.monotonic() + wait
        with self.lock:
            while not self.control.epoch_merged(epoch) and self.control.aborted is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.lock.wait(min(left, 1.0))
            return self.center.weights

    def wait_epochs(self, count: int, wait: float) -> int:
        """Waits up to ``wait`` seconds until ``count`` epochs closed; returns how many."""
        deadline = time.monotonic() + wait
        with self.lock:
            while self._history.done < count and self.control.aborted is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.lock.wait(min(left, 1.0))
            return self._history.done

    def release(self, epoch: int) -> None:
        """The driver's callbacks ran on ``epoch``: answer the round that closed it."""
        with self.lock:
            if self.control.release(epoch):
                self.center.forget_encoding()  # the answers carry what the callbacks decided
                self.lock.notify_all()

    def request_stop(self) -> None:
        """Asks workers to stop at the end of their current epoch (``stop_training``).

        The flag travels with the answers from the next version on.
        """
        with self.lock:
            self.control.stop_requested = True

    def set_learning_rate(self, rate: float) -> None:
        """Sends a new learning rate to the workers with the answers of later versions."""
        with self.lock:
            self.control.set_learning_rate(rate)

    def abort(self, reason: str) -> None:
        """Aborts training: every waiting and later request gets a 409 with ``reason``."""
        with self.lock:
            self.control.abort(reason)
            self.lock.notify_all()

    # ----------------------------------------------------------------- writes
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
        """Registers (or re-registers) a worker and its row count.

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
            StoreError: 400 for a bad worker id; 409 for a superseded attempt or when
                training was aborted.
        """
        self.check_worker(worker)
        deadline = time.monotonic() + wait
        with self.lock:
            self.control.check_aborted()
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
                self.lock.notify_all()

    # -------------------------------------- the policies' steps (lock held)
    def screen(self, update: Update, seq: int, attempt: int) -> bool:
        """Checks a push against what the service knows; returns whether ``seq`` repeats.

        Changes nothing: the policy admits the push (:meth:`admit`) once every check
        passed.

        Raises:
            StoreError: 409 for a superseded attempt or a worker that has not joined;
                400 for more samples than the worker's rows or a sequence number
                beyond :data:`SEQ_WINDOW`.
        """
        worker = update.worker
        self.rounds.check_fenced(worker, attempt, self.ledger.newest_attempt(worker))
        rows = self._rows.get(worker)
        if rows is None:
            raise StoreError(409, f"Worker {worker} pushed before it joined: POST /join first.")
        if update.samples > rows:
            raise StoreError(
                400,
                f"Worker {worker} claims {update.samples} samples in one push, but it "
                f"joined with {rows} rows.",
            )
        last = self.ledger.last_seq(worker)
        if seq > last + SEQ_WINDOW:
            raise StoreError(
                400,
                f"Worker {worker} sent sequence number {seq}, but its last applied push "
                f"was {last}: the next one must be at most {last + SEQ_WINDOW}.",
            )
        return seq <= last

    def pending_round(self) -> list[float]:
        """Summed magnitudes of the open synchronous round's pushes, per array."""
        return _summed(self.rounds.open_updates(), len(self.in_flight))

    def admit(self, worker: int, seq: int | None, attempt: int) -> tuple[WorkerRecord, bool]:
        """Fences old attempts; returns the worker's record and whether ``seq`` repeats."""
        self.rounds.check_fenced(worker, attempt, self.ledger.newest_attempt(worker))
        return self.ledger.admit(worker, seq, attempt)

    def record(
        self, record: WorkerRecord, update: Update, *, seq: int, applied: bool = True
    ) -> None:
        """Records a push in the ledger, and its epoch logs in the history."""
        meta = update.meta
        self.ledger.record_push(record, seq=seq, samples=update.samples, meta=meta, applied=applied)
        epoch, logs = meta.get("epoch"), meta.get("epoch_logs")
        if not (isinstance(logs, dict) and isinstance(epoch, int) and 0 <= epoch < 1_000_000):
            return
        record.epoch = epoch + 1
        closed = self._history.report(
            update.worker,
            epoch=epoch,
            rows=_count(meta.get("epoch_samples")),
            val_rows=_count(meta.get("val_samples")),
            logs=logs,
            quorum=self.policy.epoch_quorum(self),
            states=meta.get("epoch_states"),
        )
        for done in closed:
            self.control.epoch_closed(done)
        if closed:
            self.lock.notify_all()
        if (
            self.rounds.quorum < self.num_workers
            and self.epochs is not None
            and self._history.done >= self.epochs
            and not self.control.finished
        ):
            # Backup workers: the quorum did every epoch. Close the open round and
            # tell the stragglers to stop (the stop flag travels with every answer).
            self.control.finished = True
            self.merge_round()
            self.center.forget_encoding()
            self.lock.notify_all()

    def merge_round(self) -> None:
        """Merges the open synchronous round into the next version."""
        updates = self.rounds.take()
        if not updates:
            return
        self.center.commit(self.merge.combine(self.center.weights, updates))
        self.control.round_merged(self.center.version)
        self.lock.notify_all()

    def new_generation(self, worker: int, attempt: int) -> None:
        """Spark retried the barrier stage: fence the old attempts, drop the open round."""
        newest = max((r.attempt for r in self.ledger.records.values()), default=0)
        dropped = self.rounds.new_generation(newest, attempt)
        _log.warning(
            "worker %d rejoined with attempt %d: the training stage was retried; every "
            "worker resumes at round %d (dropped the open round's pushes from %s)",
            worker,
            attempt,
            self.center.version,
            dropped,
        )
        self.lock.notify_all()

    # ---------------------------------------------------------------- helpers
    def check_worker(self, worker: int) -> None:
        """Refuses a worker id outside ``0 <= worker < num_workers`` (400)."""
        if not 0 <= worker < max(self.num_workers, 1) or worker >= MAX_WORKERS:
            raise StoreError(
                400, f"Unknown worker id {worker}: expected 0 <= worker < {self.num_workers}."
            )

    def _close_overdue_round(self) -> None:
        if not self.rounds.overdue():
            return
        pushed = self.rounds.pushed()
        missing = sorted(set(range(self.num_workers)) - set(pushed))
        _log.warning(
            "round %d waited more than round_timeout=%ss for workers %s; it closes with "
            "workers %s, and the late pushes will be dropped. Raise round_timeout if "
            "their steps are that slow, or set backup_workers= for stragglers.",
            self.center.version,
            self.rounds.timeout,
            missing,
            pushed,
        )
        self.rounds.timed_out_rounds += 1
        self.merge_round()


def _summed(updates: Sequence[Update], arrays: int) -> list[float]:
    total = [0.0] * arrays
    for update in updates:
        for i, m in enumerate(update.magnitudes):
            total[i] += m
    return total


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
