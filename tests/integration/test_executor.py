"""A worker's callback and pusher against the real service, without Spark.

The executor's training loop is Keras's ``model.fit`` with
:class:`~sparkdl.executor.callback.SyncCallback`; these tests run it in this process
against a :class:`~sparkdl.server.web.service.ParameterService` on 127.0.0.1.
"""

from __future__ import annotations

import keras
import numpy as np
import pyarrow as pa
import pytest

from sparkdl.contract.payload import Column
from sparkdl.executor.backends import backend_for
from sparkdl.executor.cache import PartitionCache
from sparkdl.executor.callback import SyncCallback
from sparkdl.executor.feed import Feed
from sparkdl.executor.pusher import Pusher
from sparkdl.protocol.client import ServiceClient
from sparkdl.server.state.store import WeightStore
from sparkdl.server.web.service import ParameterService
from sparkdl.sync.merges import Average, Delta, Elastic, Merge
from sparkdl.sync.modes import MODES
from sparkdl.sync.schedule import Schedule, steps_for

ROWS, BATCH, EPOCHS, FREQUENCY = 40, 8, 3, 2


def _name(merge: Merge) -> str:
    return merge.name


def _model() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    return model


def _fit(store: WeightStore, merge: Merge, *, overlap: bool, epochs: int = EPOCHS):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    model = _model()
    with ParameterService(store, host="127.0.0.1") as service:
        client = ServiceClient(service.url, service.token, worker=0)
        client.join(ROWS)
        center, version = client.pull(0)
        model.set_weights(center)
        pusher = Pusher(
            client,
            merge,
            backend_for(keras.backend.backend()).weight_access(model),
            center=center,
            version=version,
            overlap=overlap,
        )
        steps = steps_for(ROWS, BATCH)
        rounds = store.mode.rounds_per_epoch(steps, [steps], FREQUENCY)
        sync = SyncCallback(pusher, Schedule(ROWS, BATCH, FREQUENCY, rounds))
        cache = PartitionCache([Column("x", "dense", 4), Column("y", "int", 1)])
        cache.append(pa.RecordBatch.from_pydict({"x": list(x), "y": y}))
        feed = Feed(
            cache, [Column("x", "dense", 4)], [(4,)], [False], [Column("y", "int", 1)], BATCH
        )
        model.fit(
            feed.train(0, ROWS, shuffle=True, seed=0),
            steps_per_epoch=steps,
            epochs=epochs,
            callbacks=[sync],
            shuffle=False,  # the pipeline shuffles
            verbose=0,
        )
        sync.flush()
        pusher.close()
        client.close()
    return model, sync, pusher


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("merge", [Average(), Delta(), Elastic(alpha=0.5)], ids=_name)
def test_every_sync_point_pushes_once_and_the_epochs_close(mode: str, merge: Merge) -> None:
    model = _model()
    store = WeightStore(model.get_weights(), num_workers=1, merge=merge, mode=mode)
    overlap = store.mode.can_overlap
    trained, sync, pusher = _fit(store, merge, overlap=overlap)
    rounds = 3  # 5 steps, every 2: after 2 and 4, then the closing sync
    status = store.status()
    assert pusher.pushes == EPOCHS * rounds and status["version"] == EPOCHS * rounds
    assert status["samples_seen"] == EPOCHS * ROWS
    assert status["epochs_done"] == EPOCHS and len(store.history()["loss"]) == EPOCHS
    assert sync.epochs_run == EPOCHS
    if not isinstance(merge, Elastic):  # the closing push waits: the worker holds the center
        for got, want in zip(trained.get_weights(), store.weights(), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert pusher.wait_seconds > 0


def test_the_driver_stops_the_workers_and_sets_their_learning_rate() -> None:
    model = _model()
    store = WeightStore(model.get_weights(), num_workers=1, merge=Delta(), mode="asynchronous")
    store.set_learning_rate(0.025)
    store.request_stop()
    trained, sync, _ = _fit(store, Delta(), overlap=False, epochs=10)
    assert sync.stop and sync.epochs_run == 1  # stopped in its first epoch
    assert sync.learning_rate == pytest.approx(0.025)
    assert float(keras.ops.convert_to_numpy(trained.optimizer.learning_rate)) == pytest.approx(
        0.025
    )
    # The stopped epoch still closed its rounds: a synchronous round would stay aligned.
    assert store.status()["epochs_done"] == 1


@pytest.mark.parametrize("inputs", [1, 2])
def test_validation_rows_are_counted_in_rows_not_features(inputs: int) -> None:
    from sparkdl.config import TrainConfig
    from sparkdl.contract.payload import WorkerPayload
    from sparkdl.contract.plan import FitPlan
    from sparkdl.executor.training import split

    plan = FitPlan.resolve(
        TrainConfig(validation_split=0.25), num_workers=1, rows=8, threads=1, service_host="h"
    )
    payload = WorkerPayload(
        plan=plan,
        url="",
        token="",
        model_bytes=None,
        custom_objects=None,
        input_shapes=[(4,)] * inputs,
        label_kinds=["int"],
    )
    columns = [Column(f"__sparkdl_features{'_1' if i else ''}", "dense", 4) for i in range(inputs)]
    cache = PartitionCache([*columns, Column("__sparkdl_label", "int", 1)])
    cache.append(
        pa.RecordBatch.from_pydict(
            {**{c.name: [[0.0] * 4] * 8 for c in columns}, "__sparkdl_label": [0] * 8}
        )
    )
    feed, validation, rows = split(payload, cache, None, held_in=6)
    assert rows == 2 and validation is not None
    assert sum(len(_first(x)) for x, _ in validation) == 2  # the last two rows
    x, _ = next(iter(feed.train(0, 6, shuffle=False, seed=0)))
    assert len(_first(x)) == 6  # one batch (BATCH > 6) of the six training rows


def _first(x):
    return x[0] if isinstance(x, tuple) else x


@pytest.mark.parametrize("mode", ["memory", "disk"])
def test_a_resumed_epoch_trains_the_rows_that_were_left(mode: str, tmp_path) -> None:
    """A retried task finishes its epoch on as many rows as were left: without
    shuffling, the epoch's last rows in order; with it, a random subset."""
    columns = [Column("x", "dense", 1), Column("y", "int", 1)]
    with PartitionCache(columns, mode=mode, directory=str(tmp_path)) as cache:
        ids = np.arange(100)
        cache.append(pa.RecordBatch.from_pydict({"x": [[float(i)] for i in ids], "y": ids}))
        feed = Feed(cache, columns[:1], [(1,)], [False], columns[1:], 8)

        def rows(start: int, *, shuffle: bool, seed: int) -> list[int]:
            batches = feed.train(start, 100, shuffle=shuffle, seed=seed, limit=30).take(4)
            return [int(v) for _, y in batches for v in y.numpy()]

        assert rows(70, shuffle=False, seed=0) == list(range(70, 100))
        first, second = rows(0, shuffle=True, seed=0), rows(0, shuffle=True, seed=1)
        assert len(set(first)) == len(set(second)) == 30  # 30 rows, none twice
        assert first != second and sorted(first) != list(range(30))  # random subsets


def test_feeds_run_without_tf_data_autotuning(tmp_path) -> None:
    """Training, evaluation and scoring pipelines turn tf.data's autotuner off: nothing
    in them has a size to tune, and we attribute stalls of up to 1.3 s at the end of a
    ``model.fit`` (its iterator deleted) to its thread
    (:func:`sparkdl.executor.feed.untuned`)."""
    columns = [Column("x", "dense", 1), Column("y", "int", 1)]
    with PartitionCache(columns, mode="memory", directory=str(tmp_path)) as cache:
        ids = np.arange(20)
        cache.append(pa.RecordBatch.from_pydict({"x": [[float(i)] for i in ids], "y": ids}))
        feed = Feed(cache, columns[:1], [(1,)], [False], columns[1:], 8)
        streamed = feed.stream(lambda: iter([]))
        for dataset in (feed.train(0, 20, shuffle=True, seed=0), feed.evaluate(), streamed):
            assert dataset.options().autotune.enabled is False
        assert int(feed.evaluate().cardinality()) == 3  # 20 rows in batches of 8
        assert [int(v) for _, y in feed.evaluate() for v in y.numpy()] == list(range(20))
