"""Merge rules: how the service combines what workers push.

A rule is a small strategy object; the Flask routes never know which one runs.

* A synchronous round hands every push of the round to :meth:`MergeRule.combine`.
* An asynchronous push (``mode="asynchronous"``) goes to :meth:`MergeRule.apply`
  under the service's lock; it returns new arrays, so a version once made is never
  changed and can be sent without copying.
* A hogwild push goes to :meth:`MergeRule.apply_in_place` without any lock: numpy
  adds into the live center from several request threads at once.

What workers push and do with the answer (see :mod:`sparkdl.merging`):

=========  ==============================  ==========================================
merge      worker pushes                   service
=========  ==============================  ==========================================
average    its weights ``w``               synchronous: mean weighted by samples;
                                           asynchronous: ``c += (w - c) / n``
delta      ``w - w_pulled``                synchronous: ``c += `` mean delta weighted
                                           by samples; asynchronous: ``c += d`` (or
                                           ``d / k`` for a delta k versions old)
elastic    ``d = alpha * (w - c_seen)``    ``c += d``, summed over the round when
           and moves ``w -= d``            synchronous (Sync EASGD)
=========  ==============================  ==========================================

Integer weights (counters, seed states) are never averaged or added: a synchronous
round keeps the first worker's value, an asynchronous push's value replaces the center's.

Example:
    >>> import numpy as np
    >>> from sparkdl.server.rules import AverageRule, Update
    >>> rule = AverageRule()
    >>> ups = [Update(worker=0, arrays=[np.array([0.0])], samples=1),
    ...        Update(worker=1, arrays=[np.array([4.0])], samples=3)]
    >>> rule.combine([np.array([9.0])], ups)[0].tolist()
    [3.0]
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sparkdl.errors import ConfigError

__all__ = [
    "STALENESS",
    "AverageRule",
    "DeltaRule",
    "ElasticRule",
    "MergeRule",
    "Update",
    "make_rule",
]

STALENESS: tuple[str, ...] = ("none", "inverse")


@dataclass
class Update:
    """One worker's push.

    Args:
        worker: Worker id (the Spark partition id).
        arrays: The pushed arrays, in the model's weight order.
        samples: Samples the worker trained on since its previous push.
        base_version: Center version the worker computed the push against.
        meta: The rest of the message's metadata.
    """

    worker: int
    arrays: list[np.ndarray]
    samples: int
    base_version: int = 0
    meta: dict[str, Any] = field(default_factory=dict)


class MergeRule(abc.ABC):
    """Combines pushed updates into the service's center weights."""

    name: str = ""

    @abc.abstractmethod
    def combine(self, center: Sequence[np.ndarray], updates: Sequence[Update]) -> list[np.ndarray]:
        """Returns the new center after a synchronous round.

        Args:
            center: The weights every worker started the round from.
            updates: One push per worker in the round.
        """

    def apply(self, center: Sequence[np.ndarray], update: Update, version: int) -> list[np.ndarray]:
        """Returns the center after one asynchronous push, as new arrays.

        Args:
            center: The current center weights (not modified).
            update: The push.
            version: The center's version before this update.
        """
        out = [np.array(c, copy=True) for c in center]
        self.apply_in_place(out, update, version)
        return out

    def apply_in_place(self, center: list[np.ndarray], update: Update, version: int) -> None:
        """Folds one push into ``center`` in place (hogwild: no lock is held).

        Args:
            center: The live center weights; modified in place.
            update: The push.
            version: The center's version before this update.
        """
        for c, d in zip(center, update.arrays, strict=True):
            if np.issubdtype(c.dtype, np.floating):
                self._step(c, d, update, version)
            else:
                c[...] = d  # integer state: the newest value wins

    @abc.abstractmethod
    def _step(self, center: np.ndarray, pushed: np.ndarray, update: Update, version: int) -> None:
        """Moves one floating-point center array in place."""


class AverageRule(MergeRule):
    """Model averaging.

    Synchronously, the mean of the pushed weights weighted by samples seen; workers that
    trained on no samples in the round (a short partition that finished its epoch) weigh
    nothing, and if no worker trained the plain mean is taken. Asynchronously, each push
    moves the center ``1 / num_workers`` of the way to the pushed weights: each worker
    owns its share of a running average.

    Args:
        num_workers: Workers sharing the average (asynchronous form).
    """

    name = "average"

    def __init__(self, num_workers: int = 1) -> None:
        self.share = 1.0 / max(num_workers, 1)

    def combine(self, center: Sequence[np.ndarray], updates: Sequence[Update]) -> list[np.ndarray]:
        if not updates:
            return [np.array(c, copy=True) for c in center]
        weights = np.array([max(u.samples, 0) for u in updates], dtype=np.float64)
        if weights.sum() <= 0:
            weights = np.ones(len(updates))
        weights /= weights.sum()
        merged = []
        for i, ref in enumerate(center):
            if not np.issubdtype(ref.dtype, np.floating):
                merged.append(np.array(updates[0].arrays[i], dtype=ref.dtype))
                continue
            acc = np.zeros(ref.shape, dtype=np.result_type(ref.dtype, np.float32))
            for w, update in zip(weights, updates, strict=True):
                if w:
                    acc += update.arrays[i] * acc.dtype.type(w)
            merged.append(acc.astype(ref.dtype, copy=False))
        return merged

    def _step(self, center: np.ndarray, pushed: np.ndarray, update: Update, version: int) -> None:
        if update.samples <= 0:
            return  # a worker that trained on nothing only reports
        share = center.dtype.type(self.share)
        center *= center.dtype.type(1.0) - share
        center += pushed * share


