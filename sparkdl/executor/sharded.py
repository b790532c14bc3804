"""A worker of a sharded service: one client and one pusher per shard, used as one.

With ``service_shards=k`` (:mod:`sparkdl.sync.shards`) the worker talks to k services.
:class:`ShardedClient` is the task's client (join, the first pull, failures, leave):
each call goes to every shard at once, on a thread per shard. :class:`ShardedPusher`
is the training loop's pusher: it splits the local weights into the shards' parts and
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
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

from sparkdl.executor.pusher import Pusher
from sparkdl.executor.weight_access import WeightAccess
from sparkdl.protocol.client import ServiceClient
from sparkdl.sync.codecs import Compression
from sparkdl.sync.merges import Merge
from sparkdl.sync.shards import ShardLayout

__all__ = ["ShardedClient", "ShardedPusher"]

_T = TypeVar("_T")


class ShardedClient:
    """The clients of every shard, called together.

    Args:
        clients: One client per shard, in shard order.
        layout: Which part of the weights each shard holds.
        realign: Asynchronous modes: after a join, number every shard's pushes from
            where the worker resumes (:meth:`join`).
    """

    def __init__(
        self,
        clients: Sequence[ServiceClient],
        layout: ShardLayout,
        *,
        realign: bool = False,
        fragments: bool = False,
    ) -> None:
        self.clients = list(clients)
        self.realign = realign and not fragments
        self.fragments = fragments
        self.layout = layout
        #: Every shard's answer to the join.
        self.joined: list[dict[str, Any]] = []
        #: Fragments: the shards the next epoch-closing push goes to, when a resumed
        #: worker replays a closing push some of them took already (``None``: all).
        self.closing_to: list[int] | None = None
        self.worker = clients[0].worker
        self.attempt = clients[0].attempt
        self.url = clients[0].url
        self._pool = ThreadPoolExecutor(len(clients), thread_name_prefix="sparkdl-shard")
        #: Each shard's part of the center from the first pull, and its version.
        self.centers: list[list[np.ndarray]] = []
        self.versions: list[int] = []

    # Counters. Requests run at once on the shards: the seconds are the largest of the
    # shards' totals (a lower bound of the time spent communicating).
    @property
    def comm_seconds(self) -> float:
        return max(c.comm_seconds for c in self.clients)

    @property
    def calls(self) -> int:
        return sum(c.calls for c in self.clients)

    @property
    def bytes_sent(self) -> int:
        return sum(c.bytes_sent for c in self.clients)

    @property
    def bytes_received(self) -> int:
        return sum(c.bytes_received for c in self.clients)

    @property
    def control(self) -> dict[str, Any]:
        """Shard 0's last answer's metadata."""
        return self.clients[0].control

    def join(self, rows: int) -> dict[str, Any]:
        """Joins every shard; returns the answer of the shard where this worker stands
        earliest (with fragments: furthest, see :meth:`fragment_version` and
        :meth:`missed_closing`): a task that died between two shards' pushes resumes
        before the push the others missed.

        In asynchronous modes every shard's pushes are then numbered from that shard's
        last one, so the shards that took the push take its replay as a retry, and
        every shard holds the update of that span once. (In synchronous mode the shard
        that was ahead takes the replay as its next round: docs/guides/sharded-service.md.)"""
        answers = self.each(lambda c: c.join(rows))
        self.joined = answers
        earliest = min(answers, key=_standing)
        if self.fragments:
            # Each fragment took only its own pushes: a worker resumes after the last
            # push it made to any of them (what the others had not synced yet is lost
            # with the process, as a worker's unsynced progress is).
            return max(answers, key=_standing)
        if self.realign:
            for client in self.clients:
                client.continue_from(int(earliest["seq"]))
        return earliest

    def fragment_version(self, rounds: int) -> int:
        """Synchronous fragments: the rounds of the whole fit done so far, from each
        fragment's own rounds (every epoch, fragment ``f`` takes the syncs ``f, f + k,
        ...`` before the last and the last, which closes the epoch): the resume point
        after the last sync every fragment it involves completed.

        A worker that died while an epoch's closing sync (which involves every
        fragment) was merged by some fragments only resumes before it, and its replay
        goes to the other fragments alone (:attr:`closing_to`).

        Example:
            >>> client = ShardedClient.__new__(ShardedClient)
            >>> client.joined = [{"version": 5}, {"version": 4}]  # rounds = 5: 0 2 | 4
            >>> client.fragment_version(rounds=5)  # f0: epoch 1 done + (0, 2); f1: 1 + (1, 3)
            8
            >>> client.joined = [{"version": 3}, {"version": 2}]  # f1 missed the closing
            >>> client.fragment_version(rounds=5), client.closing_to
            (4, [1])
        """
        count = len(self.joined)
        done = []
        for fragment, answer in enumerate(self.joined):
            mine = len(range(fragment, rounds - 1, count)) + 1  # its syncs an epoch
            epochs, extra = divmod(int(answer["version"]), mine)
            last = fragment + (extra - 1) * count + 1 if extra else 0
            done.append(epochs * rounds + last)
        furthest = max(done)
        if furthest and furthest % rounds == 0 and min(done) < furthest:
            # Replay the closing sync, to the fragments that missed it.
            self.closing_to = [f for f, d in enumerate(done) if d < furthest]
            return furthest - 1
        return furthest

    def missed_closing(self, steps: int) -> tuple[int, int] | None:
        """Asynchronous fragments: the position of an epoch's end (``steps`` batches)
        that some fragment took the closing push of and another did not (the worker
        died between them), or ``None``; the replayed closing push then goes to the
        fragments that missed it alone (:attr:`closing_to`).

        Example:
            >>> client = ShardedClient.__new__(ShardedClient)
            >>> client.joined = [{"position": [3, 23]}, {"position": [3, 16]}]
            >>> client.missed_closing(steps=23), client.closing_to
            ((3, 23), [1])
        """
        positions = [_standing(a)[0] for a in self.joined]
        furthest = max(positions)
        if len(furthest) == 2 and furthest[1] >= steps and min(positions) < furthest:
            self.closing_to = [f for f, p in enumerate(positions) if p < furthest]
            return int(furthest[0]), int(furthest[1])
        return None

    def pull(
        self, min_version: int = 0, *, replica: int | None = None
    ) -> tuple[list[np.ndarray], int]:
        """The whole center, from every shard's part (kept in :attr:`centers` for the
        pusher); the version is shard 0's."""
        answers = self.each(lambda c: c.pull(min_version, replica=replica))
        self.centers = [list(arrays) for arrays, _ in answers]
        self.versions = [version for _, version in answers]
        return self.layout.join(self.centers), self.versions[0]

    def status(self) -> dict[str, Any]:
        """Shard 0's status."""
        return self.clients[0].status()

    def report_failure(self, exc: BaseException, *, fatal: bool = True) -> None:
        """Reports to every shard (each aborts on a fatal failure)."""
        self.each(lambda c: c.report_failure(exc, fatal=fatal))

    def leave(self) -> None:
        """Leaves every shard."""
        self.each(lambda c: c.leave())

    def close(self) -> None:
        """Closes every connection."""
        for client in self.clients:
            client.close()
        self._pool.shutdown(wait=False)

    def pusher(
        self,
        merge: Merge,
        weights: WeightAccess,
        *,
        overlap: bool,
        compression: Compression | None,
    ) -> ShardedPusher:
        """The training loop's pusher, from the centers of :meth:`pull`."""
        return ShardedPusher(self, merge, weights, overlap=overlap, compression=compression)

    def each(self, call: Callable[[ServiceClient], _T]) -> list[_T]:
        """``call`` on every shard's client at once; its results in shard order (the
        first error raises, once every call ended)."""
        return self.each_shard(lambda j: call(self.clients[j]))

    def each_shard(
        self, call: Callable[[int], _T], shards: Sequence[int] | None = None
    ) -> list[_T]:
        """``call(j)`` for every shard ``j`` (of ``shards``) at once, as :meth:`each`."""
        chosen = list(range(len(self.clients)) if shards is None else shards)
        if len(chosen) == 1:
            return [call(chosen[0])]
        futures = [self._pool.submit(call, j) for j in chosen]
        return [f.result() for f in _all_done(futures)]


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


def _all_done(futures: list[Any]) -> list[Any]:
    """``futures`` once every one ended (so no call still runs when one raised)."""
    for future in futures:
        future.exception()
    return futures


def _standing(answer: dict[str, Any]) -> tuple[Any, ...]:
    position = answer.get("position")
    return (tuple(position) if position else (-1, -1), int(answer.get("version", 0)))
