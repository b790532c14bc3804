"""Idle and trickling connections against the parameter service, and a fit under them.

A client without the token opens connections and sends nothing (idle), or one byte of
a never-ending header every second (trickle), and reopens every connection the
service closes (at most once every 0.1 s each). Meanwhile an authenticated client
measures round trips: ``GET /status`` and a small asynchronous push with its answer,
on a kept-alive connection and on a new connection each time (as a worker that
retries). Every figure is printed beside the same measurement without the attack, and
beside cheroot without the gate (``--ungated``: what the service did before), and
beside waitress serving the same Flask app (``--waitress``): waitress reads every
request asynchronously before a thread sees it, with its ``connection_limit`` and
``channel_timeout`` set to the gate's bounds (:data:`sparkdl.server.web.gate.UNTRUSTED_CAP`
connections, :data:`sparkdl.server.web.gate.HEAD_SECONDS`; waitress has no per-peer cap).

The service runs in this process on 127.0.0.1, as a fit runs it. ``--fit`` also
trains digits on ``local[2]`` with the attack on the fit's port, and prints whether
and when it completed.

Run:
    .venv/bin/python benchmarks/idle_connections.py                 # 256 idle, 256 trickle
    .venv/bin/python benchmarks/idle_connections.py --ungated --requests 50
    .venv/bin/python benchmarks/idle_connections.py --waitress --requests 100
    .venv/bin/python benchmarks/idle_connections.py --fit-only      # the fit alone
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import urllib3
from cheroot import wsgi

from sparkdl.protocol import wire
from sparkdl.server.state.store import WeightStore
from sparkdl.server.web import service as service_module
from sparkdl.server.web.app import create_app, max_body_bytes
from sparkdl.server.web.gate import HEAD_SECONDS, UNTRUSTED_CAP, HeadGate
from sparkdl.server.web.service import (
    MAX_HEADER_BYTES,
    RESERVED_THREADS,
    SERVER_NAME,
    ParameterService,
)
from sparkdl.server.web.transport import use_bulk_io
from sparkdl.sync.merges import Delta
from sparkdl.sync.modes import Asynchronous

#: Seconds between two bytes of a trickling connection.
TRICKLE_SECONDS = 1.0
#: A closed connection of the attack is reopened after at least this long.
REOPEN_SECONDS = 0.1
#: Each authenticated request gives up after this long (counted as this long).
REQUEST_TIMEOUT = 5.0
#: A measurement stops after this many failures in a row (the service is stalled).
GIVE_UP_AFTER = 3
#: The model the service holds: its weights' shapes.
SHAPES = [(64, 16), (16,)]
_TRICKLE_HEAD = b"GET /status HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100_000


@dataclass
class SiegeFigures:
    """What the attack did."""

    opened: int = 0
    closed_by_service: int = 0
    held_max: int = 0
    bytes_sent: int = 0


class Siege:
    """Keeps ``idle`` silent and ``trickle`` one-byte-a-second connections open.

    A daemon thread; every connection the service closes is reopened (after at least
    :data:`REOPEN_SECONDS`). Bounded: it stops at :meth:`stop` or after ``seconds``.

    Args:
        host: The service's address (127.0.0.1 only in tests).
        port: The service's port.
        idle: Connections that send nothing.
        trickle: Connections that send one header byte every :data:`TRICKLE_SECONDS`.
        seconds: The attack's longest run.
    """

    def __init__(self, host: str, port: int, *, idle: int, trickle: int, seconds: float = 600):
        self.host, self.port = host, port
        self.idle, self.trickle = idle, trickle
        self.seconds = seconds
        self.figures = SiegeFigures()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="siege", daemon=True)

    def __enter__(self) -> Siege:
        self._thread.start()
        deadline = time.monotonic() + 30
        while self.figures.held_max < min(self.idle + self.trickle, 64):
            if time.monotonic() > deadline or not self._thread.is_alive():
                break
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stops the attack and closes its connections."""
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        slots: list[dict[str, Any]] = [
            {"kind": kind, "sock": None, "reopen": 0.0, "next": 0.0, "sent": 0}
            for kind in ["idle"] * self.idle + ["trickle"] * self.trickle
        ]
        ends = time.monotonic() + self.seconds
        with selectors.DefaultSelector() as selector:
            try:
                while not self._stop.is_set() and time.monotonic() < ends:
                    now = time.monotonic()
                    for slot in slots:
                        self._tend(slot, now, selector)
                    held = sum(slot["sock"] is not None for slot in slots)
                    self.figures.held_max = max(self.figures.held_max, held)
                    for key, _ in selector.select(timeout=0.05) if held else []:
                        self._check_closed(key.data, selector)
            finally:
                for slot in slots:
                    self._close(slot, selector)

    def _tend(self, slot: dict[str, Any], now: float, selector: Any) -> None:
        if slot["sock"] is None:
            if now < slot["reopen"]:
                return
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                sock.connect((self.host, self.port))
            slot.update(sock=sock, next=now + TRICKLE_SECONDS, sent=0)
            selector.register(sock, selectors.EVENT_READ, slot)
            self.figures.opened += 1
        elif slot["kind"] == "trickle" and now >= slot["next"]:
            try:
                slot["sock"].send(_TRICKLE_HEAD[slot["sent"] : slot["sent"] + 1])
            except OSError:
                self._close(slot, selector, by_service=True)
                return
            slot["sent"] += 1
            slot["next"] = now + TRICKLE_SECONDS
            self.figures.bytes_sent += 1

    def _check_closed(self, slot: dict[str, Any], selector: Any) -> None:
        try:
            data = slot["sock"].recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close(slot, selector, by_service=True)

    def _close(self, slot: dict[str, Any], selector: Any, by_service: bool = False) -> None:
        sock = slot["sock"]
        if sock is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            selector.unregister(sock)
        sock.close()
        slot.update(sock=None, reopen=time.monotonic() + REOPEN_SECONDS)
        if by_service:
            self.figures.closed_by_service += 1


