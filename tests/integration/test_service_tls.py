"""The parameter service over TLS: a certificate per fit, pinned by the workers."""

from __future__ import annotations

import socket
import time
from typing import Any

import numpy as np
import pytest
import urllib3

from sparkdl import TrainConfig
from sparkdl.contract.plan import FitPlan
from sparkdl.errors import ServiceError
from sparkdl.protocol.client import ServiceClient
from sparkdl.server.state.store import WeightStore
from sparkdl.server.web.service import ParameterService
from sparkdl.server.web.tls import Certificate
from sparkdl.sync.merges import Delta
from tests.stores import joined


@pytest.fixture
def tls_service() -> Any:
    store = joined(
        WeightStore([np.zeros(4, np.float32)], num_workers=1, merge=Delta(), mode="asynchronous")
    )
    cert = Certificate.make("127.0.0.1")
    with ParameterService(store, host="127.0.0.1", tls=cert) as service:
        yield service, cert


def test_a_worker_that_pins_the_fits_certificate_talks_over_tls(tls_service: Any) -> None:
    service, cert = tls_service
    assert service.url.startswith("https://127.0.0.1:")
    silent = [socket.create_connection(("127.0.0.1", service.port)) for _ in range(3)]
    try:  # clients that connect and never handshake hold nobody up
        client = ServiceClient(service.url, service.token, worker=0, tls_cert=cert.pem)
        started = time.monotonic()
        weights, version = client.push([np.ones(4, np.float32)], base_version=0, samples=1)
        assert time.monotonic() - started < 5
        assert version == 1 and weights[0].tolist() == [1.0] * 4
        client.close()
    finally:
        for sock in silent:
            sock.close()


def test_another_certificate_plain_http_and_a_plain_url_are_refused(tls_service: Any) -> None:
    service, _ = tls_service
    stranger = Certificate.make("127.0.0.1")
    impostor = ServiceClient(service.url, service.token, worker=0, tls_cert=stranger.pem, retries=0)
    with pytest.raises(ServiceError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify"):
        impostor.status()
    plain_url = service.url.replace("https://", "http://")
    with pytest.raises(urllib3.exceptions.HTTPError):
        urllib3.PoolManager(retries=False, timeout=5).request("GET", f"{plain_url}/status")
    with pytest.raises(ServiceError, match="certificate"):
        ServiceClient(service.url, service.token, worker=0)  # https without the certificate
    assert service.store.version == 0


def test_tls_is_on_by_default_only_off_a_local_master() -> None:
    config = TrainConfig(num_workers=2)
    common = {"num_workers": 2, "rows": 100, "threads": 1, "service_host": "10.0.0.1"}
    assert FitPlan.resolve(config, local_master=False, **common).service_tls
    assert not FitPlan.resolve(config, local_master=True, **common).service_tls
    forced = config.replace(service_tls=True)
    assert FitPlan.resolve(forced, local_master=True, **common).service_tls
    off = config.replace(service_tls=False)
    assert not FitPlan.resolve(off, local_master=False, **common).service_tls


def test_a_peers_handshake_flood_runs_off_the_selector_and_others_get_in(
    tls_service: Any,
) -> None:
    """One peer (127.0.0.2) completes full handshakes as fast as 4 threads can; another
    peer's new connections are all served meanwhile, and every handshake was done on the
    gate's handshake thread (which takes peers in turn), not on cheroot's selector."""
    import http.client
    import threading

    from sparkdl.protocol.tls import client_context

    service, cert = tls_service
    context = client_context(cert.pem)
    stop = threading.Event()
    flooded = [0]

    def flood() -> None:
        deadline = time.monotonic() + 20
        while not stop.is_set() and time.monotonic() < deadline:
            sock = socket.create_connection(
                ("127.0.0.1", service.port), timeout=5, source_address=("127.0.0.2", 0)
            )
            with context.wrap_socket(sock, server_hostname="127.0.0.1"):
                flooded[0] += 1

    attackers = [threading.Thread(target=flood, daemon=True) for _ in range(4)]
    for attacker in attackers:
        attacker.start()
    try:
        time.sleep(0.5)
        for _ in range(30):  # a new connection, and so a handshake, each time
            conn = http.client.HTTPSConnection(
                "127.0.0.1", service.port, timeout=5, context=context
            )
            conn.request("GET", "/status", headers={"Authorization": f"Bearer {service.token}"})
            assert conn.getresponse().status == 200
            conn.close()
    finally:
        stop.set()
        for attacker in attackers:
            attacker.join(timeout=10)
    assert flooded[0] >= 30
    assert service.gate.handshakes_completed >= 30  # the honest ones, at least


def test_a_request_pipelined_behind_a_body_over_tls_is_answered(tls_service: Any) -> None:
    """The gate reads a body to its last byte; a request in the same TLS record after it
    sits decrypted in OpenSSL, where select() cannot see it: it must still be served."""
    import ssl

    from sparkdl.protocol.tls import client_context

    service, cert = tls_service
    auth = f"Authorization: Bearer {service.token}\r\n".encode()
    body = b'{"worker": 0, "rows": 1, "attempt": 0}'
    head = (
        b"POST /join HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    status = b"GET /status HTTP/1.1\r\nHost: x\r\n" + auth + b"\r\n"
    raw = socket.create_connection(("127.0.0.1", service.port), timeout=10)
    with client_context(cert.pem).wrap_socket(raw, server_hostname="127.0.0.1") as sock:
        sock.sendall(head)
        time.sleep(0.2)  # the head goes to a thread, which waits for the body
        sock.sendall(body + status)
        answers = b""
        deadline = time.monotonic() + 10
        while answers.count(b"HTTP/1.1 200") < 2 and time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except (TimeoutError, ssl.SSLError):
                break
            if not chunk:
                break
            answers += chunk
    assert answers.count(b"HTTP/1.1 200") == 2, answers[:400]
