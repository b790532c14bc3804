"""What each worker holds of the center, so compressed updates travel both ways.

With ``compression=...`` (:mod:`sparkdl.sync.codecs`) an answer carries the center's
change since the copy of the center the worker holds, encoded, rather than the full
weights; a lossy encoding leaves part of the change out, so that copy is not any
version of the center. The service keeps, per worker, the copy the worker confirmed
(``base``) and the one its last answer would make (``pending``), each under a number:

* A worker with no copy (a task that starts, or a retried task, which rejoins) asks for
  the full weights (``replica = -1``): the answer holds them, under a new number.
* Every push and every later pull names the copy the worker holds. Naming the pending
  copy confirms it (the answer arrived); naming the confirmed one drops the pending one
  (the answer was lost: a retried request). Any other number is refused.
* An answer encodes ``center - base``; the worker adds the decoded change to its copy,
  the service adds the same decoded change to ``base`` as the new pending copy, so the
  two stay equal bit for bit, and what an answer left out the next one carries.
* A merge that pushes weights (``average``) pushes ``weights - copy`` instead, and the
  service adds its ``base`` back.

A worker's numbers belong to its newest task attempt: an older attempt's requests are
refused (409), as the store refuses its pushes. Two copies of the weights per worker
live on the driver while compression is on.

Example:
    >>> import numpy as np
    >>> from sparkdl.sync.codecs import Compression, Float16
    >>> from sparkdl.sync.merges import Delta
    >>> replicas = Replicas(Compression(Float16(), Float16()), Delta(), [np.zeros(300, np.float32)])
    >>> full, meta = replicas.answer(0, 0, -1, [np.ones(300, np.float32)], {"version": 1})
    >>> meta["full"], meta["replica"]
    (True, 1)
    >>> parts, meta = replicas.answer(0, 0, 1, [np.full(300, 3.0, np.float32)], {})
    >>> meta["full"], parts[0].dtype.name
    (False, 'float16')
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparkdl.server.errors import StoreError
from sparkdl.sync.codecs import CodecError, Compression, follow
from sparkdl.sync.merges import Merge, is_float

__all__ = ["FULL", "Replicas"]

#: The copy number of a worker that holds none: its answer is the full weights.
FULL = -1


@dataclass
class _Copy:
    attempt: int
    base: list[np.ndarray] | None = None
    base_id: int = FULL
    pending: tuple[int, list[np.ndarray]] | None = None


class Replicas:
    """Each worker's copy of the center, and the codec's service half.

    Args:
        compression: The fit's codecs (pushes decode with one, answers encode with the
            other).
        merge: The fit's merge (whether pushes are weights or differences).
        weights: The center's initial weights (their dtypes and shapes).
    """

    def __init__(
        self, compression: Compression, merge: Merge, weights: Sequence[np.ndarray]
    ) -> None:
        self.codec = compression.push
        self.answers = compression.answer
        self.merge = merge
        self.specs = [(w.dtype, tuple(w.shape)) for w in weights]
        self._full_bytes = sum(w.nbytes for w in weights)
        self._copies: dict[int, _Copy] = {}
        self._locks: dict[int, threading.Lock] = {}
        self._lock = threading.Lock()
        self._next_id = 0
        self._full: dict[int, int] = {}

    def unpack(
        self, worker: int, attempt: int, replica: Any, parts: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        """The dense arrays a push's ``parts`` encode, for the store's merge.

        Raises:
            StoreError: 400 for parts that do not decode, or a copy number the service
                never sent; 409 for a superseded attempt.
        """
        try:
            sent = self.codec.decode(parts, self.specs)
        except CodecError as exc:
            raise StoreError(400, f"Compressed push ({self.codec.name}): {exc}.") from None
        with self._worker_lock(worker):
            copy = self._confirm(worker, attempt, replica)
            if not self.merge.pushes_weights:
                return sent
            assert copy.base is not None
            return follow(copy.base, sent)

    def answer(
        self,
        worker: int,
        attempt: int,
        replica: Any,
        center: Sequence[np.ndarray],
        meta: dict[str, Any],
    ) -> tuple[list[np.ndarray], dict[str, Any]]:
        """The arrays and metadata that answer ``worker`` with ``center``: the full
        weights (``replica`` is :data:`FULL`, or the encoding would be no smaller), else
        the encoded change since its copy.

        ``center`` must not change afterwards (a hogwild center is copied first).

        Raises:
            StoreError: As :meth:`unpack`.
        """
        with self._worker_lock(worker):
            if replica == FULL:
                copy = self._start(worker, attempt)
                with self._lock:
                    self._full[worker] = self._full.get(worker, 0) + 1
            else:
                copy = self._confirm(worker, attempt, replica)
            number = self._number()
            change = None
            if copy.base is not None and self.answers.encoded_bytes(self.specs) < self._full_bytes:
                with np.errstate(over="ignore", invalid="ignore"):
                    change = [
                        c - b if is_float(c) else c for c, b in zip(center, copy.base, strict=True)
                    ]
                if not all(np.isfinite(d).all() for d in change if is_float(d)):
                    change = None  # a change beyond the dtype's range: send it all
            if change is None:
                copy.pending = (number, list(center))
                return list(center), {**meta, "replica": number, "full": True}
            parts = self.answers.encode(change)
            decoded = self.answers.decode(parts, self.specs)
            copy.pending = (number, follow(copy.base, decoded))
            return parts, {**meta, "replica": number, "full": False}

    def full_answers(self) -> dict[str, int]:
        """Per worker, the full weights it asked for (one per task attempt that
        started: a count of 2 means a retried task began again from the full weights)."""
        with self._lock:
            return {str(w): n for w, n in sorted(self._full.items())}

    # ---------------------------------------------------------------- helpers
    def _start(self, worker: int, attempt: int) -> _Copy:
        """A fresh copy record for a worker that asks for the full weights."""
        copy = self._copies.get(worker)
        if copy is not None and attempt < copy.attempt:
            raise _superseded(worker, attempt)
        copy = self._copies[worker] = _Copy(attempt)
        return copy

    def _confirm(self, worker: int, attempt: int, replica: Any) -> _Copy:
        """Takes the worker's word for the copy it holds (see the module docstring)."""
        if type(replica) is not int:
            raise StoreError(
                400, f"Expected 'replica' to be an int. Received: {repr(replica)[:60]}"
            )
        copy = self._copies.get(worker)
        if copy is not None and attempt < copy.attempt:
            raise _superseded(worker, attempt)
        if copy is None or attempt > copy.attempt:
            raise StoreError(
                400,
                f"Worker {worker} (attempt {attempt}) holds no copy of the center this "
                "service sent: with compression a task first pulls the full weights "
                f"(replica={FULL}).",
            )
        if copy.pending is not None and replica == copy.pending[0]:
            copy.base_id, copy.base = copy.pending
            copy.pending = None
        elif replica == copy.base_id and copy.base is not None:
            copy.pending = None  # that answer was lost; the worker asks again
        else:
            known = [n for n in (copy.base_id, copy.pending and copy.pending[0]) if n]
            raise StoreError(
                400,
                f"Worker {worker} names copy {replica!r} of the center; the service sent "
                f"it {known or 'none'}. Expected one of those (or {FULL} for the full "
                "weights).",
            )
        return copy

    def _number(self) -> int:
        with self._lock:
            self._next_id += 1
            return self._next_id

    def _worker_lock(self, worker: int) -> threading.Lock:
        with self._lock:
            return self._locks.setdefault(worker, threading.Lock())


def _superseded(worker: int, attempt: int) -> StoreError:
    return StoreError(
        409,
        f"Worker {worker} attempt {attempt} was superseded by a newer attempt; its "
        "requests are refused.",
    )
