"""Keras callbacks on the driver, against a master model that follows the service.

Workers train; the driver keeps a compiled copy of the model (the *master*). Each time
every worker has reported an epoch, the master takes the service's current weights and
the callbacks see ``on_epoch_begin`` / ``on_epoch_end`` with the epoch's logs merged
over workers (``loss``, metrics, ``val_*``), as in ``model.fit``. What they do travels
back: ``model.stop_training = True`` (EarlyStopping) stops every worker at its next
sync, and a changed optimizer learning rate (ReduceLROnPlateau) reaches the workers
with their next sync. In synchronous mode the workers wait at each epoch's end until
the callbacks have run on it (the store's epoch gate), so both take effect from the
next epoch, exactly as in ``model.fit``; asynchronous workers never wait, so a fast one
may be an epoch or more ahead when the callbacks see an epoch. After
training, ``on_train_end`` runs and the master's weights (EarlyStopping's restored best
ones, say) become the fitted model's.

Example:
    >>> DriverCallbacks.POLL_SECONDS
    0.1
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from sparkdl.contract import keras_io
from sparkdl.server.state.events import FitEvents

__all__ = ["DriverCallbacks"]


class DriverCallbacks:
    """Runs ``callbacks`` in a driver thread while the training job runs.

    Args:
        callbacks: Keras callbacks.
        model_bytes: The compiled model as ``.keras`` bytes (the master is built from it).
        custom_objects: Custom layers and losses, as for the model.
        events: The running fit.
        epochs: Epochs of the fit.
        initial_epoch: Epochs done before (a resumed fit).
    """

    POLL_SECONDS = 0.1

    def __init__(
        self,
        callbacks: Sequence[Any],
        model_bytes: bytes,
        custom_objects: dict[str, Any] | None,
        events: FitEvents,
        epochs: int,
        initial_epoch: int = 0,
    ) -> None:
        import keras

        self.master = keras_io.model_from_bytes(model_bytes, custom_objects)
        self.callbacks = keras.callbacks.CallbackList(
            list(callbacks),
            add_history=False,
            add_progbar=False,
            model=self.master,
            epochs=epochs,
            verbose=0,
        )
        self.events = events
        self.done = initial_epoch
        self.logs: dict[str, float] = {}
        self._rate = keras_io.learning_rate(self.master)
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="sparkdl-callbacks", daemon=True)

    def start(self) -> None:
        """Calls ``on_train_begin`` and starts following the service."""
        self.callbacks.on_train_begin()
        self._thread.start()

    def finish(self) -> list[np.ndarray]:
        """Catches up with the last epochs, calls ``on_train_end``; returns the weights.

        Raises:
            Exception: What a callback raised.
        """
        self._stop.set()
        self._thread.join()
        if self.error is None:
            self._catch_up()
        if self.error is not None:
            raise self.error
        self.callbacks.on_train_end(self.logs)
        return [np.asarray(w) for w in self.master.get_weights()]

    def abandon(self) -> None:
        """Stops following the service without ``on_train_end`` (the fit failed)."""
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.events.wait_epochs(self.done + 1, self.POLL_SECONDS)
            if self.events.aborted_event.is_set():
                return  # an aborted fit closes no more epochs (wait_epochs no longer waits)
            try:
                self._catch_up()
            except BaseException as exc:  # a callback failed: stop the fit, re-raise later
                self.error = exc
                self.events.abort(f"a driver callback raised {type(exc).__name__}: {exc}")
                return

    def _catch_up(self) -> None:
        history = self.events.history()
        closed = len(next(iter(history.values()), []))
        while self.done < closed:
            epoch = self.done
            self.logs = {k: v[epoch] for k, v in history.items() if epoch < len(v)}
            self.master.set_weights(self.events.epoch_weights(epoch, wait=60.0))
            self.callbacks.on_epoch_begin(epoch)
            self.callbacks.on_epoch_end(epoch, dict(self.logs))
            self.done += 1
            if getattr(self.master, "stop_training", False):
                self.events.request_stop()
            rate = keras_io.learning_rate(self.master)
            if rate is not None and rate != self._rate:
                self._rate = rate
                self.events.set_learning_rate(rate)
            self.events.release(epoch)
