"""Parameter service throughput against a plain TCP socket, on loopback, in one run.

For each model size a client process (as a Spark worker is) does push+pull round
trips: it sends the model's float32 arrays and gets the model back (the asynchronous
delta rule answers a push with the new weights, so one round trip is one update).
The plain socket sends the same number of bytes each way with ``sendall`` /
``recv_into`` into reused buffers: the physical limit of this machine. Rows:

* ``raw socket``: the limit.
* ``sparkdl async``: the service as shipped (cheroot + bulk I/O), asynchronous delta.
* ``sparkdl async TLS``: the same over HTTPS with a per-fit certificate pinned by the
  client (``service_tls``, the default on clusters).
* ``sparkdl sync``: the same, synchronous average with one worker.
* ``urllib3 client``: the shipped service, with a pooled urllib3 client instead of
  sparkdl's keep-alive client (urllib3 hands the body over as ``bytes``).
* ``urllib3 + Retry``: the same, with urllib3's ``Retry`` set as sparkdl's client
  retries (5 retries of any method on connection errors and 5xx, backoff 0.1 s doubling
  up to 5 s) and the answer read into one numpy buffer (``readinto``), as sparkdl's
  client reads it: what replacing the client's hand-written retries would cost.
* ``cheroot (stock)`` / ``waitress``: the same Flask app and client on other servers
  (waitress with its receive size and spill-to-disk thresholds raised for big bodies).
* ``sparkdl async x8``: 8 client processes at once, aggregate figures.

Run:
    python benchmarks/service.py            # 0.1M, 10M and 50M parameters
    python benchmarks/service.py --sizes 0.1 10 --seconds 2
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import numpy as np

from sparkdl.protocol import wire
from sparkdl.server.state.store import WeightStore
from sparkdl.server.web.app import create_app, max_body_bytes
from sparkdl.server.web.service import ParameterService
from sparkdl.server.web.tls import Certificate
from sparkdl.sync.merges import Average, Delta

Serve = Callable[[WeightStore, str], AbstractContextManager[str]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[0.1, 10, 50], help="M params")
    parser.add_argument("--seconds", type=float, default=3.0, help="time per measurement")
    args = parser.parse_args()
    print("| params | server | round trips/s | p50 ms | MB/s | of raw socket |")
    print("|---|---|---|---|---|---|")
    for millions in args.sizes:
        n = int(millions * 1_000_000)
        body_bytes = sum(memoryview(c).nbytes for c in wire.encode(_model(n), {"version": 0}))
        raw = _raw_socket(body_bytes, args.seconds)
        _row(millions, "raw socket", raw, body_bytes, raw)
        rows: list[tuple[str, str, Serve, str]] = [
            ("sparkdl async", "asynchronous", _sparkdl, "sparkdl"),
            ("sparkdl async TLS", "asynchronous", _sparkdl_tls, "sparkdl-tls"),
            ("sparkdl sync", "synchronous", _sparkdl, "sparkdl"),
            ("urllib3 client", "asynchronous", _sparkdl, "urllib3"),
            ("urllib3 + Retry", "asynchronous", _sparkdl, "urllib3-retry"),
            ("cheroot (stock)", "asynchronous", _stock_cheroot, "sparkdl"),
            ("waitress", "asynchronous", _waitress, "sparkdl"),
        ]
        for name, mode, serve, client in rows:
            try:
                times = _run(n, mode, serve, client, args.seconds, clients=1)[0]
            except ImportError as exc:
                print(f"| {millions:g}M | {name} | not installed ({exc.name}) | | | |")
                continue
            _row(millions, name, times, body_bytes, raw)
        if n <= 1_000_000:
            per_client = _run(n, "asynchronous", _sparkdl, "sparkdl", args.seconds, clients=8)
            rate = sum(len(t) / sum(t) for t in per_client)
            mbs = rate * 2 * body_bytes / 1e6
            raw_mbs = 2 * body_bytes / statistics.median(raw) / 1e6
            p50 = statistics.median(t for ts in per_client for t in ts)
            print(
                f"| {millions:g}M | sparkdl async x8 | {_rate(rate)} | {p50 * 1e3:.2f} | "
                f"{mbs:.0f} | {mbs / raw_mbs:.0%} |"
            )


def _model(n: int) -> list[np.ndarray]:
    """A dense layer's kernel and bias holding ``n`` float32 parameters."""
    bias = min(1000, n // 10)
    return [np.zeros(n - bias, np.float32), np.zeros(bias, np.float32)]


def _row(millions: float, name: str, times: list[float], nbytes: int, raw: list[float]) -> None:
    p50 = statistics.median(times)
    raw_p50 = statistics.median(raw)
    print(
        f"| {millions:g}M | {name} | {_rate(1 / p50)} | {p50 * 1e3:.2f} | "
        f"{2 * nbytes / p50 / 1e6:.0f} | {raw_p50 / p50:.0%} |",
        flush=True,
    )


def _rate(per_second: float) -> str:
    return f"{per_second:.1f}" if per_second < 10 else f"{per_second:.0f}"


# ----------------------------------------------------------------- client processes
def _run(
    n: int, mode: str, serve: Serve, client: str, seconds: float, *, clients: int
) -> list[list[float]]:
    """Serves a fresh store and times ``clients`` client processes against it."""
    weights = _model(n)
    if mode == "asynchronous":
        store = WeightStore(weights, num_workers=8, merge=Delta(), mode=mode)
    else:
        store = WeightStore(weights, num_workers=1, merge=Average(), mode=mode)
    with serve(store, "token") as url:
        pem = _CERTIFICATE.pem if client == "sparkdl-tls" else None
        return _in_processes(
            _service_client, [(url, n, mode, client, seconds, i, pem) for i in range(clients)]
        )


def _in_processes(target: Callable[..., list[float]], jobs: list[tuple[Any, ...]]) -> Any:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(len(jobs)) as pool:
        return pool.starmap(target, jobs)


def _service_client(
    url: str, n: int, mode: str, client: str, seconds: float, worker: int, pem: bytes | None
) -> list[float]:
    weights = _model(n)
    version = 0
    if client.startswith("urllib3"):
        return _urllib3_client(url, weights, seconds, worker, retry=client == "urllib3-retry")
    from sparkdl.protocol.client import ServiceClient

    service = ServiceClient(url, "token", worker=worker, tls_cert=pem)
    service.join(rows=1)

    def step() -> None:
        nonlocal version
        _, version = service.push(weights, base_version=version, samples=1)

    try:
        return _timed(step, seconds)
    finally:
        service.close()


def _urllib3_client(
    url: str, weights: list[np.ndarray], seconds: float, worker: int, *, retry: bool = False
) -> list[float]:
    import urllib3

    retries: Any = False
    if retry:  # as sparkdl's ServiceClient(retries=5, backoff=0.1)
        retries = urllib3.Retry(
            total=5,
            backoff_factor=0.1,
            backoff_max=5.0,
            backoff_jitter=0.05,
            status_forcelist=range(500, 600),
            allowed_methods=None,  # every method: a push is idempotent (worker, seq)
            raise_on_status=False,
        )
    pool = urllib3.connection_from_url(url, maxsize=1, retries=retries, timeout=60)
    seq = 0
    version = 0
    join = json.dumps({"worker": worker, "rows": 1, "attempt": 0})
    auth = {"Authorization": "Bearer token", "Content-Type": "application/json"}
    pool.urlopen("POST", "/join", body=join, headers=auth)

    def step() -> None:
        nonlocal seq, version
        seq += 1
        meta = {"worker": worker, "seq": seq, "samples": 1, "base_version": version}
        chunks = wire.encode(weights, meta)
        headers = {
            "Authorization": "Bearer token",
            "Content-Type": wire.CONTENT_TYPE,
            "Content-Length": str(sum(memoryview(c).nbytes for c in chunks)),
        }
        if not retry:
            response = pool.urlopen("POST", "/push", body=chunks, headers=headers)
            _, answer = wire.decode(response.data)
            version = answer["version"]
            return
        response = pool.urlopen(
            "POST", "/push", body=chunks, headers=headers, preload_content=False
        )
        length = int(response.headers["Content-Length"])
        view = memoryview(np.empty(length, dtype=np.uint8).data)
        got = 0
        while got < length:
            n = response.readinto(view[got:])
            if not n:
                raise ConnectionError("answer cut short")
            got += n
        response.release_conn()
        _, answer = wire.decode(view)
        version = answer["version"]

    try:
        return _timed(step, seconds)
    finally:
        pool.close()


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


# --------------------------------------------------------------------- raw socket
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
    try:
        times: list[float] = _in_processes(_raw_client, [(port, nbytes, seconds)])[0]
        return times
    finally:
        listener.close()


def _raw_client(port: int, nbytes: int, seconds: float) -> list[float]:
    client = socket.create_connection(("127.0.0.1", port))
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    outbox = bytes(nbytes)
    inbox = memoryview(bytearray(nbytes))

    def step() -> None:
        client.sendall(outbox)
        _recv_exactly(client, inbox)

    with client:
        return _timed(step, seconds)


def _recv_exactly(conn: socket.socket, buffer: memoryview) -> bool:
    got = 0
    while got < len(buffer):
        n = conn.recv_into(buffer[got:])
        if not n:
            return False
        got += n
    return True


# ------------------------------------------------------------------------ servers
@contextmanager
def _sparkdl(store: WeightStore, token: str) -> Iterator[str]:
    with ParameterService(store, host="127.0.0.1", token=token) as service:
        yield service.url


#: The TLS rows' certificate (made once; the client processes get its PEM).
_CERTIFICATE = Certificate.make("127.0.0.1")


@contextmanager
def _sparkdl_tls(store: WeightStore, token: str) -> Iterator[str]:
    with ParameterService(store, host="127.0.0.1", token=token, tls=_CERTIFICATE) as service:
        yield service.url


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
