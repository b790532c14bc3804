"""The parts of one fit's training state, and the steps that change several at once.

:class:`TrainingState` holds the parts, each a small class of its own module:
:class:`~sparkdl.server.state.center.Center` (weights and versions),
:class:`~sparkdl.server.state.rounds.Rounds` (synchronous rounds, generations, fencing),
:class:`~sparkdl.server.state.ledger.WorkerLedger` (what is known of each worker),
:class:`~sparkdl.server.state.history.EpochHistory` (per-epoch logs) and
:class:`~sparkdl.server.state.control.ControlChannel` (stop, learning rate, epoch gate,
abort), with the lock, the fit's :class:`~sparkdl.sync.merges.Merge` and the policy of
its :class:`~sparkdl.sync.modes.Mode` (:mod:`sparkdl.server.state.policies`). Its methods are
the steps a push goes through (screen, admit, record, merge a round, start a
generation): they run with the lock held and none of them takes it, so a policy
composes them into one push under one lock.
:class:`~sparkdl.server.state.store.WeightStore` adds the thread-safe API on top (every
one of its methods takes the lock); the split keeps that rule visible in the class a
method lives in.

A worker joins with the training rows it holds; the workers' rows together may not
exceed what the driver counted (:meth:`TrainingState.check_rows`): the plan comes from
the driver's scan of the data, so neither a join nor a re-join can raise a worker's
rows, nor any bound derived from them, past what no other worker holds.

A push is checked whole before it changes anything (:meth:`TrainingState.screen`): the
worker joined, its samples are at most the rows it joined with, its sequence number
lies within :data:`SEQ_WINDOW` of the last one applied (a number far ahead would make
every later honest push look like a repeat), its metadata can be recorded
(:mod:`sparkdl.server.state.meta`) and the center cannot overflow
(:meth:`~sparkdl.server.state.center.Center.reserve`).

Example:
    >>> import numpy as np
    >>> from sparkdl.server.state.store import WeightStore
    >>> from sparkdl.sync.merges import Average, Update
    >>> state: TrainingState = WeightStore([np.zeros(2, np.float32)], num_workers=1,
    ...                                    merge=Average())
    >>> _ = state.join(0, rows=4, wait=0.0)  # WeightStore's API takes the lock itself
    >>> with state.lock:  # a step: the caller holds the lock
    ...     state.screen(Update(worker=0, arrays=[np.ones(2, np.float32)], samples=4), 1, 0)
    False
"""

from __future__ import annotations

import abc
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from sparkdl.contract.backends import compiled
from sparkdl.server.state.center import Center
from sparkdl.server.state.control import ControlChannel
from sparkdl.server.state.errors import StoreError
from sparkdl.server.state.history import EpochHistory
from sparkdl.server.state.ledger import WorkerLedger, WorkerRecord
from sparkdl.server.state.policies import PushPolicy, policy_for
from sparkdl.server.state.replicas import Replicas
from sparkdl.server.state.rounds import DEFAULT_ROUND_TIMEOUT, Rounds
from sparkdl.server.state.traffic import Traffic
from sparkdl.sync.codecs import Compression
from sparkdl.sync.merges import Merge, Update
from sparkdl.sync.modes import Mode, Synchronous, mode_class
from sparkdl.sync.outer import OuterOptimizer, OuterState

__all__ = [
    "CALLBACK_LAG",
    "MAX_EPOCH_COPIES",
    "MAX_WORKERS",
    "SEQ_WINDOW",
    "SILENT_SECONDS",
    "TrainingState",
]

MAX_WORKERS = 100_000
#: How far past the last applied sequence number a worker's next push may be
#: numbered (workers number their pushes 1, 2, 3...; retries repeat a number).
SEQ_WINDOW = 16
#: Asynchronous modes with driver callbacks: a worker that ends epoch ``e`` waits until
#: the callbacks ran on epoch ``e - CALLBACK_LAG``, so a callback's ``stop_training``
#: ends the fit at most this many epochs after the one it was decided on.
CALLBACK_LAG = 1
#: Asynchronous modes with driver callbacks: an epoch end does not wait for workers
#: silent this long (a lost task, likely; silence counts from a worker's last request,
#: or the end of its own wait). A live worker that pushes less often (long epochs
#: with ``frequency="epoch"``, the default) then no longer holds the faster ones
#: within :data:`CALLBACK_LAG`, and a callback's ``stop_training`` may reach them later.
SILENT_SECONDS = 30.0
#: Epoch copies (``keep_epoch_copies``) waiting to be written, at most.
MAX_EPOCH_COPIES = 4

