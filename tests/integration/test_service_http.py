"""The parameter service over real sockets on 127.0.0.1 (cheroot + Flask + urllib3)."""

from __future__ import annotations

import json
import pickle
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import urllib3
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.fuzz_service import training_state
from sparkdl.errors import ServiceError, TrainingError
from sparkdl.protocol import wire
from sparkdl.protocol.client import ServiceClient
from sparkdl.server.state.store import WeightStore
from sparkdl.server.web.service import ParameterService
from sparkdl.sync.merges import Average, Delta
from tests.stores import joined

SHAPES = [(8, 4), (4,)]


@pytest.fixture
def service():
    store = WeightStore([np.zeros(s, np.float32) for s in SHAPES], num_workers=1, merge=Average())
    with ParameterService(joined(store), host="127.0.0.1") as svc:
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
    return wire.encode_bytes(
        arrays, {"worker": 0, "seq": seq, "base_version": round_no, "samples": 5}
    )


def push(http, service, body: bytes, headers: dict | None = None):
    h = {"Content-Type": wire.CONTENT_TYPE, **auth(service), **(headers or {})}
    return http.urlopen("POST", "/push", body=body, headers=h)


def test_client_push_pull_status(service: ParameterService) -> None:
    client = ServiceClient(service.url, service.token, worker=0)
    weights, version = client.push(
        [np.full(s, 2.0, np.float32) for s in SHAPES], base_version=0, samples=3
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
        ("POST", "/leave"),
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
        {"worker": 0, "seq": 1, "base_version": 0, "samples": 1},
    )
    assert push(http, service, wrong).status == 400
    bad_meta = wire.encode_bytes([np.zeros(s, np.float32) for s in SHAPES], {"worker": "x"})
    assert push(http, service, bad_meta).status == 400
    assert http.urlopen("GET", "/weights?wait=abc", headers=auth(service)).status == 400
    for got, want in zip(service.store.weights(), before, strict=True):
        np.testing.assert_array_equal(got, want)
    assert push(http, service, good_body()).status == 200  # still serving


@pytest.fixture(params=["synchronous", "asynchronous"])
def any_service(request):
    merge = Average() if request.param == "synchronous" else Delta()
    store = WeightStore(
        [np.zeros(s, np.float32) for s in SHAPES], num_workers=2, merge=merge, mode=request.param
    )
    with ParameterService(joined(store), host="127.0.0.1") as svc:
        yield svc


def _meta(**overrides) -> dict:
    meta = {"worker": 0, "seq": 1, "base_version": 0, "samples": 5}
    meta.update(overrides)
    return {k: v for k, v in meta.items() if v is not None}


def _bad_arrays(kind: str) -> list[np.ndarray]:
    arrays = [np.ones(s, np.float32) for s in SHAPES]
    if kind == "dtype":
        return [a.astype(np.float64) for a in arrays]
    if kind == "shape":
        return [np.ones((4, 8), np.float32), arrays[1]]
    if kind == "count":
        return arrays[:1]
    if kind == "nan":
        arrays[1][2] = np.nan
        return arrays
    return arrays


# Pushes that are refused for a reason the body states; any mutation keeps them refused.
_REFUSED_PUSHES = [
    ("unknown worker", _meta(worker=99), "ok"),
    ("stale round / future version", _meta(base_version=7), "ok"),
    ("missing seq", _meta(seq=None), "ok"),
    ("negative samples", _meta(samples=-1), "ok"),
    ("wrong dtype", _meta(), "dtype"),
    ("wrong shape", _meta(), "shape"),
    ("wrong count", _meta(), "count"),
    ("NaN values", _meta(), "nan"),
]


