"""Parameter service throughput against a plain TCP socket, on loopback, in one run.

For each model size one client does push+pull round trips: it sends the model's
float32 arrays and gets the model back (the asynchronous delta rule answers a push
with the new weights, so one round trip is one update). The plain socket sends the
same number of bytes each way with ``sendall`` / ``recv_into`` into reused buffers:
the physical limit of this machine. Rows:

* ``raw socket``: the limit.
* ``sparkdl async``: the service as shipped (cheroot + bulk I/O), asynchronous delta.
* ``sparkdl sync``: the same, synchronous average with one worker.
* ``cheroot (stock)`` / ``waitress``: the same Flask app and client, other servers
  (waitress with its receive size and spill-to-disk thresholds raised for big bodies).
* ``sparkdl async x8``: 8 concurrent clients (threads here), aggregate figures.

Run:
    python benchmarks/service.py            # 0.1M, 10M and 50M parameters
    python benchmarks/service.py --sizes 0.1 10 --seconds 2
"""

from __future__ import annotations

import argparse
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import numpy as np

from sparkdl.server import wire
from sparkdl.server.app import create_app, max_body_bytes
from sparkdl.server.client import ServiceClient
from sparkdl.server.rules import AverageRule, DeltaRule
from sparkdl.server.service import ParameterService
from sparkdl.server.store import WeightStore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[0.1, 10, 50], help="M params")
    parser.add_argument("--seconds", type=float, default=3.0, help="time per measurement")
    args = parser.parse_args()
    print("| params | server | round trips/s | p50 ms | MB/s | of raw socket |")
    print("|---|---|---|---|---|---|")
    for millions in args.sizes:
        n = int(millions * 1_000_000)
        weights = _model(n)
        body_bytes = sum(memoryview(c).nbytes for c in wire.encode(weights, {"version": 0}))
        raw = _raw_socket(body_bytes, args.seconds)
        _row(millions, "raw socket", raw, body_bytes, raw)
        runs: list[tuple[str, Callable[[list[np.ndarray], float], list[float]]]] = [
            ("sparkdl async", lambda w, s: _service_run(w, "asynchronous", s)),
            ("sparkdl sync", lambda w, s: _service_run(w, "synchronous", s)),
            ("cheroot (stock)", lambda w, s: _other_run(w, _stock_cheroot, s)),
            ("waitress", lambda w, s: _other_run(w, _waitress, s)),
        ]
        for name, run in runs:
            try:
                _row(millions, name, run(weights, args.seconds), body_bytes, raw)
            except ImportError as exc:
                print(f"| {millions:g}M | {name} | not installed ({exc.name}) | | | |")
        if n <= 1_000_000:
            times, wall = _concurrent_run(weights, 8, args.seconds)
            rate = len(times) / wall
            mbs = rate * 2 * body_bytes / 1e6
            raw_mbs = 2 * body_bytes / statistics.median(raw) / 1e6
            print(
                f"| {millions:g}M | sparkdl async x8 | {rate:.0f} | "
                f"{statistics.median(times) * 1e3:.2f} | {mbs:.0f} | {mbs / raw_mbs:.0%} |"
            )


