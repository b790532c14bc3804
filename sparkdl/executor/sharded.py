"""A sharded service's pusher: one pusher per shard, used as one.

With ``service_shards=k`` (:mod:`sparkdl.sync.shards`) the worker talks to k services
through its :class:`~sparkdl.protocol.sharded.ShardedClient`. :class:`ShardedPusher` is
the training loop's pusher: it splits the local weights into the shards' parts and
runs one :class:`~sparkdl.executor.pusher.Pusher` per shard on its part, concurrently,
so each shard has its own copy of the center, version, codec state and compressed
replica, exactly as the one pusher of an unsharded fit has for the whole weights. A
push returns once every shard answered: in synchronous mode a round is over for the
worker only when every shard closed it, so it never trains on weights mixed from two
rounds. Asynchronous shards answer independently (each merged the push as it came).

What the answers carry for the fit (the stop flag, a learning rate) is the same on
every shard (:class:`~sparkdl.server.state.sharded.ShardedStore` tells every shard); a stop
from any shard stops the worker. The metric states that make an epoch's exact logs go
to shard 0 only.

Example:
    >>> ShardedPusher.__name__
    'ShardedPusher'
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from sparkdl.executor.pusher import Pusher
from sparkdl.executor.weight_access import WeightAccess
from sparkdl.protocol.sharded import ShardedClient
from sparkdl.sync.codecs import Compression
from sparkdl.sync.merges import Merge

__all__ = ["ShardedPusher"]


class ShardedPusher:
    """One :class:`~sparkdl.executor.pusher.Pusher` per shard, on its part of the
    weights, run at once.

    Args:
        client: The worker's sharded client (after its first pull).
        merge: The fit's merge.
        weights: Read and write access to the model's weights.
        overlap: Push in the background (each shard's pusher does).
        compression: Each shard's pushes and answers are compressed apart.
    """

    def __init__(
        self,
        client: ShardedClient,
        merge: Merge,
        weights: WeightAccess,
        *,
        overlap: bool,
        compression: Compression | None,
    ) -> None:
        self.client = client
        self.layout = client.layout
        self.weights = weights
        self._slots = [_Slot() for _ in client.clients]
        #: Fragments (``sync_fragments``): a sync pushes one shard, in turn.
        self.fragments = client.fragments
        self._pending = [0] * len(client.clients)  # samples each shard has not had
        self._pushes = 0
        self._whole_pushes = 0
        self.shards = [
            Pusher.after_pull(
                shard_client,
                merge,
                slot,  # type: ignore[arg-type]
                center=center,
                version=version,
                overlap=overlap,
                compression=compression,
            )
            for shard_client, slot, center, version in zip(
                client.clients, self._slots, client.centers, client.versions, strict=True
            )
        ]

    @property
    def control(self) -> dict[str, Any]:
        """Shard 0's control fields, stopped if any shard said stop."""
        control = dict(self.shards[0].control)
        control["stop"] = any(p.control.get("stop") for p in self.shards)
        return control

    @property
    def wait_seconds(self) -> float:
        return max(p.wait_seconds for p in self.shards)

    @property
    def center(self) -> list[np.ndarray]:
        """The center as the shards last sent it, joined."""
        return self.layout.join([p.center for p in self.shards])

    @property
    def pushes(self) -> int:
        return self._pushes

    @property
    def whole_pushes(self) -> int:
        return self._whole_pushes

    @property
    def whole_bytes(self) -> int:
        return sum(p.whole_bytes for p in self.shards)

    def push(
        self,
        samples: int,
        meta: dict[str, Any],
        *,
        wait: bool,
        whole: bool = False,
        index: int = 0,
    ) -> bool:
        """Pushes each shard its part of the update (see :meth:`Pusher.push`); with
        fragments, only shard ``index mod k`` unless the push closes an epoch, each
        shard with the samples since its own last push."""
        rest = {k: v for k, v in meta.items() if k != "epoch_states"}
        metas = [meta] + [rest] * (len(self.shards) - 1)
        count = len(self.shards)
        targets: Sequence[int] = range(count)
        if self.fragments and "epoch_logs" not in meta:
            targets = range(index % count, index % count + 1)
        elif self.fragments and self.client.closing_to is not None:
            targets, self.client.closing_to = self.client.closing_to, None  # a replay
        self._pending = [n + samples for n in self._pending]
        sent = {j: self._pending[j] for j in targets}
        for j in targets:
            self._pending[j] = 0
        self._pushes += 1
        before = sum(p.whole_pushes for p in self.shards)
        answered = self._run(
            lambda j: self.shards[j].push(sent[j], metas[j], wait=wait, whole=whole),
            targets,
        )
        if sum(p.whole_pushes for p in self.shards) > before:
            self._whole_pushes += 1
        return answered

    def flush(self) -> bool:
        """Folds in every shard's answer still in flight."""
        return self._run(lambda j: self.shards[j].flush())

    def close(self) -> None:
        """Waits for every push in flight."""
        for pusher in self.shards:
            pusher.close()

    def _run(self, call: Callable[[int], bool], targets: Sequence[int] | None = None) -> bool:
        """Runs ``call`` for every shard (of ``targets``) on its part of the local
        weights, then sets the weights the shards' pushers left."""
        parts = self.layout.split(self.weights.get())
        for slot, part in zip(self._slots, parts, strict=True):
            slot.load(part)
        chosen = list(range(len(self._slots)) if targets is None else targets)
        results = self.client.each_shard(call, chosen)
        if any(slot.changed for slot in self._slots):
            self.weights.set(self.layout.join([slot.value for slot in self._slots]))
        return any(results)


class _Slot:
    """One shard's part of the weights, as its pusher reads and sets it."""

    def __init__(self) -> None:
        self.value: list[np.ndarray] = []
        self.changed = False

    def load(self, part: list[np.ndarray]) -> None:
        self.value, self.changed = part, False

    def get(self) -> list[np.ndarray]:
        return self.value

    def set(self, part: list[np.ndarray]) -> None:
        self.value, self.changed = list(part), True
