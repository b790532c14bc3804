"""The service's training state: versioned center weights, rounds, progress, failures.

All methods are thread-safe; the Flask routes call them from the WSGI server's
threads. Nothing here knows about HTTP: errors are raised as :class:`StoreError` with
the HTTP status the route should answer.

Every push carries the worker's id, a sequence number and its task attempt. A push
whose sequence number the worker already used (a retry after a lost answer) is
acknowledged without being applied again; a push from an attempt older than the
worker's newest one (a zombie task) is refused. A retried task rejoins under the same
id and learns where training stands: the last sequence number the service applied,
the version, and its own position (epoch and batches done), so it continues from
there with the current weights instead of starting over.

Synchronous fits run as one barrier stage, which Spark retries as a whole: when a
worker that already joined joins again with a newer attempt, a new *generation*
starts. The open round is dropped (every worker of the new stage attempt rejoins at
the last completed round) and every attempt of the old generation is fenced off.

Example:
    >>> import numpy as np
    >>> from sparkdl.server.rules import AverageRule
    >>> store = WeightStore([np.zeros(2, np.float32)], num_workers=1, rule=AverageRule())
    >>> out = store.push_sync(0, seq=1, round_no=0, arrays=[np.ones(2, np.float32)],
    ...                       samples=4, meta={}, wait=1.0)
    >>> out[1], out[0][0].tolist()
    (1, [1.0, 1.0])
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sparkdl.server import wire
from sparkdl.server.rules import MergeRule, Update

__all__ = ["STORE_MODES", "StoreError", "WeightStore", "WorkerInfo"]

STORE_MODES: tuple[str, ...] = ("synchronous", "asynchronous", "hogwild")

MAX_WORKERS = 100_000

_log = logging.getLogger(__name__)


class StoreError(Exception):
    """A request the store refuses; ``status`` is the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class WorkerInfo:
    """What the service knows about one worker."""

    first_contact: float = 0.0
    last_contact: float = 0.0
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


@dataclass
class _Epoch:
    #: worker -> (training rows, validation rows, logs)
    reports: dict[int, tuple[int, int, dict[str, float]]] = field(default_factory=dict)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


