"""Many clients, lost answers, retried tasks: every update is applied exactly once."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from sparkdl.errors import TrainingError
from sparkdl.protocol.client import ServiceClient
from sparkdl.server.state.store import WeightStore
from sparkdl.server.web.service import ParameterService
from sparkdl.sync.merges import Average, Delta
from tests.integration.dropping_proxy import DroppingProxy
from tests.stores import joined

SHAPES = [(64, 32), (32,)]
CLIENTS = 8
PUSHES = 200


def test_concurrent_deltas_through_dropped_answers_apply_exactly_once() -> None:
    rng = np.random.default_rng(0)
    initial = [rng.integers(-100, 100, s).astype(np.float32) for s in SHAPES]
    store = joined(WeightStore(initial, num_workers=CLIENTS, merge=Delta(), mode="asynchronous"))
    with (
        ParameterService(store, host="127.0.0.1") as service,
        DroppingProxy(service.port, drop_every=17) as proxy,
    ):

        def work(worker: int) -> list[np.ndarray]:
            client = ServiceClient(
                proxy.url, service.token, worker=worker, timeout=10, retries=10, backoff=0.005
            )
            local = np.random.default_rng(100 + worker)
            sent = [np.zeros(s, np.float64) for s in SHAPES]
            version = 0
            for _ in range(PUSHES):
                delta = [local.integers(-3, 4, s).astype(np.float32) for s in SHAPES]
                weights, new_version = client.push(delta, base_version=version, samples=1)
                assert new_version > version
                assert [w.shape for w in weights] == SHAPES
                version = new_version
                for total, d in zip(sent, delta, strict=True):
                    total += d
            client.close()
            return sent

        with ThreadPoolExecutor(CLIENTS) as pool:
            totals = list(pool.map(work, range(CLIENTS)))

    expected = [
        (init.astype(np.float64) + sum(t[i] for t in totals)).astype(np.float32)
        for i, init in enumerate(initial)
    ]
    for got, want in zip(store.weights(), expected, strict=True):
        np.testing.assert_array_equal(got, want)
    status = store.status()
    assert store.version == CLIENTS * PUSHES
    assert status["samples_seen"] == CLIENTS * PUSHES
    assert proxy.dropped >= CLIENTS * PUSHES // 17 - 1
    assert status["duplicates"] == proxy.dropped  # each lost answer: one retry, not applied
    print(
        f"{CLIENTS * PUSHES} pushes by {CLIENTS} clients, {proxy.dropped} answers dropped, "
        f"{status['duplicates']} retries recognised and not applied, center exact"
    )


def test_retried_task_rejoins_under_its_id_and_the_zombie_is_fenced() -> None:
    store = WeightStore(
        [np.zeros(4, np.float32)], num_workers=2, merge=Delta(), mode="asynchronous"
    )
    with ParameterService(store, host="127.0.0.1") as service:
        first = ServiceClient(service.url, service.token, worker=1, attempt=0)
        first.join(rows=10)
        for _ in range(3):
            first.push([np.ones(4, np.float32)], base_version=0, samples=1)
        retry = ServiceClient(service.url, service.token, worker=1, attempt=1)
        retry.join(rows=10)  # Spark re-ran the task: same worker id, next attempt
        weights, version = retry.push([np.ones(4, np.float32)], base_version=3, samples=1)
        assert version == 4 and weights[0].tolist() == [4.0] * 4
        with pytest.raises(TrainingError, match="superseded"):
            first.push([np.full(4, 100.0, np.float32)], base_version=3, samples=1)
        assert store.weights()[0].tolist() == [4.0] * 4
        status = store.status()["workers"]["1"]
        assert status["attempt"] == 1 and status["seq"] == 4 and status["pushes"] == 4
        first.close()
        retry.close()


def test_zombie_of_a_retried_barrier_stage_is_fenced_over_http() -> None:
    store = WeightStore([np.zeros(4, np.float32)], num_workers=2, merge=Average())
    with ParameterService(store, host="127.0.0.1") as service:
        old = [ServiceClient(service.url, service.token, worker=w, attempt=w) for w in (0, 1)]
        threads = [threading.Thread(target=c.join, args=(10,)) for c in old]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # Round 0 merges; then worker 1's process dies before pushing for round 1.
        pushes = [
            threading.Thread(
                target=c.push,
                args=([np.full(4, 2.0 * w, np.float32)],),
                kwargs={"base_version": 0, "samples": 1},
            )
            for w, c in enumerate(old)
        ]
        for t in pushes:
            t.start()
        for t in pushes:
            t.join()
        assert store.weights()[0].tolist() == [1.0] * 4
        # Spark retries the barrier stage: both workers rejoin with newer attempts.
        new = [ServiceClient(service.url, service.token, worker=w, attempt=2 + w) for w in (0, 1)]
        joins = [threading.Thread(target=c.join, args=(10,)) for c in new]
        for t in joins:
            t.start()
        for t in joins:
            t.join()
        with pytest.raises(TrainingError, match="superseded"):
            old[0].push([np.full(4, 100.0, np.float32)], base_version=1, samples=1)
        assert store.weights()[0].tolist() == [1.0] * 4 and store.status()["round_pushed"] == []
        for c in old + new:
            c.close()
