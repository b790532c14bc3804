"""The parameter service's memory under a churn of unfinished heads.

Clients without the token open ``--connections`` connections spread over ``--peers``
source addresses (127.0.0.1, 127.0.0.2, ...: Linux routes all of 127/8 to loopback),
each sends ``--head-bytes`` of a request head that never ends, and every connection
the service closes is reopened at once. More connections than the gate's
:data:`sparkdl.server.web.gate.UNTRUSTED_CAP` means the gate evicts one for each that is
reopened: a churn of connections, each carrying tens of kilobytes of buffered head.

The service runs in a child process (``--serve``), so that its resident memory
(``VmRSS`` of ``/proc/<pid>/status``) and open descriptors are its own. Sampled every
half second: before the attack, during it (``--seconds``), and for ``--after`` seconds
after it ends. Printed: RSS at start, peak, at the attack's end and at the end of the
watch, how soon after the attack it was back within 10% of the start, the gate's
evictions, the service's trims of freed memory, and its descriptors.
``--probe`` then asks the service to run ``gc.collect()`` and glibc's
``malloc_trim(0)``, and prints the RSS after each: memory that ``gc`` gives back was
held by garbage, memory only ``malloc_trim`` gives back was free but kept by the
allocator.

Everything runs on 127.0.0.x; every loop is bounded in count and in time.

Run:
    .venv/bin/python benchmarks/churn.py                       # 600 conns, 5 peers, 60 KB
    .venv/bin/python benchmarks/churn.py --seconds 20 --after 35 --probe
    .venv/bin/python benchmarks/churn.py --connections 120 --seconds 20   # no churn
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import selectors
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: Seconds between two samples of the service's memory.
SAMPLE_SECONDS = 0.5
#: The unfinished head every connection of the attack sends (padded to its size).
_HEAD = b"GET /status HTTP/1.1\r\nHost: x\r\nX-Pad: "


@dataclass
class Sample:
    """The service's resident memory (MiB) and open descriptors at one time."""

    at: float
    rss_mib: float
    fds: int


@dataclass
class ChurnFigures:
    """What one run measured."""

    samples: list[Sample] = field(default_factory=list)
    attack_started: float = 0.0
    attack_ended: float = 0.0
    opened: int = 0
    evicted: int = 0
    held_max: int = 0
    trims: dict[str, Any] = field(default_factory=dict)

    def at(self, when: float) -> Sample:
        """The last sample taken at or before ``when``."""
        taken = [s for s in self.samples if s.at <= when] or self.samples[:1]
        return taken[-1]

    def back_within(self, fraction: float, start_mib: float) -> float | None:
        """Seconds from the attack's end until RSS was within ``fraction`` of
        ``start_mib`` (and stayed there), ``None`` if it never was."""
        after = [s for s in self.samples if s.at >= self.attack_ended]
        back = None
        for sample in after:
            if sample.rss_mib > start_mib * (1 + fraction):
                back = None
            elif back is None:
                back = round(sample.at - self.attack_ended, 1)
        return back

    def summary(self) -> dict[str, Any]:
        start = self.at(self.attack_started)
        end = self.at(self.attack_ended)
        last = self.samples[-1]
        return {
            "rss_start_mib": round(start.rss_mib, 1),
            "rss_peak_mib": round(max(s.rss_mib for s in self.samples), 1),
            "rss_attack_end_mib": round(end.rss_mib, 1),
            "rss_after_mib": round(last.rss_mib, 1),
            "after_seconds": round(last.at - self.attack_ended, 1),
            "back_within_10pct_s": self.back_within(0.10, start.rss_mib),
            "fds_start": start.fds,
            "fds_max": max(s.fds for s in self.samples),
            "fds_after": last.fds,
            "opened": self.opened,
            "evicted": self.evicted,
            "held_max": self.held_max,
            **self.trims,
        }


