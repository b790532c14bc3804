"""A worker's reads and writes of its model's weights, as every Keras backend can do them.

:class:`WeightAccess` goes through ``model.get_weights()`` / ``model.set_weights()``.
A backend gives a faster one where it has it
(:meth:`sparkdl.executor.backends.base.Backend.weight_access`: one TensorFlow op per
variable, :mod:`sparkdl.executor.backends.tf_weights`) or adds what it needs (JAX's
trainer state written back first, :mod:`sparkdl.executor.backends.jax`); the pushers
(:mod:`sparkdl.executor.pusher`, :mod:`sparkdl.executor.sharded`) take any of them.

Example:
    >>> import keras, numpy as np
    >>> net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    >>> access = WeightAccess(net)
    >>> access.set([np.ones((3, 2), np.float32), np.zeros(2, np.float32)])
    >>> [w.shape for w in access.get()], float(net.get_weights()[0].sum()), access.fast
    ([(3, 2), (2,)], 6.0, False)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["WeightAccess"]


class WeightAccess:
    """``get_weights`` / ``set_weights`` for one model, through Keras.

    Args:
        model: A built Keras model; its weight list must not change afterwards.
    """

    def __init__(self, model: Any) -> None:
        self.model = model

    @property
    def fast(self) -> bool:
        """Whether a backend's faster path than Keras's methods is in use."""
        return False

    def get(self) -> list[np.ndarray]:
        """The current weights, as ``model.get_weights()`` returns them."""
        return list(self.model.get_weights())

    def set(self, arrays: Sequence[np.ndarray]) -> None:
        """Writes ``arrays`` (the weights' shapes and dtypes, in their order)."""
        self.model.set_weights(list(arrays))
