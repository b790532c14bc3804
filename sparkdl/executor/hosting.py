"""The parameter service inside the training job (``service_placement="cluster"``).

Over Spark Connect the user's process may be one that no executor can reach (a laptop,
a notebook container, Databricks serverless), so the service runs beside a worker of
the barrier stage, as PySpark's TorchDistributor runs its rendezvous in barrier task 0.
Every worker, once its partition is cached, enters :class:`Hosted`:

1. Worker 0 builds the store from the newest *snapshot* on its machine (the service's
   host writes one after every closed epoch, in the checkpoint format, to the
   executor's local disk), else from the model, and starts the service on its
   executor's address (TLS as the plan says, the fit's token, and the relay's routes
   for the driver: :mod:`sparkdl.server.relay`).
2. One ``allGather`` gives every worker the service's URL, certificate and starting
   epoch, and how many epochs each worker's machine has a snapshot of. If another
   machine holds a newer snapshot (a retried stage after worker 0 moved), worker 0
   stops its service and the worker with the newest one (the lowest id among equals)
   hosts instead, shared by a second ``allGather``: the retried stage finds the center
   where it survived. Each gather costs its waiters up to a second (Spark polls a
   barrier once a second), so a first attempt makes only one.
3. Each worker writes the service's address (never the token) to a *rendezvous file*
   of its own on its machine, where the driver's relay jobs find it
   (:mod:`sparkdl.relay`).
4. After training, each worker tells the service it left (``POST /leave``); the host
   waits until every worker left, then returns the service's result (weights,
   history, status) as extra result rows (:func:`sparkdl.payload.result_rows`) and
   stops it.

If the host's Python process dies, Spark retries the whole barrier stage (its output
feeds a shuffle: :func:`sparkdl.fit._run_barrier_job`); the new attempt rejoins at step
1 and resumes from the last closed epoch.

Example:
    >>> _choose_host([3, 5, 5, None])
    1
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import shutil
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from sparkdl.payload import Hosting, WorkerPayload, result_rows

__all__ = ["PRUNE_SECONDS", "Hosted", "prune", "read_rendezvous", "rendezvous_dir"]

_log = logging.getLogger(__name__)

#: Rendezvous files and snapshots untouched for this long belong to fits that ended
#: (:func:`prune`).
PRUNE_SECONDS = 2 * 24 * 3600.0


class Hosted:
    """This worker's part in hosting the fit's service.

    Args:
        payload: The driver's payload (its ``hosting`` set).
        context: The task's ``BarrierTaskContext``.
        worker: This worker's id.
        keras_ready: Waits until Keras is imported (the host builds the model).

    Attributes:
        payload: The payload to train with: the service's URL and certificate, and
            the epoch training resumes at.
    """

    def __init__(
        self,
        payload: WorkerPayload,
        context: Any,
        worker: int,
        keras_ready: Callable[[], None],
    ) -> None:
        assert payload.hosting is not None
        self.hosting: Hosting = payload.hosting
        self.payload = payload
        self._context = context
        self._worker = worker
        self._keras_ready = keras_ready
        self._service: Any = None
        self._keeper: _Keeper | None = None
        self._rendezvous: str | None = None
        self._complete = False  # the host saw the fit's training end

    def __enter__(self) -> Hosted:
        try:
            return self._enter()
        except BaseException:
            self.__exit__(*sys.exc_info())  # a started service stops with the task
            raise

    def _enter(self) -> Hosted:
        prune()
        snapshots = _snapshot_dir(self.hosting.fit_id)
        mine = self._newest_snapshot(snapshots)
        # Worker 0 offers the service; one allGather shares its address and every
        # worker's newest snapshot. Only a retried stage whose newest snapshot is on
        # another machine needs a second gather, with that worker as the host.
        host = 0
        answers, error = self._offer(host, snapshots, mine)
        newest = _choose_host([json.loads(a)["epochs"] for a in answers])
        if newest != host:
            self._stop_service()
            host = newest
            answers, error = self._offer(host, snapshots, mine)
        if error is not None:
            raise error  # this worker stays the host and could not serve
        found = json.loads(answers[host])
        if "url" not in found:
            raise RuntimeError(
                f"Worker {host} could not start the parameter service (its task's error "
                "says why); this worker stops with it."
            )
        attempt = int(self._context.taskAttemptId())
        self._rendezvous = _write_rendezvous(self.hosting.fit_id, self._worker, attempt, found)
        plan = dataclasses.replace(self.payload.plan, initial_epoch=int(found["initial_epoch"]))
        self.payload = dataclasses.replace(
            self.payload,
            plan=plan,
            url=found["url"],
            tls_cert=found["cert"].encode() if found["cert"] else None,
        )
        return self

    def _newest_snapshot(self, snapshots: str) -> int | None:
        """Epochs the newest snapshot of this fit on this machine holds (``None``)."""
        from sparkdl import checkpoints

        return checkpoints.latest_epoch(snapshots)

    def _offer(
        self, host: int, snapshots: str, mine: int | None
    ) -> tuple[list[str], Exception | None]:
        """One ``allGather``: every worker's newest snapshot, and from ``host`` the
        service it started (its URL, certificate and starting epoch).

        Returns:
            The gathered messages, and the error of a host that could not serve: it
            still takes part in the gather (every worker takes part in every gather, or
            the others wait for ever) and raises only if it stays the host.
        """
        message: dict[str, Any] = {"epochs": mine}
        error = None
        if host == self._worker:
            try:
                message.update(self._serve(snapshots))
            except Exception as exc:
                _log.warning("sparkdl: worker %d could not start the service: %s", host, exc)
                self._stop_service()
                error = exc
        return list(self._context.allGather(json.dumps(message))), error

    def _stop_service(self) -> None:
        """Stops this worker's service and its snapshots, if it started them."""
        if self._keeper is not None:
            self._keeper.stop()
            self._keeper = None
        if self._service is not None:
            self._service.stop()
            self._service = None

    def finish(self) -> list[pa.RecordBatch]:
        """The host waits until every worker left (``/leave``: each tells the service
        when its training ended) and returns the service's result rows; the others
        return at once. The store wakes the host as the last worker leaves, where a
        Spark barrier would cost up to a second."""
        if self._service is None:
            return []
        store = self._service.store
        # No deadline, as a barrier: a failed worker's task ends the stage (an abort
        # ends the wait too).
        store.wait_left(math.inf)
        status = dict(store.status(), url=self._service.url)
        self._complete = bool(status["stop_requested"]) or (
            int(status["epochs_done"]) >= self.payload.plan.epochs
        )
        return result_rows(store.weights(), store.history(), status, store.failures())

    def __exit__(self, *exc: Any) -> None:
        self._stop_service()
        if self._rendezvous is not None:
            with contextlib.suppress(OSError):
                os.remove(self._rendezvous)
        if exc[0] is None and self._complete:
            # Every epoch closed (or the driver stopped the fit): no retry needs the
            # snapshots. Kept otherwise, so that a host that stopped early (a forged
            # leave) costs a retried stage no more than the epoch in progress.
            shutil.rmtree(_snapshot_dir(self.hosting.fit_id), ignore_errors=True)

    # ---------------------------------------------------------------- the host
    def _serve(self, snapshots: str) -> dict[str, Any]:
        """Builds the store (from the newest snapshot, else the model) and starts the
        service; returns what the other workers need."""
        from sparkdl import checkpoints
        from sparkdl.metric_states import MetricStates
        from sparkdl.server.service import ParameterService
        from sparkdl.server.store import WeightStore
        from sparkdl.server.tls import Certificate

        self._keras_ready()
        payload, hosting = self.payload, self.hosting
        plan = payload.plan
        model = _model(payload)
        snapshot = checkpoints.latest(snapshots)
        weights = snapshot.weights if snapshot else model.get_weights()
        history = snapshot.history if snapshot else hosting.history
        metrics = MetricStates(
            lambda: model, payload.input_shapes, payload.label_kinds, payload.label_shapes
        )
        store = WeightStore.for_plan(
            plan,
            weights,
            history=history,
            gate_epochs=hosting.gate_epochs,
            metric_merge=metrics.results,
        )
        store.plan_rows(hosting.planned_rows)
        host = hosting.bind_host or _executor_host(self._context, self._worker)
        certificate = Certificate.make(host) if plan.service_tls else None
        service = ParameterService(
            store,
            host=host,
            port=plan.port,
            token=payload.token,
            tls=certificate,
            relay_digest=hosting.relay_digest,
        ).start()
        self._service = service
        done = snapshot.epoch if snapshot else plan.initial_epoch
        self._keeper = _Keeper(store, snapshots, done)
        if snapshot:
            _log.warning(
                "sparkdl: the parameter service resumes from the snapshot after epoch %d", done
            )
        return {
            "url": service.url,
            "cert": certificate.pem.decode() if certificate else "",
            "initial_epoch": done,
        }


