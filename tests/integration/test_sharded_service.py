"""A sharded parameter service over real sockets on 127.0.0.1: k services, one fit.

Simulated workers (threads running the real clients and pushers, no Keras) check that
a sharded synchronous service computes exactly what one service does, codecs
included; that an abort on one shard reaches the others; that each shard counts its
traffic; and that each shard refuses what one service refuses.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import urllib3

from sparkdl.errors import TrainingError
from sparkdl.executor.channel import open_pusher
from sparkdl.protocol import wire
from sparkdl.protocol.client import ServiceClient
from sparkdl.protocol.sharded import ShardedClient
from sparkdl.server.state.replicas import FULL
from sparkdl.server.state.sharded import ShardedStore
from sparkdl.server.state.store import WeightStore
from sparkdl.server.web.service import ParameterService
from sparkdl.sync.codecs import Compression, Float16, Sign, TopK
from sparkdl.sync.merges import Average, Delta, Elastic, Merge
from sparkdl.sync.shards import ShardLayout

SHAPES = [(40, 8), (8,), (8, 30), (30,), ()]
WORKERS = 3
STEPS = 6


def initial() -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.normal(size=s).astype(np.float32) for s in SHAPES]


@contextlib.contextmanager
def sharded_service(
    k: int, merge: Merge, mode: str, compression: Compression | None = None
) -> Iterator[tuple[ShardedStore, list[str], str]]:
    weights = initial()
    layout = ShardLayout.plan([(w.shape, w.dtype) for w in weights], k)
    stores = [
        WeightStore(
            part,
            num_workers=WORKERS,
            merge=merge,
            mode=mode,
            compression=compression,
            epochs=1,
        )
        for part in layout.split(weights)
    ]
    sharded = ShardedStore(stores, layout)
    sharded.start()
    token = secrets.token_urlsafe(16)
    with contextlib.ExitStack() as stack:
        stack.callback(sharded.close)
        urls = [
            stack.enter_context(ParameterService(s, host="127.0.0.1", token=token)).url
            for s in stores
        ]
        yield sharded, urls, token


class Holder:
    """A worker's weights without a model (what WeightAccess is to a Keras model)."""

    def __init__(self, weights: list[np.ndarray]) -> None:
        self.value = [w.copy() for w in weights]

    def get(self) -> list[np.ndarray]:
        return [w.copy() for w in self.value]

    def set(self, weights: list[np.ndarray]) -> None:
        self.value = [np.array(w, copy=True) for w in weights]


def train(worker: int, holder: Holder, pusher: Any) -> None:
    """Deterministic 'training': each step moves the weights by a worker-specific amount."""
    rng = np.random.default_rng(100 + worker)
    for step in range(STEPS):
        holder.set([w - 0.05 * rng.normal(size=w.shape).astype(w.dtype) for w in holder.get()])
        meta = {"loss": 1.0 / (step + 1), "epoch": 0, "step": step + 1}
        if step == STEPS - 1:
            meta.update(epoch_logs={"loss": 0.5}, epoch_samples=10 * STEPS)
        pusher.push(10, meta, wait=True, whole=step == STEPS - 1)
    pusher.close()


def run_workers(urls: list[str], token: str, layout: ShardLayout | None, merge, compression):
    """Every worker in a thread; returns their final local weights."""
    finals: dict[int, list[np.ndarray]] = {}
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            clients = [ServiceClient(u, token, worker=worker, timeout=20) for u in urls]
            client: Any = ShardedClient(clients, layout) if layout else clients[0]
            client.join(rows=100)
            weights, version = client.pull(0, replica=FULL if compression else None)
            holder = Holder(weights)
            pusher = open_pusher(
                client,
                merge,
                holder,  # type: ignore[arg-type]
                center=weights,
                version=version,
                overlap=False,
                compression=compression,
            )
            train(worker, holder, pusher)
            client.leave()
            client.close()
            finals[worker] = holder.value
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    return [finals[w] for w in range(WORKERS)]


CASES = [
    ("average", lambda: Average(), None),
    ("delta", lambda: Delta(), None),
    ("elastic", lambda: Elastic(alpha=0.3), None),
    ("delta+float16", lambda: Delta(), Compression(Float16(), Float16())),
    ("delta+topk", lambda: Delta(), Compression(TopK(0.1), TopK(0.25))),
    ("average+topk", lambda: Average(relative=True), Compression(TopK(0.1), TopK(0.25))),
    ("delta+sign", lambda: Delta(), Compression(Sign(), Float16())),
]