@dataclass
class RoundTrips:
    """Authenticated round trips, in seconds (a failure counts as the timeout)."""

    seconds: list[float] = field(default_factory=list)
    failures: int = 0

    def quantile(self, q: float) -> float:
        return float(np.quantile(self.seconds, q)) if self.seconds else float("nan")


def round_trips(url: str, token: str, *, requests: int, fresh: bool, push: bool) -> RoundTrips:
    """Times ``requests`` authenticated requests, one after another.

    Args:
        url: The service's base URL (http only).
        token: The fit's token.
        requests: How many.
        fresh: A new connection for each request (else one kept-alive connection).
        push: An asynchronous push of worker 0 with its answer (else ``GET /status``).
    """
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    timeout = urllib3.Timeout(connect=REQUEST_TIMEOUT, read=REQUEST_TIMEOUT)
    pool = urllib3.HTTPConnectionPool(host, int(port), maxsize=1, timeout=timeout, retries=False)
    headers = {"Authorization": f"Bearer {token}"}
    result = RoundTrips()
    seq = 0
    for _ in range(requests):
        started = time.perf_counter()
        try:
            if push:
                seq += 1
                body, extra = _push_body(seq)
                answer = pool.urlopen(
                    "POST", "/push", body=body, headers={**headers, **extra}, preload_content=True
                )
            else:
                answer = pool.urlopen("GET", "/status", headers=headers, preload_content=True)
            ok = answer.status == 200
        except urllib3.exceptions.HTTPError:
            ok = False
        elapsed = time.perf_counter() - started
        if not ok:
            result.failures += 1
            elapsed = max(elapsed, REQUEST_TIMEOUT)
        result.seconds.append(elapsed)
        if result.failures >= GIVE_UP_AFTER and all(
            s >= REQUEST_TIMEOUT for s in result.seconds[-GIVE_UP_AFTER:]
        ):
            break
        if fresh:
            pool.close()
            pool = urllib3.HTTPConnectionPool(
                host, int(port), maxsize=1, timeout=timeout, retries=False
            )
    pool.close()
    return result


