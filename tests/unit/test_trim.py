"""The trimmer behind the service's connections: rate-limited, only after enough freed."""

from __future__ import annotations

import itertools
import time

from sparkdl.server.web.trim import Trimmer


def test_releases_trim_at_most_once_per_interval_and_once_after_the_last() -> None:
    times: list[float] = []
    trimmer = Trimmer(
        seconds=0.3, after_bytes=100, trim=lambda: bool(times.append(time.monotonic()))
    )
    trimmer.released(99)
    time.sleep(0.05)
    assert times == []  # not enough freed yet
    started = time.monotonic()
    while time.monotonic() - started < 1.0:  # a steady stream of closes, for a second
        trimmer.released(100)
        time.sleep(0.001)
    last_release = time.monotonic()
    trimmer.join(timeout=5)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert 2 <= len(times) <= 5 and all(gap >= 0.29 for gap in gaps), times
    assert times[-1] >= last_release  # what was freed last was trimmed too
    assert trimmer.trims == len(times) and trimmer.trim_seconds >= 0


def test_a_connection_closed_with_nothing_unread_counts_nothing() -> None:
    trimmer = Trimmer(seconds=0.0, after_bytes=1, trim=lambda: True)
    trimmer.released(0)
    trimmer.join(timeout=5)
    assert trimmer.trims == 0
