"""What each worker holds of the center, so compressed updates travel both ways.

With ``compression=...`` (:mod:`sparkdl.sync.codecs`) an answer carries the center's
change since the copy of the center the worker holds, encoded, rather than the full
weights; a lossy encoding leaves part of the change out, so that copy is not any
version of the center. The service keeps, per worker, the copy the worker confirmed
(``base``) and the ones its answers since would make (``pending``), each under a
number:

* A worker with no copy (a task that starts, or a retried task, which rejoins) asks for
  the full weights (``replica = -1``): the answer holds them, under a new number.
* Every push and every later pull names the copy the worker holds. An answer confirms
  the copy its request named: a pending one becomes the base (that answer arrived) and
  the other pending ones are dropped; the base itself changes nothing (an answer was
  lost, or a retried request overtook the first: whichever answer the worker took, its
  number stays valid). Any other number is refused. A push is decoded against the copy
  it names, and only its answer confirms it: a refused push changes nothing.
* An answer encodes ``center - base``; the worker adds the decoded change to its copy,
  the service adds the same decoded change to ``base`` as a new pending copy, so the
  two stay equal bit for bit, and what an answer left out the next one carries.
* Pushes are differences: a merge that pushes weights (synchronous ``average``) is
  refused, and takes its relative form under compression (:attr:`Average.relative
  <sparkdl.sync.merges.Average.relative>`: workers push ``weights - copy``, averaged
  onto the center): averaging ``copy + difference`` would drop, every round, the part
  of the center a lossy answer has not delivered yet.

A worker's numbers belong to its newest task attempt, the one the store's ledger knows
from its join: an older attempt's requests are refused (409), a newer one must join
first. The base and at most :data:`MAX_PENDING` pending copies of the weights per
worker live on the driver while compression is on (one pending copy as a rule).

Example:
    >>> import numpy as np
    >>> from sparkdl.sync.codecs import Compression, Float16
    >>> from sparkdl.sync.merges import Delta
    >>> replicas = Replicas(Compression(Float16(), Float16()), Delta(),
    ...                     [np.zeros(300, np.float32)], newest_attempt=lambda worker: 0)
    >>> full, meta = replicas.answer(0, 0, -1, [np.ones(300, np.float32)], {"version": 1})
    >>> meta["full"], meta["replica"]
    (True, 1)
    >>> parts, meta = replicas.answer(0, 0, 1, [np.full(300, 3.0, np.float32)], {})
    >>> meta["full"], parts[0].dtype.name
    (False, 'float16')
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sparkdl.server.state.errors import StoreError
from sparkdl.sync.codecs import WHOLE, CodecError, Compression, follow
from sparkdl.sync.merges import Merge, is_float

__all__ = ["FULL", "MAX_PENDING", "Replicas"]

#: The copy number of a worker that holds none: its answer is the full weights.
FULL = -1
#: Answers a worker may have outstanding (the first, and retries of the same request).
MAX_PENDING = 3


@dataclass
class _Copy:
    attempt: int
    base: list[np.ndarray] | None = None
    base_id: int = FULL
    pending: dict[int, list[np.ndarray]] = field(default_factory=dict)


class Replicas:
    """Each worker's copy of the center, and the codec's service half.

    Args:
        compression: The fit's codecs (pushes decode with one, answers encode with the
            other).
        merge: The fit's merge (whether pushes are weights or differences).
        weights: The center's initial weights (their dtypes and shapes).
        newest_attempt: The newest task attempt the store knows of a worker (from its
            joins).
    """

    def __init__(
        self,
        compression: Compression,
        merge: Merge,
        weights: Sequence[np.ndarray],
        *,
        newest_attempt: Callable[[int], int],
    ) -> None:
        self.codec = compression.push
        self.answers = compression.answer
        if merge.pushes_weights:
            raise ValueError(f"{merge!r} must take differences under compression (relative=True)")
        self.merge = merge
        self.specs = [(w.dtype, tuple(w.shape)) for w in weights]
        self._newest_attempt = newest_attempt
        # Whether an encoded change is smaller than the weights (fixed by the specs).
        self._encode_answers = self.answers.encoded_bytes(self.specs) < sum(
            w.nbytes for w in weights
        )
        self._copies: dict[int, _Copy] = {}
        self._locks: dict[int, threading.Lock] = {}
        self._lock = threading.Lock()
        self._next_id = 0
        self._started: dict[int, set[int]] = {}

    def unpack(
        self,
        worker: int,
        attempt: int,
        replica: Any,
        parts: Sequence[np.ndarray],
        *,
        whole: bool = False,
    ) -> list[np.ndarray]:
        """The dense arrays a push's ``parts`` encode, for the store's merge (decoded
        against the copy ``replica`` names; nothing changes until it is answered).
        ``whole``: the push sent its update unencoded (a worker's closing push).

        Raises:
            StoreError: 400 for parts that do not decode, or a copy number the service
                never sent; 409 for a superseded attempt.
        """
        codec = WHOLE if whole else self.codec
        try:
            sent = codec.decode(parts, self.specs)
        except CodecError as exc:
            raise StoreError(400, f"Compressed push ({codec.name}): {exc}.") from None
        with self._worker_lock(worker):
            self._named(worker, attempt, replica)
        return sent

    def answer(
        self,
        worker: int,
        attempt: int,
        replica: Any,
        center: Sequence[np.ndarray],
        meta: dict[str, Any],
    ) -> tuple[list[np.ndarray], dict[str, Any]]:
        """The arrays and metadata that answer ``worker`` with ``center``: the full
        weights (``replica`` is :data:`FULL`, or the encoding would be no smaller, or
        the change overflows), else the encoded change since the copy it holds.

        ``center`` must not change afterwards (a hogwild center is copied first).

        Raises:
            StoreError: As :meth:`unpack`.
        """
        with self._worker_lock(worker):
            change = None
            if replica == FULL:
                copy = self._start(worker, attempt)
            else:
                self._named(worker, attempt, replica)
                copy = self._confirm(worker, replica)
            number = self._number()
            if replica != FULL and self._encode_answers:
                assert copy.base is not None
                with np.errstate(over="ignore", invalid="ignore"):
                    change = [
                        c - b if is_float(c) else c for c, b in zip(center, copy.base, strict=True)
                    ]
                if not all(np.isfinite(d).all() for d in change if is_float(d)):
                    change = None  # a change beyond the dtype's range: send it all
            if change is None:
                self._hold(copy, number, list(center))
                return list(center), {**meta, "replica": number, "full": True}
            parts = self.answers.encode(change)
            assert copy.base is not None
            self._hold(copy, number, follow(copy.base, self.answers.decode(parts, self.specs)))
            return parts, {**meta, "replica": number, "full": False}

    def full_answers(self) -> dict[str, int]:
        """Per worker, the task attempts that started from the full weights (2: a
        retried task began again from them)."""
        with self._lock:
            return {str(w): len(a) for w, a in sorted(self._started.items())}

    def copy_state(self) -> dict[str, Any]:
        """Each worker's copy numbers: ``[attempt, base, [pending...]]``."""
        with self._lock:
            copies = dict(self._copies)
        return {
            str(w): [c.attempt, c.base_id, sorted(c.pending)] for w, c in sorted(copies.items())
        }

    # ---------------------------------------------------------------- helpers
    def _start(self, worker: int, attempt: int) -> _Copy:
        """The copy record of the attempt the store knows (it joined): a fresh one for
        a new attempt, the same one for a full pull asked again."""
        newest = self._newest_attempt(worker)
        if attempt < newest:
            raise _superseded(worker, attempt)
        if attempt > newest:
            raise StoreError(
                400, f"Worker {worker} attempt {attempt} has not joined: POST /join first."
            )
        with self._lock:
            copy = self._copies.get(worker)
            if copy is None or copy.attempt != attempt:  # else a retried full pull
                copy = self._copies[worker] = _Copy(attempt)
            self._started.setdefault(worker, set()).add(attempt)
        return copy

    def _named(self, worker: int, attempt: int, replica: Any) -> list[np.ndarray]:
        """The copy ``replica`` names (the base or a pending one), checked; changes
        nothing."""
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
        if replica in copy.pending:
            return copy.pending[replica]
        if replica == copy.base_id and copy.base is not None:
            return copy.base
        known = [n for n in (copy.base_id, *copy.pending) if n != FULL]
        raise StoreError(
            400,
            f"Worker {worker} names copy {replica} of the center; the service sent it "
            f"{known or 'none'}. Expected one of those (or {FULL} for the full weights).",
        )

    def _confirm(self, worker: int, replica: int) -> _Copy:
        """Makes the copy ``replica`` names (checked by :meth:`_named`) the base."""
        copy = self._copies[worker]
        if replica in copy.pending:
            copy.base_id, copy.base = replica, copy.pending[replica]
            copy.pending.clear()
        return copy

    def _hold(self, copy: _Copy, number: int, arrays: list[np.ndarray]) -> None:
        """Records an answer's copy as pending (the oldest dropped past the bound)."""
        copy.pending[number] = arrays
        while len(copy.pending) > MAX_PENDING:
            del copy.pending[next(iter(copy.pending))]

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
