"""Every use sparkdl makes of MLflow's internals.

* :func:`keras_autologging_on`: whether ``mlflow.autolog()`` /
  ``mlflow.keras.autolog()`` switched Keras autologging on. MLflow keeps that switch in
  ``mlflow.utils.autologging_utils`` (``autologging_is_disabled``), a module outside its
  documented API; no public function reads it back.

MLflow is imported only when the caller has imported it already (its import costs a
second and more). ``tests/unit/test_compat_shapes.py`` checks the internal against the
installed MLflow, when there is one.

Example:
    >>> keras_autologging_on()  # doctest: +SKIP
    False
"""

from __future__ import annotations

import sys

__all__ = ["keras_autologging_on"]


def keras_autologging_on() -> bool:
    """Whether MLflow's Keras autologging is on in this process.

    ``False`` when MLflow is not imported (switching autologging on imports it), or when
    ``mlflow.utils.autologging_utils.autologging_is_disabled`` is gone: a fit then logs
    to MLflow only when asked to (``mlflow_run=True``).

    Returns:
        Whether Keras autologging is enabled.
    """
    if "mlflow" not in sys.modules:
        return False
    try:
        from mlflow.utils.autologging_utils import autologging_is_disabled
    except ImportError:
        return False
    return not autologging_is_disabled("keras")
