"""Ctrl-C during a fit: ``KeyboardInterrupt`` for the caller, only this fit's jobs cancelled.

PySpark's own SIGINT handler calls ``cancelAllJobs()`` (every job of the SparkContext,
other fits' too) through the main thread's Py4J connection. That connection is busy
with the training job's ``collect``, so the cancel failed: the caller got a
``WorkerError`` instead of ``KeyboardInterrupt``, and the barrier job stayed active
while Spark retried its stage with fresh workers.

So a fit runs its Spark job on a driver thread (:func:`run_job`), which carries the
caller's Spark local properties (scheduler pool, ...) plus the fit's own job group, and
the caller's thread only waits. While a fit runs on the main thread
(:func:`interrupt_raises`), SIGINT raises ``KeyboardInterrupt`` there instead of running
PySpark's handler. On it the fit aborts its service's training state (every worker's next
request is refused and it stops), cancels its own job group from a fresh thread, waits
up to :data:`CANCEL_SECONDS` for the job to end, and re-raises; the fit's ``ExitStack``
then stops the service and the fit's other threads. The caller's thread never had its
job group changed, so nothing needs restoring.

Example:
    >>> with interrupt_raises():
    ...     pass
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, TypeVar

from pyspark import InheritableThread

if TYPE_CHECKING:
    from pyspark import SparkContext

__all__ = ["CANCEL_SECONDS", "JOB_THREAD", "interrupt_raises", "run_job"]

#: Seconds an interrupted fit waits for its Spark job to end after cancelling it.
CANCEL_SECONDS = 5.0
#: Name of the driver thread that runs a fit's Spark job.
JOB_THREAD = "sparkdl-training-job"

T = TypeVar("T")
_log = logging.getLogger(__name__)


@contextlib.contextmanager
def interrupt_raises() -> Iterator[None]:
    """While inside, SIGINT raises ``KeyboardInterrupt`` instead of PySpark's handler.

    Only on the main thread (where Python runs signal handlers), and only in place of
    PySpark's handler: a handler the caller installed is left alone.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if not str(getattr(previous, "__module__", "") or "").startswith("pyspark"):
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def run_job(
    sc: SparkContext,
    group: str,
    description: str,
    job: Callable[[], T],
    *,
    on_interrupt: Callable[[], None],
) -> T:
    """Runs ``job`` (which runs Spark jobs) on a driver thread, in job group ``group``.

    Args:
        sc: The SparkContext.
        group: The fit's job group: the job's Spark jobs run in it, and it is what an
            interrupt cancels.
        description: The job group's description (the Spark UI's job name).
        job: What to run; its result or exception comes back here.
        on_interrupt: Called first when the caller is interrupted (abort the fit's
            training state so its workers stop).

    Returns:
        What ``job`` returned.

    Raises:
        KeyboardInterrupt: The caller was interrupted; the group was cancelled and the
            job given up to :data:`CANCEL_SECONDS` to end.
    """
    result: Future[T] = Future()

    def target() -> None:
        sc.setJobGroup(group, description)
        sc.setJobDescription(description)
        try:
            result.set_result(job())
        except BaseException as exc:  # the caller sees it at result()
            result.set_exception(exc)

    thread = InheritableThread(target=target, name=JOB_THREAD, daemon=True)
    thread.start()
    try:
        return result.result()
    except KeyboardInterrupt:
        _log.warning("fit interrupted: cancelling Spark job group %s", group)
        on_interrupt()
        _cancel_group(sc, group)
        thread.join(timeout=CANCEL_SECONDS)
        raise


def _cancel_group(sc: SparkContext, group: str) -> None:
    """Cancels ``group`` from a fresh thread (with its own Py4J connection: the
    interrupted thread's may have been cut mid-call), waiting at most
    :data:`CANCEL_SECONDS`."""
    done = threading.Event()

    def cancel() -> None:
        try:
            sc.cancelJobGroup(group)
        except Exception as exc:  # a stopped context: nothing left to cancel
            _log.debug("could not cancel job group %s: %s", group, exc)
        finally:
            done.set()

    threading.Thread(target=cancel, name="sparkdl-cancel-group", daemon=True).start()
    done.wait(CANCEL_SECONDS)