@st.composite
def bad_requests(draw):
    """(method, path, headers, body) of a request the service must refuse with a 4xx."""
    kind = draw(st.sampled_from(["refused", "damaged", "random", "auth", "type", "json"]))
    headers = {"Content-Type": wire.CONTENT_TYPE}
    if kind == "random":
        return "POST", "/push", headers, draw(st.binary(max_size=4096))
    if kind == "json":
        path = draw(st.sampled_from(["/join", "/fail", "/leave"]))
        body = draw(
            st.one_of(
                st.binary(max_size=512),
                st.builds(
                    lambda w, extra: json.dumps({"worker": w, **extra}).encode(),
                    st.one_of(st.integers(max_value=-1), st.integers(min_value=2), st.text()),
                    st.dictionaries(st.sampled_from(["rows", "traceback", "attempt"]), st.text()),
                ),
            )
        )
        return "POST", path, {"Content-Type": "application/json"}, body
    _, meta, arrays = draw(st.sampled_from(_REFUSED_PUSHES))
    body = wire.encode_bytes(_bad_arrays(arrays), meta)
    if kind == "refused":
        return "POST", "/push", headers, body
    if kind == "auth":  # a perfectly good push with a wrong or missing token
        good = wire.encode_bytes(_bad_arrays("ok"), _meta())
        token = draw(st.sampled_from([None, "Bearer wrong", "bearer", "Basic eA==", ""]))
        return "POST", "/push", {**headers, "Authorization": token}, good
    if kind == "type":
        content_type = draw(st.sampled_from(["application/octet-stream", "text/plain", ""]))
        good = wire.encode_bytes(_bad_arrays("ok"), _meta())
        return "POST", "/push", {"Content-Type": content_type}, good
    # damaged: bytes overwritten anywhere in a push refused for two reasons that lie more
    # than 64 bytes apart (unknown worker in the header, NaN in the last weight), so no
    # single overwrite can make it valid.
    arrays = _bad_arrays("ok")
    arrays[-1][-1] = np.nan
    body = wire.encode_bytes(arrays, _meta(worker=99))
    cut = draw(st.integers(0, len(body)))
    tail = draw(st.binary(max_size=64))
    damaged = body[:cut] + tail + body[cut + len(tail) :]
    if damaged == body:
        damaged = body[:-1]
    return "POST", "/push", headers, damaged


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(req=bad_requests())
def test_bad_requests_get_a_4xx_json_error_and_change_nothing(any_service, req) -> None:
    method, path, headers, body = req
    service = any_service
    store = service.store
    before = [w.copy() for w in store.weights()]
    version = store.version
    all_headers = {"Authorization": f"Bearer {service.token}", **headers}
    all_headers = {k: v for k, v in all_headers.items() if v is not None}
    with urllib3.PoolManager(retries=False, timeout=10) as http_pool:
        response = http_pool.request(method, f"{service.url}{path}", body=body, headers=all_headers)
    assert 400 <= response.status < 500, (response.status, response.data[:300])
    assert "error" in json.loads(response.data)
    assert store.version == version and store.status()["aborted"] is None
    for got, want in zip(store.weights(), before, strict=True):
        np.testing.assert_array_equal(got, want)


def test_service_still_works_after_bad_input(any_service) -> None:
    service = any_service
    with urllib3.PoolManager(retries=False, timeout=10) as http_pool:
        for body in (b"\x80\x04pickle", pickle.dumps({"w": 1}), b"SDLW" + b"\xff" * 12):
            response = http_pool.request(
                "POST",
                f"{service.url}/push",
                body=body,
                headers={"Content-Type": wire.CONTENT_TYPE, **auth(service)},
            )
            assert response.status == 400
    client = ServiceClient(service.url, service.token, worker=0)
    arrays = [np.ones(s, np.float32) for s in SHAPES]
    if service.store.mode.name == "asynchronous":
        weights, version = client.push(arrays, base_version=0, samples=1)
        assert version == 1 and float(weights[1][0]) == 1.0
    else:
        target = service.store.push(
            1, seq=1, attempt=0, base_version=0, arrays=arrays, samples=1, meta={}
        )
        assert service.store.pull(target, 0) is None  # worker 1 waits for worker 0
        weights, version = client.push(arrays, base_version=0, samples=1)
        assert version == 1 and float(weights[1][0]) == 1.0
    client.close()


def test_truncated_and_unframed_bodies_over_a_raw_socket(service) -> None:
    body = good_body()
    head = (
        f"POST /push HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {service.token}\r\n"
        f"Content-Type: {wire.CONTENT_TYPE}\r\n"
    )
    # Content-Length promises more than arrives, then the client stops sending.
    with socket.create_connection(("127.0.0.1", service.port), timeout=10) as sock:
        sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body[:-10])
        sock.shutdown(socket.SHUT_WR)
        answer = _read_answer(sock)
    assert answer.startswith(b"HTTP/1.1 400") and b"truncated" in answer
    # A chunked body (no Content-Length) is refused before anything is read.
    with socket.create_connection(("127.0.0.1", service.port), timeout=10) as sock:
        sock.sendall(f"{head}Transfer-Encoding: chunked\r\n\r\n4\r\nSDLW\r\n0\r\n\r\n".encode())
        answer = _read_answer(sock)
    assert answer.startswith(b"HTTP/1.1 411") and b"Content-Length" in answer
    assert service.store.version == 0


