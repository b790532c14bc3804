"""The task function of the relay's poll jobs, as the driver ships it to an executor.

The relay (:class:`sparkdl.driver.relay.Relay`) follows a fit whose service runs in the
cluster by small Spark jobs; each job's one task runs :func:`poll_function`. The function
names its executor module by string (:mod:`sparkdl.executor.relay_poll`, imported when
the task starts), as the training task's entry does
(:func:`sparkdl.contract.payload.train_function`): the driver never imports the
executor side, and the executor's Python worker unpickles no driver module.

Example:
    >>> POLL_SCHEMA
    'kind string, part int, body binary'
    >>> callable(poll_function({"fit_id": "f"}))
    True
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["POLL_SCHEMA", "poll_function"]

#: Schema of a poll task's rows: ``kind`` is ``"status"`` (JSON body), ``"weights"``
#: (part ``part`` of an epoch's weights in the wire format) or ``"missing"`` (no
#: rendezvous, or no answer: the body says why).
POLL_SCHEMA = "kind string, part int, body binary"


def poll_function(
    request: dict[str, Any],
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function a poll job's one task runs: one exchange with the service's relay
    routes (:func:`sparkdl.executor.relay_poll.poll_rows`).

    Args:
        request: What the task needs: the fit id, the relay's token, the service's
            TLS setting, timeouts, the driver's query and the last epoch whose weights
            it holds (:class:`sparkdl.driver.relay.Relay`).

    Returns:
        The function ``mapInArrow`` runs on the poll job's one partition.

    Example:
        >>> poll = poll_function({"fit_id": "f"})
        >>> poll.__name__
        'poll'
    """

    def poll(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:
            pass
        relay_poll = importlib.import_module("sparkdl.executor.relay_poll")
        yield relay_poll.poll_rows(request)

    return poll
