"""Per-epoch logs of a fit: each worker's epoch-end logs, merged when an epoch closes.

An epoch closes once its quorum of workers reported it (every worker, or all but
``backup_workers`` in synchronous mode). Its logs are averaged over the workers,
training logs weighted by training rows and ``val_*`` logs by validation rows, as
``model.fit`` would report them over the whole data; that is exact for the loss and
means over rows. Where the workers sent their metrics' states and the history has a
``merge`` (:meth:`sparkdl.contract.metric_states.MetricStates.results`), the states of the
workers that trained (validated) are summed and the results replace the averages:
AUC, precision, recall and weighted metrics come out as one ``model.fit`` over all
rows reports them. A merge that fails (states that do not fit the model), or a worker
with rows but no states, leaves that epoch's averages, with a log line.

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

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from sparkdl.server.state.meta import MAX_LOGS, MAX_VALUE

__all__ = ["EpochHistory"]

_log = logging.getLogger(__name__)

#: Workers' metric states -> the metrics' results over their sum.
Merge = Callable[[Sequence[Any]], dict[str, float]]


class _Report(NamedTuple):
    rows: int
    val_rows: int
    logs: dict[str, float]
    states: dict[str, Any]


_Reports = dict[int, _Report]


class EpochHistory:
    """Open epochs' reports and closed epochs' merged logs.

    Not thread-safe: the store holds its lock.

    Args:
        history: Logs of epochs done before (a resumed fit); epochs continue after them.
        merge: Reads metrics' results from the sum of workers' states (``None``:
            averages only).
    """

    def __init__(
        self, history: dict[str, list[float]] | None = None, merge: Merge | None = None
    ) -> None:
        self._merge = merge
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
        states: dict[str, Any] | None = None,
    ) -> list[int]:
        """Adds a worker's epoch-end logs; returns the epochs this closed, in order.

        ``states``: its metrics' states, ``{"train": ..., "val": ...}`` (checked by
        :func:`sparkdl.server.state.meta.check_push_meta`).

        A report for an epoch that already closed (a straggler's) is ignored.
        """
        if epoch < self.done:
            return []
        clean = {
            str(k): float(v)
            for k, v in list(logs.items())[:MAX_LOGS]
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        self._open.setdefault(epoch, {})[worker] = _Report(rows, val_rows, clean, states or {})
        closed = []
        while self.done in self._open and len(self._open[self.done]) >= quorum:
            epoch_no = self.done
            self._close(list(self._open.pop(epoch_no).values()))
            closed.append(epoch_no)
        return closed

    def _close(self, reports: list[_Report]) -> None:
        done = self.done
        merged: dict[str, float] = {}
        if self._merge is not None:
            merged.update(self._merged(reports, "train", ""))
            merged.update(self._merged(reports, "val", "val_"))
        for key in sorted({k for r in reports for k in r.logs}):
            val = key.startswith("val_")
            pairs = [(r.val_rows if val else r.rows, r.logs[key]) for r in reports if key in r.logs]
            weight = sum(n for n, _ in pairs)
            value = merged.get(key)
            if value is None:
                value = (
                    sum(n * v for n, v in pairs) / weight
                    if weight > 0
                    else sum(v for _, v in pairs) / len(pairs)
                )
            self._logs.setdefault(key, [float("nan")] * done).append(float(value))
        for values in self._logs.values():  # a metric missing this epoch: NaN, aligned
            if len(values) == done:
                values.append(float("nan"))

    def _merged(self, reports: list[_Report], kind: str, prefix: str) -> dict[str, float]:
        """The merged results of the ``kind`` states of the workers that had rows,
        named as in the logs (``{}``: nothing to merge, or the merge failed)."""
        had_rows = [r for r in reports if (r.val_rows if kind == "val" else r.rows) > 0]
        parts = [r.states.get(kind) for r in had_rows]
        if not parts or any(p is None for p in parts):
            return {}
        assert self._merge is not None
        try:
            results = self._merge(parts)
        except Exception as exc:  # states that do not fit the model: averages stay
            _log.warning("Epoch %d's %s metrics averaged by rows: %s", self.done + 1, kind, exc)
            return {}
        return {
            prefix + name: value
            for name, value in results.items()
            if math.isfinite(value) and abs(value) <= MAX_VALUE
        }