def test_unread_bodies_are_not_drained_and_nesting_is_a_400(service) -> None:
    # A wrong token with a large announced body: answered at once, connection closed,
    # the server never waits for (or reads) the body.
    head = (
        "POST /push HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n"
        f"Content-Type: {wire.CONTENT_TYPE}\r\nContent-Length: 100000\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", service.port), timeout=10) as sock:
        sock.sendall(head.encode())
        start = time.monotonic()
        answer = _read_answer(sock)
        assert sock.recv(1) == b""  # closed by the server
    assert answer.startswith(b"HTTP/1.1 401") and time.monotonic() - start < 5
    deep = b"[" * 100_000
    nested = wire.MAGIC + bytes([wire.VERSION, 0, 0, 0]) + len(deep).to_bytes(4, "little") + deep
    assert (
        push(urllib3.HTTPConnectionPool("127.0.0.1", service.port), service, nested).status == 400
    )
    join = urllib3.HTTPConnectionPool("127.0.0.1", service.port).urlopen(
        "POST", "/join", body=deep, headers={**auth(service), "Content-Type": "application/json"}
    )
    assert join.status == 400


def test_a_rejoin_over_http_cannot_lift_the_samples_bound() -> None:
    """Issue 35, measured over the wire: with two workers of 100 planned rows joined, a
    token holder's re-join (same attempt, rows=2**62-1) was answered 200, and its push
    of all 100s claiming 2**61 samples then took the synchronous sample-weighted mean
    to 100.0. Both are refused now (400, nothing changed) and the mean is 50.0."""
    store = WeightStore([np.zeros(s, np.float32) for s in SHAPES], num_workers=2, merge=Average())
    store.plan_rows([100, 100])
    with ParameterService(store, host="127.0.0.1") as svc:
        clients = [
            ServiceClient(svc.url, svc.token, worker=w, timeout=10, retries=1) for w in range(2)
        ]
        with pytest.raises(TrainingError, match="counted 200 for the fit"):
            clients[0].join(201)  # the client stops: a retry would be refused too
        with ThreadPoolExecutor(2) as joins:  # a synchronous join waits for every worker
            list(joins.map(lambda c: c.join(100), clients))
        pool = urllib3.HTTPConnectionPool("127.0.0.1", svc.port, retries=False, timeout=10)
        json_head = {**auth(svc), "Content-Type": "application/json"}
        push_head = {**auth(svc), "Content-Type": wire.CONTENT_TYPE}
        before = training_state(store)
        rejoin = json.dumps({"worker": 0, "rows": 2**62 - 1, "attempt": 0})
        answer = pool.urlopen("POST", "/join?wait=0", body=rejoin, headers=json_head)
        assert answer.status == 400 and b"cannot raise its row count" in answer.data
        inflated = [np.full(s, 100.0, np.float32) for s in SHAPES]
        body = wire.encode_bytes(
            inflated, {"worker": 0, "seq": 1, "base_version": 0, "samples": 2**61}
        )
        answer = pool.urlopen("POST", "/push?wait=0", body=body, headers=push_head)
        assert answer.status == 400 and b"joined with 100 rows" in answer.data
        assert training_state(store) == before  # rows joined with included
        body = wire.encode_bytes(
            inflated, {"worker": 0, "seq": 1, "base_version": 0, "samples": 100}
        )
        answer = pool.urlopen("POST", "/push?wait=0", body=body, headers=push_head)
        assert answer.status == 202  # the round waits for worker 1
        zeros = [np.zeros(s, np.float32) for s in SHAPES]
        weights, version = clients[1].push(zeros, base_version=0, samples=100)
        pool.close()
        for client in clients:
            client.close()
    assert version == 1 and all(np.all(w == 50.0) for w in weights)


