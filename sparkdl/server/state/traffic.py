"""What went through one service: requests, and body bytes in and out.

A sharded service (``service_shards``) is measured by its busiest host, so every
service counts what it moved: each answered request, the bytes of its body and of the
answer's body (headers are not counted). The counts go in the service's status, the
fit report (``report.service["traffic"]``, per shard ``report.service["shards"]``) and
``benchmarks/shards.py``.

Example:
    >>> traffic = Traffic()
    >>> traffic.count(100, 40)
    >>> traffic.as_dict()
    {'requests': 1, 'bytes_in': 100, 'bytes_out': 40}
"""

from __future__ import annotations

import threading

__all__ = ["Traffic"]


class Traffic:
    """Thread-safe counters of one service's requests and body bytes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = 0
        self.bytes_in = 0
        self.bytes_out = 0

    def count(self, bytes_in: int, bytes_out: int) -> None:
        """One answered request with these body sizes."""
        with self._lock:
            self.requests += 1
            self.bytes_in += bytes_in
            self.bytes_out += bytes_out

    def as_dict(self) -> dict[str, int]:
        """The counts so far."""
        with self._lock:
            return {
                "requests": self.requests,
                "bytes_in": self.bytes_in,
                "bytes_out": self.bytes_out,
            }
