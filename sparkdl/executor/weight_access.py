"""Reads and writes a Keras model's weights with one TensorFlow op per variable.

A worker that syncs every batch reads and writes all weights hundreds of times an
epoch. ``model.get_weights()`` / ``model.set_weights()`` go through Keras's variable
wrappers (dtype and shape checks, a ``read_value`` after each assign); reading with
``ReadVariableOp`` and writing with ``AssignVariableOp`` on the TensorFlow variables
underneath costs a fraction of that (figures in ``docs/architecture.md``).

The fast path is taken only when every weight is a plain TensorFlow resource variable
(the TensorFlow backend, no distribution strategy); otherwise the Keras methods are used
(on JAX after the trainer's state is written back to the variables, which Keras does
only when asked in the middle of an epoch). Arrays written must have the weights' shapes
and dtypes, as those the service answers with do (it checks every push against the
model's weights); the first write of a fit goes through ``model.set_weights`` and its
checks.

A write copies its arrays first: TensorFlow adopts a suitably aligned numpy buffer
instead of copying it, and the optimizer would then update the caller's array (a
worker's remembered center, say) in place. A read is a snapshot: TensorFlow copies a
variable's buffer before updating it while a read of it is alive.

Example:
    >>> import keras, numpy as np
    >>> net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    >>> access = WeightAccess(net)
    >>> access.set([np.ones((3, 2), np.float32), np.zeros(2, np.float32)])
    >>> [w.shape for w in access.get()], float(net.get_weights()[0].sum())
    ([(3, 2), (2,)], 6.0)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["WeightAccess"]


class WeightAccess:
    """Fast ``get_weights`` / ``set_weights`` for one model.

    Args:
        model: A built Keras model; its weight list must not change afterwards.
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        self._handles = _resource_variables(model)

    @property
    def fast(self) -> bool:
        """Whether the one-op-per-variable path is in use."""
        return self._handles is not None

    def get(self) -> list[np.ndarray]:
        """The current weights, as ``model.get_weights()`` returns them."""
        if self._handles is None:
            _synced(self.model)
            return list(self.model.get_weights())
        import tensorflow as tf

        read = tf.raw_ops.ReadVariableOp
        return [read(resource=v.handle, dtype=v.dtype).numpy() for v in self._handles]

    def set(self, arrays: Sequence[np.ndarray]) -> None:
        """Writes ``arrays`` (the weights' shapes and dtypes, in their order)."""
        if self._handles is None:
            _synced(self.model)  # the next step then reads the variables written here
            self.model.set_weights(list(arrays))
            return
        import tensorflow as tf

        if len(arrays) != len(self._handles):
            raise ValueError(
                f"Expected {len(self._handles)} weight arrays. Received: {len(arrays)}"
            )
        assign = tf.raw_ops.AssignVariableOp
        for variable, value in zip(self._handles, arrays, strict=True):
            assign(resource=variable.handle, value=np.array(value, copy=True))


def _synced(model: Any) -> None:
    """On JAX, inside ``model.fit``, the trainer's state written back to the model's
    variables (Keras keeps it apart between callbacks' reads); elsewhere nothing."""
    sync = getattr(model, "jax_state_sync", None)
    if sync is not None:
        sync()


def _resource_variables(model: Any) -> list[Any] | None:
    """The TensorFlow resource variables under ``model.weights``, or ``None``."""
    import keras

    if keras.backend.backend() != "tensorflow":
        return None
    import tensorflow as tf

    if tf.distribute.has_strategy():
        return None
    found = []
    for weight in model.weights:
        inner = getattr(weight, "value", weight)
        if (
            type(inner).__name__ != "ResourceVariable"
            or not isinstance(inner, tf.Variable)
            or getattr(inner, "handle", None) is None
            or tuple(inner.shape) != tuple(weight.shape)
        ):
            return None
        found.append(inner)
    return found