#: The servers :func:`service` can run: the service as shipped, cheroot with bulk I/O
#: and no gate, waitress serving the same Flask app.
SERVERS = ("gated", "cheroot", "waitress")


@dataclass
class Served:
    """A running service: what the measurements need of it."""

    url: str
    port: int
    token: str
    gate: HeadGate | None = None


@contextlib.contextmanager
def service(*, gated: bool = True, server: str | None = None) -> Iterator[Served]:
    """A service for a small model, two asynchronous workers, worker 0 joined.

    Args:
        gated: The service as shipped (else cheroot without the gate).
        server: One of :data:`SERVERS` (overrides ``gated``).
    """
    server = server or ("gated" if gated else "cheroot")
    store = WeightStore(
        [np.zeros(shape, np.float32) for shape in SHAPES],
        num_workers=2,
        merge=Delta(),
        mode=Asynchronous(),
    )
    store.join(0, rows=1000, wait=0.0)
    if server == "waitress":
        with waitress_service(store) as running:
            yield running
        return
    with _server_class(server == "gated"), ParameterService(store, host="127.0.0.1") as shipped:
        yield Served(shipped.url, shipped.port, shipped.token, shipped.gate)


@contextlib.contextmanager
def waitress_service(store: WeightStore) -> Iterator[Served]:
    """waitress serving the service's Flask app, with the service's bounds.

    The same threads, long-poll slots, header and body bounds and ``Server`` name as
    :class:`ParameterService`; ``connection_limit`` = the gate's cap on connections
    without the token, ``channel_timeout`` = its head deadline (waitress closes a
    connection without a complete request once it was silent that long), checked every
    second.
    """
    from waitress.server import create_server

    token = secrets.token_urlsafe(32)
    threads = max(8, 2 * store.num_workers + RESERVED_THREADS)
    slots = max(threads - RESERVED_THREADS, store.num_workers + 1)
    server = create_server(
        _bytes_chunks(create_app(store, token, wait_slots=slots)),
        host="127.0.0.1",
        port=0,
        threads=threads,
        connection_limit=UNTRUSTED_CAP,
        channel_timeout=int(HEAD_SECONDS),
        cleanup_interval=1,
        max_request_header_size=MAX_HEADER_BYTES,
        max_request_body_size=max_body_bytes(store),
        backlog=1024,
        ident=SERVER_NAME,
    )
    thread = threading.Thread(target=server.run, name="waitress", daemon=True)
    thread.start()
    port = int(server.effective_port)  # type: ignore[union-attr]
    try:
        yield Served(f"http://127.0.0.1:{port}", port, token)
    finally:
        store.abort("the benchmark ended")
        server.task_dispatcher.shutdown()
        for channel in list(server._map.values()):  # the loop ends once its map is empty
            with contextlib.suppress(Exception):
                channel.close()
        thread.join(timeout=5)


def _bytes_chunks(app: Any) -> Callable[..., Iterable[bytes]]:
    """``app`` answering ``bytes`` chunks: waitress counts a chunk's ``len``, which is not
    its size in bytes for the service's array views."""

    def wsgi_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        chunks = app(environ, start_response)
        try:
            return [b"".join(bytes(memoryview(c).cast("B")) for c in chunks)]
        finally:
            if hasattr(chunks, "close"):
                chunks.close()

    return wsgi_app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle", type=int, default=256)
    parser.add_argument("--trickle", type=int, default=256)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--ungated", action="store_true", help="also cheroot without the gate")
    parser.add_argument("--waitress", action="store_true", help="also waitress, same Flask app")
    parser.add_argument("--fit", action="store_true", help="also a digits fit under attack")
    parser.add_argument("--fit-only", action="store_true", help="only the fit under attack")
    args = parser.parse_args()
    if args.fit_only:
        _fit_under_attack(args.idle, args.trickle)
        return
    loads = [("none", 0, 0), ("idle", args.idle, 0), ("trickle", 0, args.trickle)]
    loads.append(("idle+trickle", args.idle, args.trickle))
    variants = ["gated"] + ["cheroot"] * args.ungated + ["waitress"] * args.waitress
    print(
        f"{'server':8} {'attack':13} {'held':>5} {'evicted':>7} {'closed':>7} {'request':18} "
        f"{'p50 ms':>8} {'p99 ms':>8} {'failed':>9}"
    )
    # The servers alternate within each load, so a busy machine weighs on all alike.
    for name, idle, trickle in loads:
        for server in variants:
            _measure(server, name, idle, trickle, args.requests)
    if args.fit:
        _fit_under_attack(args.idle, args.trickle)