def _read_answer(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


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
    store = WeightStore([np.zeros(1, np.float32)], num_workers=1, merge=Average())
    svc = ParameterService(store, host="127.0.0.1").start()
    port = svc.port
    svc.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # would raise if the port were still held


def _raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        return _read_answer(sock)


def test_unauthenticated_answers_tell_nothing_of_the_model_or_the_server() -> None:
    """The same announced sizes get the same answers from a small and a large model's
    service without the token; the banner names no software; errors are JSON."""
    answers = []
    for width in (4, 400_000):
        store = WeightStore([np.zeros(width, np.float32)], num_workers=1, merge=Average())
        with ParameterService(store, host="127.0.0.1") as svc:
            seen = []
            for size in (100, 10 * 1024 * 1024, 1 << 41):
                head = (
                    f"POST /push HTTP/1.1\r\nHost: x\r\nContent-Type: {wire.CONTENT_TYPE}\r\n"
                    f"Content-Length: {size}\r\n\r\n"
                )
                answer = _raw(svc.port, head.encode())
                status = answer.split(b"\r\n", 1)[0]
                body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
                assert b"Content-Type: application/json" in answer and "error" in body
                assert b"sparkdl" not in answer.lower() and b"cheroot" not in answer.lower()
                seen.append((status, body["status"]))
            banner = _raw(svc.port, b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
            assert b"\r\nServer: httpd\r\n" in banner
            malformed = _raw(svc.port, b"NOT A REQUEST\r\n\r\n")
            assert malformed.startswith(b"HTTP/1.1 400") and b"application/json" in malformed
            assert json.loads(malformed.split(b"\r\n\r\n", 1)[1])["status"] == 400
        answers.append(seen)
    assert answers[0] == answers[1]
    assert [status for _, status in answers[0]] == [401, 401, 413]


def test_a_whole_push_under_compression_is_checked_like_any_body() -> None:
    """A compressed fit's closing push is flagged ``whole`` and sent unencoded: the flag
    must be a bool, the arrays must then be the weights' own, and a refused push
    changes nothing."""
    from sparkdl.sync.codecs import resolve_compression

    shapes = [(40, 10), (10,)]
    store = WeightStore(
        [np.zeros(s, np.float32) for s in shapes],
        num_workers=1,
        merge=Delta(),
        mode="asynchronous",
        compression=resolve_compression("topk", 0.01, 1),
    )
    with ParameterService(joined(store), host="127.0.0.1") as svc:
        client = ServiceClient(svc.url, svc.token, worker=0, retries=0)
        client.pull(0, replica=-1)
        replica = client.control["replica"]
        dense = [np.full(s, 0.5, np.float32) for s in shapes]
        encoded = store.replicas.codec.encode(dense)  # type: ignore[union-attr]
        for flag, arrays in [("yes", dense), (1, dense), (True, encoded), (False, dense)]:
            with pytest.raises(ServiceError, match="400") as info:
                client.push(
                    arrays, base_version=0, samples=1, meta={"whole": flag}, replica=replica
                )
            assert "whole" in str(info.value) or "expected" in str(info.value).lower()
            assert store.version == 0
        client.push(dense, base_version=0, samples=1, meta={"whole": True}, replica=replica)
        assert store.version == 1
        np.testing.assert_array_equal(store.weights()[0], dense[0])


def test_leave_counts_each_worker_once_and_refuses_bad_or_superseded_leaves() -> None:
    """``POST /leave`` (a worker's training ended; the host of a service in the cluster
    waits for every worker): a token holder's malformed leave, another worker id, a
    worker that never joined, or an attempt other than the worker's newest gets a 4xx
    and counts nothing; leaving twice counts once; an aborted fit takes no leave."""
    store = WeightStore(
        [np.zeros(s, np.float32) for s in SHAPES], num_workers=2, merge=Delta(), mode="asynchronous"
    )
    with ParameterService(store, host="127.0.0.1") as svc:
        pool = urllib3.HTTPConnectionPool("127.0.0.1", svc.port, retries=False, timeout=10)
        head = {**auth(svc), "Content-Type": "application/json"}
        clients = [
            ServiceClient(svc.url, svc.token, worker=0, retries=0),
            ServiceClient(svc.url, svc.token, worker=1, attempt=5, retries=0),
        ]
        with pytest.raises(ServiceError, match="never joined"):
            clients[0].leave()
        clients[1].join(10)
        for body, status in [
            (b"not json", 400),
            (json.dumps({"worker": 2}).encode(), 400),
            (json.dumps({"worker": -1}).encode(), 400),
            (json.dumps({"worker": "0"}).encode(), 400),
            (json.dumps({"worker": 1, "attempt": 4}).encode(), 409),  # superseded by 5
            (json.dumps({"worker": 1, "attempt": 6}).encode(), 409),  # not its newest
        ]:
            answer = pool.urlopen("POST", "/leave", body=body, headers=head)
            assert answer.status == status, (body, answer.data)
            assert "error" in json.loads(answer.data)
        assert store.status()["left"] == [] and not store.wait_left(0.0)
        assert store.newest_attempt(1) == 5  # nothing fenced
        clients[0].join(10)
        clients[0].leave()
        clients[0].leave()  # a retried leave counts once
        assert store.status()["left"] == [0] and not store.wait_left(0.05)
        store.abort("a worker failed")
        with pytest.raises(ServiceError, match="abort"):
            clients[1].leave()
        assert store.status()["left"] == [0] and not store.wait_left(0.0)
        pool.close()
        for client in clients:
            client.close()


def test_the_last_leave_wakes_a_waiting_host() -> None:
    store = joined(
        WeightStore([np.zeros(2, np.float32)], num_workers=2, merge=Delta(), mode="asynchronous")
    )
    store.leave(0)
    woke: list[float] = []
    waiter = threading.Thread(
        target=lambda: woke.append(time.monotonic()) if store.wait_left(10.0) else None
    )
    waiter.start()
    time.sleep(0.1)
    left_at = time.monotonic()
    store.leave(1)
    waiter.join(10)
    assert woke and woke[0] - left_at < 0.5  # woken by the leave, not by its 1 s poll