@pytest.mark.parametrize("name,merge,compression", CASES, ids=[c[0] for c in CASES])
def test_a_sharded_synchronous_service_computes_what_one_service_does(
    name, merge, compression
) -> None:
    results = {}
    for k in (1, 3):
        with sharded_service(k, merge(), "synchronous", compression) as (store, urls, token):
            layout = store.layout if k > 1 else None
            locals_ = run_workers(urls, token, layout, merge(), compression)
            results[k] = (store.weights(), locals_, store.status())
    (one, one_locals, one_status), (three, three_locals, status) = results[1], results[3]
    # The same operations on the same numbers. Codecs work per part: top-k picks its
    # values per part of a split variable (as many in each as its share), sign scales
    # per part, and a part below 256 values goes uncompressed; the sums then differ.
    lossy = "topk" in name or "sign" in name
    atol = 2e-2 if lossy else 0.0
    for a, b in zip(one, three, strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=atol)
    if not lossy:  # (error feedback keeps what each part left out)
        for a_list, b_list in zip(one_locals, three_locals, strict=True):
            for a, b in zip(a_list, b_list, strict=True):
                np.testing.assert_array_equal(b, a)  # every worker's weights too
    assert status["history"] == one_status["history"] == {"loss": [0.5]}
    shards = status["shards"]
    assert [s["version"] for s in shards] == [STEPS] * 3
    # Each shard moved about a third of the bytes: no host carries them all.
    bytes_in = [s["traffic"]["bytes_in"] for s in shards]
    assert sum(bytes_in) == status["traffic"]["bytes_in"]
    if compression is None:  # (a compressed part below 256 values travels whole)
        assert max(bytes_in) < 0.6 * one_status["traffic"]["bytes_in"], bytes_in


@pytest.mark.parametrize("mode", ["asynchronous", "hogwild"])
def test_asynchronous_shards_merge_every_push_independently(mode) -> None:
    with sharded_service(3, Delta(), mode) as (store, urls, token):
        run_workers(urls, token, store.layout, Delta(), None)
        status = store.status()
    # Every shard took every push once: the same samples and versions everywhere.
    assert {s["samples_seen"] for s in status["shards"]} == {WORKERS * STEPS * 10}
    assert {s["version"] for s in status["shards"]} == {WORKERS * STEPS}
    assert status["epochs_done"] == 1


def test_a_fatal_failure_on_one_shard_aborts_every_shard() -> None:
    with sharded_service(3, Average(), "synchronous") as (store, urls, token):
        for shard in store.stores:  # every worker joined every shard
            for worker in range(WORKERS):
                shard.join(worker, 100, wait=0.0)
        client = ServiceClient(urls[2], token, worker=1, timeout=10)
        client.report_failure(RuntimeError("boom on purpose"))  # to shard 2 only
        assert store.aborted_event.wait(5.0)
        other = ServiceClient(urls[0], token, worker=0, timeout=10)
        with pytest.raises(TrainingError, match="aborted"):
            other.push(
                [np.zeros(a.shape, np.float32) for a in store.layout.split(initial())[0]],
                base_version=0,
                samples=1,
            )
        assert 1 in store.failures() and "boom on purpose" in store.failures()[1]
        client.close()
        other.close()


def test_each_shard_refuses_what_one_service_refuses() -> None:
    with sharded_service(3, Average(), "synchronous") as (store, urls, token):
        before = [w.copy() for w in store.weights()]
        shard1 = store.stores[1]
        port = int(urls[1].rsplit(":", 1)[1])
        pool = urllib3.HTTPConnectionPool("127.0.0.1", port, retries=False, timeout=10)
        status = pool.urlopen("GET", "/status")  # no token
        assert status.status == 401
        forged = pool.urlopen("GET", "/status", headers={"Authorization": "Bearer wrong"})
        assert forged.status == 401
        # A token holder sends shard 0's part to shard 1: its shapes do not match.
        wrong = store.layout.split(initial())[0]
        body = wire.encode_bytes(wrong, {"worker": 0, "seq": 1, "base_version": 0, "samples": 1})
        for w in range(WORKERS):
            shard1.join(w, 100, wait=0.0)
        answer = pool.urlopen(
            "POST",
            "/push",
            body=body,
            headers={"Authorization": f"Bearer {token}", "Content-Type": wire.CONTENT_TYPE},
        )
        assert answer.status == 400 and b"weight arrays" in answer.data
        pool.close()
        for a, b in zip(before, store.weights(), strict=True):
            np.testing.assert_array_equal(a, b)


def test_a_retried_asynchronous_task_replays_a_push_once_on_every_shard() -> None:
    """A task died after its push reached shard 0 but not shard 1: the retry resumes
    before that push, and shard 0 takes the replay as a retry (not twice)."""
    with sharded_service(2, Delta(), "asynchronous") as (store, urls, token):
        parts = store.layout.split([np.full(s, 0.5, np.float32) for s in SHAPES])
        first = [ServiceClient(u, token, worker=0, timeout=10) for u in urls]
        for client in first:
            client.join(rows=100)
        step = {"epoch": 0, "step": 1}
        first[0].push(parts[0], base_version=0, samples=5, meta=step)  # shard 0 only
        for client in first:
            client.close()
        retry = ShardedClient(
            [ServiceClient(u, token, worker=0, timeout=10, attempt=1) for u in urls],
            store.layout,
            realign=True,
        )
        joined = retry.join(rows=100)
        assert joined["position"] is None  # resumes before the push shard 1 missed
        retry.each_shard(
            lambda j: retry.clients[j].push(parts[j], base_version=0, samples=5, meta=step)
        )
        retry.close()
        shards = store.status()["shards"]
        assert [s["samples_seen"] for s in shards] == [5, 5]
        assert [s["version"] for s in shards] == [1, 1]  # each applied it once
