"""The relay's routes of a service in the cluster, over real sockets on 127.0.0.1.

The relay (:mod:`sparkdl.driver.relay`) is how a driver that cannot reach the service follows
and steers a fit; its routes answer only the relay's token (the service keeps its
SHA-256), the workers' token opens none of them, and every number is checked.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import urllib3

from sparkdl.contract.payload import result_rows, service_result
from sparkdl.protocol import wire
from sparkdl.protocol.client import ServiceClient
from sparkdl.server.state.store import WeightStore
from sparkdl.server.web.relay import relay_digest
from sparkdl.server.web.service import ParameterService
from sparkdl.sync.merges import Average

RELAY = "relay-secret"
SHAPES = [(3, 2), (2,)]


@pytest.fixture
def service():
    store = WeightStore(
        [np.zeros(s, np.float32) for s in SHAPES],
        num_workers=1,
        merge=Average(),
        epochs=3,
        gate_epochs=True,
    )
    with ParameterService(store, host="127.0.0.1", relay_digest=relay_digest(RELAY)) as svc:
        yield svc


@pytest.fixture
def http(service: ParameterService):
    pool = urllib3.HTTPConnectionPool("127.0.0.1", service.port, retries=False, timeout=10)
    yield pool
    pool.close()


def get(http, path: str, token: str):
    return http.urlopen("GET", path, headers={"Authorization": f"Bearer {token}"})


def test_the_relay_reads_the_status_and_steers_the_fit(service, http) -> None:
    answer = get(http, "/relay?known=0&released=0&stop=1&lr=0.01", RELAY)
    assert answer.status == 200
    status = json.loads(answer.data)
    assert status["stop_requested"] and status["learning_rate"] == 0.01
    weights = get(http, "/relay/weights?epoch=0", RELAY)
    arrays, meta = wire.decode(weights.data)
    assert weights.status == 200 and meta["epoch"] == 0
    assert [a.shape for a in arrays] == SHAPES
    aborted = get(http, "/relay?abort=user%20pressed%20stop", RELAY)
    assert aborted.status == 200 and "user pressed stop" in json.loads(aborted.data)["aborted"]
    assert service.store.aborted_event.is_set()


@pytest.mark.parametrize("token", ["", "wrong", "workers"])
def test_the_relay_routes_need_the_relay_token(service, http, token) -> None:
    token = service.token if token == "workers" else token
    for path in ("/relay", "/relay/weights?epoch=0", "/relay?abort=x"):
        assert get(http, path, token).status == 401
    assert not service.store.aborted_event.is_set()  # nothing was done


def test_the_relay_token_opens_no_worker_route(service, http) -> None:
    for path in ("/status", "/weights"):
        assert get(http, path, RELAY).status == 401
    assert get(http, "/status", service.token).status == 200


@pytest.mark.parametrize(
    "query",
    [
        "known=-1",
        "known=4",  # more epochs than the fit has
        "released=99",
        "stop=2",
        "lr=nan",
        "lr=-1",
        "lr=inf",
        "lr=abc",
        "known=1e3",
    ],
)
def test_the_relay_refuses_numbers_the_fit_cannot_have(service, http, query) -> None:
    answer = get(http, f"/relay?{query}", RELAY)
    assert answer.status == 400, answer.data
    assert "error" in json.loads(answer.data)
    status = service.store.status()
    assert not status["stop_requested"] and status["learning_rate"] is None


def test_the_relay_refuses_an_epoch_past_the_fit(service, http) -> None:
    assert get(http, "/relay/weights?epoch=3", RELAY).status == 400


def test_without_a_relay_digest_there_are_no_relay_routes() -> None:
    store = WeightStore([np.zeros(2, np.float32)], num_workers=1, merge=Average(), epochs=1)
    with ParameterService(store, host="127.0.0.1") as svc:
        client = ServiceClient(svc.url, svc.token, worker=0)
        status, _ = client.get("/relay")
        client.close()
        assert status == 401  # no token opens a route that does not exist


def test_the_hosts_result_rows_round_trip() -> None:
    weights = [np.arange(6, dtype=np.float32).reshape(3, 2), np.ones(2, np.float64)]
    rows = [b.to_pylist()[0] for b in result_rows(weights, {"loss": [1.0]}, {"v": 1}, {1: "tb"})]
    found = service_result(rows)
    assert found is not None and found["history"] == {"loss": [1.0]}
    assert found["failures"] == {1: "tb"}
    assert all(np.array_equal(a, b) for a, b in zip(found["weights"], weights, strict=True))


def test_a_missing_weights_chunk_is_an_error() -> None:
    rows = [b.to_pylist()[0] for b in result_rows([np.ones(2)], {}, {}, {})]
    with pytest.raises(RuntimeError, match="parts"):
        service_result(rows[:1])


def test_sharded_hosts_result_rows_join_into_the_whole_weights() -> None:
    from sparkdl.sync.shards import ShardLayout

    weights = [np.arange(40, dtype=np.float32).reshape(20, 2), np.ones(2, np.float32)]
    layout = ShardLayout.plan([(w.shape, w.dtype) for w in weights], 2)
    statuses = [
        {"version": 7, "samples_seen": 10, "epochs_done": 3 - j, "failures": {}, "traffic": {}}
        for j in range(2)
    ]
    rows = []
    for j, part in enumerate(layout.split(weights)):
        failures = {1: "tb"} if j == 1 else {}
        batches = result_rows(part, {"loss": [1.0]}, statuses[j], failures, shard=j)
        rows += [b.to_pylist()[0] for b in batches]
    found = service_result(list(reversed(rows)), layout)
    assert found is not None and found["failures"] == {1: "tb"}
    assert all(np.array_equal(a, b) for a, b in zip(found["weights"], weights, strict=True))
    assert found["status"]["epochs_done"] == 2 and len(found["status"]["shards"]) == 2
    one_shard = [r for r in rows if r["worker"] != -1 or json.loads(r["report"])["shard"] == 0]
    with pytest.raises(RuntimeError, match=r"from shards \[0\] of 2"):
        service_result([r for r in one_shard if not str(r["report"]).startswith("1:")], layout)


def test_the_relay_polls_every_shard_and_joins_their_weights(tmp_path, monkeypatch) -> None:
    """A poll task reads a sharded rendezvous, tells every shard what the driver
    decided, and returns the status and an epoch's weights joined from the shards."""
    import tempfile

    from sparkdl.contract import rendezvous as rv
    from sparkdl.executor import relay_poll
    from sparkdl.sync.shards import ShardLayout

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    weights = [np.arange(40, dtype=np.float32).reshape(20, 2), np.full(2, 3.0, np.float32)]
    layout = ShardLayout.plan([(w.shape, w.dtype) for w in weights], 2)
    stores = [
        WeightStore(part, num_workers=1, merge=Average(), epochs=3, history={"loss": [0.5]})
        for part in layout.split(weights)
    ]
    with (
        ParameterService(stores[0], host="127.0.0.1", relay_digest=relay_digest(RELAY)) as a,
        ParameterService(stores[1], host="127.0.0.1", relay_digest=relay_digest(RELAY)) as b,
    ):
        rv.write_rendezvous("fit-s", 0, 3, {"urls": [a.url, b.url], "certs": ["", ""]})
        request = {
            "fit_id": "fit-s",
            "token": RELAY,
            "timeout": 10,
            "layout": layout.to_json(),
            "query": {"known": 1, "released": 0, "stop": 1, "wait": 0.0},
            "fetched": -1,
        }
        rows = relay_poll.poll_rows(request).to_pylist()
    kinds = [r["kind"] for r in rows]
    assert kinds[0] == "status" and "weights" in kinds, rows[:1]
    status = json.loads(rows[0]["body"])
    assert status["epochs_done"] == 1 and [s["shard"] for s in status["shards"]] == [0, 1]
    assert all(s.status()["stop_requested"] for s in stores)
    arrays, meta = wire.decode(b"".join(r["body"] for r in rows if r["kind"] == "weights"))
    assert meta["epoch"] == 0
    assert all(np.array_equal(x, y) for x, y in zip(arrays, weights, strict=True))
