"""A worker's training loop: rebuild the model, agree on the schedule, fit every epoch.

Reads top to bottom as the algorithm it runs: the model is rebuilt from its ``.keras``
bytes and takes the service's current weights; the worker's sync points follow from
the rows of every worker (the service's join told them) and the fit's mode; a retried
task resumes where training stands (:meth:`sparkdl.sync.modes.Mode.resume`), trains the
rest of that epoch on as many rows as were left (a fresh random subset of its
partition), then the remaining epochs; ``model.fit`` runs over one endless pipeline
(``tf.data`` on TensorFlow, a generator on JAX) of the worker's cached partition
(:mod:`sparkdl.executor.feed`) with
:class:`~sparkdl.executor.callback.SyncCallback` syncing.

Example:
    >>> from sparkdl.executor.cache import PartitionCache
    >>> callable(split) and PartitionCache.__name__
    'PartitionCache'
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import cloudpickle
import keras
import numpy as np

from sparkdl.compat.keras import flatten_layers
from sparkdl.contract.keras_io import (
    learning_rate,
    model_from_bytes,
    optimizer_steps,
    set_optimizer_steps,
)
from sparkdl.contract.payload import WorkerPayload
from sparkdl.contract.plan import FitPlan
from sparkdl.contract.reports import WorkerReport
from sparkdl.executor.backends import backend_for
from sparkdl.executor.cache import PartitionCache
from sparkdl.executor.callback import SyncCallback
from sparkdl.executor.channel import Channel, PushPath, open_pusher
from sparkdl.executor.feed import Feed
from sparkdl.executor.precision import loss_scaled, mixed_precision_model
from sparkdl.executor.rate import ScaledRate, ShortBatchRate
from sparkdl.protocol import failures
from sparkdl.server.state.replicas import FULL
from sparkdl.sync.modes import Standing
from sparkdl.sync.schedule import Schedule, steps_for

__all__ = ["compute_dtypes", "payload_feed", "split", "train"]


def train(
    payload: WorkerPayload,
    channel: Channel,
    worker: int,
    data: PartitionCache,
    held_out: PartitionCache | None,
    joined: dict[str, Any],
) -> WorkerReport:
    """Trains this worker's cached rows to the end.

    Args:
        payload: What the driver sent.
        channel: The worker's channel to the service (joined).
        worker: This worker's id.
        data: The worker's partition (its training rows).
        held_out: Its rows of the validation data given apart, or ``None``.
        joined: The service's answer to the join.
    """
    plan = payload.plan
    gpus = backend_for(plan.backend).configure(plan.threads)
    model = _build_model(payload, worker)
    # With compression the first pull starts this task's copy of the center (full).
    weights, version = channel.pull(0, replica=FULL if plan.compression else None)
    model.set_weights(weights)
    held_in = plan.held_in(data.rows)  # rows model.fit trains on
    schedule = _schedule(plan, held_in, joined["rows"])
    standing = channel.standing(joined, schedule, barrier=plan.mode.barrier)
    epoch, skip, synced = _resume(payload, model, schedule, standing)
    access = backend_for(plan.backend).weight_access(model)
    pusher = open_pusher(
        channel,
        plan.merge,
        access,
        center=weights,
        version=version,
        overlap=plan.overlap,
        compression=plan.compression,
    )
    feed, validation, val_rows = split(payload, data, held_out, held_in)
    sync = _sync_callback(plan, model, pusher, schedule, val_rows)
    train_start = time.perf_counter()
    setup = _Traffic.of(channel)  # the join and the first pull
    try:
        _fit_epochs(model, sync, plan, worker, feed, validation, (epoch, skip, synced))
        sync.flush()  # the last push's answer (overlap)
    except BaseException as exc:
        failures.mark(exc, sync.position())  # the failure's first line says where
        raise
    finally:
        pusher.close()
    return WorkerReport(
        worker=worker,
        rows=data.rows,
        validation_rows=val_rows,
        gpus=len(gpus),
        train_seconds=time.perf_counter() - train_start,
        overlap=plan.overlap,
        fast_weights=access.fast,
        **setup.report(channel, pusher),
        epochs_run=sync.epochs_run,
        resumed_at=[epoch, skip] if (epoch, skip) != (plan.initial_epoch, 0) else None,
        delta_scale=getattr(plan.merge, "scale", None),
        **_model_fields(model),
    )


def _model_fields(model: keras.Model) -> dict[str, Any]:
    """The report's fields read from the trained model."""
    return {
        "compute_dtypes": compute_dtypes(model),
        "loss_scaled": loss_scaled(model),
        "learning_rate": learning_rate(model),
        "optimizer_steps": optimizer_steps(model),
    }


