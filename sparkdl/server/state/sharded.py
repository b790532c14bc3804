"""The driver's view of a sharded service: k stores, one fit.

With ``service_shards=k`` (:mod:`sparkdl.sync.shards`) the driver serves k
:class:`~sparkdl.server.state.store.WeightStore`\\ s, each holding its shard's part of the
center, each behind a :class:`~sparkdl.server.web.service.ParameterService` of its own (the
same routes, token, TLS and bounds). Every shard gets every push's metadata, so each
keeps the rounds, the epochs, the gate and the control channel of the whole fit; the
metric states that make an epoch's exact logs go to shard 0 alone, whose history is the
fit's. :class:`ShardedStore` is what the driver's threads follow
(:class:`~sparkdl.server.state.events.FitEvents`): reads join the shards' parts, and what the
driver decides (the gate's release, a stop, a learning rate, an abort) goes to every
shard.

Example:
    >>> import numpy as np
    >>> from sparkdl.sync.merges import Average
    >>> from sparkdl.sync.shards import ShardLayout, join_outer, joined_status
    >>> layout = ShardLayout.plan([((4, 2), "float32")], shards=2)
    >>> stores = [WeightStore(part, num_workers=1, merge=Average())
    ...           for part in layout.split([np.zeros((4, 2), np.float32)])]
    >>> sharded = ShardedStore(stores, layout)
    >>> sharded.weights()[0].shape
    (4, 2)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from sparkdl.server.state.store import WeightStore
from sparkdl.sync.shards import ShardLayout, join_outer, joined_status

__all__ = ["ShardedStore"]


class ShardedStore:
    """k shard stores followed as one fit.

    Args:
        stores: One store per shard, in shard order (shard 0 keeps the fit's history).
        layout: Which part of the weights each holds.
    """

    def __init__(self, stores: Sequence[WeightStore], layout: ShardLayout) -> None:
        if len(stores) != layout.count:
            raise ValueError(f"Expected {layout.count} stores. Received: {len(stores)}")
        self.stores = list(stores)
        self.layout = layout
        self.num_workers = stores[0].num_workers
        #: Set once any shard aborted (a worker reports failures to every shard).
        self._aborted = threading.Event()
        self._closed = threading.Event()
        self._watch = threading.Thread(
            target=self._follow_aborts, name="sparkdl-shard-aborts", daemon=True
        )

    def start(self) -> None:
        """Starts following the shards' aborts (until :meth:`close`)."""
        self._watch.start()

    @property
    def aborted_event(self) -> threading.Event:
        """Set once any shard was aborted (every shard is then aborted too)."""
        return self._aborted

    def weights(self) -> list[np.ndarray]:
        """The whole center."""
        return self.layout.join([s.weights() for s in self.stores])

    def history(self) -> dict[str, list[float]]:
        """The closed epochs' logs (shard 0's, from the metric states)."""
        return self.stores[0].history()

    def status(self) -> dict[str, Any]:
        """The fit's status from its shards' (:func:`~sparkdl.sync.shards.joined_status`)."""
        return joined_status([s.status() for s in self.stores])

    def failures(self) -> dict[int, str]:
        """Each failed worker's traceback (the first shard's that holds one)."""
        out: dict[int, str] = {}
        for store in self.stores:
            for worker, trace in store.failures().items():
                out.setdefault(worker, trace)
        return out

    def wait_epochs(self, count: int, wait: float) -> int:
        """Waits up to ``wait`` seconds until ``count`` epochs closed on every shard."""
        deadline = time.monotonic() + wait
        return min(
            store.wait_epochs(count, max(deadline - time.monotonic(), 0.0)) for store in self.stores
        )

    def epoch_weights(self, epoch: int, wait: float) -> list[np.ndarray]:
        """The whole center as ``epoch`` ended (each shard's, gated)."""
        deadline = time.monotonic() + wait
        return self.layout.join(
            [s.epoch_weights(epoch, max(deadline - time.monotonic(), 0.0)) for s in self.stores]
        )

    def epoch_outer_state(self) -> tuple[list[np.ndarray], int] | None:
        """The outer optimizer's state every shard read with its weights, joined into
        the whole weights' shapes (momentum, then the accumulated pseudo-gradients);
        shard 0's push count."""
        states = [s.epoch_outer_state() for s in self.stores]
        if states[0] is None:
            return None
        return join_outer(self.layout, [s for s in states if s is not None]), states[0][1]

    def release(self, epoch: int) -> None:
        """The callbacks ran on ``epoch``: every shard answers the round that closed it."""
        for store in self.stores:
            store.release(epoch)

    def request_stop(self) -> None:
        """Stops every worker at its next sync (every shard's answers carry it)."""
        for store in self.stores:
            store.request_stop()

    def set_learning_rate(self, rate: float) -> None:
        """Sends a new learning rate with every shard's answers."""
        for store in self.stores:
            store.set_learning_rate(rate)

    def abort(self, reason: str) -> None:
        """Aborts every shard."""
        for store in self.stores:
            store.abort(reason)
        self._aborted.set()

    def plan_rows(self, rows: Sequence[int]) -> None:
        """The driver's plan of rows per worker, for every shard."""
        for store in self.stores:
            store.plan_rows(rows)

    def close(self) -> None:
        """Stops following the shards' aborts."""
        self._closed.set()
        if self._watch.is_alive():
            self._watch.join(timeout=5)

    def _follow_aborts(self) -> None:
        """An abort on one shard (a fatal worker failure) aborts the others, so no
        worker waits there for a round that will never close."""
        events = [s.aborted_event for s in self.stores]
        while not (self._aborted.is_set() or self._closed.is_set()):
            for j, event in enumerate(events):
                if event.wait(0.1 / len(events)):
                    reason = self.stores[j].control.aborted or "a shard was aborted"
                    for other in self.stores:
                        if other.control.aborted is None:
                            other.abort(reason)
                    self._aborted.set()
                    return
