"""The worker's half of each merge rule: what it pushes and what it does with the answer.

The service's half is in :mod:`sparkdl.server.rules`. Per merge:

* ``"average"``: push the weights; continue from the center in the answer.
* ``"delta"``: push ``scale * (w - w_pulled)``; continue from the center in the answer.
* ``"elastic"``: push ``d = alpha * (w - center_seen)`` and move ``w -= d``; keep the
  local weights (moved toward the center) and remember the answer's center for the
  next difference.

Integer weights (counters, seed states) are pushed as they are.

With ``overlap`` (asynchronous modes) a worker does not wait for the answer: it takes
the step the push implies at once (:meth:`WorkerMerge.pushed`; elastic moves toward
the center, the others keep their weights), trains on, and folds the answer in at its
next sync (:meth:`WorkerMerge.settle`): the center in the answer plus the local
progress made since the push, so every step is pushed exactly once.

Example:
    >>> import numpy as np
    >>> side = WorkerMerge("elastic", [np.zeros(2, np.float32)], alpha=0.5)
    >>> side.outgoing([np.full(2, 4.0, np.float32)])[0].tolist()
    [2.0, 2.0]
    >>> side.incoming([np.full(2, 4.0, np.float32)], [np.full(2, 2.0, np.float32)])[0].tolist()
    [2.0, 2.0]
    >>> side = WorkerMerge("delta", [np.zeros(2, np.float32)])
    >>> side.settle([np.full(2, 5.0, np.float32)], [np.full(2, 4.0, np.float32)],
    ...             [np.full(2, 10.0, np.float32)])[0].tolist()
    [11.0, 11.0]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["WorkerMerge"]


class WorkerMerge:
    """Tracks the center a worker last saw and turns its weights into pushes.

    Args:
        merge: ``"average"``, ``"delta"`` or ``"elastic"``.
        center: The center weights the worker starts from.
        alpha: The elastic moving rate (``merge="elastic"`` only).
        scale: Factor of a pushed delta (``merge="delta"`` only).
    """

    def __init__(
        self, merge: str, center: Sequence[np.ndarray], alpha: float = 0.0, scale: float = 1.0
    ) -> None:
        if merge not in ("average", "delta", "elastic"):
            raise ValueError(f"Unknown merge {merge!r}")
        self.merge = merge
        self.alpha = alpha
        self.scale = scale
        self.center = list(center)
        self._moves: list[np.ndarray] | None = None

    def outgoing(self, local: Sequence[np.ndarray]) -> list[np.ndarray]:
        """What to push, given the worker's current weights."""
        if self.merge == "average":
            return list(local)
        out = []
        for w, c in zip(local, self.center, strict=True):
            if not np.issubdtype(w.dtype, np.floating):
                out.append(w)
            elif self.merge == "delta":
                delta = w - c
                out.append(delta if self.scale == 1.0 else delta * w.dtype.type(self.scale))
            else:
                out.append((w - c) * w.dtype.type(self.alpha))
        self._moves = out
        return out

    def pushed(self, local: list[np.ndarray]) -> list[np.ndarray]:
        """The worker's weights right after a push it does not wait for.

        Elastic: moved by the pushed difference (``w - d``), as a new list; otherwise
        ``local`` itself, unchanged (so ``pushed(local) is local`` says nothing moved).
        Call after :meth:`outgoing`.
        """
        if self.merge != "elastic" or self._moves is None:
            return local
        moves, self._moves = self._moves, None
        return [
            w - d if np.issubdtype(w.dtype, np.floating) else w
            for w, d in zip(local, moves, strict=True)
        ]

    def settle(
        self,
        local: Sequence[np.ndarray],
        at_push: Sequence[np.ndarray],
        answer: Sequence[np.ndarray],
    ) -> list[np.ndarray]:
        """The worker's weights once the answer to an earlier push arrives.

        Args:
            local: The weights now.
            at_push: The weights right after the push (what :meth:`pushed` returned).
            answer: The service's center in its answer.

        Average and delta continue from the center plus what the worker learned since
        the push (``answer + local - at_push``); elastic keeps its weights and only
        remembers the center for its next difference.
        """
        self.center = list(answer)
        if self.merge == "elastic":
            return list(local)
        return [
            c + (w - p) if np.issubdtype(c.dtype, np.floating) else c
            for w, p, c in zip(local, at_push, answer, strict=True)
        ]

    def incoming(
        self, local: Sequence[np.ndarray], answer: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        """The worker's new weights after the service answered with its center."""
        self.center = list(answer)
        if self.merge != "elastic":
            return list(answer)
        moves, self._moves = self._moves, None
        if moves is None:
            return list(local)
        return [
            w - d if np.issubdtype(w.dtype, np.floating) else c
            for w, d, c in zip(local, moves, answer, strict=True)
        ]
