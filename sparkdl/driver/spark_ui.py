"""Names a fit and each of its epochs in the Spark UI.

A fit runs as one long Spark job, and a running job's description cannot change. So as
each epoch closes, :class:`EpochMarks` submits an empty job (no partitions: Spark
records it as started and succeeded at once, and runs no task, so it never waits for a
slot the training holds) in the fit's job group, described as
``"<fit>: epoch 3/20 done, loss 0.1234"``. The Jobs page then lists the fit's training
job followed by one line per epoch, all under the fit's job group.

Example:
    >>> epoch_description("sparkdl fit", 3, 20, {"loss": [0.9, 0.5, 0.25]})
    'sparkdl fit: epoch 3/20 done, loss 0.2500'
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from sparkdl.compat.spark import run_empty_job

if TYPE_CHECKING:
    from pyspark import SparkContext

    from sparkdl.server.state.events import FitEvents

__all__ = ["EpochMarks", "epoch_description"]

_log = logging.getLogger(__name__)


class EpochMarks:
    """Adds one empty, described Spark job per closed epoch to the fit's job group.

    Args:
        sc: The SparkContext.
        events: The running fit (its history says which epochs closed).
        group: The fit's job group id.
        name: The fit's description.
        epochs: The epoch the fit ends at.
        initial_epoch: Epochs done before this fit (a resumed fit).
    """

    def __init__(
        self,
        sc: SparkContext,
        events: FitEvents,
        group: str,
        name: str,
        epochs: int,
        initial_epoch: int = 0,
    ) -> None:
        self.sc = sc
        self.events = events
        self.group = group
        self.name = name
        self.epochs = epochs
        self.marked = initial_epoch
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sparkdl-epoch-marks", daemon=True)

    def start(self) -> None:
        """Starts following the fit."""
        self._thread.start()

    def stop(self) -> None:
        """Marks the epochs closed so far and stops."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        # Local properties are per thread (PySpark pins each Python thread to a JVM one).
        self.sc.setJobGroup(self.group, self.name)
        try:
            while not self._stop.is_set() and self.marked < self.epochs:
                self.events.wait_epochs(self.marked + 1, 0.25)  # wakes as an epoch closes
                self._mark_closed()
                if self.events.aborted_event.is_set():
                    return  # no more epochs close (and wait_epochs no longer waits)
            self._mark_closed()
        except Exception as exc:  # the UI is a nicety: never let it break a fit
            _log.debug("could not mark epochs in the Spark UI: %s", exc)

    def _mark_closed(self) -> None:
        history = self.events.history()
        done = len(next(iter(history.values()), []))
        while self.marked < done:
            self.marked += 1
            self.sc.setJobDescription(
                epoch_description(self.name, self.marked, self.epochs, history)
            )
            run_empty_job(self.sc)  # a job with no task: recorded, never queued


def epoch_description(name: str, epoch: int, epochs: int, history: dict[str, Any]) -> str:
    """The Spark UI description of a closed epoch (1-based)."""
    text = f"{name}: epoch {epoch}/{epochs} done"
    losses = history.get("loss") or []
    if len(losses) >= epoch:
        text += f", loss {float(losses[epoch - 1]):.4f}"
    return text