def _schedule(plan: FitPlan, held_in: int, every_rows: list[int]) -> Schedule:
    """This worker's batches and syncs an epoch, for its ``held_in`` training rows and
    every worker's rows (``every_rows``, the join's answer)."""
    return Schedule(
        rows=held_in,
        batch_size=plan.batch_size,
        frequency=plan.frequency,
        rounds=plan.mode.rounds_per_epoch(
            steps_for(held_in, plan.batch_size),
            [steps_for(plan.held_in(n), plan.batch_size) for n in every_rows],
            plan.frequency,
        ),
        # Synchronous fragments: a sync's fragment follows from its index alone, so
        # every worker closes its epochs on the same (last) round.
        closing_last=plan.fragments > 1 and plan.mode.barrier,
    )


def _resume(
    payload: WorkerPayload, model: keras.Model, schedule: Schedule, joined: dict[str, Any]
) -> tuple[int, int, int]:
    """Where this worker starts (epoch, batches to skip, syncs done), from the join's
    answer; the optimizer's step count (what a learning-rate schedule reads) goes on
    from where this worker's earlier epochs and attempts left it (syncs only set
    weights)."""
    plan = payload.plan
    standing = Standing(plan.initial_epoch, int(joined["version"]), joined.get("position"))
    epoch, skip, synced = plan.mode.resume(schedule, standing)
    steps = payload.initial_steps + epoch * schedule.steps + skip
    set_optimizer_steps(model, steps)
    return epoch, skip, synced


def _sync_callback(
    plan: FitPlan, model: keras.Model, pusher: PushPath, schedule: Schedule, val_rows: int
) -> SyncCallback:
    """The worker's sync callback on ``model``, with the recipe's rate callback."""
    sync = SyncCallback(
        pusher,
        schedule,
        val_rows=val_rows,
        rate=_scaled_rate(plan, model, schedule.rows),
        last_epoch=plan.epochs,
        service_rate=plan.steps_model,
    )
    sync.set_model(model)
    return sync


def _scaled_rate(plan: FitPlan, model: keras.Model, held_in: int) -> ScaledRate | None:
    """The learning-rate recipe's callback on ``model``, or ``None`` when it scales
    nothing."""
    if not plan.lr_recipe.active or plan.steps_model:
        return None  # (the service scales the model's rate)
    rate = ScaledRate(plan.lr_recipe, steps_for(held_in, plan.batch_size))
    rate.set_model(model)
    return rate


@dataclasses.dataclass(frozen=True)
class _Traffic:
    """The client's counters when training starts (after the join and first pull)."""

    comm_seconds: float
    calls: int
    bytes_received: int

    @classmethod
    def of(cls, client: Channel) -> _Traffic:
        return cls(client.comm_seconds, client.calls, client.bytes_received)

    def report(self, client: Channel, pusher: PushPath) -> dict[str, Any]:
        """The report's traffic fields: training's share, and the set-up's apart."""
        return {
            "comm_seconds": client.comm_seconds - self.comm_seconds,
            "wait_seconds": pusher.wait_seconds,
            "calls": client.calls - self.calls,
            "setup_comm_seconds": self.comm_seconds,
            "syncs": pusher.pushes,
            "push_bytes": client.bytes_sent,
            "answer_bytes": client.bytes_received - self.bytes_received,
            "whole_pushes": pusher.whole_pushes,
            "whole_push_bytes": pusher.whole_bytes,
        }


def _build_model(payload: WorkerPayload, worker: int) -> keras.Model:
    """The model from the payload's bytes, seeded per worker."""
    plan = payload.plan
    if plan.seed is not None:
        keras.utils.set_random_seed(plan.seed + 7919 * worker)
    custom = cloudpickle.loads(payload.custom_objects) if payload.custom_objects else None
    if plan.mixed_precision:
        model = mixed_precision_model(payload.model_bytes.value, custom)
    else:
        model = model_from_bytes(payload.model_bytes.value, custom)
    if plan.steps_model:
        _step_plainly(model)
    return model


