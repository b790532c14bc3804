"""Idle, trickling and crowding connections do not hold the service's threads.

Real service (cheroot + Flask) on 127.0.0.1, real sockets. Each test bounds its loops
in count and time; an authenticated request gives up after 5 s, which before the gate
every request under these loads did (cheroot waited 30 s for each idle connection's
request line on one of its 8 threads).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import urllib3

from benchmarks.idle_connections import SHAPES, Siege, round_trips
from sparkdl.protocol.client import ServiceClient
from sparkdl.server.state.store import WeightStore
from sparkdl.server.web import gate as gate_module
from sparkdl.server.web.service import ParameterService
from sparkdl.server.web.tls import Certificate
from sparkdl.sync.merges import Average, Delta
from tests.stores import joined


def _store(**kwargs: Any) -> WeightStore:
    kwargs.setdefault("merge", Delta())
    kwargs.setdefault("mode", "asynchronous")
    weights = [np.zeros(shape, np.float32) for shape in SHAPES]
    return joined(WeightStore(weights, num_workers=2, **kwargs))


@pytest.fixture
def service() -> Iterator[ParameterService]:
    with ParameterService(_store(), host="127.0.0.1") as running:
        yield running


def _status(service: ParameterService, pool: urllib3.HTTPConnectionPool) -> int:
    answer = pool.urlopen("GET", "/status", headers={"Authorization": f"Bearer {service.token}"})
    return int(answer.status)


def _pool(service: ParameterService) -> urllib3.HTTPConnectionPool:
    return urllib3.HTTPConnectionPool("127.0.0.1", service.port, retries=False, timeout=5)


def _closed_by_peer(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def test_idle_and_trickling_connections_leave_every_request_answered(
    service: ParameterService,
) -> None:
    with Siege("127.0.0.1", service.port, idle=100, trickle=100, seconds=60) as siege:
        assert siege.figures.held_max >= 64
        for fresh, push in [(False, False), (True, False), (False, True)]:
            trips = round_trips(service.url, service.token, requests=20, fresh=fresh, push=push)
            assert trips.failures == 0, (fresh, push, trips.seconds)
    assert service.gate is not None and service.gate.held_max >= 64


def test_a_head_that_does_not_finish_in_time_is_closed(monkeypatch: Any) -> None:
    monkeypatch.setattr(gate_module, "HEAD_SECONDS", 0.5)
    with ParameterService(_store(), host="127.0.0.1") as running:
        silent = socket.create_connection(("127.0.0.1", running.port))
        slow = socket.create_connection(("127.0.0.1", running.port))
        try:
            slow.sendall(b"GET /status HTTP/1.1\r\n")  # then nothing more
            assert _closed_by_peer(silent, 5)
            assert _closed_by_peer(slow, 5)
        finally:
            silent.close()
            slow.close()


def test_past_the_per_peer_cap_the_oldest_waiting_connection_is_closed(
    monkeypatch: Any,
) -> None:
    monkeypatch.setattr(gate_module, "PEER_CAP", 8)
    with ParameterService(_store(), host="127.0.0.1") as running:
        crowd = []
        try:
            for _ in range(20):
                crowd.append(socket.create_connection(("127.0.0.1", running.port)))
                time.sleep(0.01)  # accepted in this order
            assert running.gate is not None
            deadline = time.monotonic() + 5
            while running.gate.evicted < 12 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert running.gate.evicted == 12 and running.gate.waiting_untrusted == 8
            assert all(_closed_by_peer(sock, 5) for sock in crowd[:12])
            assert not any(_closed_by_peer(sock, 0.2) for sock in crowd[12:])
            pool = _pool(running)  # a new client still gets in at once
            assert _status(running, pool) == 200
            pool.close()
        finally:
            for sock in crowd:
                sock.close()


def test_silent_tls_clients_past_the_cap_are_closed_and_the_service_goes_on(
    monkeypatch: Any,
) -> None:
    monkeypatch.setattr(gate_module, "PEER_CAP", 8)
    cert = Certificate.make("127.0.0.1")
    with ParameterService(_store(), host="127.0.0.1", tls=cert) as running:
        crowd = []
        fds_before = _open_fds()
        try:
            for _ in range(30):
                crowd.append(socket.create_connection(("127.0.0.1", running.port)))
                time.sleep(0.01)
            assert running.gate is not None
            deadline = time.monotonic() + 5
            while running.gate.evicted < 22 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert running.gate.evicted == 22
            assert all(_closed_by_peer(sock, 5) for sock in crowd[:22])
            client = ServiceClient(
                running.url, running.token, worker=0, tls_cert=cert.pem, timeout=5, retries=0
            )
            assert client.status()["version"] == 0
            client.close()
        finally:
            for sock in crowd:
                sock.close()
        # Every connection the service accepted is closed again, evicted ones too.
        deadline = time.monotonic() + 5
        while _open_fds() > fds_before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _open_fds() <= fds_before


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_peers_are_addresses_and_ipv6_slash_64s() -> None:
    assert gate_module.peer_key("10.0.0.7") == "10.0.0.7"
    assert gate_module.peer_key("::ffff:10.0.0.7") == "10.0.0.7"
    assert gate_module.peer_key("2001:db8:1:2:aaaa::1") == "2001:db8:1:2::/64"
    assert gate_module.peer_key("2001:db8:1:2:bbbb::9") == "2001:db8:1:2::/64"
    assert gate_module.peer_key(None) == ""


def test_only_an_authenticated_request_keeps_its_connection(service: ParameterService) -> None:
    with socket.create_connection(("127.0.0.1", service.port), timeout=5) as sock:
        sock.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = _read_until_closed(sock)
        assert b" 401 " in answer.split(b"\r\n", 1)[0] and b"Connection: close" in answer
    with socket.create_connection(("127.0.0.1", service.port), timeout=5) as sock:
        request = (
            f"GET /status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {service.token}\r\n\r\n"
        ).encode()
        # Two requests in one send, the first cut into single bytes before them.
        for byte in request[:10]:
            sock.sendall(bytes([byte]))
        sock.sendall(request[10:] + request)
        time.sleep(0.3)
        sock.shutdown(socket.SHUT_WR)
        answers = _read_until_closed(sock)
        assert answers.count(b"HTTP/1.1 200 ") == 2


def test_silent_tls_clients_hold_no_thread() -> None:
    cert = Certificate.make("127.0.0.1")
    with ParameterService(_store(), host="127.0.0.1", tls=cert) as running:
        silent = [socket.create_connection(("127.0.0.1", running.port)) for _ in range(40)]
        half = [socket.create_connection(("127.0.0.1", running.port)) for _ in range(10)]
        try:
            for sock in half:  # the start of a ClientHello, and nothing more
                sock.sendall(b"\x16\x03\x01\x02\x00\x01")
            client = ServiceClient(
                running.url, running.token, worker=0, tls_cert=cert.pem, timeout=5, retries=0
            )
            for _ in range(5):
                assert client.status()["version"] >= 0
            client.close()
        finally:
            for sock in silent + half:
                sock.close()


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_long_polls_never_take_the_last_threads() -> None:
    store = WeightStore([np.zeros(4, np.float32)], num_workers=2, merge=Average())
    with ParameterService(store, host="127.0.0.1", threads=8) as running:
        headers = {"Authorization": f"Bearer {running.token}"}
        answers: list[int] = []

        def poll() -> None:
            pool = urllib3.HTTPConnectionPool("127.0.0.1", running.port, retries=False, timeout=30)
            answer = pool.urlopen("GET", "/weights?min_version=5&wait=4", headers=headers)
            answers.append(answer.status)
            pool.close()

        polls = [threading.Thread(target=poll, daemon=True) for _ in range(10)]
        for thread in polls:
            thread.start()
        time.sleep(0.5)
        pool = _pool(running)
        started = time.monotonic()
        for _ in range(5):  # short requests still find a thread
            assert _status(running, pool) == 200
        assert time.monotonic() - started < 2
        pool.close()
        for thread in polls:
            thread.join(timeout=15)
        assert answers == [202] * 10


def _read_until_closed(sock: socket.socket) -> bytes:
    chunks = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        data = sock.recv(65536)
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks)
