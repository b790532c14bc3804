"""The center weights and their version: what every push is checked against and folds into.

A version's arrays are never modified once answered (merges make new arrays), except
in hogwild mode, where pushes add into the live arrays and an answer is encoded anew
each time. The encoded answer of a version is built once however many workers ask.

No push may make the center overflow its dtype (one worker's huge values would make
it inf for every worker). A merge moves a center array by at most the largest
magnitude it is pushed (averages take a share of it, deltas and elastic differences
add it), so the center keeps an upper bound on each array's largest magnitude: the
bound plus the push's must stay within the dtype's range, else the bound is
recomputed exactly (one pass over that array, only near the limit) and the push is
refused if it still does not fit. The check happens before anything changes.

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

from sparkdl.protocol import wire
from sparkdl.server.state.errors import StoreError
from sparkdl.sync.merges import float_limit, is_float

__all__ = ["Center", "magnitude"]


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
        self._meta: tuple[int, dict[str, Any]] | None = None
        self._limits = [float_limit(w.dtype) if is_float(w) else None for w in self.weights]
        #: Per array, at least the largest magnitude it holds or may hold once every
        #: push admitted so far is folded in.
        self._bounds = [magnitude(w) if is_float(w) else 0.0 for w in self.weights]

    def check(self, arrays: Sequence[np.ndarray]) -> list[float]:
        """Refuses arrays that do not match the weights or hold NaN or inf.

        Returns:
            Each array's largest magnitude (0 for integer arrays), for :meth:`reserve`.

        Raises:
            StoreError: 400 naming the first offending array.
        """
        if len(arrays) != len(self._specs):
            raise StoreError(
                400,
                f"Expected {len(self._specs)} weight arrays (the model's weights). "
                f"Received: {len(arrays)}",
            )
        magnitudes = []
        for i, (array, (dtype, shape)) in enumerate(zip(arrays, self._specs, strict=True)):
            if array.dtype != dtype or array.shape != shape:
                raise StoreError(
                    400,
                    f"Weight {i}: expected dtype {dtype} and shape {shape}. "
                    f"Received: dtype {array.dtype}, shape {array.shape}",
                )
            largest = magnitude(array) if is_float(array) else 0.0
            if not np.isfinite(largest):
                raise StoreError(
                    400,
                    f"Weight {i} holds NaN or infinite values; the update was refused. "
                    "Training diverged: lower the learning rate or clip gradients (the "
                    "workers' rate is the model's scaled by lr_scaling, 'auto' by default).",
                )
            magnitudes.append(largest)
        return magnitudes

    def reserve(
        self,
        magnitudes: Sequence[float],
        pending: Callable[[], Sequence[float]] | None = None,
        *,
        additive: bool = True,
    ) -> None:
        """Admits a push of these magnitudes, or refuses it if it could overflow the center.

        Args:
            magnitudes: The push's, from :meth:`check`.
            pending: The summed magnitudes of pushes admitted but not yet folded into
                :attr:`weights` (an open synchronous round, hogwild steps under way);
                asked for only when a bound is recomputed.
            additive: The merge adds pushes (``Merge.additive``). An average never
                leaves the range of the values averaged, so it is never refused.

        Raises:
            StoreError: 400; nothing changed.
        """
        if not additive:
            for i, largest in enumerate(magnitudes):
                self._bounds[i] = max(self._bounds[i], largest)
            return
        for i, largest in enumerate(magnitudes):
            limit = self._limits[i]
            if limit is None or self._bounds[i] + largest <= limit:
                continue
            extra = pending()[i] if pending is not None else 0.0
            self._bounds[i] = magnitude(self.weights[i]) + extra
            if self._bounds[i] + largest > limit:
                dtype = self._specs[i][0]
                raise StoreError(
                    400,
                    f"The update would carry weight {i} past the range of {dtype} (values up "
                    f"to {largest:.3g} onto a center holding up to {self._bounds[i]:.3g}); it "
                    "was refused and the center is unchanged. Training diverged: lower the "
                    "learning rate or clip gradients.",
                )
        for i, largest in enumerate(magnitudes):
            self._bounds[i] += largest

    def check_outer(self, weights: Sequence[np.ndarray]) -> None:
        """Refuses the result of an outer optimizer's step that left the dtype's range,
        and raises the bounds :meth:`reserve` keeps to what it holds (an outer step
        may move an array farther than the pushes' magnitudes: its momentum).

        Raises:
            StoreError: 400 naming the outer optimizer's settings; nothing changed.
        """
        self.raise_bounds(self.outer_magnitudes(weights))

    def outer_magnitudes(self, weights: Sequence[np.ndarray]) -> list[float]:
        """Each array's largest magnitude after an outer optimizer's step. Reads only
        what never changes, so it needs no lock (hogwild's step calls it outside).

        Raises:
            StoreError: 400 for an array past its dtype's range, naming the settings.
        """
        found = [magnitude(w) if is_float(w) else 0.0 for w in weights]
        for i, largest in enumerate(found):
            if not np.isfinite(largest):
                raise StoreError(
                    400,
                    f"The outer optimizer's step carried weight {i} past the range of "
                    f"{self._specs[i][0]}; the update was refused and the center and the "
                    "outer optimizer's state are unchanged. Lower outer_learning_rate or "
                    "outer_momentum (or the workers' learning rate).",
                )
        return found

    def raise_bounds(self, found: Sequence[float]) -> None:
        """Raises the bounds :meth:`reserve` keeps to at least ``found``, per array."""
        for i, largest in enumerate(found):
            self._bounds[i] = max(self._bounds[i], largest)

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

    def answer_meta(self, meta: Callable[[int], dict[str, Any]], *, live: bool) -> dict[str, Any]:
        """``meta(version)``, frozen with the version as :meth:`encoded` freezes it (the
        metadata of compressed answers, each encoded for its worker)."""
        if live:
            return meta(self.version)
        cached = self._meta
        if cached is None or cached[0] != self.version:
            cached = self._meta = (self.version, meta(self.version))
        return dict(cached[1])

    def forget_encoding(self) -> None:
        """Drops the cached answer (its control fields changed)."""
        self._encoded = None
        self._meta = None


def magnitude(array: np.ndarray) -> float:
    """The largest absolute value in a floating-point array (NaN if it holds a NaN).

    Example:
        >>> magnitude(np.array([1.0, -3.0], np.float32))
        3.0
    """
    if array.size == 0:
        return 0.0
    with np.errstate(invalid="ignore"):  # a NaN is the answer, not a warning
        return float(max(array.max(), -array.min()))
