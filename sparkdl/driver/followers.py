"""What follows a running fit on the driver, started and stopped together.

A fit's followers read its :class:`~sparkdl.server.state.events.FitEvents` (the
service's, whichever :class:`~sparkdl.driver.service.FitService` it is) in driver
threads, each stopped by the fit's ``ExitStack`` however the job ends:

* the driver's Keras callbacks (:class:`~sparkdl.driver.callbacks.DriverCallbacks`),
  checkpoints among them (:func:`sparkdl.server.state.checkpoints.checkpoint_callback`)
  and MLflow's epoch logs (:mod:`sparkdl.driver.tracking`, passed in as a callback);
* the Spark UI's epoch marks (:class:`~sparkdl.driver.spark_ui.EpochMarks`, where the
  session has a SparkContext);
* the canceller that stops the fit's jobs once it is aborted (:func:`cancel_on_abort`);
* the progress bar or lines (:class:`~sparkdl.driver.progress.Progress`, with ``verbose``).

Example:
    >>> Followers.wanted(callbacks=[], checkpoint_dir=None, verbose=1)
    True
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from sparkdl.driver.callbacks import DriverCallbacks
from sparkdl.driver.progress import Progress
from sparkdl.driver.spark_ui import EpochMarks
from sparkdl.server.state import checkpoints

if TYPE_CHECKING:
    import keras

    from sparkdl.compat.sessions import SessionTools
    from sparkdl.config import TrainConfig
    from sparkdl.contract.plan import FitPlan
    from sparkdl.server.state.events import FitEvents

__all__ = ["CANCEL_JOIN_SECONDS", "Followers", "cancel_on_abort"]

#: Seconds a fit waits, as it ends, for a cancel of its jobs still in flight.
CANCEL_JOIN_SECONDS = 10.0


class Followers:
    """The driver's followers of one fit.

    Args:
        events: The running fit.
        config: The user's settings (``verbose``, checkpoints).
        callbacks: Keras callbacks to run on the driver (MLflow's among them).
        model_bytes: The compiled model (the callbacks' master is built from it).
        custom_objects: Custom layers and losses, as for the model.
        initial_epoch: Epochs done before (a resumed fit).
        history: Their logs (a resumed fit's checkpoints keep them).
    """

    def __init__(
        self,
        events: FitEvents,
        config: TrainConfig,
        callbacks: Sequence[Any],
        model_bytes: bytes,
        custom_objects: dict[str, Any] | None,
        *,
        initial_epoch: int,
        history: dict[str, list[float]] | None,
    ) -> None:
        self.events = events
        self.config = config
        callbacks = list(callbacks)
        if config.checkpoint_dir:
            callbacks.append(
                checkpoints.checkpoint_callback(
                    config.checkpoint_dir,
                    config.checkpoint_keep,
                    config.to_dict(),
                    history or {},
                    outer=events.epoch_outer_state,
                )
            )
        #: Runs the callbacks against a master model (``None``: no callback).
        self.runner = (
            DriverCallbacks(
                callbacks, model_bytes, custom_objects, events, config.epochs, initial_epoch
            )
            if callbacks
            else None
        )

    @staticmethod
    def wanted(*, callbacks: Sequence[Any], checkpoint_dir: str | None, verbose: int) -> bool:
        """Whether anything on the driver follows the fit as it runs (a service in the
        cluster is then polled)."""
        return bool(callbacks or checkpoint_dir or verbose)

    @property
    def master(self) -> keras.Model | None:
        """The callbacks' master model (``None``: no callback), the fitted model's base."""
        return self.runner.master if self.runner else None

    def start(
        self,
        stack: contextlib.ExitStack,
        tools: SessionTools,
        plan: FitPlan,
        group: str,
        name: str,
        rows: int,
    ) -> None:
        """Starts every follower, each stopped by ``stack``: the Spark UI's epoch marks
        (none on Spark Connect), cancelling the job on an abort, the progress bar, the
        driver callbacks.

        Args:
            stack: The fit's exit stack.
            tools: The session's tools.
            plan: The fit's plan (its epochs).
            group: The fit's job group.
            name: The fit's description.
            rows: Training rows per epoch, all workers together.
        """
        events, verbose = self.events, self.config.verbose
        sc = tools.spark_context()
        if sc is not None:
            marks = EpochMarks(sc, events, group, name, plan.epochs, plan.initial_epoch)
            _follow(stack, marks.start, marks.stop)
        stack.enter_context(cancel_on_abort(tools, events, group))
        if verbose:
            progress = Progress(events, epochs=plan.epochs, rows=rows, verbose=verbose)
            _follow(stack, progress.start, progress.stop)
        if self.runner:
            _follow(stack, self.runner.start, self.runner.abandon)  # (a no-op after finish)

    def failed(self) -> BaseException | None:
        """The job failed: stops the callbacks; returns what a callback raised, if one
        stopped the fit so."""
        if self.runner is None:
            return None
        self.runner.abandon()
        return self.runner.error

    def finish(self) -> list[np.ndarray] | None:
        """The job ended: the callbacks catch up and end; the master's weights
        (``None``: no callback).

        Raises:
            Exception: What a callback raised.
        """
        return self.runner.finish() if self.runner else None


def _follow(stack: contextlib.ExitStack, start: Any, stop: Any) -> None:
    """Starts a driver thread now and stops it when ``stack`` unwinds."""
    start()
    stack.callback(stop)


@contextlib.contextmanager
def cancel_on_abort(tools: SessionTools, events: FitEvents, group: str) -> Iterator[None]:
    """Cancels the fit's jobs if it is aborted while the job runs.

    A fatal worker error (or a raising driver callback) aborts the fit: cancel the job
    then, rather than let Spark retry tasks that can only fail again.
    """
    over = threading.Event()

    def watch() -> None:
        while not over.is_set():
            if events.aborted_event.wait(0.2):
                if not over.is_set():
                    tools.cancel(group)
                return

    thread = threading.Thread(target=watch, name="sparkdl-cancel", daemon=True)
    thread.start()
    try:
        yield
    finally:
        over.set()
        if events.aborted_event.is_set():
            # A cancel in flight (a gRPC call on Spark Connect) ends before the fit
            # does; otherwise the thread only waits on the event and ends by itself,
            # and the fit does not wait out its poll.
            thread.join(CANCEL_JOIN_SECONDS)
