"""Reads and writes a Keras model's weights with one TensorFlow op per variable.

A worker that syncs every batch reads and writes all weights hundreds of times an
epoch. ``model.get_weights()`` / ``model.set_weights()`` go through Keras's variable
wrappers (dtype and shape checks, a ``read_value`` after each assign); reading with
``ReadVariableOp`` and writing with ``AssignVariableOp`` on the TensorFlow variables
underneath costs a fraction of that (figures in ``docs/architecture.md``).

The fast path is taken only when every weight is a plain TensorFlow resource variable
(no distribution strategy: :func:`resource_variables`); otherwise the TensorFlow
backend uses Keras's methods (:class:`~sparkdl.executor.weight_access.WeightAccess`).
Arrays written must have the weights' shapes and dtypes, as those the service answers
with do (it checks every push against the model's weights); the first write of a fit
goes through ``model.set_weights`` and its checks.

A write copies its arrays first: TensorFlow adopts a suitably aligned numpy buffer
instead of copying it, and the optimizer would then update the caller's array (a
worker's remembered center, say) in place. A read is a snapshot: TensorFlow copies a
variable's buffer before updating it while a read of it is alive. Only a TensorFlow
worker imports this module.

Example:
    >>> import keras, numpy as np
    >>> net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    >>> access = TensorFlowWeights(net, resource_variables(net))
    >>> access.set([np.ones((3, 2), np.float32), np.zeros(2, np.float32)])
    >>> [w.shape for w in access.get()], float(net.get_weights()[0].sum()), access.fast
    ([(3, 2), (2,)], 6.0, True)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from sparkdl.executor.weight_access import WeightAccess

__all__ = ["TensorFlowWeights", "resource_variables"]


class TensorFlowWeights(WeightAccess):
    """``get_weights`` / ``set_weights`` of one model, one TensorFlow op per variable.

    Args:
        model: A built Keras model; its weight list must not change afterwards.
        variables: Its weights' resource variables (:func:`resource_variables`).
    """

    def __init__(self, model: Any, variables: Sequence[Any]) -> None:
        super().__init__(model)
        self._variables = list(variables)

    @property
    def fast(self) -> bool:
        return True

    def get(self) -> list[np.ndarray]:
        read = tf.raw_ops.ReadVariableOp
        return [read(resource=v.handle, dtype=v.dtype).numpy() for v in self._variables]

    def set(self, arrays: Sequence[np.ndarray]) -> None:
        if len(arrays) != len(self._variables):
            raise ValueError(
                f"Expected {len(self._variables)} weight arrays. Received: {len(arrays)}"
            )
        assign = tf.raw_ops.AssignVariableOp
        for variable, value in zip(self._variables, arrays, strict=True):
            assign(resource=variable.handle, value=np.array(value, copy=True))


def resource_variables(model: Any) -> list[Any] | None:
    """The TensorFlow resource variables under ``model.weights``, or ``None`` when a
    weight is anything else (or a distribution strategy is in scope)."""
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
