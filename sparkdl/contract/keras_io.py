"""Keras model checks and transport: compiled?, input shape, labels, bytes round trip.

Models travel to executors as the bytes of a native ``.keras`` archive (architecture,
weights, compile settings), through Spark's own channels, never over the parameter
service.

Example:
    >>> import keras
    >>> net = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    >>> net.compile(optimizer="sgd", loss="mse")
    >>> model_from_bytes(model_to_bytes(net)).count_params()
    10
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import tempfile
import threading
import warnings
import zipfile
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from sparkdl.compat.keras import input_struct, raw_learning_rate
from sparkdl.contract.payload import pack_inputs, width_error
from sparkdl.errors import ConfigError, ModelError, SchemaError

if TYPE_CHECKING:
    import keras

__all__ = [
    "check_compiled",
    "check_input_structure",
    "check_labels",
    "check_model_outer",
    "copy_model",
    "declared_shapes",
    "input_dims",
    "input_keys",
    "input_names",
    "input_structure",
    "learning_rate",
    "model_from_bytes",
    "model_to_bytes",
    "optimizer_arrays",
    "optimizer_config",
    "output_names",
    "resolve_input_shape",
    "trainable_flags",
    "written_order",
]

_LOAD_LOCK = threading.Lock()

_SPARSE_LOSSES = ("sparse_categorical_crossentropy", "SparseCategoricalCrossentropy")


def check_compiled(model: Any) -> None:
    """Raises :class:`ModelError` unless ``model`` is a compiled Keras model.

    Example:
        >>> import keras
        >>> check_compiled(keras.Sequential([keras.layers.Dense(1)]))
        Traceback (most recent call last):
        ...
        sparkdl.errors.ModelError: The Keras model is not compiled. ...
    """
    import keras

    if not isinstance(model, keras.Model):
        raise ModelError(f"Expected model to be a keras.Model. Received: {type(model).__name__}")
    if not getattr(model, "compiled", False) or getattr(model, "optimizer", None) is None:
        raise ModelError(
            "The Keras model is not compiled. Call model.compile(optimizer=..., loss=..., "
            "metrics=[...]) before passing it to KerasEstimator."
        )


def resolve_input_shape(model: keras.Model, width: int, index: int = 0) -> tuple[int, ...]:
    """Returns the per-sample shape of input ``index`` that ``width`` values fill.

    A flat row is reshaped to the model's input shape when the sizes agree (64 values
    feed an ``(8, 8)`` input). An unbuilt model is built for ``(width,)`` (a
    subclassed one by a call on a zero row, which makes its layers' weights).

    Raises:
        ModelError: The model cannot be built for such inputs.
        SchemaError: ``width`` does not fit the model's input shape.
    """
    if not model.built or not getattr(model, "inputs", None):
        import keras

        try:
            if type(model).build is keras.Model.build:  # subclassed, without build()
                model(np.zeros((1, width), np.float32))  # makes its layers' weights
            else:
                model.build((None, width))
        except Exception as exc:
            raise ModelError(
                f"Could not build the model for inputs of shape (None, {width}): {exc}. "
                "Give it a keras.Input(shape=...) layer."
            ) from exc
    inputs = getattr(model, "inputs", None) or []
    if not inputs:
        return (width,)
    shape = tuple(inputs[index].shape[1:])
    known = [d for d in shape if d is not None]
    unknown = len(shape) - len(known)
    size = math.prod(known) if known else 1
    if unknown == 0 and size == width:
        return tuple(int(d) for d in shape)
    if unknown == 1 and size and width % size == 0:
        return tuple(width // size if d is None else int(d) for d in shape)
    expected = str(size) if unknown == 0 else f"a multiple of {size}"
    raise width_error(expected, input_label(model, index), shape, width)


def scheduled_rate(model: Any) -> bool:
    """Whether the model's optimizer takes its learning rate from a schedule or a
    callable (its ``learning_rate`` then reads the current value, and cannot be set).

    Example:
        >>> import keras
        >>> net = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        >>> decay = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9)
        >>> net.compile(optimizer=keras.optimizers.SGD(decay), loss="mse")
        >>> scheduled_rate(net)
        True
    """
    import keras

    rate = raw_learning_rate(_inner_optimizer(model))
    return isinstance(rate, keras.optimizers.schedules.LearningRateSchedule) or callable(rate)


def optimizer_kind(model: Any) -> str:
    """What kind of steps the model's optimizer takes, for ``lr_scaling="auto"``:
    ``"scheduled"`` (its rate comes from a schedule or a callable), ``"sgd"`` (plain gradient steps,
    ``keras.optimizers.SGD`` with or without momentum) or ``"adaptive"`` (any other:
    steps normalised by the gradients' size, as Adam, RMSprop or LARS take).

    Example:
        >>> import keras
        >>> net = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        >>> net.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
        >>> optimizer_kind(net)
        'sgd'
    """
    import keras

    if scheduled_rate(model):
        return "scheduled"
    return "sgd" if isinstance(_inner_optimizer(model), keras.optimizers.SGD) else "adaptive"


def learning_rate(model: Any) -> float | None:
    """The current learning rate of the model's optimizer, or ``None`` if it has none.

    Example:
        >>> import keras
        >>> net = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        >>> net.compile(optimizer=keras.optimizers.SGD(0.25), loss="mse")
        >>> learning_rate(net)
        0.25
    """
    import numpy as np

    try:
        return float(np.asarray(model.optimizer.learning_rate))
    except (AttributeError, TypeError, ValueError):
        return None


def copy_model(model: keras.Model, custom_objects: dict[str, Any] | None = None) -> keras.Model:
    """A compiled copy of ``model`` (through its ``.keras`` bytes); the original is kept."""
    return model_from_bytes(model_to_bytes(model), custom_objects)


def input_names(model: keras.Model) -> list[str]:
    """The names of the model's inputs, in order (``[]`` for an unbuilt model)."""
    return [
        str(getattr(t, "name", f"input_{i}")).split(":")[0]
        for i, t in enumerate(getattr(model, "inputs", None) or [])
    ]


def input_dims(model: Any) -> list[tuple[int | None, ...]]:
    """Per model input (``model.inputs`` order), its per-sample shape, ``None`` where a
    length is open (``[]`` for an unbuilt model).

    Example:
        >>> import keras
        >>> input_dims(keras.Sequential([keras.Input((None, 3)), keras.layers.Dense(2)]))
        [(None, 3)]
    """
    return [
        tuple(None if d is None else int(d) for d in t.shape[1:])
        for t in getattr(model, "inputs", None) or []
    ]


def input_structure(model: Any) -> Any:
    """The nested structure ``model``'s call takes its inputs in, as a template whose
    leaves are input positions in ``model.inputs``; ``None`` where a tuple of the inputs
    in that order is what it takes (one input, a list of inputs, a Sequential or
    subclassed model).

    A functional model built on a dict of inputs (``keras.Model({"b": b, "a": a}, out)``)
    lists ``model.inputs`` in Keras's flat order (sorted keys) and accepts only a dict:
    feeds pack each batch into this template (:func:`pack_inputs`).

    Example:
        >>> import keras
        >>> b, a = keras.Input((3,), name="b"), keras.Input((2,), name="a")
        >>> out = keras.layers.Concatenate()([a, b])
        >>> input_structure(keras.Model({"b": b, "a": a}, out))
        {'b': 1, 'a': 0}
        >>> input_structure(keras.Model([b, a], out)) is None
        True
    """
    struct = input_struct(model)
    if struct is None or not isinstance(struct, (dict, list, tuple)):
        return None
    if not isinstance(struct, dict) and not any(isinstance(s, (dict, list, tuple)) for s in struct):
        return None
    import keras

    positions = iter(range(len(keras.tree.flatten(struct))))
    return _tuples(keras.tree.map_structure(lambda _: next(positions), struct))


def input_keys(model: Any) -> dict[str, int]:
    """The keys of a model built on a dict of inputs, each to its input's position in
    ``model.inputs`` (``{}`` for other models): a ``features_col`` dict may name an
    input by its key as well as by its input layer's name.

    Example:
        >>> import keras
        >>> b, a = keras.Input((3,), name="b"), keras.Input((2,), name="a")
        >>> input_keys(keras.Model({"b": b, "a": a}, keras.layers.Concatenate()([a, b])))
        {'b': 1, 'a': 0}
    """
    structure = input_structure(model)
    if not isinstance(structure, dict):
        return {}
    return {str(k): v for k, v in structure.items() if isinstance(v, int)}


def _tuples(node: Any) -> Any:
    """``node`` with its lists as tuples: ``tf.data`` takes a list for one tensor, and
    Keras takes a tuple where the model was built on a list."""
    if isinstance(node, dict):
        return {k: _tuples(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return tuple(_tuples(v) for v in node)
    return node


def written_order(model: Any) -> list[int]:
    """The positions in ``model.inputs`` of the model's inputs in the order they were
    written: a dict of inputs in its keys' order (``model.inputs`` sorts them), else
    ``model.inputs``'s order. A list ``features_col`` follows it.

    Example:
        >>> import keras
        >>> b, a = keras.Input((3,), name="b"), keras.Input((2,), name="a")
        >>> written_order(keras.Model({"b": b, "a": a}, keras.layers.Concatenate()([a, b])))
        [1, 0]
    """
    structure = input_structure(model)
    count = len(getattr(model, "inputs", None) or [])
    if structure is None:
        return list(range(count))
    order: list[int] = []

    def visit(node: Any) -> None:
        if isinstance(node, int):
            order.append(node)
        else:
            for child in node.values() if isinstance(node, dict) else node:
                visit(child)

    visit(structure)
    return order


def declared_shapes(model: Any) -> list[tuple[int, ...] | None]:
    """Per model input, its per-sample shape where the model declares every dimension
    (``None`` for an input with an unknown one; ``[]`` for an unbuilt model).

    Example:
        >>> import keras
        >>> declared_shapes(keras.Sequential([keras.Input((8, 8)), keras.layers.Flatten()]))
        [(8, 8)]
    """
    shapes = [tuple(t.shape[1:]) for t in getattr(model, "inputs", None) or []]
    return [
        tuple(int(d) for d in shape) if all(d is not None for d in shape) else None
        for shape in shapes
    ]


def check_input_structure(model: Any) -> None:
    """Calls ``model`` on one zero row of each input, packed as the workers will feed
    it, so that a structure the model does not take fails on the driver before any job
    (only for models whose inputs are a nested structure, :func:`input_structure`,
    with fully known input shapes and no sparse input). Other errors of that call are
    left to the fit, which reports them with their context.

    Raises:
        SchemaError: The model does not take its inputs in that structure.
    """
    structure = input_structure(model)
    if structure is None or any(sparse_inputs(model)):
        return
    shapes = declared_shapes(model)
    if not shapes or any(shape is None for shape in shapes):
        return
    zeros = [np.zeros((1, *shape), np.float32) for shape in shapes if shape is not None]
    try:
        model(pack_inputs(structure, zeros), training=False)
    except Exception as exc:
        message = str(exc).strip() or repr(exc)
        if "structure" not in message:
            return  # not about the structure: the fit reports it where it happens
        raise SchemaError(
            f"The model takes its inputs as {structure!r} (positions in model.inputs "
            f"{input_names(model)}); a batch in that structure failed on the driver: "
            f"{type(exc).__name__}: {message.splitlines()[0]}"
        ) from exc


def sparse_inputs(model: keras.Model) -> list[bool]:
    """Whether each model input was built with ``keras.Input(..., sparse=True)``."""
    return [bool(getattr(t, "sparse", False)) for t in getattr(model, "inputs", None) or []]


def prefers_sparse(model: keras.Model, index: int, min_width: int) -> bool:
    """Whether input ``index`` should be fed from sparse vectors: it takes a
    ``tf.SparseTensor``, or it is declared ``min_width`` values wide or wider."""
    inputs = getattr(model, "inputs", None) or []
    if index >= len(inputs):
        return False
    if getattr(inputs[index], "sparse", False):
        return True
    shape = tuple(inputs[index].shape[1:])
    return all(d is not None for d in shape) and math.prod(shape) >= min_width


def output_names(model: keras.Model) -> list[str]:
    """The names of the model's outputs, in order."""
    names = getattr(model, "output_names", None)
    if names:
        return [str(n) for n in names]
    return [f"output_{i}" for i in range(len(getattr(model, "outputs", None) or [1]))]


def output_shapes(
    model: keras.Model, input_shapes: Sequence[tuple[int, ...]]
) -> list[tuple[int | None, ...]]:
    """Per-sample shape of each output. A subclassed model has no symbolic outputs: it
    is called once on a zero row of each input instead.

    Example:
        >>> import keras
        >>> net = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        >>> output_shapes(net, [(4,)])
        [(3,)]
    """
    outputs = getattr(model, "outputs", None)
    if outputs:
        return [tuple(t.shape[1:]) for t in outputs]
    import keras

    xs = [np.zeros((1, *shape), np.float32) for shape in input_shapes]
    result = model(xs[0] if len(xs) == 1 else xs, training=False)
    return [tuple(int(d) for d in np.shape(t)[1:]) for t in keras.tree.flatten(result)]


def input_label(model: keras.Model, index: int) -> str:
    """`` 'name'`` of input ``index`` for messages, when the model has several named
    inputs (else empty: one input, or a subclassed model without named inputs)."""
    names = input_names(model)
    return f" {names[index]!r}" if len(names) > 1 and index < len(names) else ""


def optimizer_steps(model: Any) -> int:
    """The step count of ``model``'s optimizer (what a learning-rate schedule reads)."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return 0
    try:
        return int(np.asarray(optimizer.iterations))
    except Exception:  # an optimizer without a count
        return 0


def set_optimizer_steps(model: Any, steps: int, *, only_scheduled: bool = False) -> None:
    """Sets the step count of ``model``'s optimizer, where it has a settable one.

    With gradient accumulation the count is derived from the micro-steps and is left
    alone. ``only_scheduled``: only when the learning rate is a schedule (a fitted
    model's optimizer holds no moments, so a count would turn Adam's bias correction off
    for nothing).
    """
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or getattr(optimizer, "gradient_accumulation_steps", None):
        return
    if only_scheduled and not scheduled_rate(model):
        return
    count: Any = getattr(optimizer, "iterations", None)
    if hasattr(count, "assign"):
        count.assign(steps)


def check_training_settings(model: keras.Model) -> None:
    """Refuses, on the driver, what a distributed fit cannot do as ``model.fit`` does.

    Raises:
        ConfigError: The optimizer keeps a moving average of the weights
            (``use_ema=True``): each worker's would average its own weights, and the
            center the fit returns is never one.
    """
    optimizer = getattr(model, "optimizer", None)
    if getattr(optimizer, "use_ema", False):
        raise ConfigError(
            f"The model's optimizer ({type(optimizer).__name__}) has use_ema=True. Keras "
            "swaps its moving average of the weights in at the end of model.fit; in a "
            "distributed fit each worker's average covers only its own weights and the "
            "center is never averaged. Compile with use_ema=False (or average checkpoints "
            "of the fitted model yourself)."
        )


def check_labels(
    model: keras.Model,
    kind: str,
    label_width: int,
    label_min: float | None,
    label_max: float | None,
    index: int = 0,
) -> None:
    """Checks labels against the model's output before any job runs.

    Raises:
        SchemaError: Array labels of the wrong width, or class ids out of range for a
            sparse categorical loss.
    """
    outputs = getattr(model, "outputs", None) or []
    if not outputs:
        return
    units = outputs[index].shape[-1]
    label_shape(model, kind, label_width, index)  # array labels must fill the output
    if len(outputs) != 1:
        return  # per-output losses: only the widths are checked
    sparse = kind != "array" and _sparse_loss(model, index) and units is not None
    low, high = label_min, label_max
    if sparse and low is not None and high is not None and (low < 0 or high > units - 1):
        raise SchemaError(
            f"Expected class ids in [0, {units - 1}] for a sparse categorical loss over "
            f"{units} outputs. Received labels from {label_min:g} to {label_max:g}. "
            "Re-index the labels (StringIndexer) or widen the output layer."
        )


def label_shape(model: keras.Model, kind: str, width: int, index: int = 0) -> tuple[int, ...]:
    """The per-sample shape a label of ``width`` values takes for output ``index``.

    A scalar label is ``()``. An array label fills the output's shape (10 values a
    ``(None, 5, 2)`` output's ``(5, 2)``), or, for a sparse categorical loss, the
    output's shape without its class axis (5 class ids a ``(None, 5, 7)`` output: a
    sequence's tokens). One unknown length in the output is taken from ``width``.

    Raises:
        SchemaError: The label's values fill neither.

    Example:
        >>> import keras
        >>> net = keras.Sequential([keras.Input((5, 3)), keras.layers.Dense(2)])
        >>> label_shape(net, "array", 10)
        (5, 2)
    """
    outputs = getattr(model, "outputs", None) or []
    if kind != "array" or not outputs:
        return () if kind != "array" else (width,)
    shape = tuple(outputs[index].shape[1:])
    candidates = [shape]
    if _sparse_loss(model, index) and len(shape) > 1:
        candidates.append(shape[:-1])
    for candidate in candidates:
        filled = _fill(candidate, width)
        if filled is not None:
            return filled
    sizes = " or ".join(
        str(math.prod(d for d in c if d is not None)) + (" x n" if None in c else "")
        for c in candidates
    )
    raise SchemaError(
        f"Expected label arrays of {sizes} values to fill the model's output"
        f"{_output_label(model, index)} shape {(None, *shape)}"
        f"{' (class ids per position for a sparse loss)' if len(candidates) > 1 else ''}. "
        f"Received label arrays of {width} values. Check label_col, or the output layer."
    )


def _fill(shape: tuple[Any, ...], width: int) -> tuple[int, ...] | None:
    known = [int(d) for d in shape if d is not None]
    size = math.prod(known) if known else 1
    unknown = len(shape) - len(known)
    if unknown == 0:
        return tuple(int(d) for d in shape) if size == width else None
    if unknown == 1 and size and width % size == 0 and width:
        return tuple(width // size if d is None else int(d) for d in shape)
    return None


def _sparse_loss(model: Any, index: int) -> bool:
    loss = getattr(model, "loss", None)
    if isinstance(loss, dict):
        names = output_names(model)
        loss = loss.get(names[index]) if index < len(names) else None
    elif isinstance(loss, (list, tuple)):
        loss = loss[index] if index < len(loss) else None
    name = loss if isinstance(loss, str) else getattr(loss, "__name__", type(loss).__name__)
    return name in _SPARSE_LOSSES


def _output_label(model: Any, index: int) -> str:
    names = output_names(model)
    return f" {names[index]!r}" if len(names) > 1 else ""


def model_to_bytes(model: keras.Model) -> bytes:
    """Returns ``model`` as the bytes of a ``.keras`` archive."""
    with tempfile.TemporaryDirectory(prefix="sparkdl-") as tmp:
        path = os.path.join(tmp, "model.keras")
        model.save(path)
        with open(path, "rb") as f:
            return f.read()


def model_from_bytes(
    data: bytes,
    custom_objects: dict[str, Any] | None = None,
    *,
    compile: bool = True,
    safe_mode: bool = False,
) -> keras.Model:
    """Loads a model saved by :func:`model_to_bytes`.

    ``safe_mode`` is off by default because these bytes come from the user's own
    driver through Spark (so ``Lambda`` layers work); they never come from the network.
    Stages loaded from a directory pass ``safe_mode=True`` (:mod:`sparkdl.ml.persistence`).

    Raises:
        ModelError: The bytes are no ``.keras`` archive, or safe mode refused code the
            model holds.
    """
    import keras

    import sparkdl.optimizers  # noqa: F401  (registers LARS for the models that use it)

    if not zipfile.is_zipfile(io.BytesIO(data)):
        raise ModelError("Model bytes are not a .keras archive.")
    with tempfile.TemporaryDirectory(prefix="sparkdl-") as tmp:
        path = os.path.join(tmp, "model.keras")
        with open(path, "wb") as f:
            f.write(data)
        # One load at a time: warnings.catch_warnings swaps the process's filters (two
        # threads loading at once would undo each other's), and Keras's loading keeps
        # global state.
        with _LOAD_LOCK, warnings.catch_warnings():
            # A compiled but never-trained model saves an unbuilt optimizer; Keras warns
            # that it skips those (empty) optimizer variables on load. Nothing is lost.
            warnings.filterwarnings("ignore", message="Skipping variable loading for optimizer")
            try:
                model: keras.Model = keras.saving.load_model(
                    path, custom_objects=custom_objects, compile=compile, safe_mode=safe_mode
                )
            except (TypeError, ValueError) as exc:
                _raise_if_newer_keras(data, exc)
                if not isinstance(exc, ValueError) or not safe_mode or "safe_mode" not in str(exc):
                    raise
                raise ModelError(
                    "The saved model holds code (a Lambda layer, or a function saved as "
                    "bytecode) and was loaded in safe mode, which refuses to run it. Load "
                    "it with safe_mode=False if you trust whoever saved it, or replace the "
                    "Lambda with a registered custom layer."
                ) from exc
        return model


def _raise_if_newer_keras(data: bytes, exc: BaseException) -> None:
    """A load that failed on a model saved by a newer Keras than this one gets an error
    naming both versions and the upgrade (a newer Keras writes settings an older one does
    not take, e.g. 3.15's initializers for 3.14)."""
    import keras

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            saved = str(json.loads(archive.read("metadata.json")).get("keras_version", ""))
    except (KeyError, ValueError, OSError, zipfile.BadZipFile):
        return
    if saved and _version(saved) > _version(keras.__version__):
        last = (str(exc).strip().splitlines() or [""])[-1]  # Keras's innermost cause
        raise ModelError(
            f"The model was saved by Keras {saved}; this process runs Keras "
            f"{keras.__version__}, which cannot read what a newer Keras writes ({last}). "
            f'Upgrade Keras here (pip install -U "keras>={saved}"), on the driver and '
            "every executor."
        ) from exc


def _version(text: str) -> tuple[int, ...]:
    """``"3.15.1"`` as ``(3, 15, 1)`` (a suffix such as ``rc1`` ignored).

    Example:
        >>> _version("3.15.1rc1"), _version("3.16.0.dev0")
        ((3, 15, 1), (3, 16, 0))
    """
    parts = []
    for part in text.split(".")[:3]:
        lead = re.match(r"\d+", part)  # "1rc1" is 1
        parts.append(int(lead.group()) if lead else 0)
    return tuple(parts)


def optimizer_config(model: Any) -> str:
    """The model's compiled optimizer (unwrapped from a ``LossScaleOptimizer``),
    Keras-serialized as JSON: what ``outer_optimizer="model"`` rebuilds beside the center.

    Example:
        >>> import keras
        >>> net = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> net.compile(optimizer=keras.optimizers.Adam(0.5), loss="mse")
        >>> json.loads(optimizer_config(net))["config"]["learning_rate"]
        0.5
    """
    import keras

    return json.dumps(keras.optimizers.serialize(_inner_optimizer(model)))


def optimizer_arrays(model: Any) -> list[np.ndarray]:
    """The values of the model's optimizer variables (step count, rate, slots) once it
    has stepped (a model trained before); ``[]`` for a fresh one."""
    import keras

    optimizer = _inner_optimizer(model)
    if optimizer is None or not getattr(optimizer, "built", False):
        return []
    if int(keras.ops.convert_to_numpy(optimizer.iterations)) == 0:
        return []
    return [keras.ops.convert_to_numpy(v) for v in optimizer.variables]


def check_model_outer(model: Any, config: str) -> None:
    """Refuses, on the driver, a model ``outer_optimizer="model"`` cannot step as
    ``model.fit`` would.

    Raises:
        ConfigError: ``steps_per_execution`` above 1 (a push would hold several steps),
            a trainable weight with a constraint (the worker's step, which recovers the
            gradient, would apply it), or an optimizer Keras cannot rebuild from its
            config (an unregistered class).
    """
    import keras

    steps = int(getattr(model, "steps_per_execution", 1) or 1)
    if steps > 1:
        raise ConfigError(
            f"outer_optimizer='model' needs one batch per round, and the model was compiled "
            f"with steps_per_execution={steps}. Compile with steps_per_execution=1."
        )
    for variable in model.trainable_weights:
        if getattr(variable, "constraint", None) is not None:
            raise ConfigError(
                f"outer_optimizer='model' takes each batch's gradient from the worker's plain "
                f"step, and the constraint on {variable.path} would change it. Drop the "
                "constraint, or use outer_optimizer=None."
            )
    try:
        rebuilt = keras.optimizers.deserialize(json.loads(config))
        if not isinstance(rebuilt, keras.optimizers.Optimizer):  # Keras may return a str
            raise TypeError(f"Keras rebuilt {type(rebuilt).__name__}, not an optimizer")
    except Exception as exc:
        raise ConfigError(
            f"outer_optimizer='model' rebuilds the model's optimizer on the service from its "
            f"config, which failed ({type(exc).__name__}: {exc}). Register its class with "
            "@keras.saving.register_keras_serializable(), or use outer_optimizer=None."
        ) from exc


def trainable_flags(model: Any) -> tuple[bool, ...]:
    """Whether each of ``model.weights`` (the center's order) is trainable.

    Example:
        >>> import keras
        >>> net = keras.Sequential([keras.Input((2,)), keras.layers.BatchNormalization()])
        >>> trainable_flags(net)
        (True, True, False, False)
    """
    ids = {id(v) for v in model.trainable_weights}
    return tuple(id(w) in ids for w in model.weights)


def weight_paths(model: Any) -> tuple[str, ...]:
    """Each of ``model.weights``' path (the center's order): what an optimizer that
    treats weights by their layer (``Muon``'s ``exclude_layers`` and embeddings) reads.

    Example:
        >>> import keras
        >>> net = keras.Sequential(
        ...     [keras.Input((2,)), keras.layers.Dense(1, name="out")], name="net")
        >>> weight_paths(net)
        ('net/out/kernel', 'net/out/bias')
    """
    return tuple(str(w.path) for w in model.weights)


def _inner_optimizer(model: Any) -> Any:
    """The model's optimizer, unwrapped from a ``LossScaleOptimizer`` (mixed precision)."""
    optimizer = getattr(model, "optimizer", None)
    return getattr(optimizer, "inner_optimizer", optimizer)
