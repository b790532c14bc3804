"""The relay's client half: follow a fit whose service runs in the cluster, by Spark jobs.

With ``service_placement="cluster"`` (:mod:`sparkdl.executor.hosting`) the user's process
never connects to the service and never listens on a socket: all it can do is run Spark
jobs, which is all a Spark Connect client can do. :class:`Relay` is the
:class:`~sparkdl.server.state.events.FitEvents` the progress bar and the driver's callbacks
follow; a thread keeps it current with small *poll jobs*, one task each, that run in a
task slot the training job leaves free. The task reads the service's address from the
rendezvous file the workers wrote on its machine, sends what the driver decided (the
epoch gate's release, ``stop_training``, a new learning rate, an abort) to the
service's relay routes (:mod:`sparkdl.server.web.relay`), long-polls for the next closed
epoch (:data:`Relay.POLL_WAIT` seconds), and returns the status, and the weights of a
newly closed epoch when callbacks need them, as its rows. The relay's token travels in
the job, never to the training tasks (the service keeps its SHA-256).

A poll job that finds no rendezvous (the workers are still caching, a retried stage is
starting, or the task ran on an executor without a worker) answers so and the next one
tries again. When the training job ends, the host's result rows (:func:`finish`)
complete the history and the weights, so the callbacks catch up on what polls missed.

Example:
    >>> Relay.POLL_WAIT
    1.0
"""

from __future__ import annotations

import importlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

    from sparkdl.compat.sessions import SessionTools

__all__ = ["POLL_SCHEMA", "Relay", "poll_function"]

_log = logging.getLogger(__name__)

#: Schema of a poll task's rows: ``kind`` is ``"status"`` (JSON body), ``"weights"``
#: (part ``part`` of an epoch's weights in the wire format) or ``"missing"`` (no
#: rendezvous, or no answer: the body says why).
POLL_SCHEMA = "kind string, part int, body binary"
_CHUNK = 4 << 20


