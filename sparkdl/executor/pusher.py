"""Sends a worker's pushes and folds the service's answers into its weights.

The fit's merge says what to push and how an answer changes the local weights; the
pusher keeps what that needs between syncs (the center last received, the push in
flight) and does the waiting. A push either waits for its answer, or (``overlap``, in
asynchronous modes) leaves from a background thread while training goes on: the
worker takes the step the push implies at once (:meth:`Merge.moved`) and folds the
answer in at its next sync (:meth:`Merge.settle`), so the round trip hides behind
compute and every step is still pushed exactly once.

With a codec (``compression=...``, :mod:`sparkdl.sync.codecs`) the pusher encodes
each update (for a merge that pushes weights, their difference to the copy of the
center it holds) and names its copy of the center with each push; an answer's arrays
are then the center's change since that copy (or the full weights), which it adds to
the copy (:func:`~sparkdl.sync.codecs.follow`) exactly as the service does
(:mod:`sparkdl.server.state.replicas`). Error feedback: what an encoding left out goes back
into the local weights with the answer (the center's copy plus the unsent part), so
the worker trains on with everything it learned and its next update carries the rest.
Keeping it apart as a residual while the worker restarts from the center did worse on
digits (3 seeds, a push every 4 batches: asynchronous delta with sign 0.9315 against
0.9639, top-k 0.9481 against 0.9519). Elastic averaging needs neither: its worker
moves by what the center received.

Example:
    >>> Pusher.__name__
    'Pusher'
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from sparkdl.executor.weight_access import WeightAccess
from sparkdl.protocol.client import ServiceClient
from sparkdl.sync.codecs import WHOLE, Codec, Compression, follow
from sparkdl.sync.merges import Merge, is_float

__all__ = ["Pusher"]


class Pusher:
    """One worker's pushes.

    Args:
        client: The worker's service client.
        merge: The fit's merge.
        weights: Read and write access to the model's weights.
        center: The center the worker starts from.
        version: That center's version.
        overlap: Push in the background; :meth:`push` with ``wait=True`` still waits.
        compression: Compress updates both ways (``None``: send them whole).
        replica: With a codec, the number of the copy of the center ``center`` is
            (the full pull's ``client.control["replica"]``).
    """

    def __init__(
        self,
        client: ServiceClient,
        merge: Merge,
        weights: WeightAccess,
        *,
        center: list[np.ndarray],
        version: int,
        overlap: bool,
        compression: Compression | None = None,
        replica: int | None = None,
    ) -> None:
        self.client = client
        self.merge = merge
        self.weights = weights
        self.overlap = overlap
        self.version = version
        #: Seconds training stood still waiting for the service.
        self.wait_seconds = 0.0
        self.pushes = 0
        #: Pushes sent whole under a codec, and their bytes.
        self.whole_pushes = 0
        self.whole_bytes = 0
        #: The control fields of the last answer folded in (stop, learning rate).
        self.control: dict[str, Any] = {}
        self._center = center
        self.codec = compression.push if compression else None
        self._answers = compression.answer if compression else None
        self._replica = replica
        self._specs = [(c.dtype, tuple(c.shape)) for c in center]
        #: What the last compressed push left out, as a change of the local weights.
        self._unsent: list[np.ndarray | None] = [None] * len(center)
        self._pool: ThreadPoolExecutor | None = None
        self._inflight: Future[tuple[list[np.ndarray], int]] | None = None
        self._at_push: list[np.ndarray] = []  # the weights right after that push

    @classmethod
    def after_pull(
        cls,
        client: ServiceClient,
        merge: Merge,
        weights: WeightAccess,
        *,
        center: list[np.ndarray],
        version: int,
        overlap: bool,
        compression: Compression | None,
    ) -> Pusher:
        """The pusher of a worker whose ``client`` just pulled ``center`` (full, under a
        codec): its copy of the center is the one that pull numbered."""
        return cls(
            client,
            merge,
            weights,
            center=center,
            version=version,
            overlap=overlap,
            compression=compression,
            replica=client.control.get("replica") if compression else None,
        )

    @property
    def center(self) -> list[np.ndarray]:
        """The center as this worker last received it."""
        return list(self._center)

    def push(
        self,
        samples: int,
        meta: dict[str, Any],
        *,
        wait: bool,
        whole: bool = False,
        index: int = 0,
    ) -> bool:
        """Pushes the local weights' update; waits for the answer unless overlapping.

        Args:
            samples: Samples trained on since the previous push.
            meta: The header's metadata (loss, epoch, epoch logs...).
            wait: Wait for this push's answer even when overlapping.
            whole: With a codec, send this update whole, so what error feedback held
                back reaches the center (the fit's closing push).
            index: The sync's index within its epoch (a sharded pusher's fragment
                follows from it; one pusher pushes every sync).

        Returns:
            Whether an answer was folded in (its :attr:`control` is then new).
        """
        # Elastic averaging holds nothing back: its pushes stay encoded.
        whole = whole and self.codec is not None and self.merge.error_feedback
        wait = wait or whole
        local = self.weights.get()
        settled = self._inflight is not None
        if settled:
            local = self._settle(local)
        sent_before = self.client.bytes_sent
        update = self.merge.outgoing(local, self._center)
        sent = update
        if self.codec is not None:
            if whole:
                meta = {**meta, "whole": True}
            sent, decoded = self._encode(update, WHOLE if whole else self.codec)
            if not self.merge.error_feedback:
                update = decoded  # the worker moves by what the center receives
        if self.overlap and not wait:
            after = self.merge.moved(local, update)
            if settled or after is not local:
                self.weights.set(after)
            self._at_push = after
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="sparkdl-push")
            self._inflight = self._pool.submit(
                self.client.push,
                sent,
                base_version=self.version,
                samples=samples,
                meta=meta,
                replica=self._replica,
            )
        else:
            start = time.perf_counter()
            answer, self.version = self.client.push(
                sent, base_version=self.version, samples=samples, meta=meta, replica=self._replica
            )
            self.wait_seconds += time.perf_counter() - start
            self._center, self.control = self._take(answer), self.client.control
            self.weights.set(self._keep_unsent(self.merge.incoming(local, update, self._center)))
            settled = True
        self.pushes += 1
        if whole:
            self.whole_pushes += 1
            self.whole_bytes += self.client.bytes_sent - sent_before
        return settled

    def flush(self) -> bool:
        """Waits for the answer to the push in flight, if any, and folds it in.

        Returns:
            Whether there was one.
        """
        if self._inflight is None:
            return False
        self.weights.set(self._settle(self.weights.get()))
        return True

    def close(self) -> None:
        """Waits for a push in flight (its error, if any, is the caller's to see)."""
        future, self._inflight = self._inflight, None
        if future is not None:
            future.exception()  # the client serves one call at a time
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _settle(self, local: list[np.ndarray]) -> list[np.ndarray]:
        """Waits for the push in flight and returns ``local`` with its answer folded in."""
        future, self._inflight = self._inflight, None
        assert future is not None
        start = time.perf_counter()
        answer, self.version = future.result()
        self.wait_seconds += time.perf_counter() - start
        self._center, self.control = self._take(answer), self.client.control
        return self._keep_unsent(self.merge.settle(local, self._at_push, self._center))

    def _encode(
        self, update: list[np.ndarray], codec: Codec
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """``codec``'s arrays for ``update`` (a difference: compression takes no merge
        that pushes weights) and what they decode to; what they leave out is kept
        (:attr:`_unsent`) to go back into the local weights with the answer."""
        parts = codec.encode(update)
        decoded = codec.decode(parts, self._specs)
        if self.merge.error_feedback:
            self._unsent = [
                self.merge.unsent_weights(u - d) if is_float(u) else None
                for u, d in zip(update, decoded, strict=True)
            ]
        return parts, decoded

    def _keep_unsent(self, local: list[np.ndarray]) -> list[np.ndarray]:
        """``local`` (the weights the answer set) plus what the last push left out, so
        the worker trains on with all it learned and its next push carries the rest
        (error feedback)."""
        unsent, self._unsent = self._unsent, [None] * len(local)
        return [w + u if u is not None else w for w, u in zip(local, unsent, strict=True)]

    def _take(self, answer: list[np.ndarray]) -> list[np.ndarray]:
        """The worker's copy of the center once ``answer`` arrived."""
        if self.codec is None:
            return answer
        control = self.client.control
        self._replica = int(control["replica"])
        if control.get("full"):
            return answer
        assert self._answers is not None
        return follow(self._center, self._answers.decode(answer, self._specs))
