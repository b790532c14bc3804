"""The parameter service inside the training job (``service_placement="cluster"``).

Over Spark Connect the user's process may be one that no executor can reach (a laptop,
a notebook container, Databricks serverless), so the service runs beside a worker of
the barrier stage, as PySpark's TorchDistributor runs its rendezvous in barrier task 0.
Every worker, once its partition is cached, enters :class:`Hosted`:

1. Worker j (j < ``service_shards``, one shard with the default of 1) builds shard j's
   store from the newest *snapshot* of it on its machine (each host writes one after
   every closed epoch, in the checkpoint format, to the executor's local disk), else
   from the model, and starts the shard's service on its executor's address (TLS as
   the plan says with a certificate of its own, the fit's token, and the relay's
   routes for the driver: :mod:`sparkdl.server.web.relay`).
2. One ``allGather`` gives every worker every shard's URL, certificate and starting
   epoch, and the epochs each worker's machine has a snapshot of, per shard. Every
   shard must resume from one epoch: the newest of which some machine holds a
   snapshot of every shard (:func:`_common_epoch`). If a host started from another
   one, or the snapshot is on another machine only (a retried stage after the
   workers moved), the hosts stop and the workers that hold it host instead
   (:func:`_choose_hosts`), shared by a second ``allGather``: the retried stage finds
   the center where it survived. Snapshots newer than that epoch are an abandoned
   attempt's and are removed. Each gather costs its waiters up to a second (Spark
   polls a barrier once a second), so a first attempt makes only one.
3. Each worker writes every shard's address (never the token) to a *rendezvous file*
   of its own on its machine, where the driver's relay jobs find it
   (:mod:`sparkdl.driver.relay`).
4. After training, each worker tells every shard it left (``POST /leave``); each host
   waits until every worker left its shards, then returns their results (weights,
   history, status, the outer optimizer's state) as extra result rows
   (:func:`sparkdl.contract.payload.result_rows`) and stops them.

If a host's Python process dies, Spark retries the whole barrier stage (its output
feeds a shuffle: :func:`sparkdl.driver.launcher.run_barrier_job`); the new attempt
rejoins at step 1 and resumes from the last epoch every shard closed and wrote.

Example:
    >>> _common_epoch([[[4, 5], [4]], [[], [5]]], shards=2)  # 2 workers, 2 shards
    5
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from sparkdl.contract.payload import Hosting, WorkerPayload, result_rows
from sparkdl.contract.rendezvous import (
    rendezvous_dir,
    safe_name,
    write_rendezvous,
)

if TYPE_CHECKING:
    from sparkdl.server.state.checkpoints import Checkpoint
    from sparkdl.server.state.store import WeightStore

__all__ = ["PRUNE_SECONDS", "Hosted", "prune"]

_log = logging.getLogger(__name__)

#: Rendezvous files and snapshots untouched for this long belong to fits that ended
#: (:func:`prune`).
PRUNE_SECONDS = 2 * 24 * 3600.0
#: How long a retried stage's host waits for a set ``port`` the attempt it replaces
#: still holds.
BIND_WAIT_SECONDS = 30.0


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
        self._services: list[Any] = []  # this worker's shards' services
        self._shards_served: list[int] = []
        self._keepers: list[_Keeper] = []
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
        shards = self.shards
        held = [self._held(j) for j in range(shards)]
        # Worker j offers shard j from its machine's newest snapshot of it; one
        # allGather shares the addresses and every machine's snapshots. Only a
        # retried stage whose common snapshot is elsewhere (or older than one a host
        # started from) needs a second gather, with the hosts that hold it.
        first = {j: j for j in range(shards)}
        newest = {j: held[j][-1] if held[j] else None for j in range(shards)}
        messages, errors = self._offer(first, newest, held)
        gathered = [m["held"] for m in messages]
        epoch = _common_epoch(gathered, shards)
        hosts = _choose_hosts(gathered, shards, epoch)
        if epoch is None and any(e for machine in gathered for e in machine):
            _log.warning(
                "sparkdl: no epoch has a snapshot of every shard (epochs held per worker "
                "and shard: %s): the service starts again from the model",
                gathered,
            )
        # Snapshots newer than the one every shard resumes from are an abandoned
        # attempt's: gone before training goes on (no epoch closes before every worker
        # is done here), so a later retry never mixes them with this attempt's.
        self._discard_after(epoch)
        start = self.payload.plan.initial_epoch if epoch is None else epoch
        if any(
            hosts[j] != j
            or messages[j]["served"].get(str(j), {}).get("initial_epoch", start) != start
            for j in range(shards)
        ):
            self._stop_services()
            messages, errors = self._offer(hosts, dict.fromkeys(hosts, epoch), held)
        for j in range(shards):
            if hosts[j] == self._worker and j in errors:
                raise errors[j]  # this worker stays shard j's host and could not serve
        found = []
        for j in range(shards):
            served = messages[hosts[j]]["served"].get(str(j))
            if served is None:
                reason = messages[hosts[j]].get("failed", {}).get(str(j), "")
                raise RuntimeError(
                    f"Worker {hosts[j]} could not start the parameter service"
                    f"{f' (shard {j})' if shards > 1 else ''}"
                    f"{f': {reason}' if reason else ''} (its task's error says more); "
                    "this worker stops with it, and Spark retries the stage."
                )
            found.append(served)
        attempt = int(self._context.taskAttemptId())
        urls = [f["url"] for f in found]
        certs = [f["cert"] for f in found]
        self._rendezvous = write_rendezvous(
            self.hosting.fit_id, self._worker, attempt, {"urls": urls, "certs": certs}
        )
        plan = dataclasses.replace(self.payload.plan, initial_epoch=int(found[0]["initial_epoch"]))
        self.payload = dataclasses.replace(
            self.payload,
            plan=plan,
            url=urls[0],
            tls_cert=certs[0].encode() if certs[0] else None,
            shard_urls=tuple(urls) if shards > 1 else (),
            shard_certs=tuple(c.encode() for c in certs) if shards > 1 and certs[0] else (),
        )
        return self

    @property
    def shards(self) -> int:
        """The service's shards (:mod:`sparkdl.sync.shards`)."""
        return int(self.payload.plan.service_shards)

    def _held(self, shard: int) -> list[int]:
        """The epochs this machine holds a snapshot of ``shard`` of, oldest first."""
        from sparkdl.server.state import checkpoints

        return checkpoints.epochs(_snapshot_dir(self.hosting.fit_id, shard))

    def _discard_after(self, epoch: int | None) -> None:
        """Removes this machine's snapshots of this fit newer than ``epoch`` (all of
        them for ``None``), of every shard."""
        from sparkdl.server.state import checkpoints

        for shard in range(self.shards):
            checkpoints.discard_after(_snapshot_dir(self.hosting.fit_id, shard), epoch)

    def _offer(
        self, hosts: dict[int, int], epochs: dict[int, int | None], held: list[list[int]]
    ) -> tuple[list[dict[str, Any]], dict[int, Exception]]:
        """One ``allGather``: every worker's snapshots, and from the host of each shard
        (``hosts``) the service it started (its URL, certificate and starting epoch),
        from its snapshot of ``epochs[shard]`` (``None``: from the model).

        Returns:
            The gathered messages, and the errors of shards this worker could not
            serve: it still takes part in the gather (every worker takes part in every
            gather, or the others wait for ever) and raises only if it stays the host.
        """
        message: dict[str, Any] = {"held": held, "served": {}}
        errors: dict[int, Exception] = {}
        for shard, host in sorted(hosts.items()):
            if host != self._worker:
                continue
            try:
                message["served"][str(shard)] = self._serve(shard, epochs[shard])
            except Exception as exc:
                _log.warning(
                    "sparkdl: worker %d could not start the service (shard %d): %s",
                    host,
                    shard,
                    exc,
                )
                errors[shard] = exc
        if errors:
            self._stop_services()
            message["served"] = {}
            message["failed"] = {
                str(j): f"{type(e).__name__}: {e}"[:500] for j, e in errors.items()
            }
        gathered = self._context.allGather(json.dumps(message))
        return [json.loads(m) for m in gathered], errors

    def _stop_services(self) -> None:
        """Stops this worker's services and their snapshots, if it started any."""
        for keeper in self._keepers:
            keeper.stop()
        self._keepers = []
        for service in self._services:
            service.stop()
        self._services = []
        self._shards_served = []

    def finish(self) -> list[pa.RecordBatch]:
        """Each host waits until every worker left its shards (``/leave``: each tells
        the service when its training ended) and returns their result rows; the
        others return at once. The store wakes the host as the last worker leaves,
        where a Spark barrier would cost up to a second."""
        rows: list[pa.RecordBatch] = []
        for shard, service in zip(self._shards_served, self._services, strict=True):
            store = service.store
            # No deadline, as a barrier: a failed worker's task ends the stage (an
            # abort ends the wait too).
            store.wait_left(math.inf)
            status = dict(store.status(), url=service.url)
            self._complete = bool(status["stop_requested"]) or (
                int(status["epochs_done"]) >= self.payload.plan.epochs
            )
            rows += result_rows(
                store.weights(),
                store.history(),
                status,
                store.failures(),
                shard=shard,
                outer=store.outer_state(),
            )
        return rows

    def __exit__(self, *exc: Any) -> None:
        self._stop_services()
        if self._rendezvous is not None:
            with contextlib.suppress(OSError):
                os.remove(self._rendezvous)
        if exc[0] is None and self._complete:
            # Every epoch closed (or the driver stopped the fit): no retry needs the
            # snapshots. Kept otherwise, so that a host that stopped early (a forged
            # leave) costs a retried stage no more than the epoch in progress.
            for shard in range(self.shards):
                shutil.rmtree(_snapshot_dir(self.hosting.fit_id, shard), ignore_errors=True)

    # ---------------------------------------------------------------- the host
    def _serve(self, shard: int, epoch: int | None) -> dict[str, Any]:
        """Builds ``shard``'s store (from its snapshot of ``epoch``, else the model)
        and starts its service; returns what the other workers need."""
        from sparkdl.server.web.service import ParameterService
        from sparkdl.server.web.tls import Certificate

        self._keras_ready()
        payload, hosting = self.payload, self.hosting
        plan = payload.plan
        store, snapshot = self._store(shard, epoch)
        host = hosting.bind_host or _executor_host(self._context, self._worker)
        certificate = Certificate.make(host) if plan.service_tls else None
        service = _start(
            lambda: ParameterService(
                store,
                host=host,
                port=plan.port + shard if plan.port else 0,  # a set port: shard j takes port + j
                token=payload.token,
                tls=certificate,
                relay_digest=hosting.relay_digest,
            ),
            wait=BIND_WAIT_SECONDS if plan.port else 0.0,
        )
        self._services.append(service)
        self._shards_served.append(shard)
        done = snapshot.epoch if snapshot else plan.initial_epoch
        # A sharded service keeps a few snapshots: the shards' newest may differ by
        # an epoch when a host dies, and a retried stage resumes from a common one.
        snapshots = _snapshot_dir(hosting.fit_id, shard)
        self._keepers.append(_Keeper(store, snapshots, keep=1 if self.shards == 1 else 3))
        if snapshot:
            _log.warning(
                "sparkdl: the parameter service%s resumes from the snapshot after epoch %d",
                f" (shard {shard})" if self.shards > 1 else "",
                done,
            )
        return {
            "url": service.url,
            "cert": certificate.pem.decode() if certificate else "",
            "initial_epoch": done,
        }

    def _store(self, shard: int, epoch: int | None) -> tuple[WeightStore, Checkpoint | None]:
        """``shard``'s store and the snapshot it starts from: this machine's snapshot
        of ``epoch``, or the model's weights (``None`` for the snapshot) when
        ``epoch`` is ``None``."""
        from sparkdl.contract.metric_states import MetricStates
        from sparkdl.server.state import checkpoints
        from sparkdl.server.state.store import WeightStore
        from sparkdl.sync.shards import ShardLayout

        payload, hosting = self.payload, self.hosting
        model = _model(payload)
        snapshots = _snapshot_dir(hosting.fit_id, shard)
        snapshot = checkpoints.latest(snapshots, epoch) if epoch is not None else None
        if epoch is not None and snapshot is None:
            raise FileNotFoundError(
                f"The snapshot of epoch {epoch} is gone from {snapshots} (removed since the "
                "gather): this stage fails and Spark's retry resumes from the snapshots "
                "left."
            )
        layout = ShardLayout.from_json(payload.shard_layout) if payload.shard_layout else None
        outer = hosting.outer_state(layout, shard)
        if snapshot:
            weights, outer = snapshot.weights, snapshot.outer
        elif layout is not None:
            weights = layout.split(model.get_weights())[shard]
        else:
            weights = model.get_weights()
        metrics = MetricStates(
            lambda: model, payload.input_shapes, payload.label_kinds, payload.label_shapes
        )
        store = WeightStore.for_plan(
            payload.plan,
            weights,
            history=snapshot.history if snapshot else hosting.history,
            gate_epochs=hosting.gate_epochs,
            metric_merge=metrics.results if shard == 0 else None,
            outer_state=outer,
            keep_epoch_copies=True,
        )
        store.plan_rows(hosting.planned_rows)
        return store, snapshot


