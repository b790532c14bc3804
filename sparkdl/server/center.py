"""The center weights and their version: what every push is checked against and folds into.

A version's arrays are never modified once answered (merges make new arrays), except
in hogwild mode, where pushes add into the live arrays and an answer is encoded anew
each time. The encoded answer of a version is built once however many workers ask.

Example:
    >>> import numpy as np
    >>> center = Center([np.zeros(2, np.float32)])
    >>> center.commit([np.ones(2, np.float32)])
    >>> center.version, center.weights[0].tolist()
    (1, [1.0, 1.0])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from sparkdl.server import wire
from sparkdl.server.errors import StoreError
from sparkdl.sync.merges import is_float

__all__ = ["Center"]


class Center:
    """The service's weights, their version and their encoded form.

    Not thread-safe: the store calls it with its lock held.

    Args:
        weights: Initial center weights (copied).
    """

    def __init__(self, weights: Sequence[np.ndarray]) -> None:
        self.weights = [np.array(w, copy=True) for w in weights]
        self.version = 0
        self._specs = [(w.dtype, w.shape) for w in self.weights]
        self._encoded: tuple[int, list[Any]] | None = None

    def check(self, arrays: Sequence[np.ndarray]) -> None:
        """Refuses arrays that do not match the weights or hold NaN or inf.

        Raises:
            StoreError: 400 naming the first offending array.
        """
        if len(arrays) != len(self._specs):
            raise StoreError(
                400,
                f"Expected {len(self._specs)} weight arrays (the model's weights). "
                f"Received: {len(arrays)}",
            )
        for i, (array, (dtype, shape)) in enumerate(zip(arrays, self._specs, strict=True)):
            if array.dtype != dtype or array.shape != shape:
                raise StoreError(
                    400,
                    f"Weight {i}: expected dtype {dtype} and shape {shape}. "
                    f"Received: dtype {array.dtype}, shape {array.shape}",
                )
            if is_float(array) and not np.isfinite(array).all():
                raise StoreError(
                    400,
                    f"Weight {i} holds NaN or infinite values; the update was refused. "
                    "Training diverged: lower the learning rate or clip gradients.",
                )

    def commit(self, weights: list[np.ndarray]) -> None:
        """Makes ``weights`` (new arrays) the next version."""
        self.weights = weights
        self.version += 1

    def bump(self) -> None:
        """Counts an update applied in place (hogwild)."""
        self.version += 1

    def encoded(self, meta: Callable[[int], dict[str, Any]], *, live: bool) -> list[Any]:
        """The weights as wire chunks with ``meta(version)`` as the header's metadata.

        Args:
            meta: The answer's metadata for a version (version, stop, learning rate).
            live: The arrays change in place (hogwild): encode now, never cache.
        """
        if live:
            return wire.encode(self.weights, meta(self.version))
        cached = self._encoded
        if cached is None or cached[0] != self.version:
            # The control fields are frozen with the version: every worker of a
            # synchronous round reads the same stop flag and learning rate.
            cached = self._encoded = (self.version, wire.encode(self.weights, meta(self.version)))
        return cached[1]

    def forget_encoding(self) -> None:
        """Drops the cached answer (its control fields changed)."""
        self._encoded = None