class WeightStore:
    """Center weights plus the bookkeeping of one fit.

    Args:
        weights: Initial center weights (the model's weights on the driver).
        num_workers: Workers that take part in every synchronous round.
        rule: The merge rule.
        mode: ``"synchronous"`` (rounds closed when every worker pushed),
            ``"asynchronous"`` (each push applied under the lock as it arrives, as new
            arrays) or ``"hogwild"`` (each push added into the live arrays with no lock
            held; see :meth:`push_async`).
        round_timeout: Seconds a synchronous round waits for missing workers before
            it closes with the pushes present (a warning is logged).
        history: Per-epoch logs of epochs done before (a resumed fit); the workers'
            epoch numbers continue after them.
        backup_workers: A synchronous round closes once ``num_workers - backup_workers``
            workers pushed; later pushes for it are dropped. Epochs close on the same
            quorum, and once ``epochs`` epochs closed every answer says stop.
        epochs: The epoch count the fit ends at (with ``backup_workers``).
        gate_epochs: Synchronous mode with driver callbacks: the answer to the round
            that closes an epoch waits until :meth:`release` (the callbacks ran on that
            epoch), so ``stop_training`` and a new learning rate take effect at the next
            epoch, as in ``model.fit``.
    """

    def __init__(
        self,
        weights: Sequence[np.ndarray],
        *,
        num_workers: int,
        rule: MergeRule,
        mode: str = "synchronous",
        round_timeout: float = 3600.0,
        history: dict[str, list[float]] | None = None,
        backup_workers: int = 0,
        epochs: int | None = None,
        gate_epochs: bool = False,
    ) -> None:
        if mode not in STORE_MODES:
            raise ValueError(f"Expected mode to be one of {STORE_MODES}. Received: {mode!r}")
        self.mode = mode
        self._cond = threading.Condition()
        self._weights = [np.array(w, copy=True) for w in weights]
        self._specs = [(w.dtype, w.shape) for w in self._weights]
        self.num_workers = num_workers
        self.rule = rule
        self.round_timeout = round_timeout
        if not 0 <= backup_workers < max(num_workers, 1):
            raise ValueError(
                f"Expected 0 <= backup_workers < num_workers={num_workers}. "
                f"Received: {backup_workers}"
            )
        self.quorum = max(num_workers - backup_workers, 1)
        self.epochs = epochs
        self._finished = False
        self.gate_epochs = gate_epochs and mode == "synchronous"
        self._gate_pending: int | None = None  # an epoch closed; hold its last round
        self._hold: int | None = None  # a merged version not yet answered
        self._epoch_version: dict[int, int] = {}
        self._generation = 0
        self._floor = 0  # attempts below this belong to a fenced-off generation
        self._joined: set[int] = set()
        self._timed_out_rounds = 0
        self._version = 0
        self._round: dict[int, Update] = {}
        self._round_started: float | None = None
        self._workers: dict[int, WorkerInfo] = {}
        self._epochs: dict[int, _Epoch] = {}
        self._history: dict[str, list[float]] = {
            k: [float(v) for v in vs] for k, vs in (history or {}).items()
        }
        self._samples_seen = 0
        self._failures: dict[int, str] = {}
        self._aborted: str | None = None
        self._stop_requested = False
        #: Set when training is aborted (the driver then cancels the Spark job).
        self.aborted_event = threading.Event()
        self._learning_rate: float | None = None
        self._rows: dict[int, int] = {}
        self._encoded: tuple[int, list[Any]] | None = None
        self.started = time.time()

    # ------------------------------------------------------------------ reads
    @property
    def version(self) -> int:
        """Number of completed rounds (synchronous) or applied updates."""
        return self._version

    def pull(self, min_version: int = 0, wait: float = 0.0) -> tuple[list[np.ndarray], int] | None:
        """Returns ``(weights, version)`` once ``version >= min_version``.

        Waits up to ``wait`` seconds; returns ``None`` if the version is still older.

        Raises:
            StoreError: 409 when training was aborted.
        """
        deadline = time.monotonic() + wait
        with self._cond:
            while True:
                self._check_aborted()
                if self._visible() >= min_version:
                    return self._weights, self._version
                self._check_round_timeout()
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(min(left, 1.0))

    def encoded(self, min_version: int = 0, wait: float = 0.0) -> tuple[list[Any], int] | None:
        """Like :meth:`pull`, but returns the weights as wire-format chunks.

        The chunks are a small header plus views of the version's own arrays (never
        copied: a version's arrays are never modified, merges make new ones), built
        once per version however many workers ask for it.

        Returns:
            ``(chunks, version)`` with ``version >= min_version``, or ``None`` after
            ``wait`` seconds.
        """
        if self.pull(min_version, wait) is None:
            return None
        if self.mode == "hogwild":  # live arrays: views of memory other pushes change
            version = self._version
            return wire.encode(self._weights, self._answer_meta(version)), version
        with self._cond:
            cached = self._encoded
            if cached is None or cached[0] != self._version:
                # The control fields are frozen with the version: every worker of a
                # synchronous round reads the same stop flag and learning rate.
                chunks = wire.encode(self._weights, self._answer_meta(self._version))
                cached = self._encoded = (self._version, chunks)
            return cached[1], cached[0]

    def _visible(self) -> int:
        """The newest version answers may carry (one held for the callbacks is not)."""
        return self._version if self._hold is None else self._hold - 1

    def epoch_weights(self, epoch: int, wait: float) -> list[np.ndarray]:
        """The weights as epoch ``epoch`` ended (gated: once its last round merged)."""
        deadline = time.monotonic() + wait
        with self._cond:
            while self.gate_epochs and epoch not in self._epoch_version:
                left = deadline - time.monotonic()
                if left <= 0 or self._aborted is not None:
                    break
                self._cond.wait(min(left, 1.0))
            return self._weights

    def wait_epochs(self, count: int, wait: float) -> int:
        """Waits up to ``wait`` seconds until ``count`` epochs closed; returns how many."""
        deadline = time.monotonic() + wait
        with self._cond:
            while self._epochs_done() < count and self._aborted is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 1.0))
            return self._epochs_done()

    def release(self, epoch: int) -> None:
        """The driver's callbacks ran on ``epoch``: answer the round that closed it."""
        with self._cond:
            held = self._epoch_version.get(epoch)
            if self._hold is not None and held is not None and held >= self._hold:
                self._hold = None
                self._encoded = None  # the answers carry what the callbacks decided
                self._cond.notify_all()

    def _answer_meta(self, version: int) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "version": version,
            "stop": self._stop_requested or self._finished,
        }
        if self._learning_rate is not None:
            meta["learning_rate"] = self._learning_rate
        return meta

    def weights(self) -> list[np.ndarray]:
        """Returns the current center weights (do not modify them)."""
        with self._cond:
            return self._weights

    def history(self) -> dict[str, list[float]]:
        """Per-epoch logs averaged over workers, weighted by samples."""
        with self._cond:
            return {k: list(v) for k, v in self._history.items()}

    def failures(self) -> dict[int, str]:
        """``{worker: traceback}`` of every failure a worker reported."""
        with self._cond:
            return dict(self._failures)

    def status(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot: version, round, samples, workers, history."""
        with self._cond:
            now = time.time()
            return {
                "mode": self.mode,
                "merge": self.rule.name,
                "version": self._version,
                "round": self._version,
                "round_pushed": sorted(self._round),
                "num_workers": self.num_workers,
                "samples_seen": self._samples_seen,
                "duplicates": sum(info.duplicates for info in self._workers.values()),
                "epochs_done": self._epochs_done(),
                "elapsed": now - self.started,
                "workers": {
                    str(w): {
                        "first_contact": info.first_contact,
                        "last_contact": info.last_contact,
                        "first_push": info.first_push,
                        "last_push": info.last_push,
                        "seconds_since_contact": now - info.last_contact,
                        "last_loss": info.last_loss,
                        "samples": info.samples,
                        "pushes": info.pushes,
                        "seq": info.seq,
                        "attempt": info.attempt,
                        "duplicates": info.duplicates,
                        "epoch": info.epoch,
                        "position": list(info.position) if info.position else None,
                        "attempts": info.attempts,
                        "attempt_joined": info.attempt_joined,
                        "attempt_first_push": info.attempt_first_push,
                        "late": info.late,
                        "late_samples": info.late_samples,
                    }
                    for w, info in sorted(self._workers.items())
                },
                "history": {k: list(v) for k, v in self._history.items()},
                "failures": {str(k): v for k, v in self._failures.items()},
                "aborted": self._aborted,
                "generation": self._generation,
                "restarts": sum(max(info.attempts - 1, 0) for info in self._workers.values()),
                "late_pushes": sum(info.late for info in self._workers.values()),
                "timed_out_rounds": self._timed_out_rounds,
                "finished": self._finished,
                "stop_requested": self._stop_requested,
                "learning_rate": self._learning_rate,
            }

    # ----------------------------------------------------------------- writes
    def push_sync(
        self,
        worker: int,
        *,
        seq: int,
        round_no: int,
        arrays: Sequence[np.ndarray],
        samples: int,
        meta: dict[str, Any],
        wait: float,
        attempt: int = 0,
    ) -> tuple[list[np.ndarray], int] | None:
        """Adds a worker's push to synchronous round ``round_no``.

        When the quorum of the round has pushed (every worker, or all but
        ``backup_workers``), the rule merges the round and the version becomes
        ``round_no + 1``. A push repeated with the same sequence number (a retry after
        a timeout) is counted once. A newer attempt of a worker that already pushed in
        the open round replaces that push. A push for a round that already closed
        without it (a backup worker, or ``round_timeout``) is dropped: its epoch logs
        still count if its epoch is open, and it gets the current weights at once.

        Returns:
            ``(weights, version)`` once the round is merged (or at once for a dropped
            push, or after the fit finished), or ``None`` if the round is still open
            after ``wait`` seconds (poll with :meth:`pull`).

        Raises:
            StoreError: 400 for a bad worker id, shapes or values; 409 for a round from
                the future, a superseded attempt, or when training was aborted.
        """
        self._expect_mode("synchronous")
        self._check_worker(worker)
        self._check_arrays(arrays)
        with self._cond:
            self._check_aborted()
            info, duplicate = self._admit(worker, seq, attempt)
            if round_no < self._version and duplicate:
                return self._weights, self._version  # retry of a merged round
            if round_no > self._version:
                raise StoreError(
                    409,
                    f"Worker {worker} pushed for round {round_no}, but the open round is "
                    f"{self._version}.",
                )
            if not duplicate:
                info.seq = seq
                late = round_no < self._version or self._finished
                self._record(worker, info, samples, meta, applied=not late)
                if late:
                    return self._weights, self._version
                self._round[worker] = Update(
                    worker=worker, arrays=list(arrays), samples=samples, meta=meta
                )
                if self._round_started is None:
                    self._round_started = time.monotonic()
                if len(self._round) >= self.quorum:
                    self._merge_round()
            elif self._finished:
                return self._weights, self._version
        return self.pull(round_no + 1, wait)

    def push_async(
        self,
        worker: int,
        *,
        seq: int,
        base_version: int,
        arrays: Sequence[np.ndarray],
        samples: int,
        meta: dict[str, Any],
        attempt: int = 0,
    ) -> int:
        """Applies one asynchronous push; returns the new version.

        A push repeated with a sequence number the worker already used is not applied
        again; the current version is returned.

        In ``"asynchronous"`` mode the rule makes the new center under the lock. In
        ``"hogwild"`` mode only the bookkeeping (sequence numbers, version, samples)
        is done under the lock; numpy then adds into the live center with no lock held,
        so pushes from several request threads add at once. What may race: two adds to
        the same element can interleave their read-modify-write and lose one of them,
        and a worker may pull weights with another push half applied. Both are the
        bounded noise that Hogwild (Recht et al. 2011) shows SGD tolerates; every push
        is still applied at most once and the arrays' shapes never change.

        Raises:
            StoreError: 400 for a bad worker id, shapes, values or a version from the
                future; 409 for a superseded attempt or when training was aborted.
        """
        self._expect_mode("asynchronous")
        self._check_worker(worker)
        self._check_arrays(arrays)
        with self._cond:
            self._check_aborted()
            info, duplicate = self._admit(worker, seq, attempt)
            if duplicate:
                return self._version
            if base_version > self._version:
                raise StoreError(
                    400,
                    f"Worker {worker} pushed an update against version {base_version}, but "
                    f"the service is at version {self._version}.",
                )
            update = Update(
                worker=worker,
                arrays=list(arrays),
                samples=samples,
                base_version=base_version,
                meta=meta,
            )
            before = self._version
            if self.mode == "asynchronous":
                self._weights = self.rule.apply(self._weights, update, before)
            info.seq = seq
            self._record(worker, info, samples, meta)
            self._version += 1
            version = self._version
            self._cond.notify_all()
        if self.mode == "hogwild":
            self.rule.apply_in_place(self._weights, update, before)
        return version

    def join(self, worker: int, rows: int, wait: float, attempt: int = 0) -> dict[str, Any] | None:
        """Registers (or re-registers) a worker and its row count.

        A retried task joins again under the same id with a higher ``attempt``: from
        then on pushes of older attempts are refused, and the answer tells the new
        attempt the last sequence number applied, so it continues the numbering.

        Returns:
            ``{"rows": [...], "seq": s, "version": v}``. In synchronous mode it waits
            until every worker joined and ``rows`` holds every worker's row count (the
            workers agree on the rounds per epoch from it); returns ``None`` if that
            takes longer than ``wait`` seconds (ask again). In asynchronous mode it
            answers at once with the row counts known so far.

        Raises:
            StoreError: 400 for a bad worker id; 409 for a superseded attempt or when
                training was aborted.
        """
        self._check_worker(worker)
        deadline = time.monotonic() + wait
        with self._cond:
            self._check_aborted()
            known = self._workers.get(worker)
            if (
                self.mode == "synchronous"
                and known is not None
                and worker in self._joined
                and attempt > known.attempt
            ):
                self._new_generation(worker, attempt)
            info, _ = self._admit(worker, seq=None, attempt=attempt)
            if attempt > info.joined_attempt or worker not in self._joined:
                info.attempts += 1
                info.attempt_joined = time.time()
                info.attempt_first_push = 0.0
                info.joined_attempt = attempt
            self._joined.add(worker)
            self._rows[worker] = rows
            self._cond.notify_all()
            while self.mode == "synchronous" and len(self._joined) < self.num_workers:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(min(left, 1.0))
                self._check_aborted()
                self._check_fenced(worker, attempt)
            return {
                "rows": [self._rows.get(w, 0) for w in range(self.num_workers)],
                "seq": info.seq,
                "version": self._version,
                "position": list(info.position) if info.position else None,
                "generation": self._generation,
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
        self._check_worker(worker)
        with self._cond:
            if self._aborted is not None:
                return  # a consequence of the first fatal failure; keep that one
            self._admit(worker, seq=None, attempt=attempt)
            self._failures[worker] = trace[-20_000:]
            if fatal:
                self._aborted = f"worker {worker} failed"
                self.aborted_event.set()
                self._cond.notify_all()

    def abort(self, reason: str) -> None:
        """Aborts training: every waiting and later push gets a 409 with ``reason``."""
        with self._cond:
            self._aborted = reason
            self.aborted_event.set()
            self._cond.notify_all()

    def request_stop(self) -> None:
        """Asks workers to stop at the end of their current epoch (``stop_training``).

        The flag travels with the answers from the next version on.
        """
        with self._cond:
            self._stop_requested = True

    def set_learning_rate(self, rate: float) -> None:
        """Sends a new learning rate to the workers with the answers of later versions."""
        with self._cond:
            self._learning_rate = float(rate)

    @property
    def stop_requested(self) -> bool:
        """Whether workers were asked to stop at their next sync."""
        return self._stop_requested

    # ---------------------------------------------------------------- helpers
    def _admit(self, worker: int, seq: int | None, attempt: int) -> tuple[WorkerInfo, bool]:
        """Fences old attempts and spots repeated pushes; call with the lock held."""
        self._check_fenced(worker, attempt)
        info = self._workers.setdefault(worker, WorkerInfo())
        info.attempt = attempt
        info.last_contact = time.time()
        info.first_contact = info.first_contact or info.last_contact
        duplicate = seq is not None and seq <= info.seq
        if duplicate:
            info.duplicates += 1
        return info, duplicate

    def _check_fenced(self, worker: int, attempt: int) -> None:
        info = self._workers.get(worker)
        newest = info.attempt if info is not None else 0
        if attempt < newest or attempt < self._floor:
            raise StoreError(
                409,
                f"Worker {worker} attempt {attempt} was superseded by a newer attempt "
                f"(attempt {max(newest, self._floor)} or later); its requests are refused.",
            )

    def _new_generation(self, worker: int, attempt: int) -> None:
        """Spark retried the barrier stage: fence the old attempts, drop the open round."""
        self._floor = max(
            self._floor, max((i.attempt for i in self._workers.values()), default=0) + 1
        )
        self._floor = min(self._floor, attempt)
        self._generation += 1
        dropped = sorted(self._round)
        self._round = {}
        self._round_started = None
        self._joined = set()
        _log.warning(
            "worker %d rejoined with attempt %d: the training stage was retried; every "
            "worker resumes at round %d (dropped the open round's pushes from %s)",
            worker,
            attempt,
            self._version,
            dropped,
        )
        self._cond.notify_all()

    def _expect_mode(self, mode: str) -> None:
        if (self.mode == "synchronous") != (mode == "synchronous"):
            raise StoreError(
                400, f"This fit runs in {self.mode} mode; a {mode} push does not belong to it."
            )

    def _merge_round(self) -> None:
        if not self._round:
            return
        updates = [self._round[w] for w in sorted(self._round)]
        self._weights = self.rule.combine(self._weights, updates)
        self._version += 1
        if self._gate_pending is not None:
            self._epoch_version[self._gate_pending] = self._version
            self._hold = self._version
            self._gate_pending = None
        self._round = {}
        self._round_started = None
        self._cond.notify_all()

    def _record(
        self,
        worker: int,
        info: WorkerInfo,
        samples: int,
        meta: dict[str, Any],
        applied: bool = True,
    ) -> None:
        info.last_push = time.time()
        info.first_push = info.first_push or info.last_push
        info.attempt_first_push = info.attempt_first_push or info.last_push
        if applied:
            info.pushes += 1
            info.samples += samples
            self._samples_seen += samples
        else:
            info.late += 1
            info.late_samples += samples
        epoch, step = meta.get("epoch"), meta.get("step")
        if isinstance(epoch, int) and isinstance(step, int) and epoch >= 0 and step >= 0:
            info.position = (epoch, step)
        loss = meta.get("loss")
        if isinstance(loss, (int, float)):
            info.last_loss = float(loss)
        comm = meta.get("comm_seconds")
        if isinstance(comm, (int, float)):
            info.comm_seconds = float(comm)
        logs = meta.get("epoch_logs")
        if isinstance(logs, dict) and isinstance(epoch, int) and 0 <= epoch < 1_000_000:
            info.epoch = epoch + 1
            clean = {
                str(k): float(v)
                for k, v in list(logs.items())[:256]
                if isinstance(v, (int, float)) and not isinstance(v, bool)
            }
            n = _count(meta.get("epoch_samples"))
            val_n = _count(meta.get("val_samples"))
            if epoch < self._epochs_done():
                return  # a late report for an epoch the quorum already closed
            report = self._epochs.setdefault(epoch, _Epoch())
            report.reports[worker] = (n, val_n, clean)
            self._close_epochs()

    def _epochs_done(self) -> int:
        return len(next(iter(self._history.values()), []))

    def _close_epochs(self) -> None:
        done = self._epochs_done()
        quorum = self.quorum if self.mode == "synchronous" else self.num_workers
        while done in self._epochs and len(self._epochs[done].reports) >= quorum:
            reports = list(self._epochs.pop(done).reports.values())
            keys = sorted({k for _, _, logs in reports for k in logs})
            for key in keys:
                # Training logs weigh by training rows, val_* logs by validation rows.
                val = key.startswith("val_")
                pairs = [(vn if val else n, logs[key]) for n, vn, logs in reports if key in logs]
                weight = sum(n for n, _ in pairs)
                value = (
                    sum(n * v for n, v in pairs) / weight
                    if weight > 0
                    else sum(v for _, v in pairs) / len(pairs)
                )
                self._history.setdefault(key, [float("nan")] * done).append(float(value))
            if self.gate_epochs:
                self._gate_pending = done
            done += 1
            self._cond.notify_all()
        if (
            self.quorum < self.num_workers
            and self.epochs is not None
            and done >= self.epochs
            and not self._finished
        ):
            # Backup workers: the quorum did every epoch. Close the open round and
            # tell the stragglers to stop (the stop flag travels with every answer).
            self._finished = True
            self._merge_round()
            self._encoded = None
            self._cond.notify_all()

    def _check_worker(self, worker: int) -> None:
        if not 0 <= worker < max(self.num_workers, 1) or worker >= MAX_WORKERS:
            raise StoreError(
                400, f"Unknown worker id {worker}: expected 0 <= worker < {self.num_workers}."
            )

    def _check_arrays(self, arrays: Sequence[np.ndarray]) -> None:
        if len(arrays) != len(self._specs):
            raise StoreError(
                400,
                f"Expected {len(self._specs)} weight arrays (the model's weights). "
                f"Received: {len(arrays)}",
            )
        for i, (array, (dtype, shape)) in enumerate(zip(arrays, self._specs, strict=True)):
            if array.dtype != dtype or array.shape != shape:
                raise StoreError(
                    400,
                    f"Weight {i}: expected dtype {dtype} and shape {shape}. "
                    f"Received: dtype {array.dtype}, shape {array.shape}",
                )
            if np.issubdtype(dtype, np.floating) and not np.isfinite(array).all():
                raise StoreError(
                    400,
                    f"Weight {i} holds NaN or infinite values; the update was refused. "
                    "Training diverged: lower the learning rate or clip gradients.",
                )

    def _check_aborted(self) -> None:
        if self._aborted is not None:
            raise StoreError(409, f"Training was aborted: {self._aborted}.")

    def _check_round_timeout(self) -> None:
        started = self._round_started
        if started is not None and time.monotonic() - started > self.round_timeout:
            missing = sorted(set(range(self.num_workers)) - set(self._round))
            _log.warning(
                "round %d waited more than round_timeout=%ss for workers %s; it closes with "
                "workers %s, and the late pushes will be dropped. Raise round_timeout if "
                "their steps are that slow, or set backup_workers= for stragglers.",
                self._version,
                self.round_timeout,
                missing,
                sorted(self._round),
            )
            self._timed_out_rounds += 1
            self._merge_round()