def _start(make: Callable[[], Any], wait: float) -> Any:
    """Starts the service ``make()`` builds; a set port still held (by the service of
    the attempt this retried stage replaces, whose process Spark is still killing) is
    tried again for up to ``wait`` seconds."""
    import errno

    from sparkdl.errors import ServiceError

    deadline = time.monotonic() + wait
    while True:
        try:
            return make().start()
        except ServiceError as exc:
            cause = exc.__cause__
            busy = isinstance(cause, OSError) and (
                cause.errno == errno.EADDRINUSE or "in use" in str(cause)
            )
            if not busy or time.monotonic() >= deadline:
                raise
            time.sleep(0.5)


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
    """Writes a snapshot (the checkpoint format, the newest ``keep``) after every
    closed epoch, where a retried stage's host finds it."""

    def __init__(self, store: Any, directory: str, keep: int = 1) -> None:
        self._store = store
        self._keep = keep
        self._directory = directory
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sparkdl-snapshots", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()  # a snapshot being written ends before anything removes it

    def _loop(self) -> None:
        from sparkdl.server.state import checkpoints

        store = self._store
        while not self._stop.is_set() and not store.aborted_event.is_set():
            # Every closed epoch, in order, as the center was when it closed (the
            # store keeps the copies): each shard's snapshot of an epoch is of the
            # same round, so a retried stage can resume every shard from it.
            for epoch, weights, outer in store.take_epoch_copies(0.5):
                closed = epoch + 1
                history = {k: v[:closed] for k, v in store.history().items()}
                try:
                    checkpoints.write(
                        self._directory, closed, weights, history, {}, keep=self._keep, outer=outer
                    )
                except OSError as exc:  # a full disk costs the resume, not the fit
                    _log.warning("sparkdl: could not write the service's snapshot: %s", exc)


