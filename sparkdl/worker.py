"""The executor side of a fit: one Spark task per worker.

A task reads its partition once into numpy, joins the service (``/join``: in
synchronous mode it learns every worker's row count, so all workers agree on the
number of rounds per epoch), rebuilds the model from the ``.keras`` bytes, pulls the
service's current weights, and runs ``model.fit`` over every epoch with a callback
that pushes an update every ``frequency`` and continues from the answer. Synchronous
fits run as a barrier stage; asynchronous and hogwild fits as ordinary tasks, so a slow
or restarted worker never holds up the others.

A retried task (Spark re-runs it after a lost process or executor) rejoins where
training stands (:func:`resume_point`): synchronous workers at the last completed
round, asynchronous ones after their last applied push. It trains the rest of that
epoch on as many rows as were left (a fresh random subset of its partition), then the
remaining epochs.

The closure carries only plain data (:class:`WorkerPayload`): never the SparkSession,
the estimator or the service.

Example:
    >>> rounds_per_epoch([23, 22], every=4)
    6
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

__all__ = [
    "RESULT_SCHEMA",
    "WorkerPayload",
    "delta_scale_for",
    "make_train_function",
    "resume_point",
    "rounds_per_epoch",
    "train_rows",
]

#: Schema of the one row each worker returns.
RESULT_SCHEMA = "worker int, report string"


@dataclass(frozen=True)
class WorkerPayload:
    """Everything a worker needs, as plain values.

    Attributes:
        model_bytes: A Spark broadcast of the ``.keras`` archive bytes.
        custom_objects: cloudpickled ``custom_objects`` dict, or ``None``.
        url: The parameter service's URL.
        token: The fit's secret.
        input_shapes: Per-sample shape of each model input.
        label_kinds: ``"int"``, ``"float"`` or ``"array"``, per model output.
        epochs: Passes over the data.
        batch_size: Samples per step.
        sync_every: Batches between syncs, or ``None`` for epoch ends only.
        shuffle: Shuffle each epoch.
        seed: Base seed, or ``None``.
        threads: TensorFlow intra-op threads, or ``None``.
        request_timeout: Seconds per service call.
        request_retries: Retries per service call.
        mode: ``"synchronous"``, ``"asynchronous"`` or ``"hogwild"``.
        merge: ``"average"``, ``"delta"`` or ``"elastic"``.
        elastic_alpha: The elastic moving rate (``merge="elastic"``).
        delta_scale: Factor of an asynchronous delta, or ``None`` for
            :func:`delta_scale_for`'s default.
        validation_split: Fraction of this worker's rows held out for ``val_*`` logs.
        validation: A broadcast of ``(x, y)`` validation arrays, or ``None``; worker i
            evaluates rows ``i::num_workers``.
        num_workers: Number of workers.
        initial_epoch: Epochs done before this fit (a resumed fit starts after them).
        mixed_precision: Compute in float16 with float32 variables.
        overlap: Asynchronous modes: push in the background and fold the answer in at
            the next sync (see :class:`sparkdl.merging.WorkerMerge`).
    """

    model_bytes: Any
    custom_objects: bytes | None
    url: str
    token: str
    input_shapes: list[tuple[int, ...]]
    label_kinds: list[str]
    epochs: int
    batch_size: int
    sync_every: int | None
    shuffle: bool
    seed: int | None
    threads: int | None
    request_timeout: float
    request_retries: int
    mode: str = "synchronous"
    merge: str = "average"
    elastic_alpha: float = 0.0
    delta_scale: float | None = None
    validation_split: float = 0.0
    validation: Any = None
    num_workers: int = 1
    initial_epoch: int = 0
    mixed_precision: bool = False
    overlap: bool = False


def make_train_function(
    payload: WorkerPayload,
) -> Callable[[Iterable[pa.RecordBatch]], Iterable[pa.RecordBatch]]:
    """Returns the function ``mapInArrow`` runs on each partition (one worker each)."""

    def train_partition(batches: Iterable[pa.RecordBatch]) -> Iterable[pa.RecordBatch]:
        report = _run(payload, batches)
        yield pa.RecordBatch.from_pydict(
            {"worker": [report["worker"]], "report": [json.dumps(report)]},
            schema=pa.schema([("worker", pa.int32()), ("report", pa.string())]),
        )

    return train_partition


def train_rows(rows: int, validation_split: float) -> int:
    """Rows ``model.fit(validation_split=...)`` trains on (it holds out the last ones).

    Example:
        >>> train_rows(718, 0.1), train_rows(718, 0.0)
        (646, 718)
    """
    kept = math.floor(rows * (1.0 - validation_split))
    return kept if validation_split > 0 and kept > 0 else rows


def rounds_per_epoch(steps: list[int], every: int | None) -> int:
    """Synchronous rounds per epoch when workers take ``steps`` batches each.

    Every worker takes part in every round; one whose epoch is shorter pushes with zero
    samples, so partitions of different sizes never deadlock a round.
    """
    longest = max(steps) if steps else 0
    if every is None:
        return 1
    return max(1, math.ceil(longest / every))


def delta_scale_for(
    scale: float | None, *, synchronous: bool, every: int | None, steps: int, num_workers: int
) -> float:
    """The factor of an asynchronous delta (``TrainConfig.delta_scale``).

    Example:
        >>> delta_scale_for(None, synchronous=False, every=None, steps=23, num_workers=2)
        0.5
        >>> delta_scale_for(None, synchronous=False, every=4, steps=23, num_workers=2)
        1.0
    """
    if synchronous:
        return 1.0  # the service averages the round's deltas
    if scale is not None:
        return float(scale)
    whole_epoch = every is None or every >= steps
    return 1.0 / max(num_workers, 1) if whole_epoch else 1.0


def resume_point(
    *,
    synchronous: bool,
    initial_epoch: int,
    every: int | None,
    steps: int,
    rounds: int,
    version: int,
    position: tuple[int, int] | list[int] | None,
) -> tuple[int, int, int]:
    """Where a (re)joining worker starts: ``(epoch, batches done in it, syncs done in it)``.

    Synchronous workers start at the last completed round ``version`` (rounds count
    from ``initial_epoch``, ``rounds`` per epoch); asynchronous ones after their last
    applied push, ``position`` = (epoch, batches done), or at ``initial_epoch``.

    Example:
        >>> resume_point(synchronous=True, initial_epoch=0, every=4, steps=23, rounds=6,
        ...              version=15, position=None)
        (2, 12, 3)
        >>> resume_point(synchronous=False, initial_epoch=0, every=None, steps=23,
        ...              rounds=1, version=40, position=(4, 23))
        (5, 0, 0)
    """
    if synchronous:
        epoch, done = initial_epoch + version // rounds, version % rounds
        return epoch, min(done * every, steps) if every else 0, done
    if position is None:
        return initial_epoch, 0, 0
    epoch, step = int(position[0]), int(position[1])
    if step >= steps:
        return epoch + 1, 0, 0
    return epoch, step, step // every if every else 0


def _run(payload: WorkerPayload, batches: Iterable[pa.RecordBatch]) -> dict[str, Any]:
    from pyspark import TaskContext

    from sparkdl import gpu

    started = time.perf_counter()
    started_at = time.time()
    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("sparkdl's train function runs only inside a Spark task.")
    worker = ctx.partitionId()
    gpu_ids = gpu.assign_gpus(ctx) or []
    # Import TensorFlow while the partition is read: the import dominates a cold worker.
    importer = threading.Thread(target=_import_tensorflow, name="sparkdl-import", daemon=True)
    importer.start()

    from sparkdl.data import to_numpy_multi
    from sparkdl.server.client import ServiceClient

    xs, ys = to_numpy_multi(list(batches), payload.input_shapes, payload.label_kinds)
    x, y = _unwrap(xs), _unwrap(ys)  # what model.fit takes
    client = ServiceClient(
        payload.url,
        payload.token,
        worker=worker,
        timeout=payload.request_timeout,
        retries=payload.request_retries,
        attempt=_attempt(ctx),
    )
    try:
        joined = client.join(_rows(x))
        importer.join()
        import_seconds = time.perf_counter() - started
        report = _train(payload, client, worker, x, y, joined, started, import_seconds)
        report["gpu_ids"] = gpu_ids
        report["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
        report["attempt"] = client.attempt
        report["started_at"] = started_at
        report["ended_at"] = time.time()
        return report
    except BaseException as exc:
        client.report_failure(exc, fatal=not _transient(exc))
        raise
    finally:
        client.close()


def _rows(x: Any) -> int:
    """Rows of a model input: one array, or a list of arrays (one per input)."""
    return len(x[0]) if isinstance(x, list) else len(x)


def _unwrap(arrays: list[Any]) -> Any:
    return arrays[0] if len(arrays) == 1 else arrays


def batches(x: Any, y: Any, batch_size: int, shuffle: bool) -> Any:
    """An endless ``tf.data`` pipeline of the epochs' batches, as ``model.fit`` cuts them.

    Every epoch is one pass in a new random order (the last batch may be short), as
    ``model.fit(x, y, shuffle=True)`` does, but one iterator serves every epoch: Keras
    builds a new one per epoch for numpy input, which costs more than the training
    steps of a small partition. Rows are shuffled as indices and gathered, so the
    shuffle buffer holds 8 bytes a row rather than a copy of the data.
    """
    import tensorflow as tf

    def tensors(arrays: Any) -> Any:  # several inputs or outputs: a tuple, in order
        if isinstance(arrays, list):
            return tuple(tf.convert_to_tensor(a) for a in arrays)
        return tf.convert_to_tensor(arrays)

    data = (tensors(x), tensors(y))
    order = tf.data.Dataset.range(_rows(x))
    if shuffle:
        order = order.shuffle(_rows(x), reshuffle_each_iteration=True)
    return (
        order.batch(batch_size)
        .map(lambda index: tf.nest.map_structure(lambda t: tf.gather(t, index), data))
        .repeat()
        .prefetch(2)
    )


def _transient(exc: BaseException) -> bool:
    """Whether a retry of the task may succeed (else the fit stops at once).

    The service out of reach or a connection lost may pass; an error in the model, the
    loss, the data or a diverged loss would only happen again.
    """
    from sparkdl.errors import ServiceError

    return isinstance(exc, (ServiceError, ConnectionError, TimeoutError, KeyboardInterrupt))


def _take(arrays: Any, index: Any) -> Any:
    """Rows ``index`` (a slice or an index array) of one array or a list of arrays."""
    if isinstance(arrays, list):
        return [a[index] for a in arrays]
    return arrays[index]


def _attempt(ctx: Any) -> int:
    """A number that grows with each new attempt of this task, stage retries included.

    Spark numbers task attempts uniquely and in launch order within a SparkContext.
    """
    return int(ctx.taskAttemptId())


def _import_tensorflow() -> None:
    import keras  # noqa: F401
    import tensorflow  # noqa: F401


def _train(
    payload: WorkerPayload,
    client: Any,
    worker: int,
    x: Any,
    y: Any,
    joined: dict[str, Any],
    started: float,
    import_seconds: float,
) -> dict[str, Any]:
    import cloudpickle
    import keras
    import numpy as np

    from sparkdl import gpu
    from sparkdl.keras_io import learning_rate, model_from_bytes
    from sparkdl.merging import WorkerMerge

    gpus = gpu.configure_tensorflow(payload.threads)
    if payload.seed is not None:
        keras.utils.set_random_seed(payload.seed + 7919 * worker)
    custom = cloudpickle.loads(payload.custom_objects) if payload.custom_objects else None
    model_bytes = payload.model_bytes.value
    if payload.mixed_precision:
        from sparkdl.keras_io import mixed_precision_bytes

        model_bytes = mixed_precision_bytes(model_bytes)
    model = model_from_bytes(model_bytes, custom)
    weights, version = client.pull(0)
    model.set_weights(weights)

    rows = joined["rows"]
    split = 0.0 if payload.validation is not None else payload.validation_split
    held_in = train_rows(_rows(x), split)  # rows model.fit trains on
    steps = math.ceil(held_in / payload.batch_size)
    synchronous = payload.mode == "synchronous"
    if synchronous:  # every worker takes part in every round
        rounds = rounds_per_epoch(
            [math.ceil(train_rows(n, split) / payload.batch_size) for n in rows],
            payload.sync_every,
        )
    else:
        rounds = rounds_per_epoch([steps], payload.sync_every)
    epoch, skip, synced = resume_point(
        synchronous=synchronous,
        initial_epoch=payload.initial_epoch,
        every=payload.sync_every,
        steps=steps,
        rounds=rounds,
        version=int(joined.get("version", 0)),
        position=joined.get("position"),
    )
    scale = delta_scale_for(
        payload.delta_scale,
        synchronous=synchronous,
        every=payload.sync_every,
        steps=steps,
        num_workers=payload.num_workers,
    )
    sync = _SyncCallback(
        client,
        merge=WorkerMerge(payload.merge, weights, payload.elastic_alpha, scale),
        synchronous=synchronous,
        rows=held_in,
        batch_size=payload.batch_size,
        steps=steps,
        rounds=rounds,
        every=payload.sync_every,
        version=version,
        overlap=payload.overlap and not synchronous,
    )
    sync.set_model(model)
    x_fit, y_fit = x, y
    validation_data = None
    if payload.validation is not None:
        xvs, yvs = payload.validation.value
        step = payload.num_workers
        xv = [a[worker::step] for a in xvs]
        yv = [a[worker::step] for a in yvs]
        if len(xv[0]):
            validation_data = (_unwrap(xv), _unwrap(yv))
            sync.val_rows = len(xv[0])
    elif held_in < _rows(x):  # as model.fit(validation_split=...): the last rows
        validation_data = (_take(x, slice(held_in, None)), _take(y, slice(held_in, None)))
        x_fit, y_fit = _take(x, slice(0, held_in)), _take(y, slice(0, held_in))
        sync.val_rows = _rows(x) - held_in

    def fit(xs: Any, ys: Any, first: int, last: int) -> None:
        rows = _rows(xs)
        model.fit(
            batches(xs, ys, payload.batch_size, payload.shuffle),
            steps_per_epoch=math.ceil(rows / payload.batch_size),
            epochs=last,
            initial_epoch=first,
            shuffle=False,  # the pipeline shuffles
            verbose=0,
            callbacks=[sync.keras_callback],
            validation_data=validation_data,
        )

    resumed_at = [epoch, skip] if (epoch, skip) != (payload.initial_epoch, 0) else None
    train_start = time.perf_counter()
    setup_comm, setup_calls = client.comm_seconds, client.calls  # join and first pull
    try:
        if skip and epoch < payload.epochs:  # finish the epoch this worker was in
            sync.resume(skip, synced)
            left = held_in - min(skip * payload.batch_size, held_in)
            if left:
                rng = np.random.default_rng((payload.seed or 0) + 7919 * worker + epoch)
                pick = np.sort(rng.permutation(held_in)[:left])
                fit(_take(x_fit, pick), _take(y_fit, pick), epoch, epoch + 1)
            else:  # its batches were done; only the epoch's last rounds are left
                sync.on_epoch_begin(epoch)
                sync.on_epoch_end(epoch, {})
            epoch += 1
        if epoch < payload.epochs and not sync.stop:
            if held_in:
                fit(x_fit, y_fit, epoch, payload.epochs)
            else:  # an empty partition still takes part in every round
                for each in range(epoch, payload.epochs):
                    sync.on_epoch_begin(each)
                    sync.on_epoch_end(each, {})
                    if sync.stop:
                        break
        sync.flush()  # the last push's answer (overlap)
    finally:
        sync.close()
    train_seconds = time.perf_counter() - train_start
    return {
        "worker": worker,
        "rows": _rows(x),
        "gpus": len(gpus),
        "import_seconds": import_seconds,
        "train_seconds": train_seconds,
        "task_seconds": time.perf_counter() - started,
        "comm_seconds": client.comm_seconds - setup_comm,
        "wait_seconds": sync.wait_seconds,
        "overlap": sync.overlap,
        "fast_weights": sync.weights.fast,
        "calls": client.calls - setup_calls,
        "setup_comm_seconds": setup_comm,
        "syncs": sync.syncs,
        "epochs_run": sync.epochs_run,
        "resumed_at": resumed_at,
        "delta_scale": scale if payload.merge == "delta" else None,
        "compute_dtypes": sorted({str(layer.compute_dtype) for layer in model.layers}),
        "learning_rate": learning_rate(model),
    }


class _SyncCallback:
    """Keras callback that pushes an update every ``every`` batches and at epoch ends."""

    def __init__(
        self,
        client: Any,
        *,
        merge: Any,
        synchronous: bool,
        rows: int,
        batch_size: int,
        steps: int,
        rounds: int,
        every: int | None,
        version: int,
        overlap: bool = False,
    ) -> None:
        import keras

        # Subclassing keras.callbacks.Callback at import time would import Keras too
        # early; wrap a real Callback instead.
        outer = self

        class _Bridge(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
                outer.on_epoch_begin(epoch)

            def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
                outer.on_batch_end(batch, logs or {})

            def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
                outer.on_epoch_end(epoch, logs or {})

        self.keras_callback = _Bridge()
        self.client = client
        self.merge = merge
        self.synchronous = synchronous
        self.rows = rows
        self.batch_size = batch_size
        self.steps = steps
        self.rounds = rounds
        self.every = every
        self.mid_rounds = (steps - 1) // every if every and steps else 0
        self.version = version
        self.val_rows = 0
        self.stop = False
        self.epochs_run = 0
        self.learning_rate: float | None = None
        self.weights: Any = None  # a WeightAccess of the model
        self.syncs = 0
        #: Push in a background thread; the answer is folded in at the next sync.
        self.overlap = overlap
        #: Seconds training stood still waiting for the service.
        self.wait_seconds = 0.0
        self._pool: Any = None
        self._inflight: Any = None  # the Future of the push in flight
        self._at_push: list[Any] = []  # the weights right after that push
        self._done = 0
        self._sent = 0
        self._epoch = 0
        self._offset = 0  # batches of the current epoch done before this fit call
        self._resume: tuple[int, int] | None = None

    @property
    def model(self) -> Any:
        return self.keras_callback.model

    def set_model(self, model: Any) -> None:
        """The model this callback syncs, and its fast weight access."""
        from sparkdl.weight_access import WeightAccess

        self.keras_callback.set_model(model)
        self.weights = WeightAccess(model)

    def resume(self, batches: int, syncs: int) -> None:
        """The next epoch starts with ``batches`` done and ``syncs`` pushed (a retry)."""
        self._resume = (batches, syncs)

    def on_epoch_begin(self, epoch: int) -> None:
        self.epochs_run = epoch + 1
        self._epoch = epoch
        batches, syncs = self._resume or (0, 0)
        self._resume = None
        self._offset = batches
        self._done = syncs
        self._sent = min(batches * self.batch_size, self.rows)

    def on_batch_end(self, batch: int, logs: dict[str, Any]) -> None:
        if not self.every:
            return
        step = self._offset + batch + 1
        target = min(step // self.every, self.mid_rounds)
        while self._done < target:
            self._sync(min(step * self.batch_size, self.rows), logs, None)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any]) -> None:
        while self._done < self.mid_rounds:
            self._sync(self.rows, logs, None)
        if self._done == self.mid_rounds:  # (a resumed worker may be past it)
            self._sync(self.rows, logs, logs)
        while self._done < self.rounds:
            self._sync(self.rows, {}, None)
        if self.stop and self.model is not None:
            self.model.stop_training = True  # a driver callback stopped the fit

    def _sync(self, seen: int, logs: dict[str, Any], epoch_logs: dict[str, Any] | None) -> None:
        from sparkdl.errors import TrainingError

        loss = logs.get("loss")
        loss = float(loss) if loss is not None else None
        if loss is not None and not math.isfinite(loss):
            raise TrainingError(
                f"The loss became {loss} in epoch {self._epoch + 1}: training diverged. "
                "Lower the learning rate, clip gradients (clipnorm=...), or scale the features."
            )
        # "step": batches of this epoch done, where a retried task resumes from.
        step = math.ceil(seen / self.batch_size) if self.batch_size else 0
        meta: dict[str, Any] = {"loss": loss, "epoch": self._epoch, "step": step}
        if epoch_logs is not None:
            meta["epoch_logs"] = {k: float(v) for k, v in epoch_logs.items()}
            meta["epoch_samples"] = self.rows
            meta["val_samples"] = self.val_rows
        local = self.weights.get()
        settled = self._inflight is not None
        if settled:
            local = self._settle(local)
        update = self.merge.outgoing(local)
        samples = seen - self._sent
        if self.overlap and epoch_logs is None:  # an epoch's last push waits (below)
            after = self.merge.pushed(local)
            if settled or after is not local:
                self.weights.set(after)
            self._at_push = after
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(1, thread_name_prefix="sparkdl-push")
            self._inflight = self._pool.submit(
                self.client.push_async,
                update,
                base_version=self.version,
                samples=samples,
                meta=meta,
            )
        else:
            start = time.perf_counter()
            if self.synchronous:
                answer, version = self.client.push_sync(
                    update, round_no=self.version, samples=samples, meta=meta
                )
            else:
                answer, version = self.client.push_async(
                    update, base_version=self.version, samples=samples, meta=meta
                )
            self.wait_seconds += time.perf_counter() - start
            self.weights.set(self.merge.incoming(local, answer))
            self._answered(version)
        self._sent = seen
        self._done += 1
        self.syncs += 1

    def flush(self) -> None:
        """Waits for the answer to the push in flight, if any, and folds it in."""
        if self._inflight is not None:
            self.weights.set(self._settle(self.weights.get()))

    def close(self) -> None:
        """Waits for a push in flight (its error, if any, is the caller's to see)."""
        future, self._inflight = self._inflight, None
        if future is not None:
            future.exception()  # the client serves one call at a time
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _settle(self, local: list[Any]) -> list[Any]:
        """Waits for the push in flight and returns ``local`` with its answer folded in."""
        future, self._inflight = self._inflight, None
        start = time.perf_counter()
        answer, version = future.result()
        self.wait_seconds += time.perf_counter() - start
        self._answered(version)
        return self.merge.settle(local, self._at_push, answer)

    def _answered(self, version: int) -> None:
        """Takes the version and the control fields of an answer."""
        self.version = version
        control = self.client.control
        if control.get("stop"):
            # Stop at this sync: Keras leaves the epoch after this batch, and
            # on_epoch_end still closes the epoch's rounds, the same ones on every
            # worker, so synchronous rounds stay aligned.
            self.stop = True
            if self.model is not None:
                self.model.stop_training = True
        rate = control.get("learning_rate")
        if isinstance(rate, (int, float)) and rate != self.learning_rate:
            self.model.optimizer.learning_rate = float(rate)  # ReduceLROnPlateau
            self.learning_rate = float(rate)