class Relay:
    """The running fit as the driver's threads see it, kept current by poll jobs.

    Args:
        spark: The session (classic or Spark Connect).
        tools: Its :class:`~sparkdl.compat.sessions.SessionTools`.
        group: The fit's job group or tag (Ctrl-C cancels the polls with the fit).
        request: What each poll task needs: the fit id, the relay's token, the
            service's TLS setting, timeouts (:func:`poll_function`).
        epochs: The epoch the fit ends at.
        history: Logs of the epochs done before (a resumed fit).
        want_weights: Fetch each closed epoch's weights (the callbacks read them).
    """

    POLL_WAIT = 1.0
    #: Seconds between polls when one found no service (the workers still cache).
    IDLE_SECONDS = 0.5

    def __init__(
        self,
        spark: Any,
        tools: SessionTools,
        group: str,
        request: dict[str, Any],
        *,
        epochs: int,
        history: dict[str, list[float]] | None,
        want_weights: bool,
    ) -> None:
        self._spark = spark
        self._tools = tools
        self._group = group
        self._request = dict(request)
        self._epochs = epochs
        self._want_weights = want_weights
        history = {k: list(v) for k, v in (history or {}).items()}
        self._status: dict[str, Any] = {
            "samples_seen": 0,
            "epochs_done": len(next(iter(history.values()), [])),
            "history": history,
            "workers": {},
            "failures": {},
            "aborted": None,
        }
        self._weights: dict[int, list[np.ndarray]] = {}
        #: The outer optimizer's state by epoch, as the weights' polls brought it.
        self._outer: dict[int, tuple[list[np.ndarray], int]] = {}
        self._served = -1  # the epoch whose weights epoch_weights last returned
        self._lock = threading.Condition()
        self._released = 0
        self._stop_requested = False
        self._rate: float | None = None
        self._abort: str | None = None
        self._finished = False
        self._over = threading.Event()
        self._wake = threading.Event()
        self.polls = 0
        self.aborted_event = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sparkdl-relay", daemon=True)

    # ----------------------------------------------------------- the fit's side
    def start(self) -> None:
        """Starts polling."""
        self._thread.start()

    def stop(self) -> None:
        """Stops polling (the poll in flight ends within its wait)."""
        self._over.set()
        self._wake.set()
        self._thread.join(timeout=self.POLL_WAIT + 30)

    def finish(
        self,
        history: dict[str, list[float]],
        status: dict[str, Any],
        weights: list[np.ndarray],
        outer: tuple[list[np.ndarray], int] | None = None,
    ) -> None:
        """The training job ended: its hosts' result completes what polls missed."""
        with self._lock:
            self._status = dict(status, history=history)
            self._weights[self._epochs] = weights  # later than every epoch
            if outer is not None:
                self._outer[self._epochs] = outer
            self._finished = True
            self._lock.notify_all()

    def failures(self) -> dict[int, str]:
        """``{worker: traceback}`` of the failures the service reported so far."""
        with self._lock:
            return {int(k): v for k, v in (self._status.get("failures") or {}).items()}

    # ----------------------------------------------------- FitEvents (threads)
    def wait_epochs(self, count: int, wait: float) -> int:
        """Waits up to ``wait`` seconds until ``count`` epochs closed; returns how many."""
        deadline = time.monotonic() + wait
        with self._lock:
            while self._status["epochs_done"] < count and not self._idle():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._lock.wait(min(left, 0.5))
            return int(self._status["epochs_done"])

    def history(self) -> dict[str, list[float]]:
        """The closed epochs' logs."""
        with self._lock:
            return {k: list(v) for k, v in self._status["history"].items()}

    def status(self) -> dict[str, Any]:
        """The service's latest status, as the last poll brought it."""
        with self._lock:
            return dict(self._status)

    def epoch_weights(self, epoch: int, wait: float) -> list[np.ndarray]:
        """The weights as ``epoch`` ended, or those of the nearest later epoch a poll
        brought (an asynchronous fit's callbacks may lag its epochs)."""
        deadline = time.monotonic() + wait
        with self._lock:
            while True:
                later = [e for e in self._weights if e >= epoch]
                if later:
                    self._served = min(later)
                    for old in [e for e in self._weights if e < self._served]:
                        del self._weights[old]  # the callbacks go on in order
                        self._outer.pop(old, None)
                    return self._weights[self._served]
                left = deadline - time.monotonic()
                if left <= 0 or self._idle():
                    raise TimeoutError(f"The weights of epoch {epoch} did not arrive.")
                self._wake.set()
                self._lock.wait(min(left, 0.5))

    def epoch_outer_state(self) -> tuple[list[np.ndarray], int] | None:
        """The outer optimizer's state that came with the weights
        :meth:`epoch_weights` last returned (``None`` without one)."""
        with self._lock:
            return self._outer.get(self._served)

    def release(self, epoch: int) -> None:
        """The callbacks ran on ``epoch``: the next poll lets the workers go on."""
        with self._lock:
            self._released = max(self._released, epoch + 1)
        self._wake.set()

    def request_stop(self) -> None:
        """The next poll stops every worker at its next sync."""
        with self._lock:
            self._stop_requested = True
        self._wake.set()

    def set_learning_rate(self, rate: float) -> None:
        """The next poll sends a new learning rate to the workers."""
        with self._lock:
            self._rate = float(rate)
        self._wake.set()

    def abort(self, reason: str) -> None:
        """Aborts the fit (the driver cancels its job; the next poll tells the service)."""
        with self._lock:
            self._abort = reason[:500]
            self._lock.notify_all()
        self.aborted_event.set()
        self._wake.set()

    # ------------------------------------------------------------------ polls
    def _idle(self) -> bool:
        return self._finished or self._abort is not None or self._over.is_set()

    def _loop(self) -> None:
        with self._tools.jobs_named(self._group, "sparkdl relay: the fit's progress"):
            while not self._over.is_set():
                self._wake.clear()  # a decision made from here on polls at once
                query, fetched = self._query()
                try:
                    rows = self._poll(query, fetched)
                except Exception as exc:  # the job cancelled at the fit's end, say
                    if self._over.is_set():
                        return
                    _log.debug("sparkdl relay: a poll failed: %s", exc)
                    self._over.wait(self.IDLE_SECONDS)
                    continue
                self.polls += 1
                if not self._take(rows) or self._owed():
                    self._wake.wait(self.IDLE_SECONDS)

    def _owed(self) -> bool:
        """The callbacks have an epoch to run on, and the workers wait for them."""
        with self._lock:
            done = int(self._status["epochs_done"])
            return self._want_weights and self._released < done and done - 1 in self._weights

    def _query(self) -> tuple[dict[str, Any], int]:
        with self._lock:
            status = self._status
            done = int(status["epochs_done"])
            query: dict[str, Any] = {"known": done, "released": self._released}
            if self._stop_requested:
                query["stop"] = 1
            if self._rate is not None:
                query["lr"] = repr(self._rate)
            if self._abort is not None:
                query["abort"] = self._abort
            fetched = max(self._weights, default=-1)
            # Nothing to wait for while the callbacks still owe a release.
            behind = self._want_weights and done > 0 and fetched < done - 1
            owed = self._want_weights and self._released < done
            query["wait"] = 0.0 if behind or owed else self.POLL_WAIT
        return query, fetched

    def _poll(self, query: dict[str, Any], fetched: int) -> list[Any]:
        # With callbacks, the task also brings the weights of an epoch newer than
        # ``fetched`` (the one its long poll saw close): one job per epoch.
        request = dict(self._request, query=query, fetched=fetched if self._want_weights else None)
        frame = self._spark.range(0, 1, 1, 1).mapInArrow(poll_function(request), POLL_SCHEMA)
        return list(frame.collect())

    def _take(self, rows: list[Any]) -> bool:
        """Takes a poll's rows; whether it reached the service."""
        status = next((r for r in rows if r["kind"] == "status"), None)
        if status is None:
            missing = next((r for r in rows if r["kind"] == "missing"), None)
            if missing is not None:
                _log.debug("sparkdl relay: %s", bytes(missing["body"]).decode())
            return False
        parts = sorted((r["part"], bytes(r["body"])) for r in rows if r["kind"] == "weights")
        found = json.loads(bytes(status["body"]))
        weights = None
        if parts:
            from sparkdl.protocol import wire

            arrays, meta = wire.decode(b"".join(p for _, p in parts))
            arrays = [np.array(a) for a in arrays]
            outer = None
            if "outer_pushes" in meta:  # the outer optimizer's state follows the weights
                count = len(arrays) // 3
                outer = (arrays[count:], int(meta["outer_pushes"]))
                arrays = arrays[:count]
            weights = (int(meta.get("epoch", 0)), arrays, outer)
        with self._lock:
            if not self._finished:
                self._status = found
                if weights is not None:
                    self._weights[weights[0]] = weights[1]
                    if weights[2] is not None:
                        self._outer[weights[0]] = weights[2]
                if found.get("aborted") and found.get("failures"):
                    # A worker's fatal failure (not the service's stop as the job
                    # ends): the driver cancels the job rather than let Spark retry.
                    self.aborted_event.set()
            self._lock.notify_all()
        return True


