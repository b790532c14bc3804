"""Ctrl-C during a fit: ``KeyboardInterrupt`` for the caller, only this fit's jobs cancelled.

PySpark's own SIGINT handler calls ``cancelAllJobs()`` (every job of the SparkContext,
other fits' too) through the main thread's Py4J connection. That connection is busy
with the training job's ``collect``, so the cancel failed: the caller got a
``WorkerError`` instead of ``KeyboardInterrupt``, and the barrier job stayed active
while Spark retried its stage with fresh workers.

So a fit runs its Spark job on a driver thread (:func:`run_job`), which carries the
caller's Spark local properties (scheduler pool, ...) plus the fit's own job group (a
job tag on Spark Connect: :mod:`sparkdl.compat.sessions`), and the caller's thread only
waits. While a fit runs on the main thread
(:func:`interrupt_raises`), SIGINT raises ``KeyboardInterrupt`` there instead of running
PySpark's handler. On it the fit aborts its service's training state (every worker's next
request is refused and it stops), cancels its own job group from a fresh thread, and
gives the job what is left of :data:`CANCEL_SECONDS` to end (a second Ctrl-C meanwhile
is ignored), then re-raises; the fit's ``ExitStack``
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
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, TypeVar

from sparkdl.compat.spark_versions import inheritable_thread
from sparkdl.errors import SparkDLError

if TYPE_CHECKING:
    from sparkdl.compat.sessions import SessionTools

__all__ = ["CANCEL_SECONDS", "JOB_THREAD", "interrupt_raises", "run_job"]

#: Seconds an interrupted fit waits, in all, for its job group's cancel and its job to end.
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
    tools: SessionTools,
    group: str,
    description: str,
    job: Callable[[], T],
    *,
    on_interrupt: Callable[[], None],
) -> T:
    """Runs ``job`` (which runs Spark jobs) on a driver thread, in job group ``group``.

    Args:
        tools: The session's :class:`~sparkdl.compat.sessions.SessionTools`.
        group: The fit's job group (or tag): the job's Spark jobs run in it, and it is
            what an interrupt cancels.
        description: The job group's description (the Spark UI's job name).
        job: What to run; its result or exception comes back here.
        on_interrupt: Called first when the caller is interrupted (abort the fit's
            training state so its workers stop).

    Returns:
        What ``job`` returned.

    Raises:
        KeyboardInterrupt: The caller was interrupted (or any other exception ended
            its wait): the group was cancelled and the job given what is left of
            :data:`CANCEL_SECONDS` to end.
        SparkDLError: The driver thread ended without running ``job`` (Spark refused
            its local properties, e.g. a stopped SparkContext).
    """
    result: Future[T] = Future()

    def target() -> None:
        try:
            with tools.jobs_named(group, description):
                result.set_result(job())
        except BaseException as exc:  # the caller sees it at result()
            result.set_exception(exc)

    thread = inheritable_thread(target, name=JOB_THREAD, session=tools.spark)
    try:
        thread.start()
        while not result.done():
            thread.join(0.5)
            if not thread.is_alive() and not result.done():
                raise SparkDLError(
                    "The fit's Spark job thread ended before the job started (Spark "
                    "could not take its local properties or job tags). Is the session stopped?"
                )
    except BaseException as exc:
        _release(tools, group, thread, on_interrupt, exc)
        raise
    return result.result()


def _release(
    tools: SessionTools,
    group: str,
    thread: threading.Thread,
    on_interrupt: Callable[[], None],
    exc: BaseException,
) -> None:
    """Stops the fit's job after ``exc`` ended the caller's wait, within
    :data:`CANCEL_SECONDS` in all, undisturbed by a second Ctrl-C."""
    deadline = time.monotonic() + CANCEL_SECONDS
    with _sigint_ignored():
        _log.warning("fit stopped by %s: cancelling Spark job group %s", type(exc).__name__, group)
        on_interrupt()
        _cancel_group(tools, group, deadline)
        if thread.is_alive():
            thread.join(max(0.0, deadline - time.monotonic()))


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT is ignored while inside (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _cancel_group(tools: SessionTools, group: str, deadline: float) -> None:
    """Cancels ``group`` from a fresh thread (with its own Py4J connection: the
    interrupted thread's may have been cut mid-call), waiting until ``deadline`` at
    most."""
    done = threading.Event()

    def cancel() -> None:
        try:
            tools.cancel(group)
        except Exception as exc:  # a stopped context: nothing left to cancel
            _log.debug("could not cancel job group %s: %s", group, exc)
        finally:
            done.set()

    threading.Thread(target=cancel, name="sparkdl-cancel-group", daemon=True).start()
    done.wait(max(0.0, deadline - time.monotonic()))