def rendezvous_dir() -> str:
    """This machine's directory of rendezvous and snapshot files (the user's only)."""
    path = os.path.join(tempfile.gettempdir(), f"sparkdl-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    found = os.lstat(path)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        raise PermissionError(
            f"{path} is not a directory of this user's alone (another user's, a link, or "
            "open to others): remove it, or set TMPDIR for the executors."
        )
    return path


def read_rendezvous(fit_id: str) -> dict[str, Any] | None:
    """The service's address as the newest task attempt on this machine wrote it, or
    ``None``.

    Each worker writes a file of its own, named by its task attempt (a worker that ends
    early removes only its own); the highest attempt id is the newest stage attempt's,
    whose service is the live one (Spark numbers task attempts in launch order).
    """
    files = _rendezvous_files(fit_id)
    if not files:
        return None
    try:
        with open(files[max(files)]) as f:
            found: dict[str, Any] = json.load(f)
    except (OSError, ValueError):
        return None
    return found


def prune(older_than: float = PRUNE_SECONDS) -> None:
    """Removes the rendezvous files and snapshots of fits that ended long ago.

    A fit that completes removes its own; one that failed, was cancelled, or whose
    service moved to another machine leaves them (a snapshot holds the model's
    weights). Each hosted fit prunes what has not changed for ``older_than`` seconds
    (a running fit rewrites its snapshot every epoch).
    """
    directory = rendezvous_dir()
    deadline = time.time() - older_than
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            path = os.path.join(directory, name)
            with contextlib.suppress(OSError):
                if os.lstat(path).st_mtime >= deadline:
                    continue
                if name.endswith("-snapshots"):
                    shutil.rmtree(path, ignore_errors=True)
                elif name.endswith(".json") or name.startswith(".rendezvous-"):
                    os.remove(path)


