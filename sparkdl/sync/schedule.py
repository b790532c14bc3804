"""Where a worker syncs within its epochs: pure arithmetic, the same on every worker.

A worker with ``rows`` training rows takes ``steps`` batches an epoch and syncs after
every ``frequency`` of them (``None``: only at the epoch's end). Every epoch ends with the
sync that carries its logs. In synchronous mode every worker takes part in every round,
so a worker whose partition is shorter than the longest pushes *padding* rounds with no
samples at its epoch's end; partitions of different sizes then never deadlock a round.

Example:
    >>> s = Schedule(rows=90, batch_size=10, frequency=4, rounds=3)
    >>> s.steps, s.mid_rounds, s.due(8), s.epoch_end(done=2)
    (9, 2, 2, EpochEnd(mid=0, closes=True, padding=0, first=False))
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["EpochEnd", "Schedule", "rounds_per_epoch", "steps_for", "train_rows"]


def train_rows(rows: int, validation_split: float) -> int:
    """Rows ``model.fit(validation_split=...)`` trains on (it holds out the last ones).

    Example:
        >>> train_rows(718, 0.1), train_rows(718, 0.0)
        (646, 718)
    """
    kept = math.floor(rows * (1.0 - validation_split))
    return kept if validation_split > 0 and kept > 0 else rows


def steps_for(rows: int, batch_size: int) -> int:
    """Batches an epoch over ``rows`` rows takes (the last one may be short).

    Example:
        >>> steps_for(23, 4), steps_for(0, 4)
        (6, 0)
    """
    return math.ceil(rows / batch_size)


def rounds_per_epoch(steps: list[int], frequency: int | None) -> int:
    """Syncs per epoch when the workers that share rounds take ``steps`` batches each.

    Example:
        >>> rounds_per_epoch([23, 22], frequency=4), rounds_per_epoch([23], frequency=None)
        (6, 1)
    """
    longest = max(steps) if steps else 0
    if frequency is None:
        return 1
    return max(1, math.ceil(longest / frequency))


@dataclass(frozen=True)
class EpochEnd:
    """The syncs an epoch's end still owes: ``mid`` ones due before it, then the one
    that ``closes`` it with the epoch's logs, then ``padding`` rounds with no samples
    (the padding ``first`` with :attr:`Schedule.closing_last`)."""

    mid: int
    closes: bool
    padding: int
    #: The padding comes before the closing sync (:attr:`Schedule.closing_last`).
    first: bool = False


@dataclass(frozen=True)
class Schedule:
    """One worker's sync points.

    Args:
        rows: Training rows per epoch.
        batch_size: Rows per batch.
        frequency: Batches between syncs, or ``None`` for epoch ends only.
        rounds: Syncs per epoch (from :meth:`sparkdl.sync.modes.Mode.rounds_per_epoch`).
        closing_last: A short partition's padding rounds come before its closing sync,
            not after, so every worker's closing sync is the epoch's last round
            (synchronous fragments: a sync's fragment follows from its index alone).
    """

    rows: int
    batch_size: int
    frequency: int | None
    rounds: int
    closing_last: bool = False

    @property
    def steps(self) -> int:
        """Batches an epoch takes."""
        return steps_for(self.rows, self.batch_size)

    @property
    def mid_rounds(self) -> int:
        """Syncs within an epoch, before the one that closes it."""
        return (self.steps - 1) // self.frequency if self.frequency and self.steps else 0

    def due(self, step: int) -> int:
        """Syncs due within the epoch once ``step`` batches of it are done.

        Example:
            >>> Schedule(rows=90, batch_size=10, frequency=4, rounds=3).due(5)
            1
        """
        return min(step // self.frequency, self.mid_rounds) if self.frequency else 0

    def seen(self, step: int) -> int:
        """Rows of the epoch done after ``step`` batches."""
        return min(step * self.batch_size, self.rows)

    def step_of(self, seen: int) -> int:
        """Batches done once ``seen`` rows are (where a retried task resumes)."""
        return math.ceil(seen / self.batch_size) if self.batch_size else 0

    def epoch_end(self, done: int) -> EpochEnd:
        """What the epoch's end owes once ``done`` of its syncs were made.

        A resumed worker may be past the closing sync already (``closes`` is then
        false); padding fills the epoch up to ``rounds``.

        Example:
            >>> Schedule(rows=20, batch_size=10, frequency=1, rounds=4).epoch_end(done=0)
            EpochEnd(mid=1, closes=True, padding=2, first=False)
            >>> Schedule(20, 10, 1, rounds=4, closing_last=True).epoch_end(done=0)
            EpochEnd(mid=1, closes=True, padding=2, first=True)
        """
        mid = max(self.mid_rounds - done, 0)
        after = done + mid
        if self.closing_last:
            padding = max(self.rounds - 1 - after, 0)
            return EpochEnd(mid=mid, closes=after < self.rounds, padding=padding, first=True)
        closes = after == self.mid_rounds
        return EpochEnd(mid=mid, closes=closes, padding=max(self.rounds - after - closes, 0))
