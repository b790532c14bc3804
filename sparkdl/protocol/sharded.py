"""A worker's client of a sharded service: one :class:`ServiceClient` per shard, used as one.

With ``service_shards=k`` (:mod:`sparkdl.sync.shards`) the worker talks to k services.
:class:`ShardedClient` is the task's client (join, the first pull, failures, leave):
each call goes to every shard at once, on a thread per shard. It keeps what the
pushers of the shards start from (each shard's part of the center and its version,
from the first pull: :class:`sparkdl.executor.sharded.ShardedPusher`), and works out
where a retried worker resumes when the shards' answers to its join differ
(:meth:`ShardedClient.standing`).

What the answers carry for the fit (the stop flag, a learning rate) is the same on
every shard (:class:`~sparkdl.server.state.sharded.ShardedStore` tells every shard).

Example:
    >>> import numpy as np
    >>> from sparkdl.protocol.client import ServiceClient
    >>> from sparkdl.server.state.store import WeightStore
    >>> from sparkdl.server.web.service import ParameterService
    >>> from sparkdl.sync.merges import Average
    >>> from sparkdl.sync.shards import ShardLayout
    >>> weights = [np.arange(6, dtype=np.float32), np.ones(2, np.float32)]
    >>> layout = ShardLayout.plan([((6,), "float32"), ((2,), "float32")], shards=2)
    >>> stores = [WeightStore(p, num_workers=1, merge=Average()) for p in layout.split(weights)]
    >>> with ParameterService(stores[0]) as a, ParameterService(stores[1]) as b:
    ...     clients = [ServiceClient(s.url, s.token, worker=0) for s in (a, b)]
    ...     client = ShardedClient(clients, layout)
    ...     joined = client.join(rows=3)
    ...     center, version = client.pull()  # each shard's part, joined whole
    ...     client.close()
    >>> [c.tolist() for c in center]
    [[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 1.0]]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

from sparkdl.protocol.client import ServiceClient
from sparkdl.sync.schedule import Schedule
from sparkdl.sync.shards import ShardLayout

__all__ = ["ShardedClient"]

_T = TypeVar("_T")


class ShardedClient:
    """The clients of every shard, called together.

    Args:
        clients: One client per shard, in shard order.
        layout: Which part of the weights each shard holds.
        realign: Asynchronous modes: after a join, number every shard's pushes from
            where the worker resumes (:meth:`join`).
        fragments: Sync fragments (``sync_fragments``): a sync pushes one shard, in
            turn (:class:`sparkdl.executor.sharded.ShardedPusher`), and a retried
            worker resumes as :meth:`standing` says.
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
        earliest (with fragments: furthest, see :meth:`standing`): a task that died
        between two shards' pushes resumes before the push the others missed.

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

    def standing(
        self, joined: dict[str, Any], schedule: Schedule, *, barrier: bool
    ) -> dict[str, Any]:
        """The join's answer (:meth:`join`) as the point this worker resumes from.

        Only fragments change it: in synchronous mode each fragment counts only its own
        rounds, so the version is the fit's, from all of them
        (:meth:`fragment_version`); in asynchronous modes a worker that died between
        two fragments' closing pushes replays the epoch's end from its last mid-epoch
        sync, and the closing push goes to the fragments that missed it alone
        (:meth:`missed_closing`).

        Args:
            joined: What :meth:`join` returned.
            schedule: The worker's sync points.
            barrier: The fit's mode syncs in rounds (synchronous).

        Example:
            >>> client = ShardedClient.__new__(ShardedClient)
            >>> client.fragments, client.joined = True, [{"version": 5}, {"version": 4}]
            >>> schedule = Schedule(rows=90, batch_size=10, frequency=2, rounds=5)
            >>> client.standing({"version": 5}, schedule, barrier=True)
            {'version': 8}
        """
        if not self.fragments:
            return joined
        if barrier:
            return dict(joined, version=self.fragment_version(schedule.rounds))
        closing = self.missed_closing(schedule.steps)
        if closing is None:
            return joined
        last_mid = schedule.mid_rounds * (schedule.frequency or 0)
        return dict(joined, position=[closing[0], last_mid])

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


def _all_done(futures: list[Any]) -> list[Any]:
    """``futures`` once every one ended (so no call still runs when one raised)."""
    for future in futures:
        future.exception()
    return futures


def _standing(answer: dict[str, Any]) -> tuple[Any, ...]:
    position = answer.get("position")
    return (tuple(position) if position else (-1, -1), int(answer.get("version", 0)))
