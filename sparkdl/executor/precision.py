"""Mixed precision on a worker: its model rebuilt to compute in float16, with float32
variables and loss scaling.

``mixed_precision=True`` (:class:`~sparkdl.config.ScalingConfig`) sends the user's
float32 model as usual; each worker rebuilds it here, and only here, so the driver, the
service and the fitted model stay float32. A Sequential or functional model is cloned
with ``keras.models.clone_model`` (nested models too), each layer but the outputs made
under Keras's ``mixed_float16`` policy; a subclassed model, whose layers Keras cannot
clone, is loaded under that policy as the default (what the Keras mixed precision guide
has users do: the layers it makes compute in float16, output layers included unless
the class gives them ``dtype="float32"``). Either way the weights and the optimizer's
state are the source model's, and the model is compiled again under its own
``mixed_float16`` policy, so Keras wraps its optimizer in a ``LossScaleOptimizer``.

The clone replaced an edit of the ``.keras`` archive's config: measured, that left
Sequential and functional models with no loss scaling and nested models in float32
(``docs/benchmarks/service.md``, "Mixed precision").

Example:
    >>> import keras
    >>> from sparkdl.contract.keras_io import model_to_bytes
    >>> net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4),
    ...                         keras.layers.Dense(1)])
    >>> net.compile(optimizer="sgd", loss="mse")
    >>> mixed = mixed_precision_model(model_to_bytes(net))
    >>> [layer.compute_dtype for layer in mixed.layers]
    ['float16', 'float32']
    >>> type(mixed.optimizer).__name__, type(mixed.optimizer.inner_optimizer).__name__
    ('LossScaleOptimizer', 'SGD')
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import keras

from sparkdl.compat.keras import graph_model
from sparkdl.contract.keras_io import model_from_bytes

__all__ = ["MIXED", "loss_scaled", "mixed_precision_model"]

#: Keras's policy: float16 computations, float32 variables.
MIXED = "mixed_float16"


def mixed_precision_model(data: bytes, custom_objects: dict[str, Any] | None = None) -> keras.Model:
    """The ``.keras`` model of ``data``, computing in float16 with float32 variables.

    Args:
        data: The bytes of a compiled model's ``.keras`` archive.
        custom_objects: What loading it needs, as for
            :func:`sparkdl.contract.keras_io.model_from_bytes`.

    Returns:
        The model, compiled with its optimizer in a ``LossScaleOptimizer``: every layer
        but the outputs (of a Sequential or functional model) computes in float16, its
        variables, weights and optimizer state those of the source.
    """
    source = model_from_bytes(data, custom_objects)
    optimizer = getattr(source.optimizer, "inner_optimizer", source.optimizer)
    if graph_model(source):
        mixed = _mixed_clone(source)
        mixed.set_weights(source.get_weights())
    else:
        # Keras cannot clone a subclassed model's layers: its __init__ makes them, so
        # they take the default policy in force while it loads.
        with _default_policy(MIXED):
            mixed = model_from_bytes(data, custom_objects)
    mixed.dtype_policy = MIXED  # compile then wraps the optimizer in a LossScaleOptimizer
    with keras.saving.custom_object_scope(custom_objects or {}):
        mixed.compile_from_config(source.get_compile_config())
    _copy_state(optimizer, getattr(mixed.optimizer, "inner_optimizer", None))
    return mixed


def loss_scaled(model: keras.Model) -> bool:
    """Whether ``model`` trains with loss scaling (a ``LossScaleOptimizer``)."""
    return isinstance(getattr(model, "optimizer", None), keras.optimizers.LossScaleOptimizer)


def _mixed_clone(model: keras.Model) -> keras.Model:
    """A clone of a Sequential or functional ``model`` (nested ones too), each layer but
    its outputs made under the ``mixed_float16`` policy (a custom layer's own sublayers
    included)."""
    outputs = _output_layers(model)

    def clone(layer: Any) -> Any:
        config = layer.get_config()
        if id(layer) in outputs:
            return layer.__class__.from_config(config)
        config["dtype"] = keras.DTypePolicy(MIXED)
        with _default_policy(MIXED):
            return layer.__class__.from_config(config)

    return keras.models.clone_model(model, clone_function=clone, recursive=True)


def _output_layers(model: keras.Model) -> set[int]:
    """``id`` of each layer whose output is one of ``model``'s, and inside a nested model
    that is one, its own output layers."""
    if isinstance(model, keras.Sequential):
        layers = model.layers[-1:]
    else:
        layers = [model.get_layer(name) for name in model.output_names]
    found = {id(layer) for layer in layers}
    for layer in layers:
        if graph_model(layer):
            found |= _output_layers(layer)
    return found


@contextlib.contextmanager
def _default_policy(name: str) -> Iterator[None]:
    """Makes ``name`` the default dtype policy, then restores the one before.

    Keras keeps its default policy per thread, so the task's other threads (the
    pusher's) never see it."""
    before = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(before)


def _copy_state(source: Any, target: Any) -> None:
    """Copies the source optimizer's variables (step count, moments) into ``target``,
    built for the same trainable variables in the same order; left fresh if they do not
    pair up."""
    if source is None or target is None:
        return
    old, new = list(source.variables), list(target.variables)
    shapes = [tuple(v.shape) for v in old] == [tuple(v.shape) for v in new]
    if shapes:
        for value, variable in zip(old, new, strict=True):
            variable.assign(value)