class ServiceProcess:
    """The parameter service in a child process, answering commands on its stdin."""

    def __init__(self) -> None:
        script = os.path.abspath(__file__)
        self.proc = subprocess.Popen(
            [sys.executable, script, "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        ready = self._answer()
        self.port = int(ready["port"])
        self.pid = self.proc.pid

    def ask(self, command: str) -> dict[str, Any]:
        """Sends one command (``gate``, ``gc``, ``trim``) and returns its answer."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def sample(self) -> Sample:
        """The child's RSS and open descriptors now."""
        rss_kib = 0
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    rss_kib = int(line.split()[1])
        fds = len(os.listdir(f"/proc/{self.pid}/fd"))
        return Sample(time.monotonic(), rss_kib / 1024, fds)

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)

    def _answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the service process ended")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def __enter__(self) -> ServiceProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Churn:
    """``connections`` sockets over ``peers`` addresses, each sending ``head_bytes`` of an
    unfinished head; each one the service closes is reopened at once.

    Args:
        port: The service's port on 127.0.0.1 (the peers are 127.0.0.1 .. 127.0.0.N).
        connections: Connections held open at once.
        peers: Source addresses they are spread over.
        head_bytes: Bytes of unfinished head each connection sends.
    """

    def __init__(self, port: int, *, connections: int, peers: int, head_bytes: int) -> None:
        self.port = port
        self.head = (_HEAD + b"a" * head_bytes)[:head_bytes]
        self.sources = [f"127.0.0.{1 + i % peers}" for i in range(connections)]
        self.opened = 0

    def run(self, seconds: float, tick: Any = None) -> None:
        """Churns for ``seconds``, calling ``tick()`` about every :data:`SAMPLE_SECONDS`."""
        slots: list[dict[str, Any]] = [{"source": s, "sock": None} for s in self.sources]
        ends = time.monotonic() + seconds
        next_tick = 0.0
        with selectors.DefaultSelector() as selector:
            try:
                while time.monotonic() < ends:
                    for slot in slots:
                        if slot["sock"] is None:
                            self._open(slot, selector)
                    for key, events in selector.select(timeout=0.05):
                        self._serve(key.data, events, selector)
                    if tick is not None and time.monotonic() >= next_tick:
                        tick()
                        next_tick = time.monotonic() + SAMPLE_SECONDS
            finally:
                for slot in slots:
                    self._close(slot, selector)

    def _open(self, slot: dict[str, Any], selector: Any) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.bind((slot["source"], 0))
            sock.connect(("127.0.0.1", self.port))
        except BlockingIOError:
            pass
        except OSError:
            sock.close()
            return
        slot.update(sock=sock, sent=0)
        selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, slot)
        self.opened += 1

    def _serve(self, slot: dict[str, Any], events: int, selector: Any) -> None:
        sock = slot["sock"]
        if events & selectors.EVENT_READ:
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                data = b"-"
            except OSError:
                data = b""
            if not data:
                self._close(slot, selector)
                return
        if events & selectors.EVENT_WRITE:
            try:
                slot["sent"] += sock.send(self.head[slot["sent"] :])
            except BlockingIOError:
                return
            except OSError:
                self._close(slot, selector)
                return
            if slot["sent"] >= len(self.head):
                selector.modify(sock, selectors.EVENT_READ, slot)

    @staticmethod
    def _close(slot: dict[str, Any], selector: Any) -> None:
        sock = slot["sock"]
        if sock is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            selector.unregister(sock)
        sock.close()
        slot["sock"] = None


def measure(
    *,
    connections: int = 600,
    peers: int = 5,
    head_bytes: int = 60_000,
    seconds: float = 30.0,
    after: float = 35.0,
    before: float = 2.0,
) -> tuple[ChurnFigures, ServiceProcess]:
    """Runs one churn against a fresh service; returns its figures and the still
    running service (close it, or use it as a context manager)."""
    service = ServiceProcess()
    figures = ChurnFigures()
    try:
        _watch(service, figures, before)
        figures.attack_started = time.monotonic()
        figures.samples.append(service.sample())
        churn = Churn(service.port, connections=connections, peers=peers, head_bytes=head_bytes)
        churn.run(seconds, tick=lambda: figures.samples.append(service.sample()))
        figures.attack_ended = time.monotonic()
        figures.samples.append(service.sample())
        figures.opened = churn.opened
        _watch(service, figures, after)
        gate = service.ask("gate")
        figures.evicted, figures.held_max = int(gate["evicted"]), int(gate["held_max"])
        figures.trims = {k: gate[k] for k in ("trims", "trim_ms") if k in gate}
    except BaseException:
        service.close()
        raise
    return figures, service


def _watch(service: ServiceProcess, figures: ChurnFigures, seconds: float) -> None:
    ends = time.monotonic() + seconds
    while True:
        figures.samples.append(service.sample())
        if time.monotonic() >= ends:
            return
        time.sleep(min(SAMPLE_SECONDS, max(0.0, ends - time.monotonic())))


def serve() -> None:
    """The child: a service for a small model, answering commands on stdin."""
    from benchmarks.idle_connections import service

    def say(answer: dict[str, Any]) -> None:
        print(json.dumps(answer), flush=True)

    with _quiet_logs(), service() as running:
        say({"port": running.port})
        for line in sys.stdin:
            command = line.strip()
            if command == "gate":
                gate = running.gate
                assert gate is not None
                trims = _trims()
                say({"evicted": gate.evicted, "held_max": gate.held_max, **trims})
            elif command == "gc":
                say({"collected": gc.collect()})
            elif command == "trim":
                from sparkdl.compat.libc import malloc_trim

                say({"trimmed": malloc_trim()})
            else:
                say({"error": f"unknown command {command!r}"})


def _trims() -> dict[str, Any]:
    try:
        from sparkdl.server.web.trim import TRIMMER
    except ImportError:  # a service from before the trimmer
        return {}
    return {"trims": TRIMMER.trims, "trim_ms": round(1000 * TRIMMER.trim_seconds, 1)}


@contextlib.contextmanager
def _quiet_logs() -> Iterator[None]:
    import logging

    logging.getLogger("sparkdl").setLevel(logging.ERROR)
    yield


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--connections", type=int, default=600)
    parser.add_argument("--peers", type=int, default=5)
    parser.add_argument("--head-bytes", type=int, default=60_000)
    parser.add_argument("--seconds", type=float, default=30.0, help="the attack's length")
    parser.add_argument("--after", type=float, default=35.0, help="watch after the attack")
    parser.add_argument("--probe", action="store_true", help="then gc.collect, malloc_trim")
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    figures, service = measure(
        connections=args.connections,
        peers=args.peers,
        head_bytes=args.head_bytes,
        seconds=args.seconds,
        after=args.after,
    )
    with service:
        summary = figures.summary()
        if args.probe:
            service.ask("gc")
            summary["rss_after_gc_mib"] = round(service.sample().rss_mib, 1)
            service.ask("trim")
            summary["rss_after_trim_mib"] = round(service.sample().rss_mib, 1)
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
