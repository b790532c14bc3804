"""The parameter service over real sockets on 127.0.0.1 (cheroot + Flask + urllib3)."""

from __future__ import annotations

import json
import pickle
import socket

import numpy as np
import pytest
import urllib3
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkdl.errors import ServiceError
from sparkdl.server import wire
from sparkdl.server.client import ServiceClient
from sparkdl.server.rules import AverageRule
from sparkdl.server.service import ParameterService
from sparkdl.server.store import WeightStore

SHAPES = [(8, 4), (4,)]


@pytest.fixture
def service():
    store = WeightStore(
        [np.zeros(s, np.float32) for s in SHAPES], num_workers=1, rule=AverageRule()
    )
    with ParameterService(store, host="127.0.0.1") as svc:
        yield svc


@pytest.fixture
def http(service: ParameterService):
    pool = urllib3.HTTPConnectionPool("127.0.0.1", service.port, retries=False, timeout=10)
    yield pool
    pool.close()


def auth(service: ParameterService) -> dict[str, str]:
    return {"Authorization": f"Bearer {service.token}"}


def good_body(value: float = 1.0, seq: int = 1, round_no: int = 0) -> bytes:
    arrays = [np.full(s, value, np.float32) for s in SHAPES]
    return wire.encode_bytes(arrays, {"worker": 0, "seq": seq, "round": round_no, "samples": 5})


def push(http, service, body: bytes, headers: dict | None = None):
    h = {"Content-Type": wire.CONTENT_TYPE, **auth(service), **(headers or {})}
    return http.urlopen("POST", "/push", body=body, headers=h)


def test_client_push_pull_status(service: ParameterService) -> None:
    client = ServiceClient(service.url, service.token, worker=0)
    weights, version = client.push_sync(
        [np.full(s, 2.0, np.float32) for s in SHAPES], round_no=0, samples=3
    )
    assert version == 1 and float(weights[0][0, 0]) == 2.0
    status = client.status()
    assert status["version"] == 1 and status["samples_seen"] == 3
    assert status["workers"]["0"]["pushes"] == 1
    client.close()


@pytest.mark.parametrize("header", [None, "Bearer wrong", "Basic abc", "Bearer "])
def test_every_route_needs_the_token(service, http, header) -> None:
    headers = {} if header is None else {"Authorization": header}
    for method, path in [
        ("GET", "/status"),
        ("GET", "/weights"),
        ("POST", "/push"),
        ("POST", "/fail"),
        ("POST", "/join"),
    ]:
        response = http.urlopen(
            method, path, headers=headers, body=b"" if method == "POST" else None
        )
        assert response.status == 401, (method, path)
        assert "token" in json.loads(response.data)["error"]
    assert service.store.version == 0


def test_pickle_oversize_and_malformed_bodies_get_4xx(service, http) -> None:
    before = [w.copy() for w in service.store.weights()]
    cases = {
        "pickle": pickle.dumps([np.ones(s, np.float32) for s in SHAPES]),
        "truncated": good_body()[:-4],
        "empty": b"",
        "garbage": b"\x00" * 64,
    }
    for name, body in cases.items():
        response = push(http, service, body)
        assert response.status == 400, name
        assert "error" in json.loads(response.data)
    big = b"\0" * (service.store.weights()[0].nbytes * 64 + (2 << 20))
    assert push(http, service, big).status == 413
    assert (
        push(http, service, good_body(), {"Content-Type": "application/octet-stream"}).status == 415
    )
    wrong = wire.encode_bytes(
        [np.zeros((3, 3), np.float32), np.zeros(4, np.float32)],
        {"worker": 0, "seq": 1, "round": 0, "samples": 1},
    )
    assert push(http, service, wrong).status == 400
    bad_meta = wire.encode_bytes([np.zeros(s, np.float32) for s in SHAPES], {"worker": "x"})
    assert push(http, service, bad_meta).status == 400
    assert http.urlopen("GET", "/weights?wait=abc", headers=auth(service)).status == 400
    for got, want in zip(service.store.weights(), before, strict=True):
        np.testing.assert_array_equal(got, want)
    assert push(http, service, good_body()).status == 200  # still serving


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=st.binary(max_size=2048), prefix=st.booleans())
def test_random_bodies_never_cause_5xx(service, http, body: bytes, prefix: bool) -> None:
    if prefix:
        body = good_body()[: len(body) % 200] + body
    response = push(http, service, body)
    assert 400 <= response.status < 500
    assert service.store.version == 0


def test_client_error_names_url_and_setting() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = ServiceClient(
        f"http://127.0.0.1:{port}", "t", worker=0, timeout=1, retries=1, backoff=0.01
    )
    with pytest.raises(ServiceError, match=rf"127\.0\.0\.1:{port}.*request_retries"):
        client.status()


def test_port_is_released_after_stop() -> None:
    store = WeightStore([np.zeros(1, np.float32)], num_workers=1, rule=AverageRule())
    svc = ParameterService(store, host="127.0.0.1").start()
    port = svc.port
    svc.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # would raise if the port were still held