def _model(n: int) -> list[np.ndarray]:
    """A dense layer's kernel and bias holding ``n`` float32 parameters."""
    bias = min(1000, n // 10)
    return [np.zeros(n - bias, np.float32), np.zeros(bias, np.float32)]


def _row(millions: float, name: str, times: list[float], nbytes: int, raw: list[float]) -> None:
    p50 = statistics.median(times)
    raw_p50 = statistics.median(raw)
    print(
        f"| {millions:g}M | {name} | {1 / p50:.0f} | {p50 * 1e3:.2f} | "
        f"{2 * nbytes / p50 / 1e6:.0f} | {raw_p50 / p50:.0%} |"
    )


def _timed(step: Callable[[], object], seconds: float, min_reps: int = 5) -> list[float]:
    step()  # warm up connections and caches
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(times) < min_reps or time.perf_counter() < deadline:
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
        if len(times) >= 20_000:
            break
    return times


def _raw_socket(nbytes: int, seconds: float) -> list[float]:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def echo() -> None:
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        inbox = memoryview(bytearray(nbytes))
        reply = bytes(nbytes)
        with conn:
            while _recv_exactly(conn, inbox):
                conn.sendall(reply)

    threading.Thread(target=echo, daemon=True).start()
    client = socket.create_connection(("127.0.0.1", port))
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    outbox = bytes(nbytes)
    inbox = memoryview(bytearray(nbytes))

    def step() -> None:
        client.sendall(outbox)
        _recv_exactly(client, inbox)

    try:
        return _timed(step, seconds)
    finally:
        client.close()
        listener.close()


def _recv_exactly(conn: socket.socket, buffer: memoryview) -> bool:
    got = 0
    while got < len(buffer):
        n = conn.recv_into(buffer[got:])
        if not n:
            return False
        got += n
    return True


def _store(weights: list[np.ndarray], mode: str) -> WeightStore:
    if mode == "asynchronous":
        return WeightStore(weights, num_workers=8, rule=DeltaRule(), mode=mode)
    return WeightStore(weights, num_workers=1, rule=AverageRule(), mode=mode)


def _stepper(client: ServiceClient, weights: list[np.ndarray], mode: str) -> Callable[[], None]:
    version = [0]

    def step() -> None:
        if mode == "asynchronous":
            _, version[0] = client.push_async(weights, base_version=version[0], samples=1)
        else:
            _, version[0] = client.push_sync(weights, round_no=version[0], samples=1)

    return step


def _service_run(weights: list[np.ndarray], mode: str, seconds: float) -> list[float]:
    with ParameterService(_store(weights, mode)) as service:
        client = ServiceClient(service.url, service.token, worker=0)
        try:
            return _timed(_stepper(client, weights, mode), seconds)
        finally:
            client.close()


def _concurrent_run(
    weights: list[np.ndarray], clients: int, seconds: float
) -> tuple[list[float], float]:
    times: list[list[float]] = [[] for _ in range(clients)]
    with ParameterService(_store(weights, "asynchronous")) as service:

        def work(i: int) -> None:
            client = ServiceClient(service.url, service.token, worker=i)
            times[i] = _timed(_stepper(client, weights, "asynchronous"), seconds)
            client.close()

        threads = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
    return [t for ts in times for t in ts], wall


def _other_run(
    weights: list[np.ndarray],
    server: Callable[[WeightStore, str], AbstractContextManager[str]],
    seconds: float,
) -> list[float]:
    store = _store(weights, "asynchronous")
    with server(store, "token") as url:
        client = ServiceClient(url, "token", worker=0)
        try:
            return _timed(_stepper(client, weights, "asynchronous"), seconds)
        finally:
            client.close()


def _bytes_app(store: WeightStore, token: str) -> Callable[..., Iterable[bytes]]:
    """The service's app for servers that take only ``bytes`` chunks (joined once)."""
    app = create_app(store, token)

    def wsgi_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        chunks = app(environ, start_response)
        try:
            return [b"".join(chunks)]
        finally:
            if hasattr(chunks, "close"):
                chunks.close()

    return wsgi_app


@contextmanager
def _stock_cheroot(store: WeightStore, token: str) -> Iterator[str]:
    from cheroot import wsgi

    server = wsgi.Server(("127.0.0.1", 0), _bytes_app(store, token), numthreads=8)
    server.max_request_body_size = max_body_bytes(store)
    server.prepare()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.bind_addr[1]}"
    finally:
        server.stop()


@contextmanager
def _waitress(store: WeightStore, token: str) -> Iterator[str]:
    from waitress.server import create_server

    bound = max_body_bytes(store)
    server = create_server(
        _bytes_app(store, token),
        host="127.0.0.1",
        port=0,
        threads=8,
        recv_bytes=1 << 20,
        inbuf_overflow=2 * bound,
        outbuf_overflow=2 * bound,
        max_request_body_size=bound,
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.effective_port}"
    finally:
        server.task_dispatcher.shutdown()
        server.close()
        thread.join(timeout=5)


if __name__ == "__main__":
    main()
