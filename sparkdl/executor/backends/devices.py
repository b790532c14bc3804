"""Executor GPU assignment from Spark's resource scheduling, the same on every backend.

Call :func:`assign_gpus` in a task before the Keras backend starts its devices: it sets
``CUDA_VISIBLE_DEVICES`` to the GPU addresses Spark gave the task, so each task sees
only its own GPU. The backend then sets its devices up
(:meth:`sparkdl.executor.backends.base.Backend.configure`: TensorFlow's memory growth),
or logs that the task runs on the CPU.

Example:
    >>> assign_gpus(None) is None
    True
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from sparkdl.compat.tensorflow import runtime_started

__all__ = ["assign_gpus"]

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
    started = _tensorflow_started() or "jax" in sys.modules or _torch_cuda_started()
    if started and os.environ.get("CUDA_VISIBLE_DEVICES") != visible:
        _log.warning(
            "The backend may have started its devices in this Python worker with "
            "CUDA_VISIBLE_DEVICES=%s; task GPUs %s take effect in a fresh worker.",
            os.environ.get("CUDA_VISIBLE_DEVICES"),
            visible,
        )
    os.environ["CUDA_VISIBLE_DEVICES"] = visible
    return addresses


def _torch_cuda_started() -> bool:
    """Whether PyTorch may have read ``CUDA_VISIBLE_DEVICES`` in this process: Keras's
    torch backend asks ``torch.cuda.is_available()`` as it loads, which initialises
    CUDA's driver (it reads the variable then), before torch's own lazy CUDA start."""
    return "torch" in sys.modules


def _tensorflow_started() -> bool:
    """Whether TensorFlow has set up its devices in this process (it reads
    ``CUDA_VISIBLE_DEVICES`` then, not at import: a warmed-up worker has imported it)."""
    return runtime_started()
