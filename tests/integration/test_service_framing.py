"""Stalled bodies, ambiguous framing and bare line feeds at the service's gate.

Real service (cheroot + Flask) on 127.0.0.1, real sockets; every loop is bounded in
count and time. Before the gate read token holders' bodies, 8 connections with the
token that stalled mid-body held all 8 threads for 30 s (every other request timed
out), and cheroot took the last of two different ``Content-Length`` headers, serving
the bytes the first covered as a second request.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import numpy as np
import pytest

from benchmarks.idle_connections import SHAPES, round_trips
from benchmarks.stalled_body import Stalled
from sparkdl.server.state.store import WeightStore
from sparkdl.server.web import bodies
from sparkdl.server.web.service import ParameterService
from sparkdl.sync.merges import Delta
from tests.stores import joined


@pytest.fixture
def service() -> Iterator[ParameterService]:
    weights = [np.zeros(shape, np.float32) for shape in SHAPES]
    store = joined(WeightStore(weights, num_workers=2, merge=Delta(), mode="asynchronous"))
    with ParameterService(store, host="127.0.0.1") as running:
        yield running


def _exchange(port: int, data: bytes, seconds: float = 5.0) -> tuple[bytes, bool]:
    """Sends ``data`` on a new connection; returns everything answered within
    ``seconds`` and whether the service closed the connection."""
    deadline = time.monotonic() + seconds
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=seconds) as sock:
        sock.sendall(data)
        while time.monotonic() < deadline:
            sock.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                return answer, False
            except OSError:
                return answer, True
            if not chunk:
                return answer, True
            answer += chunk
    return answer, False


def _opened(stalled: Stalled, count: int) -> None:
    deadline = time.monotonic() + 10
    while (stalled.drops.opened < count or not stalled.started) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert stalled.drops.opened == count


def _statuses(answer: bytes) -> list[bytes]:
    return [line.split(b" ")[1] for line in answer.split(b"\r\n") if line.startswith(b"HTTP/1.")]


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_stalled_bodies_of_token_holders_hold_no_thread(service: ParameterService) -> None:
    """64 token holders stall mid-body beside 128 idle connections without the token:
    every honest request is answered, each stalled one gets 408 within 10 s, and none of
    their pushes changes the weights."""
    version = service.store.status()["version"]
    idle = [socket.create_connection(("127.0.0.1", service.port)) for _ in range(128)]
    try:
        with Stalled(service.port, service.token, count=64, trickle=False, seconds=15) as stalled:
            _opened(stalled, 64)
            for fresh in (False, True):
                trips = round_trips(
                    service.url, service.token, requests=20, fresh=fresh, push=False
                )
                assert trips.failures == 0, trips.seconds
            stalled.wait_dropped(stalled.started + 12)
        assert len(stalled.drops.dropped) == 64
        assert {answer for _, answer in stalled.drops.dropped} == {"408"}
        assert max(seconds for seconds, _ in stalled.drops.dropped) <= 10
    finally:
        for sock in idle:
            sock.close()
    assert service.store.status()["version"] == version


def test_a_trickling_body_is_answered_408_at_its_deadline(
    service: ParameterService, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bodies, "BODY_SECONDS", 1.0)
    with Stalled(service.port, service.token, count=4, trickle=True, seconds=10) as stalled:
        _opened(stalled, 4)
        stalled.wait_dropped(stalled.started + 8)
    assert [answer for _, answer in stalled.drops.dropped] == ["408"] * 4
    assert max(seconds for seconds, _ in stalled.drops.dropped) < 4


def test_a_body_arriving_in_pieces_within_its_deadline_is_served(
    service: ParameterService,
) -> None:
    body = b'{"worker": 0, "rows": 1, "attempt": 0}'
    head = (
        f"POST /join HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {service.token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", service.port), timeout=5) as sock:
        sock.sendall(head + body[:5])
        for start in range(5, len(body), 10):
            time.sleep(0.1)
            sock.sendall(body[start : start + 10])
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        (b"Content-Length: 4\r\nContent-Length: 60\r\n", b"Two different Content-Length"),
        (b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n", b"Transfer-Encoding"),
        (b"Content-Length : 4\r\n", b"no whitespace"),
        # cheroot strips any whitespace around a name: a vertical tab made this a
        # second Content-Length there (two answers), a second Authorization likewise.
        (b"Content-Length: 4\r\nContent-Length\x0b: 60\r\n", b"control byte before the colon"),
        (b"Authorization\x0b: Bearer wrong\r\nContent-Length: 4\r\n", b"a token"),
        (b"Authorization: Bearer wrong\r\nContent-Length: 4\r\n", b"Two Authorization"),
    ],
)
def test_ambiguous_framing_is_refused_and_the_connection_closed(
    service: ParameterService, fields: bytes, why: bytes
) -> None:
    auth = f"Authorization: Bearer {service.token}\r\n".encode()
    # What the first Content-Length covers would read as a second request.
    smuggled = b"GET /status HTTP/1.1\r\nHost: x\r\n" + auth + b"\r\n"
    request = b"POST /join HTTP/1.1\r\nHost: x\r\n" + auth + fields + b"\r\n" + b"{}\r\n" + smuggled
    answer, closed = _exchange(service.port, request)
    assert _statuses(answer) == [b"400"], answer[:300]
    assert why in answer and closed


def test_a_head_ending_in_bare_line_feeds_is_answered_at_once(
    service: ParameterService,
) -> None:
    started = time.monotonic()
    answer, closed = _exchange(service.port, b"GET /status HTTP/1.1\nHost: x\n\n")
    assert answer.startswith(b"HTTP/1.1 400") and b"CRLF" in answer and closed
    assert time.monotonic() - started < 2  # the head's 10 s deadline never comes into it


def test_the_gate_holds_token_holders_bodies_within_a_budget() -> None:
    """A token holder's pending bodies are reserved against a budget; past it, a body is
    left to the thread that serves it; ``Expect: 100-continue`` bodies are never held
    (the client waits for cheroot's 100 first)."""
    from sparkdl.server.web.bodies import BodyPolicy
    from sparkdl.server.web.framing import Head

    policy = BodyPolicy("secret", max_body=100, budget=150)
    head = Head(size=40, length=100, authorization=b"Bearer secret")
    assert policy.wanted(head) == 100
    assert policy.wanted(head) == 0  # 200 > 150
    policy.release(100)
    assert policy.wanted(head) == 100 and policy.held == 100
    expecting = Head(size=40, length=10, authorization=b"Bearer secret", expects_continue=True)
    assert policy.wanted(expecting) == 0
    assert policy.wanted(Head(size=40, length=10, authorization=b"Bearer guess")) == 0
    assert policy.held == 100