def _measure(server: str, name: str, idle: int, trickle: int, requests: int) -> None:
    """One load against one server; ``closed``: the attack's connections it closed."""
    with service(server=server) as running:
        siege = Siege("127.0.0.1", running.port, idle=idle, trickle=trickle)
        with siege if idle + trickle else contextlib.nullcontext():
            time.sleep(1.0 if idle + trickle else 0)
            for label, fresh, push in [
                ("status, kept", False, False),
                ("status, new conn", True, False),
                ("push+pull, kept", False, True),
            ]:
                trips = round_trips(
                    running.url, running.token, requests=requests, fresh=fresh, push=push
                )
                gate = running.gate
                held = gate.held_max if gate else siege.figures.held_max
                evicted = gate.evicted if gate else 0
                print(
                    f"{server:8} {name:13} {held:5d} {evicted:7d} "
                    f"{siege.figures.closed_by_service:7d} "
                    f"{label:18} {1000 * trips.quantile(0.5):8.2f} "
                    f"{1000 * trips.quantile(0.99):8.2f} "
                    f"{trips.failures:3d}/{len(trips.seconds):<5d}",
                    flush=True,
                )


def _fit_under_attack(idle: int, trickle: int) -> None:
    """A warm-up fit, then the same fit without and with the attack on its port."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from examples.digits import digits_frames, digits_model
    from sparkdl import KerasEstimator

    spark = SparkSession.builder.master("local[2]").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    train, test = digits_frames(spark)
    train = train.cache()
    for label in ["warm-up", "no attack", f"{idle} idle + {trickle} trickle"]:
        port = free_port()
        attack = label.endswith("trickle")
        siege = Siege("127.0.0.1", port, idle=idle if attack else 0, trickle=trickle)
        with siege if attack else contextlib.nullcontext():
            started = time.perf_counter()
            fitted = KerasEstimator(
                model=digits_model(),
                mode="asynchronous",
                frequency="batch",
                overlap=False,
                epochs=10,
                num_workers=2,
                port=port,
                verbose=0,
            ).fit(train)
            seconds = time.perf_counter() - started
        accuracy = fitted.evaluate(test)["accuracy"]
        figures = {
            "fit": label,
            "fit_seconds": round(seconds, 2),
            "test_accuracy": round(float(accuracy), 4),
        }
        if attack:
            figures["attack_connections_opened"] = siege.figures.opened
            figures["closed_by_service"] = siege.figures.closed_by_service
        print(json.dumps(figures), flush=True)
    spark.stop()


class _Ungated(wsgi.Server):
    """cheroot with sparkdl's bulk I/O and no gate: the service before the gate."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        use_bulk_io(self)


@contextlib.contextmanager
def _server_class(gated: bool) -> Iterator[None]:
    if gated:
        yield
        return
    saved = service_module.GatedServer
    service_module.GatedServer = _Ungated  # type: ignore[misc]
    try:
        yield
    finally:
        service_module.GatedServer = saved  # type: ignore[misc]


def _push_body(seq: int) -> tuple[bytes, dict[str, str]]:
    arrays = [np.full(shape, 1e-6, np.float32) for shape in SHAPES]
    meta = {"worker": 0, "seq": seq, "attempt": 0, "samples": 1, "base_version": 0}
    parts = wire.encode(arrays, meta)
    body = b"".join(bytes(p) for p in parts)
    return body, {"Content-Type": wire.CONTENT_TYPE}


def free_port() -> int:
    """A port free on 127.0.0.1 now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


if __name__ == "__main__":
    main()
