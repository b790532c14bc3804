"""The store's side of :class:`~sparkdl.server.state.events.FitEvents`: what the
driver's threads read from a fit and tell it, each method taking the lock.

:class:`StoreEvents` sits between the steps of
:class:`~sparkdl.server.state.training.TrainingState` (run with the lock held) and the
routes' API of :class:`~sparkdl.server.state.store.WeightStore`: the status and history
the progress bar and the Spark UI marks read, the weights (and the outer optimizer's
state) as each epoch ended that the callbacks and checkpoints read, and what the driver
decides (the epoch gate's release, a stop, a learning rate, an abort). The relay routes
of a service in the cluster (:mod:`sparkdl.server.web.relay`) answer from the same
methods.

Example:
    >>> import numpy as np
    >>> from sparkdl.server.state.store import WeightStore
    >>> from sparkdl.sync.merges import Average
    >>> store = WeightStore([np.zeros(1)], num_workers=1, merge=Average())
    >>> store.request_stop()
    >>> store.status()["stop_requested"], store.wait_epochs(1, wait=0.0)
    (True, 0)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from sparkdl.server.state.training import TrainingState

__all__ = ["StoreEvents"]


class StoreEvents(TrainingState):
    """A fit's training state as the driver's threads follow it (thread-safe reads and
    decisions); :class:`~sparkdl.server.state.store.WeightStore` adds the workers'
    requests. It takes the arguments of
    :class:`~sparkdl.server.state.training.TrainingState`."""

    @property
    def aborted_event(self) -> threading.Event:
        """Set when training is aborted (the driver then cancels the Spark job)."""
        return self.control.aborted_event

    def history(self) -> dict[str, list[float]]:
        """Per-epoch logs over all workers (metrics merged from their states)."""
        with self.lock:
            return self._history.logs()

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
                "initial_epochs": self.initial_epochs,
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
                "planned_rows": None if self.planned_rows is None else list(self.planned_rows),
                "joined_rows": {str(w): n for w, n in sorted(self._rows.items())},
                "left": sorted(self._left),
                "traffic": self.traffic.as_dict(),
            }

    def epoch_weights(self, epoch: int, wait: float) -> list[np.ndarray]:
        """The weights as epoch ``epoch`` ended (gated: once its last round merged);
        the outer optimizer's state is read with them (:meth:`epoch_outer_state`)."""
        return self.epoch_state(epoch, wait)[0]

    def epoch_state(
        self, epoch: int, wait: float
    ) -> tuple[list[np.ndarray], tuple[list[np.ndarray], int] | None]:
        """:meth:`epoch_weights` and the outer optimizer's state, read together."""
        with self.lock:
            self._wait_until(lambda: self.control.epoch_merged(epoch), wait)
            outer = self.outer.snapshot() if self.outer is not None else None
            self._served_outer = outer
            return self.center.weights, outer

    def epoch_outer_state(self) -> tuple[list[np.ndarray], int] | None:
        """The outer optimizer's state read with the weights :meth:`epoch_weights`
        last returned (what a checkpoint of those weights keeps beside them)."""
        with self.lock:
            return self._served_outer

    def take_epoch_copies(self, wait: float) -> list[tuple[int, list[np.ndarray], Any]]:
        """Waits up to ``wait`` seconds for copies of the center as epochs ended
        (``keep_epoch_copies``) and takes them, oldest first: ``(epoch, weights,
        outer state or None)``."""
        with self.lock:
            copies = self.epoch_copies
            if copies is None:
                return []
            self._wait_until(lambda: bool(copies), wait)
            taken = [(e, *copies.pop(e)) for e in sorted(copies)]
        return taken

    def outer_state(self) -> tuple[list[np.ndarray], int] | None:
        """The outer optimizer's state now (its arrays and push count: what a
        checkpoint keeps), or ``None`` without one."""
        with self.lock:
            return self.outer.snapshot() if self.outer is not None else None

    def wait_epochs(self, count: int, wait: float) -> int:
        """Waits up to ``wait`` seconds until ``count`` epochs closed; returns how many."""
        with self.lock:
            self._wait_until(lambda: self._history.done >= count, wait)
            return self._history.done

    def release(self, epoch: int) -> None:
        """The driver's callbacks ran on ``epoch``: answer the round that closed it."""
        with self.lock:
            before = self.control.released
            held = self.control.release(epoch)
            caught_up = self.control.callback_lag is not None and self.control.released > before
            if held or caught_up:
                self.center.forget_encoding()  # the answers carry what the callbacks decided
                self.lock.notify_all()

    def request_stop(self) -> None:
        """Asks workers to stop at the end of their current epoch (``stop_training``).

        The flag travels with the answers from the next version on.
        """
        with self.lock:
            self.control.stop_requested = True
            self.center.forget_encoding()  # cached answers said stop=False
            self.lock.notify_all()

    def set_learning_rate(self, rate: float) -> None:
        """Sends a new learning rate to the workers with the answers of later versions."""
        with self.lock:
            self.control.set_learning_rate(rate)
            self.center.forget_encoding()
            if self.outer is not None:  # the model's own optimizer steps the center
                self.outer.set_learning_rate(rate)

    def abort(self, reason: str) -> None:
        """Aborts training: every waiting and later request gets a 409 with ``reason``."""
        with self.lock:
            self.control.abort(reason)
            self.lock.notify_all()

    def _wait_until(self, done: Callable[[], bool], wait: float) -> None:
        """With the lock held: waits up to ``wait`` seconds until ``done()`` or the fit
        was aborted (woken by every change, checking at least once a second)."""
        deadline = time.monotonic() + wait
        while not done() and self.control.aborted is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.lock.wait(min(left, 1.0))
