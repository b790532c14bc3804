"""The warm-up task's side in a Python worker: import the executor modules in the background.

:func:`sparkdl.driver.warmup.warm_up` runs one small ``mapInArrow`` job; each task runs
the function of :func:`sparkdl.contract.warmup_task.warm_function`, which imports this
module by name and calls :func:`warm`. The task does not hold its slot while its worker
imports: :func:`warm` starts the import in a background thread of the worker and
returns (or waits for it, when the driver asked so). The thread holds Python's global
import lock (:func:`sparkdl.compat.imports.global_import_lock`) for the whole import, so
every other thread of that worker that imports a module not yet loaded waits until it
is done: TensorFlow and Keras import each other in cycles, and two threads importing
them at once raise ``_DeadlockError`` (see :mod:`sparkdl.driver.warmup`).

This module's globals are the worker's record: its background import thread, and how
each import ended, once per Python worker (Spark reuses a worker between tasks). It
lives on the executor side so that the worker imports no driver module.

Example:
    >>> _import_ok("a module no warm-up imported")
    False
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator

import pyarrow as pa

from sparkdl.compat.imports import global_import_lock
from sparkdl.contract.tf_logs import TensorFlowLogs

__all__ = ["warm"]

_log = logging.getLogger(__name__)

# This process's background import, and how each import ended.
_importer: threading.Thread | None = None
_imported: dict[str, bool] = {}


def warm(
    module: str, logs: TensorFlowLogs, backend: str, *, block: bool
) -> Iterator[pa.RecordBatch]:
    """A warm-up task's rows: starts importing ``module`` on the Keras ``backend`` in
    this worker's background (and waits for it when ``block``).

    Args:
        module: The module to import.
        logs: How quietly TensorFlow loads (:mod:`sparkdl.contract.tf_logs`).
        backend: The Keras backend to load.
        block: Whether to wait for the import and answer how it went.

    Yields:
        One row of :data:`~sparkdl.contract.warmup_task.WARMUP_SCHEMA`.

    Example:
        >>> rows = warm("json", TensorFlowLogs(), "tensorflow", block=True)  # doctest: +SKIP
        >>> next(rows).column("ok").to_pylist()  # doctest: +SKIP
        [True]
    """
    if block:
        _start_import(module, logs, backend).join()
        yield _answer(_import_ok(module))
        return
    # Everything this task still does imports its modules before the lock is
    # taken (pyarrow loads some lazily), so that it ends at once.
    answer = _answer(True)
    yield answer
    _start_import(module, logs, backend)


def _answer(ok: bool) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"pid": [os.getpid()], "ok": [ok]})


def _import_ok(module: str) -> bool:
    """Whether this worker imported ``module``."""
    return _imported.get(module, False)


def _start_import(module: str, logs: TensorFlowLogs, backend: str) -> threading.Thread:
    """Starts importing ``module`` in a background thread of this worker (once).

    Returns once the thread holds the import lock. The caller is in no import then, so
    the thread never waits for a module lock this thread holds while this thread waits
    for the import lock (a deadlock Python would not detect).
    """
    global _importer
    if _importer is None or not (_importer.is_alive() or module in _imported):
        locked = threading.Event()
        _importer = threading.Thread(
            target=_import_holding_lock,
            args=(module, locked, logs, backend),
            name="sparkdl-warm-import",
            daemon=True,
        )
        _importer.start()
        locked.wait()
    return _importer


def _import_holding_lock(
    module: str, locked: threading.Event, logs: TensorFlowLogs, backend: str
) -> None:
    """Imports ``module`` holding the global import lock: no other thread of this
    process imports anything new until it is done (see the module docstring)."""
    with global_import_lock():
        locked.set()
        try:
            from sparkdl.executor.backends import backend_for
            from sparkdl.executor.imports import import_executor

            backend_for(backend).load(logs, lambda: import_executor(module))
            _imported[module] = True
        except Exception:  # the fit's own import raises it again, in its task
            _imported[module] = False
            _log.debug("sparkdl warm-up import failed (ignored)", exc_info=True)
