"""Every use sparkdl makes of Keras's private internals.

Keras 3 has public ways to *serialize* a model's layers, compile arguments and
optimizer, but sparkdl sometimes needs the *live* objects behind them:

* :func:`flatten_layers`: every layer of a model, nested ones included
  (``Layer._flatten_layers``), to find the user's custom classes and functions that must
  travel to the executors;
* :func:`compile_arguments`: what ``compile`` was given, as given
  (``Trainer._compile_config.config``): a custom loss object, not its config;
* :func:`raw_learning_rate`: the learning rate an optimizer was built with
  (``BaseOptimizer._learning_rate``): a schedule or a callable as such, where the
  public ``learning_rate`` evaluates it at the current step;
* :func:`graph_model`: whether a model is Sequential or functional
  (``keras.src.models.functional.Functional``, which Keras does not export), the
  models ``keras.models.clone_model`` can rebuild layer by layer.

Keras is imported by the callers, never here: this module costs nothing to import.
``tests/unit/test_compat_shapes.py`` checks each against the installed Keras.

Example:
    >>> import keras
    >>> net = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> net.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    >>> [type(layer).__name__ for layer in flatten_layers(net)]
    ['Sequential', 'InputLayer', 'Dense']
    >>> compile_arguments(net)["loss"]
    'mse'
    >>> float(raw_learning_rate(net.optimizer))
    0.5
    >>> graph_model(net)
    True
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "compile_arguments",
    "flatten_layers",
    "graph_model",
    "input_struct",
    "raw_learning_rate",
]


def flatten_layers(model: Any) -> list[Any]:
    """The model itself and every layer inside it, depth first, each once.

    Reaches ``Layer._flatten_layers(include_self=True, recursive=True)``, which also
    finds layers a custom layer holds as attributes (Keras tracks them; no public
    property lists them). When it is gone, falls back to walking the public ``layers``
    lists of the model and of each layer that has one: nested models are found, layers
    a custom layer holds as attributes are not.

    Args:
        model: A Keras model (or layer).

    Returns:
        The layers, ``model`` first.
    """
    flatten = getattr(model, "_flatten_layers", None)
    if callable(flatten):
        return list(flatten(include_self=True, recursive=True))
    found: list[Any] = []
    seen: set[int] = set()
    stack = [model]
    while stack:
        layer = stack.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        found.append(layer)
        stack.extend(reversed(list(getattr(layer, "layers", None) or [])))
    return found


def compile_arguments(model: Any) -> dict[str, Any]:
    """The arguments ``model.compile`` was given, as live objects (empty if none).

    Reaches ``Trainer._compile_config``, a ``SerializableDict`` whose ``config`` holds
    them; the public ``get_compile_config()`` only returns them serialized, which names
    a custom loss but does not hold it. When it is gone, returns ``{}``: the caller then
    finds only what the model's layers and optimizer hold.

    Args:
        model: A Keras model.

    Returns:
        ``{"optimizer": ..., "loss": ..., "metrics": ..., ...}`` as given to ``compile``.
    """
    compiled = getattr(model, "_compile_config", None)
    config = getattr(compiled, "config", None)
    return dict(config) if isinstance(config, dict) else {}


def input_struct(model: Any) -> Any:
    """The structure a functional model was built on (``keras.Model(inputs=...)``): a
    dict, list or tuple of its input tensors, or one tensor; ``None`` for a Sequential
    or subclassed model.

    Reaches ``Functional._inputs_struct``. The public ``model.input`` returns it for a
    functional model but raises for a Sequential one that has not been called, and
    ``model.inputs`` is flat: it cannot tell a dict of inputs (which Keras then accepts
    only as a dict, or as a tuple in sorted-key order) from a list. When it is gone,
    returns ``None``: batches are then fed as a tuple in ``model.inputs`` order, which
    serves every model but a dict of inputs written in unsorted order.
    """
    if type(model).__name__ == "Sequential":
        return None
    return getattr(model, "_inputs_struct", None)


def raw_learning_rate(optimizer: Any) -> Any:
    """The learning rate ``optimizer`` was built with: a ``LearningRateSchedule``, a
    callable, or the variable holding a fixed rate; ``None`` when it has none.

    Reaches ``BaseOptimizer._learning_rate``: the public ``learning_rate`` property
    evaluates a schedule or callable at the current step, so it cannot tell whether the
    rate is scheduled. When the attribute is gone, returns ``None`` (the rate is then
    taken as fixed).

    Args:
        optimizer: A Keras optimizer (or ``None``).

    Returns:
        The raw learning rate, or ``None``.
    """
    return getattr(optimizer, "_learning_rate", None)


def graph_model(model: Any) -> bool:
    """Whether ``model`` is a Sequential or functional model (a functional subclass
    included), not a subclassed one: a graph of layers ``keras.models.clone_model`` can
    rebuild one by one.

    Reaches ``keras.src.models.functional.Functional``, the class of every functional
    model, which Keras does not export (``clone_model`` itself tests for it). When it is
    gone, falls back to the public config: a functional model's lists its
    ``output_layers``.

    Args:
        model: A Keras model (or layer).

    Returns:
        ``True`` for a Sequential or functional model.
    """
    import keras

    if isinstance(model, keras.Sequential):
        return True
    try:
        from keras.src.models.functional import Functional
    except ImportError:
        if not isinstance(model, keras.Model):
            return False
        try:
            return "output_layers" in model.get_config()
        except Exception:  # a subclassed model without get_config
            return False
    return isinstance(model, Functional)
