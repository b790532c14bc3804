"""Work a driver call runs in daemon threads, and the wait for its end.

A fit rebuilds the trained model, and the copy that merges its metrics, in daemon
threads while the workers train. A thread still inside TensorFlow (or in a gRPC call
of a Spark Connect session) as the interpreter exits crashes the process (``terminate
called without an active exception``, a segmentation fault) or hangs it for good; a
script whose fit failed at its start (a port it may not bind, say) exits just then. So
the call that starts such work waits for it before it returns or raises, for at most
:data:`SETTLE_SECONDS`.

Example:
    >>> background = Background()
    >>> future = background.run(lambda: 6 * 7, name="sparkdl-example")
    >>> background.settle()
    []
    >>> future.result()
    42
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

__all__ = ["SETTLE_SECONDS", "Background"]

_log = logging.getLogger(__name__)

#: Seconds :meth:`Background.settle` waits at most, all threads together.
SETTLE_SECONDS = 120.0

T = TypeVar("T")


class Background:
    """The daemon threads one call started, to be waited for as it ends."""

    def __init__(self) -> None:
        self._threads: list[threading.Thread] = []

    def run(self, work: Callable[[], T], name: str) -> Future[T]:
        """Runs ``work()`` in a daemon thread named ``name``.

        Args:
            work: What to run; its result (or exception) goes to the future.
            name: The thread's name.

        Returns:
            A future set with what ``work()`` returned or raised.
        """
        future: Future[T] = Future()

        def target() -> None:
            try:
                future.set_result(work())
            except BaseException as exc:  # the caller sees it at .result()
                future.set_exception(exc)

        thread = threading.Thread(target=target, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()
        return future

    def settle(self, timeout: float = SETTLE_SECONDS) -> list[str]:
        """Waits until every thread :meth:`run` started has ended.

        Args:
            timeout: Seconds to wait at most, all threads together.

        Returns:
            The names of the threads still running then (a warning names them).
        """
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        running = [thread.name for thread in self._threads if thread.is_alive()]
        if running:
            _log.warning(
                "sparkdl: %s still run(s) after %.0f s; the process may crash if it "
                "exits meanwhile",
                ", ".join(running),
                timeout,
            )
        return running
