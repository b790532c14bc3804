"""Shards of a service in the cluster, hosted for real (:class:`~sparkdl.executor.
hosting.Hosted` with its real services, snapshots and TLS on 127.0.0.1), in worker
threads whose ``allGather`` is a barrier and whose machines hold the snapshots a test
gives them: one worker takes over two shards from snapshots of an epoch, the newer
snapshot of an abandoned attempt is discarded, and the host returns both shards' result
rows, which join into the whole model. (The barrier stage itself is tested by the slow
tier's killed-host fits.)"""

from __future__ import annotations

import threading
import types
from typing import Any

import numpy as np
import pytest

from sparkdl.config import TrainConfig
from sparkdl.contract.payload import Hosting, WorkerPayload, result_rows, service_result
from sparkdl.contract.plan import FitPlan
from sparkdl.executor import hosting
from sparkdl.executor.hosting import Hosted
from sparkdl.server.state import checkpoints
from sparkdl.sync.shards import ShardLayout
from tests.unit.test_hosting import FakeBarrier


class Machine(Hosted):
    """A worker whose machine holds snapshots of ``held[shard]`` epochs (the snapshot
    files all live in this test's one directory)."""

    held: list[list[int]]

    def _held(self, shard: int) -> list[int]:
        on_disk = super()._held(shard)
        return [e for e in self.held[shard] if e in on_disk]


@pytest.fixture(autouse=True)
def _own_rendezvous_dir(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


def test_one_worker_takes_over_two_shards_from_their_snapshots() -> None:
    import keras

    from sparkdl.contract.keras_io import model_to_bytes

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(40), keras.layers.Dense(3)])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    weights = model.get_weights()
    layout = ShardLayout.plan([(w.shape, w.dtype) for w in weights], 2)
    plan = FitPlan.resolve(
        TrainConfig(service_shards=2, service_placement="cluster", epochs=10, service_tls=True),
        num_workers=3,
        rows=300,
        threads=1,
        service_host="127.0.0.1",
        service_placement="cluster",
    )
    assert plan.service_tls  # each host makes a certificate of its own
    fit_id = "fit-takeover"
    saved = [[np.full_like(w, 3.0) for w in part] for part in layout.split(weights)]
    for shard, part in enumerate(saved):
        directory = hosting._snapshot_dir(fit_id, shard)
        checkpoints.write(directory, 3, part, {"loss": [3.0, 2.0, 1.0]}, {}, keep=3)
    # An abandoned attempt's newer snapshot of shard 0 alone: never resumed from.
    stale = hosting._snapshot_dir(fit_id, 0)
    checkpoints.write(stale, 4, [np.full_like(w, 4.0) for w in saved[0]], {}, {}, keep=3)

    payload = WorkerPayload(
        plan=plan,
        url="",
        token="t" * 32,
        model_bytes=types.SimpleNamespace(value=model_to_bytes(model)),
        custom_objects=None,
        input_shapes=[(4,)],
        label_kinds=["int"],
        label_widths=[1],
        label_shapes=[()],
        hosting=Hosting(fit_id, "d" * 64, False, None, [100, 100, 100], "127.0.0.1"),
        shard_layout=layout.to_json(),
    )
    fake = FakeBarrier(3)
    # Workers 0 and 2 are on machines without snapshots; worker 1's holds both shards'.
    holdings = [[[], []], [[3, 4], [3]], [[], []]]
    workers = []
    for worker, held in enumerate(holdings):
        machine = Machine(payload, fake.context(worker), worker, lambda: None)
        machine.held = held
        workers.append(machine)
    entered: list[Any] = [None] * 3

    def enter(worker: int) -> None:
        try:
            entered[worker] = workers[worker].__enter__()
        except Exception as exc:  # the test reads it
            entered[worker] = exc

    threads = [threading.Thread(target=enter, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert all(isinstance(e, Hosted) for e in entered), entered
        urls = {e.payload.shard_urls for e in entered}
        assert len(urls) == 1 and all(u.startswith("https://127.0.0.1:") for u in urls.pop())
        assert {e.payload.plan.initial_epoch for e in entered} == {3}
        assert len(set(entered[0].payload.shard_certs)) == 2  # one certificate per host
        assert checkpoints.epochs(stale) == [3]  # the abandoned epoch 4 is gone
        host = workers[1]
        assert host._shards_served == [0, 1] and workers[0]._services == []
        stores = [service.store for service in host._services]
        for store, part in zip(stores, saved, strict=True):
            assert store.initial_epochs == 3
            for a, b in zip(store.weights(), part, strict=True):
                np.testing.assert_array_equal(a, b)
        for store in stores:
            for worker in range(3):
                store.join(worker, 100, wait=0.0)
                store.leave(worker)
        rows = [b.to_pylist()[0] for b in host.finish()]
        result = service_result(rows, layout)
        assert result is not None and result["history"]["loss"] == [3.0, 2.0, 1.0]
        for a, b in zip(result["weights"], layout.join(saved), strict=True):
            np.testing.assert_array_equal(a, b)
    finally:
        for machine in workers:
            machine.__exit__(None, None, None)


def test_result_rows_of_one_service_still_read_without_a_layout() -> None:
    rows = [b.to_pylist()[0] for b in result_rows([np.ones(3)], {}, {"v": 1}, {})]
    found = service_result(rows)
    assert found is not None and found["outer"] is None and found["weights"][0].tolist() == [1] * 3
