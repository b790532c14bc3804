"""Merge rules: how the service combines the weights workers push.

A rule is a small strategy object; the Flask routes never know which one runs. A
synchronous round hands every push of the round to :meth:`MergeRule.combine` at once;
an asynchronous push is folded into the center by :meth:`MergeRule.apply` as it comes.

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

__all__ = ["STALENESS", "AverageRule", "DeltaRule", "MergeRule", "Update", "make_rule"]

STALENESS: tuple[str, ...] = ("none", "inverse")


@dataclass
class Update:
    """One worker's push.

    Args:
        worker: Worker id (the Spark partition id).
        arrays: The pushed arrays, in the model's weight order.
        samples: Samples the worker trained on since its previous push.
        base_version: Model version the worker started from.
        meta: The rest of the message's metadata.
    """

    worker: int
    arrays: list[np.ndarray]
    samples: int
    base_version: int = 0
    meta: dict[str, Any] = field(default_factory=dict)


class MergeRule(abc.ABC):
    """Combines pushed weights into the service's center weights."""

    name: str = ""

    @abc.abstractmethod
    def combine(self, center: Sequence[np.ndarray], updates: Sequence[Update]) -> list[np.ndarray]:
        """Returns the new center after a synchronous round.

        Args:
            center: The weights every worker started the round from.
            updates: One push per worker in the round.
        """

    def apply(self, center: Sequence[np.ndarray], update: Update, version: int) -> list[np.ndarray]:
        """Returns the center after one asynchronous push.

        The result is made of new arrays: the service hands each version's arrays to
        the socket without copying them, so a version is never changed once made.

        Args:
            center: The current center weights (not modified).
            update: The push.
            version: The center's version before this update.

        Raises:
            ConfigError: The rule has no asynchronous form.
        """
        raise ConfigError(f"merge={self.name!r} has no asynchronous form; use merge='delta'.")


class AverageRule(MergeRule):
    """Model averaging: the mean of the pushed weights, weighted by samples seen.

    Workers that trained on no samples in the round (a short partition that finished
    its epoch) weigh nothing; if no worker trained, the plain mean is taken.
    """

    name = "average"

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
                # Integer state (counters, seeds): take the first worker's value.
                merged.append(np.array(updates[0].arrays[i], dtype=ref.dtype))
                continue
            acc = np.zeros(ref.shape, dtype=np.result_type(ref.dtype, np.float32))
            for w, update in zip(weights, updates, strict=True):
                if w:
                    acc += update.arrays[i] * acc.dtype.type(w)
            merged.append(acc.astype(ref.dtype, copy=False))
        return merged


class DeltaRule(MergeRule):
    """Adds pushed deltas (``w_new - w_pulled``) to the center.

    Asynchronously, each delta is added as it arrives. With ``staleness="inverse"`` a
    delta computed against a center ``k >= 1`` versions old is scaled by ``1 / k``
    (staleness-aware async SGD, Zhang et al. 2016); a fresh delta (``k = 0``) is added
    as is. In a synchronous round the deltas are averaged, weighted by samples, which
    is the same step model averaging takes.

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
        lag = max(version - update.base_version, 0)
        scale = 1.0 / lag if self.staleness == "inverse" and lag > 1 else 1.0
        out = []
        for c, d in zip(center, update.arrays, strict=True):
            if not np.issubdtype(c.dtype, np.floating):
                out.append(np.array(d, dtype=c.dtype))  # integer state: the newest wins
            elif scale == 1.0:
                out.append(np.add(c, d))
            else:
                out.append(np.add(c, d * c.dtype.type(scale)))
        return out


def make_rule(merge: str, *, staleness: str = "none") -> MergeRule:
    """Returns the rule named ``merge``.

    Example:
        >>> make_rule("average").name
        'average'
    """
    if merge == "average":
        return AverageRule()
    if merge == "delta":
        return DeltaRule(staleness)
    raise ConfigError(
        f"Expected merge to be one of ('average', 'delta'). Received: merge={merge!r}"
    )