def poll_function(
    request: dict[str, Any],
) -> Callable[[Iterable[pa.RecordBatch]], Iterable[pa.RecordBatch]]:
    """The function a poll job's one task runs (names its module, like the training
    task's): see :class:`Relay`."""

    def poll(batches: Iterable[pa.RecordBatch]) -> Iterable[pa.RecordBatch]:
        for _ in batches:
            pass
        relay = importlib.import_module("sparkdl.driver.relay")
        yield relay.poll_rows(request)

    return poll


def poll_rows(request: dict[str, Any]) -> pa.RecordBatch:
    """On an executor: one exchange with the service's relay routes, as rows of
    :data:`POLL_SCHEMA`."""
    import pyarrow as pa

    from sparkdl.contract.rendezvous import read_rendezvous
    from sparkdl.errors import ServiceError

    kinds: list[str] = []
    parts: list[int] = []
    bodies: list[bytes] = []

    def add(kind: str, body: bytes, part: int = 0) -> None:
        kinds.append(kind)
        parts.append(part)
        bodies.append(body)

    found = read_rendezvous(request["fit_id"])
    if found is None:
        add("missing", b"no rendezvous on this executor yet")
    else:
        try:
            status, blob = _exchange(request, found)
            add("status", status)
            for i in range(0, len(blob), _CHUNK):
                add("weights", blob[i : i + _CHUNK], i // _CHUNK)
        except (ServiceError, OSError, ValueError) as exc:
            add("missing", f"the service did not answer: {exc}"[:1000].encode())
    return pa.RecordBatch.from_pydict(
        {"kind": kinds, "part": parts, "body": bodies},
        schema=pa.schema([("kind", pa.string()), ("part", pa.int32()), ("body", pa.binary())]),
    )


def _exchange(request: dict[str, Any], found: dict[str, Any]) -> tuple[bytes, bytes]:
    """The relay's exchange with every shard of the service at once: the joined status
    (JSON) and, when the driver wants them, the weights of a newly closed epoch (wire
    format, empty if none)."""
    from concurrent.futures import ThreadPoolExecutor

    from sparkdl.errors import ServiceError
    from sparkdl.protocol import wire
    from sparkdl.protocol.client import ServiceClient
    from sparkdl.sync.shards import joined_status

    query = dict(request["query"])
    urls, certs = list(found["urls"]), list(found["certs"])
    clients = [
        ServiceClient(
            url,
            request["token"],
            worker=0,
            timeout=max(float(request["timeout"]), float(query.get("wait", 0)) + 5),
            retries=1,
            tls_cert=cert.encode() if cert else None,
        )
        for url, cert in zip(urls, certs, strict=True)
    ]

    def get(j: int, path: str) -> bytes:
        status, data = clients[j].get(path)
        if status != 200:
            raise ServiceError(f"relay answered {status}: {bytes(data)[:300]!r}")
        return bytes(data)

    def weights(j: int, epoch: int) -> tuple[list[np.ndarray], dict[str, Any]] | None:
        status, data = clients[j].get(f"/relay/weights?epoch={epoch}")
        return wire.decode(bytes(data)) if status == 200 else None

    try:
        with ThreadPoolExecutor(len(clients)) as pool:
            path = f"/relay?{urlencode(query)}"
            statuses = [json.loads(b) for b in pool.map(lambda j: get(j, path), range(len(urls)))]
            status = statuses[0] if len(urls) == 1 else joined_status(statuses)
            blob = b""
            known = int(status.get("epochs_done", 0))
            if request["fetched"] is not None and known - 1 > request["fetched"]:
                parts = list(pool.map(lambda j: weights(j, known - 1), range(len(urls))))
                if all(p is not None for p in parts):
                    blob = _joined_weights(
                        [p for p in parts if p is not None], request.get("layout"), known - 1
                    )
    finally:
        for client in clients:
            client.close()
    return json.dumps(status).encode(), blob


def _joined_weights(
    parts: list[tuple[list[np.ndarray], dict[str, Any]]],
    layout: dict[str, Any] | None,
    epoch: int,
) -> bytes:
    """Every shard's answer of ``/relay/weights`` (its part of the weights, then of the
    outer optimizer's state) as one answer for the whole model (wire format)."""
    from sparkdl.protocol import wire
    from sparkdl.sync.shards import ShardLayout, join_outer

    meta: dict[str, Any] = {"epoch": epoch}
    if len(parts) == 1:
        arrays = parts[0][0]
        meta.update({k: v for k, v in parts[0][1].items() if k == "outer_pushes"})
    else:
        shards = ShardLayout.from_json(layout or {})
        sizes = [len(pieces) for pieces in shards.shards]
        arrays = shards.join([a[:n] for (a, _), n in zip(parts, sizes, strict=True)])
        if "outer_pushes" in parts[0][1]:
            states = [(a[n:], 0) for (a, _), n in zip(parts, sizes, strict=True)]
            arrays = arrays + join_outer(shards, states)
            meta["outer_pushes"] = parts[0][1]["outer_pushes"]
    return b"".join(wire.encode([np.asarray(a) for a in arrays], meta))
