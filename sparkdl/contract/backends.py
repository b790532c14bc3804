"""Which Keras backend the executors run: the driver's, resolved once, checked early.

Keras 3 runs on TensorFlow or JAX (and others sparkdl does not train on). The driver's
backend (``keras.backend.backend()``) goes into every payload
(:class:`~sparkdl.contract.tf_logs.TensorFlowLogs`); a Python worker then sets ``KERAS_BACKEND``
before its first ``import keras`` (:func:`prepare`), and, for JAX, turns off XLA's
preallocation of most of the GPU's memory, so that the worker shares its GPU as a
TensorFlow worker (memory growth) does. Nothing here imports a backend.

A worker without the backend's package, or one that imported Keras on another
backend (Spark reuses Python workers across jobs), fails at the start of its task with
an error that names the package, the extra to install, or the setting to change.

Example:
    >>> check_supported("jax")
    'jax'
    >>> extra_for("tensorflow")
    'sparkdl-keras[tensorflow]'
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import sys
from collections.abc import MutableMapping

from sparkdl.errors import ConfigError, SparkDLError

__all__ = [
    "SUPPORTED",
    "BackendError",
    "check_supported",
    "driver_backend",
    "extra_for",
    "prepare",
]

#: The Keras backends sparkdl trains on, each with the package a worker must have.
SUPPORTED = {"tensorflow": "tensorflow", "jax": "jax"}


class BackendError(SparkDLError):
    """A worker cannot run the driver's Keras backend."""


def driver_backend() -> str:
    """The driver's Keras backend: ``keras.backend.backend()`` once Keras is imported,
    else what Keras would pick (``KERAS_BACKEND``, then ``~/.keras/keras.json``)."""
    keras = sys.modules.get("keras")
    if keras is not None:
        return str(keras.backend.backend())
    if os.environ.get("KERAS_BACKEND"):
        return os.environ["KERAS_BACKEND"]
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    try:
        with open(os.path.join(home, "keras.json")) as f:
            return str(json.load(f).get("backend") or "tensorflow")
    except (OSError, ValueError, AttributeError):
        return "tensorflow"


def check_supported(backend: str) -> str:
    """``backend`` if sparkdl trains on it.

    Raises:
        ConfigError: Another backend (torch, numpy, openvino).
    """
    if backend not in SUPPORTED:
        raise ConfigError(
            f"Keras runs on the {backend!r} backend here; sparkdl trains on "
            f"{' or '.join(map(repr, SUPPORTED))}. Set KERAS_BACKEND=tensorflow (or jax) "
            "before importing Keras."
        )
    return backend


def extra_for(backend: str) -> str:
    """The pip requirement that installs sparkdl with ``backend``."""
    return f"sparkdl-keras[{backend}]"


def prepare(backend: str, environ: MutableMapping[str, str] | None = None) -> None:
    """Sets this Python worker up to import Keras on ``backend``; call it before the
    worker's first ``import keras`` (it is a check only, after).

    Raises:
        BackendError: The backend's package is not installed, or Keras was imported
            on another backend in this process.
    """
    env = os.environ if environ is None else environ
    keras = sys.modules.get("keras")
    if keras is not None:
        # Another thread (the warm-up) may be importing Keras still: its backend is then
        # the one the environment names, which that thread's prepare() set.
        module = getattr(keras, "backend", None)
        running = str(module.backend() if module else env.get("KERAS_BACKEND", "tensorflow"))
        if running != backend:
            raise BackendError(
                f"This Python worker imported Keras on the {running!r} backend, but the "
                f"driver's Keras runs on {backend!r}. A worker keeps its first backend: "
                "use one backend per SparkSession, or set spark.python.worker.reuse=false."
            )
        return
    package = SUPPORTED.get(backend, backend)
    # A scan of sys.path, which takes no import lock (a warm-up may hold it).
    if importlib.machinery.PathFinder.find_spec(package) is None:
        raise BackendError(
            f"The driver's Keras runs on the {backend!r} backend, but this executor's "
            f"Python ({sys.executable}) has no {package!r} package. Install "
            f"'{extra_for(backend)}' on every executor (or the driver's backend's "
            "package), or run Keras on a backend the executors have."
        )
    env["KERAS_BACKEND"] = backend
    if backend == "jax":
        # A worker shares its GPU's memory as TensorFlow's memory growth does.
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
