"""The relay's client half: follow a fit whose service runs in the cluster, by Spark jobs.

With ``service_placement="cluster"`` (:mod:`sparkdl.executor.hosting`) the user's process
never connects to the service and never listens on a socket: all it can do is run Spark
jobs, which is all a Spark Connect client can do. :class:`Relay` is the
:class:`~sparkdl.server.state.events.FitEvents` the progress bar and the driver's callbacks
follow; a thread keeps it current with small *poll jobs*, one task each, that run in a
task slot the training job leaves free. The task
(:mod:`sparkdl.executor.relay_poll`) reads the service's address from the
rendezvous file the workers wrote on its machine, sends what the driver decided (the
epoch gate's release, ``stop_training``, a new learning rate, an abort) to the
service's relay routes (:mod:`sparkdl.server.web.relay`), long-polls for the next closed
epoch (:data:`Relay.POLL_WAIT` seconds), and returns the status, and the weights of a
newly closed epoch when callbacks need them, as its rows. The relay's token travels in
the job, never to the training tasks (the service keeps its SHA-256).

A poll job that finds no rendezvous (the workers are still caching, a retried stage is
starting, or the task ran on an executor without a worker) answers so and the next one
tries again. When the training job ends, the host's result rows (:func:`finish`)
complete the history and the weights, so the callbacks catch up on what polls missed.

Example:
    >>> Relay.POLL_WAIT
    1.0
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from sparkdl.contract.poll_task import POLL_SCHEMA, poll_function

if TYPE_CHECKING:
    from sparkdl.compat.sessions import SessionTools

__all__ = ["Relay"]

_log = logging.getLogger(__name__)


class Relay:
    """The running fit as the driver's threads see it, kept current by poll jobs.

    Args:
        spark: The session (classic or Spark Connect).
        tools: Its :class:`~sparkdl.compat.sessions.SessionTools`.
        group: The fit's job group or tag (Ctrl-C cancels the polls with the fit).
        request: What each poll task needs: the fit id, the relay's token, the
            service's TLS setting, timeouts
            (:func:`~sparkdl.contract.poll_task.poll_function`).
        epochs: The epoch the fit ends at.
        history: Logs of the epochs done before (a resumed fit).
        want_weights: Fetch each closed epoch's weights (the callbacks read them).
    """

    POLL_WAIT = 1.0
    #: Seconds between polls when one found no service (the workers still cache).
    IDLE_SECONDS = 0.5

    def __init__(
        self,
        spark: Any,
        tools: SessionTools,
        group: str,
        request: dict[str, Any],
        *,
        epochs: int,
        history: dict[str, list[float]] | None,
        want_weights: bool,
    ) -> None:
        self._spark = spark
        self._tools = tools
        self._group = group
        self._request = dict(request)
        self._epochs = epochs
        self._want_weights = want_weights
        history = {k: list(v) for k, v in (history or {}).items()}
        self._status: dict[str, Any] = {
            "samples_seen": 0,
            "epochs_done": len(next(iter(history.values()), [])),
            "history": history,
            "workers": {},
            "failures": {},
            "aborted": None,
        }
        self._weights: dict[int, list[np.ndarray]] = {}
        #: The outer optimizer's state by epoch, as the weights' polls brought it.
        self._outer: dict[int, tuple[list[np.ndarray], int]] = {}
        self._served = -1  # the epoch whose weights epoch_weights last returned
        self._lock = threading.Condition()
        self._released = 0
        self._stop_requested = False
        self._rate: float | None = None
        self._abort: str | None = None
        self._finished = False
        self._over = threading.Event()
        self._wake = threading.Event()
        self.polls = 0
        self.aborted_event = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sparkdl-relay", daemon=True)

    # ----------------------------------------------------------- the fit's side
    def start(self) -> None:
        """Starts polling."""
        self._thread.start()

    def stop(self) -> None:
        """Stops polling (the poll in flight ends within its wait)."""
        self._over.set()
        self._wake.set()
        self._thread.join(timeout=self.POLL_WAIT + 30)

    def finish(
        self,
        history: dict[str, list[float]],
        status: dict[str, Any],
        weights: list[np.ndarray],
        outer: tuple[list[np.ndarray], int] | None = None,
    ) -> None:
        """The training job ended: its hosts' result completes what polls missed."""
        with self._lock:
            self._status = dict(status, history=history)
            self._weights[self._epochs] = weights  # later than every epoch
            if outer is not None:
                self._outer[self._epochs] = outer
            self._finished = True
            self._lock.notify_all()

    def failures(self) -> dict[int, str]:
        """``{worker: traceback}`` of the failures the service reported so far."""
        with self._lock:
            return {int(k): v for k, v in (self._status.get("failures") or {}).items()}

    # ----------------------------------------------------- FitEvents (threads)
    def wait_epochs(self, count: int, wait: float) -> int:
        """Waits up to ``wait`` seconds until ``count`` epochs closed; returns how many."""
        deadline = time.monotonic() + wait
        with self._lock:
            while self._status["epochs_done"] < count and not self._idle():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._lock.wait(min(left, 0.5))
            return int(self._status["epochs_done"])

    def history(self) -> dict[str, list[float]]:
        """The closed epochs' logs."""
        with self._lock:
            return {k: list(v) for k, v in self._status["history"].items()}

    def status(self) -> dict[str, Any]:
        """The service's latest status, as the last poll brought it."""
        with self._lock:
            return dict(self._status)

    def epoch_weights(self, epoch: int, wait: float) -> list[np.ndarray]:
        """The weights as ``epoch`` ended, or those of the nearest later epoch a poll
        brought (an asynchronous fit's callbacks may lag its epochs)."""
        deadline = time.monotonic() + wait
        with self._lock:
            while True:
                later = [e for e in self._weights if e >= epoch]
                if later:
                    self._served = min(later)
                    for old in [e for e in self._weights if e < self._served]:
                        del self._weights[old]  # the callbacks go on in order
                        self._outer.pop(old, None)
                    return self._weights[self._served]
                left = deadline - time.monotonic()
                if left <= 0 or self._idle():
                    raise TimeoutError(f"The weights of epoch {epoch} did not arrive.")
                self._wake.set()
                self._lock.wait(min(left, 0.5))

    def epoch_outer_state(self) -> tuple[list[np.ndarray], int] | None:
        """The outer optimizer's state that came with the weights
        :meth:`epoch_weights` last returned (``None`` without one)."""
        with self._lock:
            return self._outer.get(self._served)

    def release(self, epoch: int) -> None:
        """The callbacks ran on ``epoch``: the next poll lets the workers go on."""
        with self._lock:
            self._released = max(self._released, epoch + 1)
        self._wake.set()

    def request_stop(self) -> None:
        """The next poll stops every worker at its next sync."""
        with self._lock:
            self._stop_requested = True
        self._wake.set()

    def set_learning_rate(self, rate: float) -> None:
        """The next poll sends a new learning rate to the workers."""
        with self._lock:
            self._rate = float(rate)
        self._wake.set()

    def abort(self, reason: str) -> None:
        """Aborts the fit (the driver cancels its job; the next poll tells the service)."""
        with self._lock:
            self._abort = reason[:500]
            self._lock.notify_all()
        self.aborted_event.set()
        self._wake.set()

    # ------------------------------------------------------------------ polls
    def _idle(self) -> bool:
        return self._finished or self._abort is not None or self._over.is_set()

    def _loop(self) -> None:
        with self._tools.jobs_named(self._group, "sparkdl relay: the fit's progress"):
            while not self._over.is_set():
                self._wake.clear()  # a decision made from here on polls at once
                query, fetched = self._query()
                try:
                    rows = self._poll(query, fetched)
                except Exception as exc:  # the job cancelled at the fit's end, say
                    if self._over.is_set():
                        return
                    _log.debug("sparkdl relay: a poll failed: %s", exc)
                    self._over.wait(self.IDLE_SECONDS)
                    continue
                self.polls += 1
                if not self._take(rows) or self._owed():
                    self._wake.wait(self.IDLE_SECONDS)

    def _owed(self) -> bool:
        """The callbacks have an epoch to run on, and the workers wait for them."""
        with self._lock:
            done = int(self._status["epochs_done"])
            return self._want_weights and self._released < done and done - 1 in self._weights

    def _query(self) -> tuple[dict[str, Any], int]:
        with self._lock:
            status = self._status
            done = int(status["epochs_done"])
            query: dict[str, Any] = {"known": done, "released": self._released}
            if self._stop_requested:
                query["stop"] = 1
            if self._rate is not None:
                query["lr"] = repr(self._rate)
            if self._abort is not None:
                query["abort"] = self._abort
            fetched = max(self._weights, default=-1)
            # Nothing to wait for while the callbacks still owe a release.
            behind = self._want_weights and done > 0 and fetched < done - 1
            owed = self._want_weights and self._released < done
            query["wait"] = 0.0 if behind or owed else self.POLL_WAIT
        return query, fetched

    def _poll(self, query: dict[str, Any], fetched: int) -> list[Any]:
        # With callbacks, the task also brings the weights of an epoch newer than
        # ``fetched`` (the one its long poll saw close): one job per epoch.
        request = dict(self._request, query=query, fetched=fetched if self._want_weights else None)
        frame = self._spark.range(0, 1, 1, 1).mapInArrow(poll_function(request), POLL_SCHEMA)
        return list(frame.collect())

    def _take(self, rows: list[Any]) -> bool:
        """Takes a poll's rows; whether it reached the service."""
        status = next((r for r in rows if r["kind"] == "status"), None)
        if status is None:
            missing = next((r for r in rows if r["kind"] == "missing"), None)
            if missing is not None:
                _log.debug("sparkdl relay: %s", bytes(missing["body"]).decode())
            return False
        parts = sorted((r["part"], bytes(r["body"])) for r in rows if r["kind"] == "weights")
        found = json.loads(bytes(status["body"]))
        weights = None
        if parts:
            from sparkdl.protocol import wire

            arrays, meta = wire.decode(b"".join(p for _, p in parts))
            arrays = [np.array(a) for a in arrays]
            outer = None
            if "outer_pushes" in meta:  # the outer optimizer's state follows the weights
                count = len(arrays) // 3
                outer = (arrays[count:], int(meta["outer_pushes"]))
                arrays = arrays[:count]
            weights = (int(meta.get("epoch", 0)), arrays, outer)
        with self._lock:
            if not self._finished:
                self._status = found
                if weights is not None:
                    self._weights[weights[0]] = weights[1]
                    if weights[2] is not None:
                        self._outer[weights[0]] = weights[2]
                if found.get("aborted") and found.get("failures"):
                    # A worker's fatal failure (not the service's stop as the job
                    # ends): the driver cancels the job rather than let Spark retry.
                    self.aborted_event.set()
            self._lock.notify_all()
        return True
