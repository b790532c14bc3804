"""Synchronous rounds, generations of a retried barrier stage, and fencing of old attempts.

A round collects one push per worker and closes when its quorum pushed (every worker,
or all but ``backup_workers``), or when it waited ``round_timeout`` seconds. Spark
retries a barrier stage as a whole: when a worker that already joined joins again with
a newer attempt, a new *generation* starts, the open round is dropped (every worker of
the new stage attempt rejoins at the last completed round) and every attempt of the old
generation is fenced off. An attempt older than a worker's newest is refused in every
mode (a zombie task).

Example:
    >>> import numpy as np
    >>> from sparkdl.sync.merges import Update
    >>> rounds = Rounds(quorum=2, timeout=60.0)
    >>> rounds.add(Update(worker=0, arrays=[np.zeros(1)], samples=1))
    >>> rounds.full(), rounds.pushed()
    (False, [0])
"""

from __future__ import annotations

import time

from sparkdl.server.state.errors import StoreError
from sparkdl.sync.merges import Update
from sparkdl.sync.modes import DEFAULT_ROUND_TIMEOUT

__all__ = ["DEFAULT_ROUND_TIMEOUT", "Rounds"]


class Rounds:
    """The open round, the joined workers and the attempt floor.

    Not thread-safe: the store holds its lock.

    Args:
        quorum: Pushes that close a round.
        timeout: Seconds an open round waits before it closes with the pushes present.
    """

    def __init__(self, *, quorum: int, timeout: float) -> None:
        self.quorum = quorum
        self.timeout = timeout
        self.generation = 0
        #: Workers that joined in this generation.
        self.joined: set[int] = set()
        self.timed_out_rounds = 0
        self._open: dict[int, Update] = {}
        self._started: float | None = None
        self._floor = 0  # attempts below this belong to a fenced-off generation

    def add(self, update: Update) -> None:
        """Adds (or, for a newer attempt of the same worker, replaces) a push."""
        self._open[update.worker] = update
        if self._started is None:
            self._started = time.monotonic()

    def pushed(self) -> list[int]:
        """Workers that pushed in the open round."""
        return sorted(self._open)

    def full(self) -> bool:
        """Whether the quorum pushed."""
        return len(self._open) >= self.quorum

    def overdue(self) -> bool:
        """Whether the open round waited longer than the timeout."""
        return self._started is not None and time.monotonic() - self._started > self.timeout

    def open_updates(self) -> list[Update]:
        """The open round's pushes (not closing it)."""
        return list(self._open.values())

    def take(self) -> list[Update]:
        """Closes the open round: its pushes in worker order."""
        updates = [self._open[w] for w in sorted(self._open)]
        self._open = {}
        self._started = None
        return updates

    def check_fenced(self, worker: int, attempt: int, newest: int) -> None:
        """Refuses an attempt older than the worker's ``newest`` or the generation's floor.

        Raises:
            StoreError: 409.
        """
        if attempt < newest or attempt < self._floor:
            raise StoreError(
                409,
                f"Worker {worker} attempt {attempt} was superseded by a newer attempt "
                f"(attempt {max(newest, self._floor)} or later); its requests are refused.",
            )

    def new_generation(self, newest_known: int, attempt: int) -> list[int]:
        """Spark retried the barrier stage: fences older attempts, drops the open round.

        Args:
            newest_known: The newest attempt any worker used so far.
            attempt: The attempt that started the new generation.

        Returns:
            The workers whose pushes in the open round were dropped.
        """
        self._floor = min(max(self._floor, newest_known + 1), attempt)
        self.generation += 1
        dropped = self.pushed()
        self.take()
        self.joined = set()
        return dropped
