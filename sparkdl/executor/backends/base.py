"""What differs between Keras backends on an executor, as one interface.

A worker runs the Keras backend the driver resolved into its plan
(``FitPlan.backend``, ``ScoringPayload.backend``); :func:`sparkdl.executor.backends.
backend_for` gives the :class:`Backend` for that name, and the executor's code asks it,
never the name, for what depends on it:

* the environment before Keras is first imported (:meth:`Backend.prepare`:
  ``KERAS_BACKEND``, and what the backend reads at its own load),
* the import itself, quiet as the driver decided (:meth:`Backend.load`),
* its devices (:meth:`Backend.configure`: threads, GPU memory),
* the input pipeline of a feed (:meth:`Backend.endless`, :meth:`Backend.counted`,
  :meth:`Backend.streamed`) and sparse batches (:meth:`Backend.sparse_batch`),
* reading and writing a model's weights (:meth:`Backend.weight_access`).

A backend's module imports nothing of the backend's package at its top: picking a
backend (and preparing the environment for it) never loads it.

Example:
    >>> from sparkdl.executor.backends import backend_for
    >>> isinstance(backend_for("jax"), Backend)
    True
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any, ClassVar, Protocol, TypeVar

from sparkdl.contract.backends import SUPPORTED, BackendError, extra_for
from sparkdl.contract.payload import Column
from sparkdl.contract.tf_logs import TensorFlowLogs
from sparkdl.executor.blocks import Csr
from sparkdl.executor.weight_access import WeightAccess

__all__ = ["Backend", "BatchLayout"]

_T = TypeVar("_T")


class BatchLayout(Protocol):
    """What an input pipeline reads of a feed (:class:`~sparkdl.executor.feed.Feed`):
    its columns and the shape of its batches."""

    @property
    def inputs(self) -> Sequence[Column]: ...

    @property
    def outputs(self) -> Sequence[Column]: ...

    @property
    def weight(self) -> Column | None: ...

    @property
    def batch_size(self) -> int: ...

    @property
    def input_structure(self) -> Any: ...

    def input_slots(self) -> list[tuple[Column, tuple[int, ...], bool]]: ...

    def output_slots(self) -> list[tuple[Column, tuple[int, ...]]]: ...


class Backend(ABC):
    """One Keras backend as an executor uses it.

    Attributes:
        name: The backend's name, as ``keras.backend.backend()`` says it.
        environment: Variables the backend reads as it loads, set by :meth:`prepare`
            unless the worker's environment has them already.
    """

    name: ClassVar[str]
    environment: ClassVar[Mapping[str, str]] = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    # ------------------------------------------------------------ environment
    def prepare(self, environ: MutableMapping[str, str] | None = None) -> None:
        """Sets this Python worker up to import Keras on this backend; call it before
        the worker's first ``import keras`` (it is a check only, after).

        Args:
            environ: The environment to set; ``None``: ``os.environ``.

        Raises:
            BackendError: The backend's package is not installed, or Keras was imported
                on another backend in this process.
        """
        env = os.environ if environ is None else environ
        keras = sys.modules.get("keras")
        if keras is not None:
            # Another thread (the warm-up) may be importing Keras still: its backend is
            # then the one the environment names, which that thread's prepare() set.
            module = getattr(keras, "backend", None)
            running = str(module.backend() if module else env.get("KERAS_BACKEND", "tensorflow"))
            if running != self.name:
                raise BackendError(
                    f"This Python worker imported Keras on the {running!r} backend, but the "
                    f"driver's Keras runs on {self.name!r}. A worker keeps its first backend: "
                    "use one backend per SparkSession, or set spark.python.worker.reuse=false."
                )
            return
        package = SUPPORTED.get(self.name, self.name)
        # A scan of sys.path, which takes no import lock (a warm-up may hold it).
        if importlib.machinery.PathFinder.find_spec(package) is None:
            raise BackendError(
                f"The driver's Keras runs on the {self.name!r} backend, but this executor's "
                f"Python ({sys.executable}) has no {package!r} package. Install "
                f"'{extra_for(self.name)}' on every executor, or the backend's own package "
                f"(pip install {package}), or run Keras on a backend the executors have."
            )
        env["KERAS_BACKEND"] = self.name
        for key, value in self.environment.items():
            env.setdefault(key, value)

    def load(self, logs: TensorFlowLogs, importer: Callable[[], _T]) -> _T:
        """Runs ``importer`` (an import of Keras, or of the executor's modules) on this
        backend: :meth:`prepare` first, then the import quiet as ``logs`` says
        (:meth:`~sparkdl.contract.tf_logs.TensorFlowLogs.load`).

        Both backends log through the same native logging (XLA, JAX's compiler, is
        TensorFlow's, and reads ``TF_CPP_MIN_LOG_LEVEL`` too), so both load as ``logs``
        says.

        Raises:
            BackendError: :meth:`prepare` cannot set the worker up.
        """
        self.prepare()
        return logs.load(importer)

    # ---------------------------------------------------------------- devices
    @abstractmethod
    def configure(self, threads: int | None = None) -> list[Any]:
        """Sets the backend's devices up for training (after it loaded); returns the
        GPUs it sees.

        Args:
            threads: Threads per worker for the backend's own pools, where it has them.
        """

    # ------------------------------------------------------------------ feeds
    @abstractmethod
    def endless(self, layout: BatchLayout, make: Callable[[], Iterator[Any]]) -> Any:
        """What ``model.fit`` reads: the batches of ``make()`` (endless epochs)."""

    @abstractmethod
    def counted(self, layout: BatchLayout, make: Callable[[], Iterator[Any]], batches: int) -> Any:
        """What ``model.evaluate`` (or validation) reads: the ``batches`` batches of
        ``make()``, read again from the start each time, of known length."""

    @abstractmethod
    def streamed(self, layout: BatchLayout, make: Callable[[], Iterator[Any]]) -> Any:
        """The batches ``make()`` yields, of unknown length, read once (scoring)."""

    @abstractmethod
    def sparse_batch(self, rows: Csr, *, tensor: bool = False) -> Any:
        """CSR rows as the backend's sparse batch (for an input built with
        ``keras.Input(..., sparse=True)``).

        Args:
            rows: The batch's rows.
            tensor: What ``predict_on_batch`` takes, where that differs from what a
                pipeline's generator yields.
        """

    # ---------------------------------------------------------------- weights
    @abstractmethod
    def weight_access(self, model: Any) -> WeightAccess:
        """Reads and writes the weights of ``model`` (built) between training steps."""