def _step_plainly(model: keras.Model) -> None:
    """``outer_optimizer="model"``: the worker's step is its batch's gradient (``SGD`` at
    rate 1, loss-scaled as the model's was), so the service's copy of the compiled
    optimizer steps on the round's mean gradient."""
    plain: keras.optimizers.Optimizer = keras.optimizers.SGD(learning_rate=1.0)
    if isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer):
        plain = keras.optimizers.LossScaleOptimizer(plain)
    model.optimizer = plain


def compute_dtypes(model: keras.Model) -> list[str]:
    """The compute dtypes of the model's layers, those of nested models and the layers a
    custom layer holds included (models and input layers not counted)."""
    return sorted(
        {
            str(layer.compute_dtype)
            for layer in flatten_layers(model)
            if not isinstance(layer, (keras.Model, keras.layers.InputLayer))
        }
    )


def split(
    payload: WorkerPayload,
    data: PartitionCache,
    held_out: PartitionCache | None,
    held_in: int,
) -> tuple[Feed, Any, int]:
    """The training feed, the validation dataset (or ``None``) and its rows.

    Validation data given apart arrives with the partition (the rows the driver
    marked) and is cached apart; otherwise, as ``model.fit(validation_split=...)``, the
    last rows of the partition are held out.
    """
    feed = payload_feed(payload, data)
    if held_out is not None:
        if not held_out.rows:
            return feed, None, 0
        return feed, payload_feed(payload, held_out).evaluate(), held_out.rows
    if held_in < data.rows:
        # Keras weights validation rows by sample_weight, never by class_weight.
        scoring = dataclasses.replace(feed, weight=None) if payload.class_weighted else feed
        return feed, scoring.evaluate(held_in, data.rows), data.rows - held_in
    return feed, None, 0


def payload_feed(payload: WorkerPayload, cache: PartitionCache) -> Feed:
    """A :class:`Feed` of ``cache`` for the payload's model."""
    inputs, outputs, weight = payload.columns()
    return Feed(
        cache=cache,
        inputs=inputs,
        input_shapes=payload.input_shapes,
        sparse_inputs=payload.sparse_inputs or [False] * len(inputs),
        outputs=outputs,
        batch_size=payload.plan.batch_size,
        weight=weight,
        output_shapes=payload.label_shapes or None,
        backend=payload.plan.backend,
        input_structure=payload.input_structure,
    )


def _fit_epochs(
    model: keras.Model,
    sync: SyncCallback,
    plan: FitPlan,
    worker: int,
    feed: Feed,
    validation: Any,
    start: tuple[int, int, int],
) -> None:
    """Runs epochs ``start[0]`` to ``plan.epochs``, the first from a resume point."""
    epoch, skip, synced = start
    held_in = sync.schedule.rows
    # Without a seed, every task shuffles in its own order, as model.fit does.
    base = plan.seed if plan.seed is not None else int(np.random.default_rng().integers(2**31))
    seed = base + 7919 * worker

    def fit(first: int, last: int, rows: int | None = None) -> None:
        # Without shuffling, the rows left are the epoch's last ones; else a fresh
        # random subset of as many.
        start = held_in - rows if rows is not None and not plan.shuffle else 0
        epoch_rows = held_in if rows is None else rows
        callbacks = [sync] if sync.rate is None else [sync.rate, sync]
        if plan.num_workers > 1:  # the merged model moves by each row alike
            callbacks.insert(-1, ShortBatchRate(epoch_rows, plan.batch_size))
        model.fit(
            feed.train(start, held_in, shuffle=plan.shuffle, seed=seed + first, limit=rows),
            steps_per_epoch=steps_for(epoch_rows, plan.batch_size),
            epochs=last,
            initial_epoch=first,
            shuffle=False,  # the pipeline shuffles
            verbose=0,
            callbacks=callbacks,
            validation_data=validation,
        )

    if skip and epoch < plan.epochs:  # finish the epoch this worker was in
        sync.resume(skip, synced)
        left = held_in - min(skip * plan.batch_size, held_in)
        if left:  # a fresh random subset of as many rows as were left
            fit(epoch, epoch + 1, rows=left)
        else:  # its batches were done; only the epoch's last rounds are left
            _empty_epoch(sync, epoch)
        epoch += 1
    if epoch < plan.epochs and not sync.stop:
        if held_in:
            fit(epoch, plan.epochs)
        else:  # an empty partition still takes part in every round
            for each in range(epoch, plan.epochs):
                _empty_epoch(sync, each)
                if sync.stop:
                    break


def _empty_epoch(sync: SyncCallback, epoch: int) -> None:
    sync.on_epoch_begin(epoch)
    sync.on_epoch_end(epoch, {})
