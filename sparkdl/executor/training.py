"""A worker's training loop: rebuild the model, agree on the schedule, fit every epoch.

Reads top to bottom as the algorithm it runs: the model is rebuilt from its ``.keras``
bytes and takes the service's current weights; the worker's sync points follow from
the rows of every worker (the service's join told them) and the fit's mode; a retried
task resumes where training stands (:meth:`sparkdl.sync.modes.Mode.resume`), trains the
rest of that epoch on as many rows as were left (a fresh random subset of its
partition), then the remaining epochs; ``model.fit`` runs over one endless ``tf.data``
pipeline with :class:`~sparkdl.executor.callback.SyncCallback` syncing.

Example:
    >>> import numpy as np
    >>> take(np.arange(5), slice(3, None)).tolist()
    [3, 4]
"""

from __future__ import annotations

import time
from typing import Any

import cloudpickle
import keras
import numpy as np
import tensorflow as tf

from sparkdl import gpu
from sparkdl.executor.callback import SyncCallback
from sparkdl.executor.pusher import Pusher
from sparkdl.keras_io import learning_rate, mixed_precision_bytes, model_from_bytes
from sparkdl.plan import FitPlan
from sparkdl.reports import WorkerReport
from sparkdl.server.client import ServiceClient
from sparkdl.sync.modes import Standing
from sparkdl.sync.schedule import Schedule, steps_for, train_rows
from sparkdl.weight_access import WeightAccess
from sparkdl.worker import WorkerPayload

__all__ = ["batches", "split", "take", "train"]


def train(
    payload: WorkerPayload,
    client: ServiceClient,
    worker: int,
    xs: list[np.ndarray],
    ys: list[np.ndarray],
    joined: dict[str, Any],
) -> WorkerReport:
    """Trains this worker's rows ``xs``/``ys`` (one array per input/output) to the end.

    Args:
        payload: What the driver sent.
        client: The worker's service client (joined).
        worker: This worker's id.
        xs: Feature arrays, one per model input.
        ys: Label arrays, one per model output.
        joined: The service's answer to the join.
    """
    plan = payload.plan
    gpus = gpu.configure_tensorflow(plan.threads)
    model = _build_model(payload, worker)
    weights, version = client.pull(0)
    model.set_weights(weights)
    rows = len(xs[0])
    held_in = train_rows(rows, plan.validation_split)  # rows model.fit trains on
    every_rows = [train_rows(n, plan.validation_split) for n in joined["rows"]]
    schedule = Schedule(
        rows=held_in,
        batch_size=plan.batch_size,
        frequency=plan.frequency,
        rounds=plan.mode.rounds_per_epoch(
            steps_for(held_in, plan.batch_size),
            [steps_for(n, plan.batch_size) for n in every_rows],
            plan.frequency,
        ),
    )
    standing = Standing(plan.initial_epoch, int(joined["version"]), joined.get("position"))
    epoch, skip, synced = plan.mode.resume(schedule, standing)
    access = WeightAccess(model)
    pusher = Pusher(
        client, plan.merge, access, center=weights, version=version, overlap=plan.overlap
    )
    (x_fit, y_fit), validation, val_rows = split(payload, worker, xs, ys, held_in)
    sync = SyncCallback(pusher, schedule, val_rows=val_rows)
    sync.set_model(model)
    train_start = time.perf_counter()
    setup_comm, setup_calls = client.comm_seconds, client.calls  # join and first pull
    try:
        _fit_epochs(model, sync, plan, worker, (x_fit, y_fit), validation, (epoch, skip, synced))
        sync.flush()  # the last push's answer (overlap)
    finally:
        pusher.close()
    return WorkerReport(
        worker=worker,
        rows=rows,
        gpus=len(gpus),
        train_seconds=time.perf_counter() - train_start,
        comm_seconds=client.comm_seconds - setup_comm,
        wait_seconds=pusher.wait_seconds,
        overlap=plan.overlap,
        fast_weights=access.fast,
        calls=client.calls - setup_calls,
        setup_comm_seconds=setup_comm,
        syncs=pusher.pushes,
        epochs_run=sync.epochs_run,
        resumed_at=[epoch, skip] if (epoch, skip) != (plan.initial_epoch, 0) else None,
        delta_scale=getattr(plan.merge, "scale", None),
        compute_dtypes=sorted({str(layer.compute_dtype) for layer in model.layers}),
        learning_rate=learning_rate(model),
    )


