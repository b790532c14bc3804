"""The service's memory under a churn of unfinished heads comes back.

A real service in a child process (``benchmarks/churn.py``) on 127.0.0.1; 600
connections from 127.0.0.1-5 each send 60 KB of a head that never ends, and each one
the gate evicts is reopened at once. Before the fix, every closed connection (and its
60 KB buffer) lived until Python's cyclic collector ran, and glibc kept what was freed:
the service went from 52 to 293 MB within two seconds and stayed there.
"""

from __future__ import annotations

import time

import pytest

from benchmarks.churn import measure

#: The bounds of issue 35: growth under the churn, and the way back after it.
GROWTH_MIB = 64
RETURN_FRACTION = 0.10
RETURN_SECONDS = 30.0


@pytest.mark.slow
def test_memory_under_a_churn_of_unfinished_heads_is_bounded_and_returns() -> None:
    figures, service = measure(
        connections=600, peers=5, head_bytes=60_000, seconds=6.0, after=0.0, before=1.0
    )
    with service:
        start = figures.at(figures.attack_started)
        peak = max(s.rss_mib for s in figures.samples)
        assert figures.evicted >= 1000, figures.summary()  # it was a churn
        assert peak - start.rss_mib <= GROWTH_MIB, figures.summary()
        deadline = time.monotonic() + RETURN_SECONDS
        now = service.sample()
        while time.monotonic() < deadline:
            now = service.sample()
            if now.rss_mib <= start.rss_mib * (1 + RETURN_FRACTION) and now.fds <= start.fds:
                break
            time.sleep(0.5)
        assert now.rss_mib <= start.rss_mib * (1 + RETURN_FRACTION), (now, figures.summary())
        assert now.fds <= start.fds, (now, figures.summary())
