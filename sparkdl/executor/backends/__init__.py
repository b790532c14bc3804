"""The Keras backends an executor runs, behind one interface.

:func:`backend_for` is the one place a backend's name (the driver's, resolved into
the plan) becomes the :class:`~sparkdl.executor.backends.base.Backend` that knows what
differs: the environment before Keras loads, the quiet import, the devices, the input
pipeline, sparse batches and weight access. TensorFlow's side is
:mod:`~sparkdl.executor.backends.tensorflow` (with :mod:`~sparkdl.executor.backends.
tf_feed` and :mod:`~sparkdl.executor.backends.tf_weights`), JAX's
:mod:`~sparkdl.executor.backends.jax`, PyTorch's :mod:`~sparkdl.executor.backends.torch`.
Nothing here imports TensorFlow, JAX or PyTorch: a
backend's package loads when Keras does.

Example:
    >>> backend_for("jax").name, backend_for("tensorflow").name
    ('jax', 'tensorflow')
"""

from __future__ import annotations

import functools

from sparkdl.contract.backends import check_supported
from sparkdl.executor.backends.base import Backend, BatchLayout

__all__ = ["Backend", "BatchLayout", "backend_for"]


@functools.cache
def backend_for(name: str) -> Backend:
    """The executor's side of the Keras backend ``name``.

    Args:
        name: A backend sparkdl trains on (``FitPlan.backend``).

    Raises:
        ConfigError: A backend sparkdl does not train on.

    Example:
        >>> backend_for("tensorflow")
        TensorFlowBackend()
    """
    check_supported(name)
    if name == "jax":
        from sparkdl.executor.backends.jax import JaxBackend

        return JaxBackend()
    if name == "torch":
        from sparkdl.executor.backends.torch import TorchBackend

        return TorchBackend()
    from sparkdl.executor.backends.tensorflow import TensorFlowBackend

    return TensorFlowBackend()