def _common_epoch(held: list[list[list[int]]], shards: int) -> int | None:
    """The newest epoch of which some machine holds a snapshot of every shard
    (``held[worker][shard]``: the epochs that worker's machine holds), or ``None``."""
    common: set[int] | None = None
    for shard in range(shards):
        found = {e for machine in held for e in machine[shard]}
        common = found if common is None else common & found
    return max(common) if common else None


def _choose_hosts(held: list[list[list[int]]], shards: int, epoch: int | None) -> dict[int, int]:
    """Shard j's host: worker j, unless ``epoch``'s snapshot of it is only on other
    machines: then the one of their workers hosting the fewest shards so far (the
    lowest id among equals), so that moved shards spread over a machine's workers.

    Example:
        >>> _choose_hosts([[[], []], [[4], [4]], [[4], [4]]], shards=2, epoch=4)
        {0: 1, 1: 1}
        >>> _choose_hosts([[[], [], []], [[4], [4], [4]], [[4], [4], [4]]], 3, epoch=4)
        {0: 1, 1: 1, 2: 2}
    """
    if epoch is None:
        return {j: j for j in range(shards)}
    hosts: dict[int, int] = {}
    for j in range(shards):
        if epoch in held[j][j]:
            hosts[j] = j
            continue
        candidates = [w for w, machine in enumerate(held) if epoch in machine[j]]
        load = [sum(1 for h in hosts.values() if h == w) for w in candidates]
        hosts[j] = min(zip(load, candidates, strict=True))[1]
    return hosts


def _snapshot_dir(fit_id: str, shard: int = 0) -> str:
    """Where a host keeps its snapshots of ``shard``."""
    name = (
        f"{safe_name(fit_id)}-snapshots"
        if shard == 0
        else f"{safe_name(fit_id)}-s{shard}-snapshots"
    )
    return os.path.join(rendezvous_dir(), name)


def _executor_host(context: Any, worker: int) -> str:
    """This task's executor address, as Spark knows it (``host:port``)."""
    address = str(context.getTaskInfos()[worker].address)
    host = address.rsplit(":", 1)[0]
    return host.strip("[]") or "127.0.0.1"


def _model(payload: WorkerPayload) -> Any:
    import cloudpickle

    from sparkdl.contract.keras_io import model_from_bytes

    custom = cloudpickle.loads(payload.custom_objects) if payload.custom_objects else None
    return model_from_bytes(payload.model_bytes.value, custom)