def batches(x: Any, y: Any, batch_size: int, shuffle: bool) -> tf.data.Dataset:
    """An endless ``tf.data`` pipeline of the epochs' batches, as ``model.fit`` cuts them.

    Every epoch is one pass in a new random order (the last batch may be short), as
    ``model.fit(x, y, shuffle=True)`` does, but one iterator serves every epoch: Keras
    builds a new one per epoch for numpy input, which costs more than the training
    steps of a small partition. Rows are shuffled as indices and gathered, so the
    shuffle buffer holds 8 bytes a row rather than a copy of the data.
    """

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


def take(arrays: Any, index: Any) -> Any:
    """Rows ``index`` (a slice or an index array) of one array or a list of arrays."""
    if isinstance(arrays, list):
        return [a[index] for a in arrays]
    return arrays[index]


def _build_model(payload: WorkerPayload, worker: int) -> keras.Model:
    """The model from the payload's bytes, seeded per worker."""
    plan = payload.plan
    if plan.seed is not None:
        keras.utils.set_random_seed(plan.seed + 7919 * worker)
    custom = cloudpickle.loads(payload.custom_objects) if payload.custom_objects else None
    model_bytes = payload.model_bytes.value
    if plan.mixed_precision:
        model_bytes = mixed_precision_bytes(model_bytes)
    return model_from_bytes(model_bytes, custom)


def split(
    payload: WorkerPayload, worker: int, xs: list[np.ndarray], ys: list[np.ndarray], held_in: int
) -> tuple[tuple[Any, Any], tuple[Any, Any] | None, int]:
    """``((x, y) to fit, (x, y) to validate or None, validation rows)``, as ``model.fit``
    takes them (one array, or a list of arrays for several inputs or outputs).

    Validation data given apart is broadcast; worker i takes rows ``i::num_workers``.
    Otherwise, as ``model.fit(validation_split=...)``, the last rows are held out.
    """
    x, y = _unwrap(xs), _unwrap(ys)
    if payload.validation is not None:
        xvs, yvs = payload.validation.value
        step = payload.plan.num_workers
        xv, yv = [a[worker::step] for a in xvs], [a[worker::step] for a in yvs]
        rows = len(xv[0])
        return (x, y), ((_unwrap(xv), _unwrap(yv)) if rows else None), rows
    if held_in < len(xs[0]):
        held_out = slice(held_in, None)
        validation = (take(x, held_out), take(y, held_out))
        fit = (take(x, slice(0, held_in)), take(y, slice(0, held_in)))
        return fit, validation, len(xs[0]) - held_in
    return (x, y), None, 0


def _fit_epochs(
    model: keras.Model,
    sync: SyncCallback,
    plan: FitPlan,
    worker: int,
    data: tuple[Any, Any],
    validation: tuple[Any, Any] | None,
    start: tuple[int, int, int],
) -> None:
    """Runs epochs ``start[0]`` to ``plan.epochs``, the first from a resume point."""
    epoch, skip, synced = start
    x, y = data
    held_in = sync.schedule.rows

    def fit(xs: Any, ys: Any, first: int, last: int) -> None:
        model.fit(
            batches(xs, ys, plan.batch_size, plan.shuffle),
            steps_per_epoch=steps_for(_rows(xs), plan.batch_size),
            epochs=last,
            initial_epoch=first,
            shuffle=False,  # the pipeline shuffles
            verbose=0,
            callbacks=[sync],
            validation_data=validation,
        )

    if skip and epoch < plan.epochs:  # finish the epoch this worker was in
        sync.resume(skip, synced)
        left = held_in - min(skip * plan.batch_size, held_in)
        if left:
            rng = np.random.default_rng((plan.seed or 0) + 7919 * worker + epoch)
            pick = np.sort(rng.permutation(held_in)[:left])
            fit(take(x, pick), take(y, pick), epoch, epoch + 1)
        else:  # its batches were done; only the epoch's last rounds are left
            _empty_epoch(sync, epoch)
        epoch += 1
    if epoch < plan.epochs and not sync.stop:
        if held_in:
            fit(x, y, epoch, plan.epochs)
        else:  # an empty partition still takes part in every round
            for each in range(epoch, plan.epochs):
                _empty_epoch(sync, each)
                if sync.stop:
                    break


def _empty_epoch(sync: SyncCallback, epoch: int) -> None:
    sync.on_epoch_begin(epoch)
    sync.on_epoch_end(epoch, {})


def _rows(x: Any) -> int:
    """Rows of a model input: one array, or a list of arrays (one per input)."""
    return len(x[0]) if isinstance(x, list) else len(x)


def _unwrap(arrays: list[Any]) -> Any:
    return arrays[0] if len(arrays) == 1 else arrays