# -------------------------------------------------------------------- helpers
class _Keeper:
    """Writes a snapshot (the checkpoint format, newest only) after every closed epoch,
    where a retried stage's host finds it."""

    def __init__(self, store: Any, directory: str, done: int) -> None:
        self._store = store
        self._directory = directory
        self._done = done
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sparkdl-snapshots", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()  # a snapshot being written ends before anything removes it

    def _loop(self) -> None:
        from sparkdl import checkpoints

        store = self._store
        while not self._stop.is_set() and not store.aborted_event.is_set():
            closed = store.wait_epochs(self._done + 1, 0.5)
            if closed <= self._done:
                continue
            weights = store.epoch_weights(closed - 1, wait=60.0)
            history = {k: v[:closed] for k, v in store.history().items()}
            try:
                checkpoints.write(self._directory, closed, weights, history, {}, keep=1)
            except OSError as exc:  # a full disk costs the resume, not the fit
                _log.warning("sparkdl: could not write the service's snapshot: %s", exc)
            self._done = closed


def _choose_host(counts: list[int | None]) -> int:
    """The worker with the newest snapshot (the lowest id among equals)."""
    best = max(-1 if c is None else c for c in counts)
    return next(i for i, c in enumerate(counts) if (-1 if c is None else c) == best)


def _snapshot_dir(fit_id: str) -> str:
    return os.path.join(rendezvous_dir(), f"{_safe(fit_id)}-snapshots")


def _write_rendezvous(fit_id: str, worker: int, attempt: int, found: dict[str, Any]) -> str:
    """Writes the service's address (URL, certificate) where relay tasks find it, in
    this task attempt's own file; removes the files of older attempts of this fit on
    this machine (a killed attempt's, which name a dead service)."""
    path = os.path.join(rendezvous_dir(), f"{_safe(fit_id)}.a{attempt}.w{worker}.json")
    text = json.dumps({"url": found["url"], "cert": found["cert"]})
    fd, staging = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".rendezvous-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(staging, path)
    for older, stale in _rendezvous_files(fit_id).items():
        if older < attempt:
            with contextlib.suppress(OSError):
                os.remove(stale)
    return path


def _rendezvous_files(fit_id: str) -> dict[int, str]:
    """This fit's rendezvous files on this machine, by task attempt id."""
    directory = rendezvous_dir()
    prefix = f"{_safe(fit_id)}.a"
    found: dict[int, str] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            if not (name.startswith(prefix) and name.endswith(".json")):
                continue
            attempt = name[len(prefix) :].split(".", 1)[0]
            if attempt.isdigit():
                found[int(attempt)] = os.path.join(directory, name)
    return found


def _safe(fit_id: str) -> str:
    return "".join(c for c in fit_id if c.isalnum() or c in "-_")[:100]


def _executor_host(context: Any, worker: int) -> str:
    """This task's executor address, as Spark knows it (``host:port``)."""
    address = str(context.getTaskInfos()[worker].address)
    host = address.rsplit(":", 1)[0]
    return host.strip("[]") or "127.0.0.1"


def _model(payload: WorkerPayload) -> Any:
    import cloudpickle

    from sparkdl.keras_io import model_from_bytes

    custom = cloudpickle.loads(payload.custom_objects) if payload.custom_objects else None
    return model_from_bytes(payload.model_bytes.value, custom)