class DeltaRule(MergeRule):
    """Adds pushed deltas (``w_new - w_pulled``) to the center.

    Asynchronously, each delta is added as it arrives. With ``staleness="inverse"`` a
    delta computed against a center ``k >= 2`` versions old is scaled by ``1 / k``
    (staleness-aware async SGD, Zhang et al. 2016); a fresher one is added as is. In a
    synchronous round the deltas are averaged, weighted by samples, which is the same
    step model averaging takes.

    Args:
        staleness: ``"none"`` or ``"inverse"``.

    Example:
        >>> import numpy as np
        >>> center = [np.zeros(2, np.float32)]
        >>> new = DeltaRule("inverse").apply(
        ...     center, Update(worker=0, arrays=[np.ones(2, np.float32)], samples=1,
        ...                    base_version=3), version=7)
        >>> new[0].tolist()
        [0.25, 0.25]
    """

    name = "delta"

    def __init__(self, staleness: str = "none") -> None:
        if staleness not in STALENESS:
            raise ConfigError(
                f"Expected staleness to be one of {STALENESS}. Received: staleness={staleness!r}"
            )
        self.staleness = staleness

    def combine(self, center: Sequence[np.ndarray], updates: Sequence[Update]) -> list[np.ndarray]:
        mean = AverageRule().combine([np.zeros_like(c) for c in center], updates)
        return [
            c + d if np.issubdtype(c.dtype, np.floating) else d
            for c, d in zip(center, mean, strict=True)
        ]

    def apply(self, center: Sequence[np.ndarray], update: Update, version: int) -> list[np.ndarray]:
        scale = self._scale(update, version)
        out = []
        for c, d in zip(center, update.arrays, strict=True):
            if not np.issubdtype(c.dtype, np.floating):
                out.append(np.array(d, dtype=c.dtype))
            elif scale == 1.0:
                out.append(np.add(c, d))  # one pass into new memory, no copy first
            else:
                out.append(np.add(c, d * c.dtype.type(scale)))
        return out

    def _step(self, center: np.ndarray, pushed: np.ndarray, update: Update, version: int) -> None:
        scale = self._scale(update, version)
        if scale == 1.0:
            np.add(center, pushed, out=center)
        else:
            np.add(center, pushed * center.dtype.type(scale), out=center)

    def _scale(self, update: Update, version: int) -> float:
        lag = max(version - update.base_version, 0)
        return 1.0 / lag if self.staleness == "inverse" and lag > 1 else 1.0


class ElasticRule(MergeRule):
    """Elastic averaging (EASGD, Zhang, Choromanska and LeCun 2015).

    Workers push their elastic difference ``d = alpha * (w - center_seen)`` and move
    their own weights by ``-d``; the center moves by ``+d``. In a synchronous round the
    differences of all workers, computed against the same center, are summed: Sync
    EASGD. Asynchronously each is added as it arrives, computed against the center the
    worker received with its previous answer (one round trip per update, as in
    DeepSpark's asynchronous EASGD).

    Example:
        >>> import numpy as np
        >>> ups = [Update(worker=0, arrays=[np.array([0.5])], samples=1),
        ...        Update(worker=1, arrays=[np.array([-0.25])], samples=1)]
        >>> ElasticRule().combine([np.array([1.0])], ups)[0].tolist()
        [1.25]
    """

    name = "elastic"

    def combine(self, center: Sequence[np.ndarray], updates: Sequence[Update]) -> list[np.ndarray]:
        merged = []
        for i, c in enumerate(center):
            if not np.issubdtype(c.dtype, np.floating):
                merged.append(np.array(updates[0].arrays[i], dtype=c.dtype))
                continue
            total = np.array(c, copy=True)
            for update in updates:
                total += update.arrays[i]
            merged.append(total)
        return merged

    def apply(self, center: Sequence[np.ndarray], update: Update, version: int) -> list[np.ndarray]:
        return [
            np.add(c, d) if np.issubdtype(c.dtype, np.floating) else np.array(d, dtype=c.dtype)
            for c, d in zip(center, update.arrays, strict=True)
        ]

    def _step(self, center: np.ndarray, pushed: np.ndarray, update: Update, version: int) -> None:
        np.add(center, pushed, out=center)


def make_rule(merge: str, *, staleness: str = "none", num_workers: int = 1) -> MergeRule:
    """Returns the rule named ``merge``.

    Example:
        >>> make_rule("elastic").name
        'elastic'
    """
    if merge == "average":
        return AverageRule(num_workers)
    if merge == "delta":
        return DeltaRule(staleness)
    if merge == "elastic":
        return ElasticRule()
    raise ConfigError(
        f"Expected merge to be one of ('average', 'delta', 'elastic'). Received: merge={merge!r}"
    )
