"""Executor GPU assignment from Spark's resource scheduling.

Call :func:`assign_gpus` in a task before TensorFlow is imported: it sets
``CUDA_VISIBLE_DEVICES`` to the GPU addresses Spark gave the task, so each task sees
only its own GPU. :func:`configure_tensorflow` then turns memory growth on, or logs that
the task runs on the CPU.

Example:
    >>> assign_gpus(None) is None
    True
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import Any

from sparkdl.compat.tensorflow import runtime_started

__all__ = ["assign_gpus", "configure", "configure_tensorflow"]

_log = logging.getLogger(__name__)


def assign_gpus(task_context: Any) -> list[str] | None:
    """Restricts this process to the GPUs Spark assigned to the task.

    Args:
        task_context: A ``pyspark.TaskContext`` (or ``None`` outside a task).

    Returns:
        The GPU addresses, or ``None`` when the task has no GPU resource.
    """
    if task_context is None:
        return None
    try:
        resource = task_context.resources().get("gpu")
    except Exception:
        resource = None
    addresses = list(resource.addresses) if resource is not None else []
    if not addresses:
        return None
    visible = ",".join(addresses)
    started = _tensorflow_started() or "jax" in sys.modules  # JAX: it may have
    if started and os.environ.get("CUDA_VISIBLE_DEVICES") != visible:
        _log.warning(
            "The backend may have started its devices in this Python worker with "
            "CUDA_VISIBLE_DEVICES=%s; task GPUs %s take effect in a fresh worker.",
            os.environ.get("CUDA_VISIBLE_DEVICES"),
            visible,
        )
    os.environ["CUDA_VISIBLE_DEVICES"] = visible
    return addresses


def configure(backend: str, threads: int | None = None) -> list[Any]:
    """Sets the backend up for training (:func:`configure_tensorflow`; JAX reads its
    settings from the environment before it loads, :func:`sparkdl.contract.backends.prepare`);
    returns the visible GPUs."""
    if backend == "tensorflow":
        return configure_tensorflow(threads)
    import jax

    try:
        gpus = list(jax.devices("gpu"))
    except RuntimeError:  # no GPU platform in this jaxlib, or no device
        gpus = []
    if not gpus:
        _log.info("sparkdl worker: no GPU visible, training on the CPU")
    return gpus


def configure_tensorflow(threads: int | None = None) -> list[Any]:
    """Sets thread counts and GPU memory growth; returns the visible GPUs.

    Settings that TensorFlow refuses after its runtime started (a reused Python worker)
    are left as they are.
    """
    import tensorflow as tf

    if threads:
        with contextlib.suppress(RuntimeError):  # runtime already started
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(max(2, threads))
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        with contextlib.suppress(RuntimeError):
            tf.config.experimental.set_memory_growth(gpu, True)
    if not gpus:
        _log.info("sparkdl worker: no GPU visible, training on the CPU")
    return gpus


def _tensorflow_started() -> bool:
    """Whether TensorFlow has set up its devices in this process (it reads
    ``CUDA_VISIBLE_DEVICES`` then, not at import: a warmed-up worker has imported it)."""
    return runtime_started()
