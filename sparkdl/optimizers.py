"""LARS, layer-wise adaptive rate scaling, as a Keras optimizer for large global batches.

Synchronous training over n workers multiplies the global batch by n, and a learning
rate scaled to match (``lr_scaling="linear"``, Goyal et al. 2017) makes some layers'
steps large against their weights: past a few thousand samples momentum SGD then
diverges early or ends below the small-batch accuracy. LARS (You, Gitman and Ginsburg
2017) gives each layer its own rate, proportional to the ratio of its weights' norm to
its gradient's norm, so no layer moves far against its own size. Its Adam counterpart,
LAMB (You et al. 2020), ships with Keras as ``keras.optimizers.Lamb``.

Algorithm 1 of the paper, for each layer ``l`` at step ``t`` (global rate ``gamma_t``,
momentum ``m``, weight decay ``beta``, trust coefficient ``eta``)::

    lambda_l = eta * ||w_l|| / (||g_l|| + beta * ||w_l||)
    v_l      = m * v_l + gamma_t * lambda_l * (g_l + beta * w_l)
    w_l      = w_l - v_l

Two choices the paper leaves open, taken as its authors' ResNet recipes and most
implementations do: a layer whose weights have norm 0 (zero-initialised biases), or
whose denominator is 0 (a zero gradient without weight decay), takes ``lambda_l = 1``,
and 1-D variables (biases, normalisation scales) are
not adapted (``lambda_l = 1``) unless ``adapt_vectors=True``. The global rate of such
a recipe is large (around 1-10, with a polynomial decay the user passes as a Keras
schedule), since ``eta`` scales the adapted layers' steps down.

Example:
    >>> import numpy as np
    >>> opt = LARS(learning_rate=1.0, momentum=0.0, trust_coefficient=0.1)
    >>> w = keras.Variable(np.full((2, 2), 3.0, np.float32))
    >>> _ = opt.apply_gradients([(np.full((2, 2), 1.0, np.float32), w)])
    >>> round(float(w.numpy()[0, 0]), 4)  # 3 - 0.1 * (||w|| / ||g|| = 3) * 1
    2.7
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

__all__ = ["LARS"]


@keras.saving.register_keras_serializable(package="sparkdl")
class LARS(keras.optimizers.Optimizer):
    """Momentum SGD with layer-wise adaptive rates (You, Gitman and Ginsburg 2017).

    Args:
        learning_rate: The global rate ``gamma`` (a float or a Keras schedule).
        momentum: ``m``, in [0, 1).
        weight_decay: ``beta``: L2 decay inside the update, as in the paper (not
            Keras's decoupled ``weight_decay``).
        trust_coefficient: ``eta``: how far an adapted layer moves relative to its
            weights' norm per step (before the global rate).
        epsilon: Added to the denominator of ``lambda_l``.
        adapt_vectors: Adapt 1-D variables too (biases, normalisation scales).
        name: The optimizer's name.
        **kwargs: Keras's optimizer arguments (``clipnorm``, ``global_clipnorm``...).

    Example:
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        >>> model.compile(optimizer=LARS(learning_rate=2.0, weight_decay=1e-4), loss="mse")
        >>> model.optimizer.get_config()["trust_coefficient"]
        0.001
    """

    def __init__(
        self,
        learning_rate: Any = 1.0,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        trust_coefficient: float = 0.001,
        epsilon: float = 0.0,
        adapt_vectors: bool = False,
        name: str = "lars",
        **kwargs: Any,
    ) -> None:
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"Expected 0 <= momentum < 1. Received: momentum={momentum}")
        if weight_decay < 0 or trust_coefficient <= 0 or epsilon < 0:
            raise ValueError(
                "Expected weight_decay >= 0, trust_coefficient > 0 and epsilon >= 0. "
                f"Received: weight_decay={weight_decay}, "
                f"trust_coefficient={trust_coefficient}, epsilon={epsilon}"
            )
        self.momentum = float(momentum)
        self.lars_weight_decay = float(weight_decay)
        self.trust_coefficient = float(trust_coefficient)
        self.epsilon = float(epsilon)
        self.adapt_vectors = bool(adapt_vectors)

    def build(self, var_list: list[Any]) -> None:
        """Creates one momentum buffer per variable."""
        if self.built:
            return
        super().build(var_list)
        self._velocities = self.add_optimizer_variables(var_list, "velocity")

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        """One step of Algorithm 1 for one variable (a layer's weight)."""
        dtype = variable.dtype
        rate = ops.cast(learning_rate, dtype)
        gradient = ops.cast(gradient, dtype)
        decay = ops.cast(self.lars_weight_decay, dtype)
        step = (
            ops.add(gradient, ops.multiply(decay, variable)) if self.lars_weight_decay else gradient
        )
        if self.adapt_vectors or len(variable.shape) > 1:
            # Norms in float32 at least: a float16 sum of squares overflows early.
            wide = "float32" if dtype in ("float16", "bfloat16") else dtype
            w_norm = ops.cast(ops.sqrt(ops.sum(ops.square(ops.cast(variable, wide)))), dtype)
            g_norm = ops.cast(ops.sqrt(ops.sum(ops.square(ops.cast(gradient, wide)))), dtype)
            denominator = ops.add(ops.add(g_norm, ops.multiply(decay, w_norm)), self.epsilon)
            usable = ops.logical_and(ops.greater(w_norm, 0), ops.greater(denominator, 0))
            safe = ops.where(usable, denominator, ops.ones_like(denominator))
            local = ops.where(
                usable,
                ops.divide(ops.multiply(ops.cast(self.trust_coefficient, dtype), w_norm), safe),
                ops.ones_like(w_norm),
            )
            rate = ops.multiply(rate, local)
        velocity = self._velocities[self._get_variable_index(variable)]
        self.assign(
            velocity,
            ops.add(
                ops.multiply(ops.cast(self.momentum, dtype), velocity), ops.multiply(rate, step)
            ),
        )
        self.assign_sub(variable, velocity)

    def get_config(self) -> dict[str, Any]:
        """The settings :meth:`from_config` rebuilds it from (on every executor)."""
        config = super().get_config()
        config.update(
            {
                "momentum": self.momentum,
                "weight_decay": self.lars_weight_decay,
                "trust_coefficient": self.trust_coefficient,
                "epsilon": self.epsilon,
                "adapt_vectors": self.adapt_vectors,
            }
        )
        return config
