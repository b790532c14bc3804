"""One peer's flood of TLS handshakes against the service, and everyone else's latency.

A TLS service (``service_tls``, a per-fit certificate) runs in this process. An attacker
process opens new connections from ``127.0.0.2`` as fast as its threads can, completes a
full TLS handshake on each (the certificate pinned, as a worker's client does; no
session reuse) and closes it: the most expensive thing a client without the token can
make the service do (``--processes`` such processes of ``--threads`` threads).
Meanwhile an honest client on ``127.0.0.1`` times authenticated
``GET /status`` requests, each on a new TLS connection (``new conn``: its own handshake
included) and on one kept connection (``kept``). Printed: p50 / p99 per case, with and
without the flood, and the handshakes per second the attacker completed.

Every loop is bounded in count and time; everything runs on 127.0.0.1 / 127.0.0.2.

Run:
    .venv/bin/python benchmarks/tls_flood.py
    .venv/bin/python benchmarks/tls_flood.py --processes 4 --threads 8
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing
import os
import socket
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from sparkdl.protocol.tls import client_context
from sparkdl.server.state.store import WeightStore
from sparkdl.server.web.service import ParameterService
from sparkdl.server.web.tls import Certificate
from sparkdl.sync.merges import Delta

ATTACKER = "127.0.0.2"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=4, help="threads per attacker process")
    parser.add_argument("--processes", type=int, default=1, help="attacker processes")
    parser.add_argument("--requests", type=int, default=200, help="honest requests per case")
    parser.add_argument("--seconds", type=float, default=60.0, help="longest flood")
    args = parser.parse_args()
    cert = Certificate.make("127.0.0.1")
    store = WeightStore([np.zeros(1000, np.float32)], num_workers=2, merge=Delta())
    with ParameterService(store, host="127.0.0.1", tls=cert) as service:
        print(
            f"{'flood':6} {'request':9} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
            f"{'handshakes/s':>13}"
        )
        for flood in (False, True):
            _case(service, cert.pem, flood, args)


def _case(service: ParameterService, pem: bytes, flood: bool, args: argparse.Namespace) -> None:
    stop = multiprocessing.Event()
    done = multiprocessing.Value("l", 0)
    attackers = []
    if flood:
        for _ in range(args.processes):
            attacker = multiprocessing.Process(
                target=_flood, args=(service.port, pem, args.threads, stop, done, args.seconds)
            )
            attacker.start()
            attackers.append(attacker)
        time.sleep(1.0)  # the flood under way
    started, before = time.monotonic(), done.value
    try:
        for label, fresh in (("new conn", True), ("kept", False)):
            seconds = _honest(service, pem, fresh, args.requests)
            ms = sorted(1000 * s for s in seconds)
            rate = (done.value - before) / (time.monotonic() - started) if flood else 0.0
            print(
                f"{'yes' if flood else 'no':6} {label:9} {statistics.median(ms):8.2f} "
                f"{ms[int(0.99 * (len(ms) - 1))]:8.2f} {ms[-1]:8.2f} {rate:13.0f}",
                flush=True,
            )
    finally:
        stop.set()
        for attacker in attackers:
            attacker.join(timeout=10)


def _honest(service: ParameterService, pem: bytes, fresh: bool, requests: int) -> list[float]:
    context = client_context(pem)
    headers = {"Authorization": f"Bearer {service.token}"}
    conn = None
    seconds = []
    for _ in range(requests):
        begun = time.perf_counter()
        if conn is None:
            conn = http.client.HTTPSConnection(
                "127.0.0.1", service.port, timeout=10, context=context
            )
        conn.request("GET", "/status", headers=headers)
        answer = conn.getresponse()
        answer.read()
        assert answer.status == 200, answer.status
        seconds.append(time.perf_counter() - begun)
        if fresh:
            conn.close()
            conn = None
    if conn is not None:
        conn.close()
    return seconds


def _flood(port: int, pem: bytes, threads: int, stop, done, seconds: float) -> None:
    import threading

    context = client_context(pem)
    deadline = time.monotonic() + seconds

    def one() -> None:
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                sock = socket.create_connection(
                    ("127.0.0.1", port), timeout=5, source_address=(ATTACKER, 0)
                )
                with context.wrap_socket(sock, server_hostname="127.0.0.1"):
                    pass
                with done.get_lock():
                    done.value += 1
            except OSError:
                time.sleep(0.01)

    workers = [threading.Thread(target=one, daemon=True) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=seconds + 10)


if __name__ == "__main__":
    main()
