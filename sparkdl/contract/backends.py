"""Which Keras backend the executors run: the driver's, resolved once, checked early.

Keras 3 runs on TensorFlow, JAX or PyTorch (and others sparkdl does not train on:
numpy, openvino). The driver's
backend (``keras.backend.backend()``, :func:`training_backend`) goes into every plan
and payload as its own field (``FitPlan.backend``, ``ScoringPayload.backend``); a
Python worker then sets itself up for it before its first ``import keras``
(:meth:`sparkdl.executor.backends.base.Backend.prepare`: ``KERAS_BACKEND``, and JAX's
GPU memory settings). Nothing here imports a backend.

A worker without the backend's package, or one that imported Keras on another
backend (Spark reuses Python workers across jobs), fails at the start of its task with
a :class:`BackendError` that names the package, the extra to install, or the setting
to change.

Example:
    >>> check_supported("jax")
    'jax'
    >>> extra_for("tensorflow")
    'sparkdl-keras[tensorflow]'
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

from sparkdl.errors import ConfigError, SparkDLError

__all__ = [
    "SUPPORTED",
    "BackendError",
    "check_supported",
    "compiled",
    "driver_backend",
    "extra_for",
    "training_backend",
]

#: The Keras backends sparkdl trains on, each with the package a worker must have.
SUPPORTED = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}


class BackendError(SparkDLError):
    """A worker cannot run the driver's Keras backend."""


def compiled(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` (of Keras variables and arrays) compiled as a graph where the running
    backend pays per eager operation: ``tf.function`` on TensorFlow (one Adam step of a
    small MLP: 0.7 ms against 15 ms eager); as it is elsewhere (JAX's and PyTorch's
    eager steps are cheaper, and JAX's variables cannot be assigned inside ``jit``).

    Example:
        >>> compiled(abs)(-2) if driver_backend() != "tensorflow" else 2
        2
    """
    if driver_backend() == "tensorflow":
        import tensorflow as tf

        return tf.function(function)
    return function


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
        ConfigError: Another backend (numpy, openvino).
    """
    if backend not in SUPPORTED:
        raise ConfigError(
            f"Keras runs on the {backend!r} backend here; sparkdl trains on "
            f"{', '.join(map(repr, SUPPORTED))}. Set KERAS_BACKEND=tensorflow (or jax, torch) "
            "before importing Keras."
        )
    return backend


def extra_for(backend: str) -> str:
    """The pip requirement that installs sparkdl with ``backend``."""
    return f"sparkdl-keras[{backend}]"


def training_backend() -> str:
    """The backend the executors run: the driver's (:func:`driver_backend`), checked
    (:func:`check_supported`). The plan and the scoring payload carry it.

    Raises:
        ConfigError: The driver's Keras runs on a backend sparkdl does not train on.
    """
    return check_supported(driver_backend())