#: The store's logger: the round and generation warnings keep the name they are filtered by.
_log = logging.getLogger("sparkdl.server.store")  # its name before the tier folders


class TrainingState(abc.ABC):
    """The parts of one fit's training state and the steps across them, under one lock.

    Not thread-safe on its own: the steps run with :attr:`lock` held and none of its
    methods takes it (:meth:`check_worker` reads only the worker count). Built as a
    :class:`~sparkdl.server.state.store.WeightStore`, which adds the thread-safe API.

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
        gate_epochs: The fit has driver callbacks. Synchronous mode: the answer to
            the round that closes an epoch waits until
            :meth:`~sparkdl.server.state.store.WeightStore.release`. Asynchronous modes: a
            worker's epoch end waits until the callbacks ran on the epoch
            :data:`CALLBACK_LAG` before
            (:meth:`~sparkdl.server.state.store.WeightStore.wait_callbacks`).
        metric_merge: Reads exact per-epoch metrics from the workers' summed metric
            states (:meth:`sparkdl.contract.metric_states.MetricStates.results`); ``None``:
            metrics averaged by rows.
        compression: Updates travel compressed both ways (:mod:`sparkdl.sync.codecs`);
            the store then keeps each worker's copy of the center (:attr:`replicas`).
        outer: The outer optimizer that steps on each merge's change
            (:mod:`sparkdl.sync.outer`), or ``None``.
        outer_state: Its state from a checkpoint or snapshot: the arrays of
            :meth:`~sparkdl.sync.outer.OuterState.arrays` and the push count.
        keep_epoch_copies: Keep a copy of the center as each epoch ends, until it is
            taken (the snapshots of a service in the cluster: every shard's snapshot
            of an epoch is then of the same round).
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
        outer: OuterOptimizer | None = None,
        outer_state: tuple[Sequence[np.ndarray], int] | None = None,
        keep_epoch_copies: bool = False,
    ) -> None:
        self.mode: Mode = mode_class(mode)() if isinstance(mode, str) else mode
        #: The mode's service half: how pushes are taken.
        self.policy: PushPolicy = policy_for(self.mode)
        self.merge = merge
        self.num_workers = num_workers
        self.epochs = epochs
        self.lock = threading.Condition()
        self.center = Center(weights)
        #: Copies of the center as epochs ended (epoch -> weights, outer state), or None.
        self.epoch_copies: dict[int, tuple[list[np.ndarray], Any]] | None = (
            {} if keep_epoch_copies else None
        )
        self._copy_pending: list[int] = []
        #: The outer optimizer's state read with the weights of an epoch last served.
        self._served_outer: tuple[list[np.ndarray], int] | None = None
        #: The outer optimizer's state (momentum beside the center), or None.
        self.outer = _outer_state(outer, self.center, num_workers, outer_state)
        #: Each worker's copy of the center when updates are compressed, else None.
        self.replicas = (
            Replicas(compression, merge, self.center.weights, newest_attempt=self.newest_attempt)
            if compression
            else None
        )
        self.rounds = Rounds(quorum=max(num_workers - backup_workers, 1), timeout=round_timeout)
        self.ledger = WorkerLedger()
        self._history = EpochHistory(history, metric_merge)
        #: Epochs done when this service started (a resumed fit, a snapshot).
        self.initial_epochs = self._history.done
        self.control = ControlChannel(
            gate_epochs=gate_epochs and self.mode.barrier,
            callback_lag=CALLBACK_LAG if gate_epochs and not self.mode.barrier else None,
            released=self._history.done - 1,
        )
        self._failures: dict[int, str] = {}
        self._rows: dict[int, int] = {}
        #: Workers whose training ended (``/leave``): the host of a service in the
        #: cluster stops it once every worker left.
        self._left: set[int] = set()
        #: The most training rows each worker may join with (the driver's plan:
        #: :meth:`~sparkdl.server.state.store.WeightStore.plan_rows`); ``None`` takes a
        #: worker's count as given (a store no fit planned: tests, benchmarks).
        self.planned_rows: list[int] | None = None
        #: Summed magnitudes of hogwild steps admitted but not yet added in.
        self.in_flight = [0.0] * len(self.center.weights)
        self.started = time.time()
        #: Requests and body bytes the service answered (:mod:`sparkdl.server.state.traffic`).
        self.traffic = Traffic()

    @abc.abstractmethod
    def newest_attempt(self, worker: int) -> int:
        """The newest task attempt taken from ``worker``, read under the lock (the
        :class:`~sparkdl.server.state.replicas.Replicas` ask from the request threads)."""

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

    def check_rows(self, worker: int, rows: int) -> None:
        """Refuses a join whose training rows, with the other workers' joined rows,
        exceed the rows the driver counted for the fit (the plan's total).

        The total, not each worker's share, is what the scan knows for sure: which
        rows a task gets may change from one Spark job to the next (a range
        partitioning samples its bounds anew, a coalesce groups partitions where their
        blocks are), but not how many there are. A worker therefore cannot claim rows
        that no other worker lacks. Changes nothing.

        Raises:
            StoreError: 400 for more rows than the plan leaves this worker.
        """
        planned = self.planned_rows
        if planned is None:
            return
        others = sum(n for w, n in self._rows.items() if w != worker)
        total = sum(planned)
        if rows + others > total:
            raise StoreError(
                400,
                f"Worker {worker} joined with {rows} training rows, but the driver counted "
                f"{total} for the fit and the other workers joined with {others}: a worker "
                "cannot raise its row count. If the DataFrame's rows change from one "
                "Spark job to the next (a nondeterministic source), cache or checkpoint "
                "it before fit.",
            )

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
            if self.epoch_copies is not None:
                # Asynchronous: the center as the epoch closed. Synchronous: as the
                # round that closes it merges (merge_round).
                if self.mode.barrier:
                    self._copy_pending.append(done)
                else:
                    self._copy_epoch(done)
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
        merged = self.merge.combine(self.center.weights, updates)
        if self.outer is not None:
            try:
                merged = self.outer.round(self.center.weights, merged, self.center.check_outer)
            except StoreError as exc:  # the round is taken: no worker may wait for it
                self.control.abort(exc.message)
                self.lock.notify_all()
                raise
            except Exception as exc:  # a step that fails (a Keras optimizer's) aborts too
                message = (
                    f"The service's outer optimizer failed to step: {type(exc).__name__}: "
                    f"{exc}. Training stopped; the center is as the last round left it."
                )
                self.control.abort(message)
                self.lock.notify_all()
                raise StoreError(500, message) from exc
        self.center.commit(merged)
        for done in self._copy_pending:
            self._copy_epoch(done)
        self._copy_pending.clear()
        self.control.round_merged(self.center.version)
        self.lock.notify_all()

    def _copy_epoch(self, epoch: int) -> None:
        """Keeps a copy of the center (and the outer optimizer's state) as ``epoch``
        ended, for :meth:`~sparkdl.server.state.store.WeightStore.take_epoch_copies`; at most
        :data:`MAX_EPOCH_COPIES` wait (the oldest goes)."""
        assert self.epoch_copies is not None
        outer = self.outer.snapshot() if self.outer is not None else None
        self.epoch_copies[epoch] = ([np.array(w) for w in self.center.weights], outer)
        while len(self.epoch_copies) > MAX_EPOCH_COPIES:
            oldest = min(self.epoch_copies)
            del self.epoch_copies[oldest]
            _log.warning(
                "the copy of epoch %d's weights was dropped before it was written: "
                "snapshots fall behind the epochs",
                oldest + 1,
            )

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


def _outer_state(
    outer: OuterOptimizer | None,
    center: Center,
    num_workers: int,
    saved: tuple[Sequence[np.ndarray], int] | None,
) -> OuterState | None:
    """The outer optimizer's state beside ``center``: fresh, or ``saved`` (a checkpoint's
    or a snapshot's arrays and push count); ``None`` without an outer optimizer."""
    if outer is None:
        return None
    arrays, pushes = saved if saved else (None, 0)
    return outer.state(
        center.weights, num_workers=num_workers, arrays=arrays, pushes=pushes, compile=compiled
    )


def _summed(updates: Sequence[Update], arrays: int) -> list[float]:
    total = [0.0] * arrays
    for update in updates:
        for i, m in enumerate(update.magnitudes):
            total[i] += m
    return total


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
