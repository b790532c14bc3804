"""Memory freed by closed connections goes back to the system, at most once a second.

A client without the token can open and drop connections as fast as the gate evicts
them, each holding up to the head bound (68 KiB) of an unfinished head in its read
buffer. That memory is freed when the connection closes, but glibc's allocator keeps
it resident: 600 connections from 5 peers, evicted and reopened 100,000 times in 30 s,
left the service 30 MB above its starting RSS for good. :class:`Trimmer` counts what
closed connections held; once :data:`TRIM_AFTER_BYTES` have been freed it schedules
one ``malloc_trim(0)`` (:func:`sparkdl.compat.libc.malloc_trim`, a no-op off glibc),
no sooner than :data:`TRIM_SECONDS` after the last one. A connection that closes with
nothing unread (every request answered) counts nothing, so normal traffic never trims.

Example:
    >>> calls = []
    >>> trimmer = Trimmer(seconds=0.0, after_bytes=10, trim=lambda: calls.append(1) or True)
    >>> trimmer.released(4); trimmer.released(6); trimmer.join(timeout=5)
    >>> calls, trimmer.trims
    ([1], 1)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from sparkdl.compat.libc import malloc_trim

__all__ = ["TRIMMER", "TRIM_AFTER_BYTES", "TRIM_SECONDS", "Trimmer"]

#: At most one trim in this many seconds.
TRIM_SECONDS = 1.0
#: Bytes freed by closed connections' buffers that make a trim worth its cost.
TRIM_AFTER_BYTES = 1 << 20


class Trimmer:
    """Trims the process's heaps after enough buffers were freed, rate-limited.

    Args:
        seconds: See :data:`TRIM_SECONDS` (the default).
        after_bytes: See :data:`TRIM_AFTER_BYTES` (the default).
        trim: The trim to run (glibc's ``malloc_trim(0)``).
    """

    def __init__(
        self,
        *,
        seconds: float | None = None,
        after_bytes: int | None = None,
        trim: Callable[[], bool] = malloc_trim,
    ) -> None:
        self.seconds = TRIM_SECONDS if seconds is None else seconds
        self.after_bytes = TRIM_AFTER_BYTES if after_bytes is None else after_bytes
        self._trim = trim
        #: Trims run, and the seconds they took in all.
        self.trims = 0
        self.trim_seconds = 0.0
        self._lock = threading.Lock()
        self._freed = 0
        self._last = float("-inf")
        self._timer: threading.Timer | None = None

    def released(self, nbytes: int) -> None:
        """Counts ``nbytes`` freed; schedules a trim once enough were (one at a time)."""
        with self._lock:
            self._freed += nbytes
            self._schedule_locked()

    def join(self, timeout: float = 10.0) -> None:
        """Waits until no trim is scheduled or running, at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                timer = self._timer
            if timer is None:
                return
            timer.join(max(0.0, deadline - time.monotonic()))

    def _schedule_locked(self) -> None:
        if self._freed < self.after_bytes or self._timer is not None:
            return
        delay = max(0.0, self._last + self.seconds - time.monotonic())
        self._timer = threading.Timer(delay, self._run)
        self._timer.name = "sparkdl-trim"
        self._timer.daemon = True
        self._timer.start()

    def _run(self) -> None:
        with self._lock:
            self._freed = 0  # what is freed from now on counts towards the next trim
        started = time.perf_counter()
        try:
            self._trim()
        finally:
            with self._lock:
                self._timer = None
                self._last = time.monotonic()
                self.trims += 1
                self.trim_seconds += time.perf_counter() - started
                self._schedule_locked()  # for what was freed while this one ran


#: The process's trimmer (a trim is process-wide): every service's connections count.
TRIMMER = Trimmer()
