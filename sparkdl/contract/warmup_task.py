"""The task function of the warm-up job, as the driver ships it to an executor.

:func:`sparkdl.driver.warmup.warm_up` runs one small ``mapInArrow`` job whose tasks
start importing the executor modules in their Python worker. Each task runs
:func:`warm_function`, which names its executor module by string
(:mod:`sparkdl.executor.warmup`, imported when the task starts), as the training task's
entry does (:func:`sparkdl.contract.payload.train_function`): the driver never imports
the executor side, and the worker unpickles no driver module. The worker's record of
its imports lives in that executor module, once per Python worker.

Example:
    >>> WARMUP_SCHEMA
    'pid long, ok boolean'
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

    from sparkdl.contract.tf_logs import TensorFlowLogs

__all__ = ["WARMUP_SCHEMA", "warm_function"]

#: Schema of a warm-up task's one row: its worker's process id and whether the import
#: went well (``True`` at once when the task does not wait for it).
WARMUP_SCHEMA = "pid long, ok boolean"


def warm_function(
    logs: TensorFlowLogs, backend: str, module: str, *, block: bool
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function each warm-up task runs in its Python worker: starts importing
    ``module`` on the Keras ``backend`` (and waits for it when ``block``), by
    :func:`sparkdl.executor.warmup.warm`.

    Args:
        logs: How quietly the worker loads TensorFlow (:mod:`sparkdl.contract.tf_logs`).
        backend: The Keras backend the worker loads (the driver's).
        module: The module to import (the executor's training module).
        block: Whether the task waits for the import (and answers how it went).

    Returns:
        The function ``mapInArrow`` runs on each of the job's partitions.

    Example:
        >>> from sparkdl.contract.tf_logs import TensorFlowLogs
        >>> warm_function(TensorFlowLogs(), "tensorflow", "json", block=True).__name__
        'warm'
    """

    def warm(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:
            pass
        # Imported before the worker's import lock is taken (see the executor module).
        worker = importlib.import_module("sparkdl.executor.warmup")
        yield from worker.warm(module, logs, backend, block=block)

    return warm
