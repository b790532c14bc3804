"""A worker's one channel to the parameter service, whatever its number of shards.

A fit's service is one process or ``service_shards`` of them
(:mod:`sparkdl.sync.shards`). The task, the training loop and the sync callback talk
to a :class:`Channel` and push through a :class:`PushPath`, and never ask which: this
module builds both (:func:`open_channel` for a payload, :func:`open_pusher` after the
first pull) and is the one place on the executors that tells the variants apart. One
service is one :class:`~sparkdl.protocol.client.ServiceClient` and one
:class:`~sparkdl.executor.pusher.Pusher`; a sharded one is a
:class:`~sparkdl.protocol.sharded.ShardedClient` and a
:class:`~sparkdl.executor.sharded.ShardedPusher`. What the shards add is a method of
the interface that one service answers trivially: :meth:`Channel.standing` (where a
retried worker resumes when the shards' answers to its join differ).

Example:
    >>> from sparkdl.protocol.client import ServiceClient
    >>> from sparkdl.sync.schedule import Schedule
    >>> channel: Channel = ServiceClient("http://127.0.0.1:1", "token", worker=0)
    >>> channel.standing({"version": 4}, Schedule(90, 10, 4, 3), barrier=True)
    {'version': 4}
    >>> channel.close()
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from sparkdl.contract.payload import WorkerPayload
from sparkdl.executor.pusher import Pusher
from sparkdl.executor.sharded import ShardedPusher
from sparkdl.executor.weight_access import WeightAccess
from sparkdl.protocol.client import ServiceClient
from sparkdl.protocol.sharded import ShardedClient
from sparkdl.sync.codecs import Compression
from sparkdl.sync.merges import Merge
from sparkdl.sync.schedule import Schedule
from sparkdl.sync.shards import ShardLayout

__all__ = ["Channel", "PushPath", "open_channel", "open_pusher"]


class Channel(Protocol):
    """What a worker asks the service, and what that traffic cost.

    The counters are training's whole traffic: with shards, the calls and bytes of
    every shard, and the seconds of the slowest (the shards are called at once).
    """

    @property
    def worker(self) -> int:
        """This worker's id."""
        ...

    @property
    def attempt(self) -> int:
        """This task's attempt (the service fences out older ones)."""
        ...

    @property
    def url(self) -> str:
        """The service's URL (shard 0's)."""
        ...

    @property
    def comm_seconds(self) -> float: ...

    @property
    def calls(self) -> int: ...

    @property
    def bytes_sent(self) -> int: ...

    @property
    def bytes_received(self) -> int: ...

    def join(self, rows: int) -> dict[str, Any]:
        """Registers this worker with its rows; the service's answer."""
        ...

    def standing(
        self, joined: dict[str, Any], schedule: Schedule, *, barrier: bool
    ) -> dict[str, Any]:
        """The join's answer as the point this worker resumes from."""
        ...

    def pull(
        self, min_version: int = 0, *, replica: int | None = None
    ) -> tuple[list[np.ndarray], int]:
        """The center's weights and version."""
        ...

    def status(self) -> dict[str, Any]:
        """The service's status."""
        ...

    def report_failure(self, exc: BaseException, *, fatal: bool = True) -> None:
        """Reports this worker's failure (best effort)."""
        ...

    def leave(self) -> None:
        """Tells the service this worker finished training."""
        ...

    def close(self) -> None:
        """Closes the connections."""
        ...


class PushPath(Protocol):
    """The training loop's pushes: each sends the local weights' update and folds the
    answer in (:meth:`sparkdl.executor.pusher.Pusher.push`)."""

    @property
    def control(self) -> dict[str, Any]:
        """The control fields of the last answer folded in (stop, learning rate)."""
        ...

    @property
    def wait_seconds(self) -> float: ...

    @property
    def center(self) -> list[np.ndarray]:
        """The center as this worker last received it."""
        ...

    @property
    def pushes(self) -> int: ...

    @property
    def whole_pushes(self) -> int: ...

    @property
    def whole_bytes(self) -> int: ...

    def push(
        self,
        samples: int,
        meta: dict[str, Any],
        *,
        wait: bool,
        whole: bool = False,
        index: int = 0,
    ) -> bool:
        """Pushes an update; whether an answer was folded in."""
        ...

    def flush(self) -> bool:
        """Folds in the answer still in flight; whether there was one."""
        ...

    def close(self) -> None:
        """Waits for every push in flight."""
        ...


def open_channel(payload: WorkerPayload, worker: int, attempt: int) -> Channel:
    """The task's channel to the payload's service (one client per shard of a sharded
    service). Spark numbers task attempts (``attempt``) uniquely and in launch order
    within a SparkContext, stage retries included: a newer attempt has a larger id,
    which the service's fencing relies on."""
    plan = payload.plan
    clients = [
        ServiceClient(
            url,
            payload.token,
            worker=worker,
            timeout=plan.request_timeout,
            retries=plan.request_retries,
            attempt=attempt,
            tls_cert=cert,
        )
        for url, cert in zip(
            payload.shard_urls or (payload.url,),
            payload.shard_certs or [payload.tls_cert] * max(len(payload.shard_urls), 1),
            strict=True,
        )
    ]
    if payload.shard_layout is None:
        return clients[0]
    return ShardedClient(
        clients,
        ShardLayout.from_json(payload.shard_layout),
        realign=not plan.mode.barrier,
        fragments=plan.fragments > 1,
    )


def open_pusher(
    channel: Channel,
    merge: Merge,
    weights: WeightAccess,
    *,
    center: list[np.ndarray],
    version: int,
    overlap: bool,
    compression: Compression | None,
) -> PushPath:
    """The training loop's pushes over ``channel``, which just pulled ``center`` at
    ``version`` (a sharded channel keeps each shard's part and version itself).

    Args:
        channel: The worker's channel, after its first pull.
        merge: The fit's merge.
        weights: Read and write access to the model's weights.
        center: The center that pull returned.
        version: Its version.
        overlap: Push in the background.
        compression: Compress updates both ways (``None``: send them whole).
    """
    if isinstance(channel, ShardedClient):
        return ShardedPusher(channel, merge, weights, overlap=overlap, compression=compression)
    assert isinstance(channel, ServiceClient), type(channel)
    return Pusher.after_pull(
        channel,
        merge,
        weights,
        center=center,
        version=version,
        overlap=overlap,
        compression=compression,
    )
