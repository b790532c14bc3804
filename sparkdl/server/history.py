"""Per-epoch logs of a fit: each worker's epoch-end logs, merged when an epoch closes.

An epoch closes once its quorum of workers reported it (every worker, or all but
``backup_workers`` in synchronous mode). Its logs are averaged over the workers,
training logs weighted by training rows and ``val_*`` logs by validation rows, as
``model.fit`` would report them over the whole data.

Example:
    >>> history = EpochHistory()
    >>> history.report(0, epoch=0, rows=100, val_rows=0, logs={"loss": 1.0}, quorum=2)
    []
    >>> history.report(1, epoch=0, rows=300, val_rows=0, logs={"loss": 2.0}, quorum=2)
    [0]
    >>> history.logs()
    {'loss': [1.75]}
"""

from __future__ import annotations

from typing import Any

from sparkdl.server.meta import MAX_LOGS

__all__ = ["EpochHistory"]

#: worker -> (training rows, validation rows, logs)
_Reports = dict[int, tuple[int, int, dict[str, float]]]


class EpochHistory:
    """Open epochs' reports and closed epochs' merged logs.

    Not thread-safe: the store holds its lock.

    Args:
        history: Logs of epochs done before (a resumed fit); epochs continue after them.
    """

    def __init__(self, history: dict[str, list[float]] | None = None) -> None:
        self._logs: dict[str, list[float]] = {
            k: [float(v) for v in vs] for k, vs in (history or {}).items()
        }
        self._open: dict[int, _Reports] = {}

    @property
    def done(self) -> int:
        """Epochs closed (resumed ones included)."""
        return len(next(iter(self._logs.values()), []))

    def logs(self) -> dict[str, list[float]]:
        """A copy of the closed epochs' logs, like ``keras.callbacks.History.history``."""
        return {k: list(v) for k, v in self._logs.items()}

    def report(
        self,
        worker: int,
        *,
        epoch: int,
        rows: int,
        val_rows: int,
        logs: dict[str, Any],
        quorum: int,
    ) -> list[int]:
        """Adds a worker's epoch-end logs; returns the epochs this closed, in order.

        A report for an epoch that already closed (a straggler's) is ignored.
        """
        if epoch < self.done:
            return []
        clean = {
            str(k): float(v)
            for k, v in list(logs.items())[:MAX_LOGS]
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        self._open.setdefault(epoch, {})[worker] = (rows, val_rows, clean)
        closed = []
        while self.done in self._open and len(self._open[self.done]) >= quorum:
            epoch_no = self.done
            self._close(list(self._open.pop(epoch_no).values()))
            closed.append(epoch_no)
        return closed

    def _close(self, reports: list[tuple[int, int, dict[str, float]]]) -> None:
        done = self.done
        for key in sorted({k for _, _, logs in reports for k in logs}):
            val = key.startswith("val_")
            pairs = [(vn if val else n, logs[key]) for n, vn, logs in reports if key in logs]
            weight = sum(n for n, _ in pairs)
            value = (
                sum(n * v for n, v in pairs) / weight
                if weight > 0
                else sum(v for _, v in pairs) / len(pairs)
            )
            self._logs.setdefault(key, [float("nan")] * done).append(float(value))
        for values in self._logs.values():  # a metric missing this epoch: NaN, aligned
            if len(values) == done:
                values.append(float("nan"))
