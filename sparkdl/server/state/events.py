"""What the driver's threads may read from and tell a running fit.

The callbacks runner, the progress bar, the Spark UI marks and the job canceller follow
a fit through this small interface rather than the service's state, so the state can
change shape without them. The store implements it
(:class:`sparkdl.server.state.store_events.StoreEvents`, a base of
:class:`~sparkdl.server.state.store.WeightStore`), and so do the sharded store
(:class:`~sparkdl.server.state.sharded.ShardedStore`) and the relay of a service in the
cluster (:class:`sparkdl.driver.relay.Relay`); the driver's
:class:`~sparkdl.driver.service.FitService` hands it to the fit's followers.

Example:
    >>> import numpy as np
    >>> from sparkdl.server.state.store import WeightStore
    >>> from sparkdl.sync.merges import Average
    >>> events: FitEvents = WeightStore([np.zeros(1)], num_workers=1, merge=Average())
    >>> events.wait_epochs(1, wait=0.0)
    0
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

import numpy as np

__all__ = ["FitEvents"]


class FitEvents(Protocol):
    """A running fit, as the driver's threads see it."""

    @property
    def aborted_event(self) -> threading.Event:
        """Set once training is aborted."""

    def wait_epochs(self, count: int, wait: float) -> int:
        """Waits up to ``wait`` seconds until ``count`` epochs closed; returns how many."""

    def history(self) -> dict[str, list[float]]:
        """The closed epochs' logs."""

    def status(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot (samples seen, per-worker losses...)."""

    def epoch_weights(self, epoch: int, wait: float) -> list[np.ndarray]:
        """The center weights as ``epoch`` ended."""

    def epoch_outer_state(self) -> tuple[list[np.ndarray], int] | None:
        """The outer optimizer's state (arrays shaped like the weights, twice, and the
        push count) read with the weights ``epoch_weights`` last returned; ``None``
        without one."""

    def release(self, epoch: int) -> None:
        """The driver's callbacks ran on ``epoch``: the workers may go on."""

    def request_stop(self) -> None:
        """Stops every worker at its next sync."""

    def set_learning_rate(self, rate: float) -> None:
        """Sends a new learning rate to the workers."""

    def abort(self, reason: str) -> None:
        """Aborts the fit."""

    def failures(self) -> dict[int, str]:
        """``{worker: traceback}`` of the failures workers reported so far."""
