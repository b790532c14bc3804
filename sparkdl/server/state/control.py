"""The driver's control channel to the workers: stop, learning rate, epoch gate, abort.

What the driver decides (a callback's ``stop_training``, ReduceLROnPlateau's new rate)
travels to the workers in the metadata of the weights they receive. In synchronous
mode with driver callbacks, the answer to the round that closes an epoch is held until
the callbacks ran on that epoch (the *gate*), so their decisions take effect from the
next epoch, as in ``model.fit``. Asynchronous workers do not wait for one another, but
with driver callbacks a worker that ended epoch ``e`` waits until the callbacks ran on
epoch ``e - callback_lag`` (:meth:`callbacks_caught_up`): without that bound a fit of
short epochs could end before a callback's ``stop_training`` reached the workers, which
it does a poll job later when the service runs in the cluster. An abort (a fatal
worker error, a raising callback, the fit's end) refuses every later request.

Example:
    >>> control = ControlChannel(gate_epochs=False)
    >>> control.set_learning_rate(0.01)
    >>> control.answer_meta(3)
    {'version': 3, 'stop': False, 'learning_rate': 0.01}
"""

from __future__ import annotations

import threading
from typing import Any

from sparkdl.server.state.errors import StoreError

__all__ = ["ControlChannel"]


class ControlChannel:
    """Stop flag, learning rate, epoch gate and abort state of one fit.

    Not thread-safe: the store holds its lock (``aborted_event`` may be waited on
    from any thread).

    Args:
        gate_epochs: Hold each closing round's answer until :meth:`release`.
        callback_lag: Asynchronous modes with driver callbacks: how many epochs a
            worker may end ahead of the callbacks; ``None``: no bound.
        released: The newest epoch the callbacks already ran on (a resumed fit's last).
    """

    def __init__(
        self, *, gate_epochs: bool, callback_lag: int | None = None, released: int = -1
    ) -> None:
        self.gate_epochs = gate_epochs
        self.callback_lag = callback_lag
        #: The newest epoch the driver's callbacks ran on.
        self.released = released
        self.stop_requested = False
        #: Every epoch closed (backup workers): answers tell stragglers to stop.
        self.finished = False
        self.learning_rate: float | None = None
        self.aborted: str | None = None
        #: Set when training is aborted (the driver then cancels the Spark job).
        self.aborted_event = threading.Event()
        self._pending: int | None = None  # an epoch closed; gate its last round
        self._hold: int | None = None  # a merged version not yet answered
        self._epoch_version: dict[int, int] = {}

    def answer_meta(self, version: int) -> dict[str, Any]:
        """The control fields every answer of ``version`` carries."""
        meta: dict[str, Any] = {"version": version, "stop": self.stop_requested or self.finished}
        if self.learning_rate is not None:
            meta["learning_rate"] = self.learning_rate
        return meta

    def set_learning_rate(self, rate: float) -> None:
        """Sends ``rate`` to the workers with the answers of later versions."""
        self.learning_rate = float(rate)

    def abort(self, reason: str) -> None:
        """Refuses every later request with ``reason``."""
        self.aborted = reason
        self.aborted_event.set()

    def check_aborted(self) -> None:
        """Raises:
        StoreError: 409 once training was aborted.
        """
        if self.aborted is not None:
            raise StoreError(409, f"Training was aborted: {self.aborted}.")

    # ------------------------------------------------------------- epoch gate
    def epoch_closed(self, epoch: int) -> None:
        """An epoch closed: with the gate on, its last round's answer will be held."""
        if self.gate_epochs:
            self._pending = epoch

    def round_merged(self, version: int) -> None:
        """A round merged into ``version``: hold it if it closed a gated epoch."""
        if self._pending is not None:
            self._epoch_version[self._pending] = version
            self._hold = version
            self._pending = None

    def visible(self, version: int) -> int:
        """The newest version answers may carry (one held for the callbacks is not)."""
        return version if self._hold is None else self._hold - 1

    def epoch_merged(self, epoch: int) -> bool:
        """Whether ``epoch``'s last round merged (always true without the gate)."""
        return not self.gate_epochs or epoch in self._epoch_version

    def callbacks_caught_up(self, epoch: int) -> bool:
        """Whether a worker that ended ``epoch`` may go on: the callbacks ran on epoch
        ``epoch - callback_lag``, or they stopped the fit, or every epoch closed."""
        if self.callback_lag is None or self.stop_requested or self.finished:
            return True
        return self.released >= epoch - self.callback_lag

    def release(self, epoch: int) -> bool:
        """The callbacks ran on ``epoch``: lets its held answer go; True if one was held."""
        self.released = max(self.released, epoch)
        held = self._epoch_version.get(epoch)
        if self._hold is not None and held is not None and held >= self._hold:
            self._hold = None
            return True
        return False
