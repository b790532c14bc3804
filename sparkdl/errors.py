"""Exceptions raised by sparkdl.

Every error derives from :class:`SparkDLError`; where a built-in type fits, the error
also derives from it (``SchemaError`` is a ``ValueError``), so ``except ValueError``
keeps working. All errors survive pickling, so they cross process boundaries intact.

Example:
    >>> from sparkdl.errors import SchemaError, SparkDLError
    >>> issubclass(SchemaError, ValueError) and issubclass(SchemaError, SparkDLError)
    True
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ClusterError",
    "ConfigError",
    "ModelError",
    "SchemaError",
    "ServiceError",
    "SparkDLError",
    "TrainingError",
    "WorkerError",
]


class SparkDLError(Exception):
    """Base class of every error sparkdl raises."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, self.args)


class ConfigError(SparkDLError, ValueError):
    """A training or service setting has a value that is not allowed."""


class SchemaError(SparkDLError, ValueError):
    """The DataFrame's columns or values do not fit the model (missing column, NaN...)."""


class ModelError(SparkDLError, ValueError):
    """The Keras model cannot be trained as given (uncompiled, unbuildable...)."""


class ClusterError(SparkDLError, RuntimeError):
    """The Spark cluster cannot run the requested job (too few task slots...)."""


class ServiceError(SparkDLError, RuntimeError):
    """The parameter service could not be reached or refused a request."""


class TrainingError(SparkDLError, RuntimeError):
    """Training diverged or was aborted (for example a NaN loss)."""


class WorkerError(SparkDLError, RuntimeError):
    """One or more Spark tasks failed while training.

    Attributes:
        failures: ``{worker_id: traceback_text}`` for every worker that reported a failure.
        reported: A worker's training raised (the model, the data or a setting: running
            it again fails again), as opposed to tasks Spark lost or gave up retrying.
    """

    def __init__(
        self, message: str, failures: dict[int, str] | None = None, reported: bool = False
    ) -> None:
        super().__init__(message)
        self.failures: dict[int, str] = dict(failures or {})
        self.reported = reported

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.args[0], self.failures, self.reported))

    def __str__(self) -> str:
        text = str(self.args[0])
        for worker, trace in sorted(self.failures.items()):
            text += f"\n--- worker {worker} ---\n{trace.rstrip()}"
        return text
