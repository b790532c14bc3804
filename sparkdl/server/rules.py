"""Merge rules: how the service combines the weights workers push.

A rule is a small strategy object; the Flask routes never know which one runs. A
synchronous round hands every push of the round to :meth:`MergeRule.combine` at once.

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

__all__ = ["AverageRule", "MergeRule", "Update", "make_rule"]


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


def make_rule(merge: str) -> MergeRule:
    """Returns the rule named ``merge``.

    Example:
        >>> make_rule("average").name
        'average'
    """
    rules: dict[str, type[MergeRule]] = {"average": AverageRule}
    if merge not in rules:
        raise ConfigError(f"Expected merge to be one of {tuple(rules)}. Received: merge={merge!r}")
    return rules[merge]()
