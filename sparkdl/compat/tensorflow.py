"""Every use sparkdl makes of TensorFlow's private internals.

* :func:`runtime_started`: whether TensorFlow's eager context has set up its devices
  in this process (``context.context()._context_handle``, reached through the private
  ``tensorflow.python.eager`` package). TensorFlow reads ``CUDA_VISIBLE_DEVICES`` then,
  not at import, so a worker that has only imported TensorFlow (warmed up) may still
  choose its GPU; every public way to ask (``tf.config.list_logical_devices``...)
  starts the runtime itself.

TensorFlow is imported only when the caller has imported it already.
``tests/unit/test_compat_shapes.py`` checks the internal against the installed
TensorFlow (``pyproject.toml`` pins ``tensorflow<2.22`` for it).

Example:
    >>> runtime_started()  # doctest: +SKIP
    False
"""

from __future__ import annotations

import sys

__all__ = ["runtime_started"]


def runtime_started() -> bool:
    """Whether TensorFlow has set up its devices in this process.

    ``False`` when TensorFlow is not imported. Reaches
    ``tensorflow.python.eager.context.context()._context_handle``, which TensorFlow
    fills when the eager context starts. When that is gone or fails, returns ``True``:
    the caller then assumes the worst (that the devices are fixed already).

    Returns:
        Whether the eager context (and with it the device list) is initialised.
    """
    if "tensorflow" not in sys.modules:
        return False
    try:
        from tensorflow.python.eager import context

        return context.context()._context_handle is not None
    except Exception:  # another TensorFlow: assume the worst
        return True
