"""Clients that stall in the middle of a request body, against the parameter service.

Each of N clients opens a connection and sends the head of a push (``POST /push``, with
the fit's token, as a worker that hangs mid-push, or without it) announcing the whole
body, then half the body, then nothing more (``stall``) or one more byte a second
(``trickle``). Meanwhile an honest client times authenticated round trips as in
``benchmarks/idle_connections.py``: ``GET /status`` on a kept connection and on a new
connection each time, and a small push with its answer. Printed for each server: the
honest client's p50 / p99 and failures, and how many of the stalled clients the server
dropped (answered or closed), how long after they stalled, and with what answer.

Servers: ``gated``, the service as shipped (cheroot, bulk I/O, the head gate);
``waitress``, the same Flask app on waitress with the service's bounds
(``idle_connections.waitress_service``: ``channel_timeout`` = the gate's 10 s). Rows
alternate server by server. Everything runs on 127.0.0.1; every loop is bounded in
count and in time (``--hold``).

``--idle N`` also holds N idle connections without the token open meanwhile.

Run:
    .venv/bin/python benchmarks/stalled_body.py                    # 4 and 16 stalled
    .venv/bin/python benchmarks/stalled_body.py --servers gated --stalled 64 --idle 128
    .venv/bin/python benchmarks/stalled_body.py --stalled 16 --hold 40 --requests 50
"""

from __future__ import annotations

import argparse
import contextlib
import os
import selectors
import socket
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.idle_connections import _push_body, round_trips, service

#: Seconds between two body bytes of a trickling client.
TRICKLE_SECONDS = 1.0


@dataclass
class Drops:
    """What became of the stalled clients: (seconds after the stall, answer) each."""

    dropped: list[tuple[float, str]] = field(default_factory=list)
    opened: int = 0

    def summary(self) -> str:
        if not self.dropped:
            return f"0/{self.opened} dropped"
        seconds = [s for s, _ in self.dropped]
        answers = sorted({a for _, a in self.dropped})
        return (
            f"{len(self.dropped)}/{self.opened} dropped after "
            f"{min(seconds):.1f}-{max(seconds):.1f} s ({', '.join(answers)})"
        )


class Stalled:
    """``count`` connections that send a push's head and half its body, then stall.

    A daemon thread watches them: a connection the server answers or closes counts as
    dropped (its first answer's status, or ``closed``). ``trickle`` sends one more body
    byte a second (never the whole body). Stops at :meth:`stop` or after ``seconds``.
    """

    def __init__(
        self, port: int, token: str | None, *, count: int, trickle: bool, seconds: float
    ) -> None:
        body, extra = _push_body(1)
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        self._head = (
            f"POST /push HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}"
            f"Content-Type: {extra['Content-Type']}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        self._body = body
        self.port, self.count, self.trickle, self.seconds = port, count, trickle, seconds
        self.drops = Drops()
        self.started = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stalled", daemon=True)

    def __enter__(self) -> Stalled:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def wait_dropped(self, until: float) -> None:
        """Waits until every stalled client was dropped, or ``until`` (monotonic)."""
        while len(self.drops.dropped) < self.drops.opened and time.monotonic() < until:
            if not self._thread.is_alive():
                return
            time.sleep(0.05)

    def _run(self) -> None:
        half = len(self._body) // 2
        socks: dict[socket.socket, int] = {}  # body bytes sent
        with selectors.DefaultSelector() as selector:
            try:
                for _ in range(self.count):
                    sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
                    sock.sendall(self._head + self._body[:half])
                    sock.setblocking(False)
                    selector.register(sock, selectors.EVENT_READ)
                    socks[sock] = half
                    self.drops.opened += 1
                self.started = time.monotonic()
                ends = self.started + self.seconds
                next_byte = self.started + TRICKLE_SECONDS
                while socks and not self._stop.is_set() and time.monotonic() < ends:
                    for key, _ in selector.select(timeout=0.05):
                        self._answered(key.fileobj, selector, socks)  # type: ignore[arg-type]
                    if self.trickle and time.monotonic() >= next_byte:
                        next_byte += TRICKLE_SECONDS
                        for sock, sent in list(socks.items()):
                            if sent < len(self._body) - 1:
                                with contextlib.suppress(OSError):
                                    sock.send(self._body[sent : sent + 1])
                                    socks[sock] = sent + 1
            finally:
                for sock in socks:
                    sock.close()

    def _answered(
        self, sock: socket.socket, selector: selectors.BaseSelector, socks: dict[socket.socket, int]
    ) -> None:
        try:
            data = sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        answer = "closed"
        if data.startswith(b"HTTP/"):
            answer = data.split(b" ", 2)[1].decode("latin-1", "replace")
        self.drops.dropped.append((time.monotonic() - self.started, answer))
        selector.unregister(sock)
        socks.pop(sock, None)
        sock.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stalled", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--requests", type=int, default=100, help="per honest measurement")
    parser.add_argument("--hold", type=float, default=35.0, help="longest wait for the drops")
    parser.add_argument("--servers", nargs="+", default=["gated", "waitress"])
    parser.add_argument(
        "--idle", type=int, default=0, help="idle connections without the token held meanwhile"
    )
    parser.add_argument(
        "--cases",
        nargs="+",
        default=["token,stall", "none,stall", "token,trickle"],
        help="who stalls (token: a worker with the fit's token, none: without) and how",
    )
    args = parser.parse_args()
    print(
        f"{'server':8} {'stalled':>7} {'token':5} {'how':7} {'request':18} "
        f"{'p50 ms':>8} {'p99 ms':>8} {'failed':>7}  stalled clients"
    )
    for case in args.cases:
        auth, how = case.split(",")
        counts = args.stalled if case == "token,stall" else [max(args.stalled)]
        for count in counts:
            for server in args.servers:
                _measure(server, count, auth == "token", how == "trickle", args)


def _measure(server: str, count: int, with_token: bool, trickle: bool, args: argparse.Namespace):
    with service(server=server) as running, contextlib.ExitStack() as idle:
        for _ in range(args.idle):  # connected, sending nothing
            idle.enter_context(socket.create_connection(("127.0.0.1", running.port), timeout=5))
        token = running.token if with_token else "wrong-" + running.token[:8]
        with Stalled(
            running.port, token, count=count, trickle=trickle, seconds=args.hold
        ) as stalled:
            time.sleep(0.5)
            rows = []
            for label, fresh, push in [
                ("status, kept", False, False),
                ("status, new conn", True, False),
                ("push+pull, kept", False, True),
            ]:
                trips = round_trips(
                    running.url, running.token, requests=args.requests, fresh=fresh, push=push
                )
                rows.append((label, trips))
            stalled.wait_dropped(stalled.started + args.hold)
        for label, trips in rows:
            p50 = statistics.median(trips.seconds) if trips.seconds else float("nan")
            print(
                f"{server:8} {count:7d} {'yes' if with_token else 'no':5} "
                f"{'trickle' if trickle else 'stall':7} {label:18} {1000 * p50:8.2f} "
                f"{1000 * trips.quantile(0.99):8.2f} {trips.failures:3d}/{len(trips.seconds):<3d}  "
                f"{stalled.drops.summary() if label.startswith('push') else ''}",
                flush=True,
            )


if __name__ == "__main__":
    main()
