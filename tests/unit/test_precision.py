"""Mixed precision as a worker builds it (:mod:`sparkdl.executor.precision`), for each
kind of model: Sequential, functional, functional with a nested Sequential, a registered
custom layer (holding a layer of its own), a registered subclassed model.

After the build, each must compute in float16 in every layer but its outputs (nested
ones too), keep float32 variables and outputs, train with a ``LossScaleOptimizer``
around the user's optimizer class, hold the source's weights and optimizer state, and
take a training step with a finite loss; Keras's default policy is left as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from sparkdl.compat.keras import flatten_layers  # noqa: E402
from sparkdl.contract.keras_io import (  # noqa: E402
    learning_rate,
    model_to_bytes,
    optimizer_kind,
    optimizer_steps,
    set_optimizer_steps,
)
from sparkdl.executor.precision import _output_layers, loss_scaled, mixed_precision_model  # noqa: E402
from sparkdl.executor.training import compute_dtypes  # noqa: E402

WIDTH, CLASSES = 8, 3


@keras.saving.register_keras_serializable(package="sparkdl_test_precision")
class Block(keras.layers.Layer):
    """A custom layer holding a ``Dense`` it makes itself."""

    def __init__(self, units: int = 16, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.units = units
        self.dense = keras.layers.Dense(units, activation="relu")

    def build(self, input_shape: Any) -> None:
        self.scale = self.add_weight(shape=(self.units,), initializer="random_normal")
        self.dense.build(input_shape)

    def call(self, x: Any) -> Any:
        return self.dense(x) * self.scale

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "units": self.units}


@keras.saving.register_keras_serializable(package="sparkdl_test_precision")
class Classifier(keras.Model):
    """A subclassed model; its output layer pinned to float32 as the Keras mixed
    precision guide advises (``dtype="float32"``)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(16, activation="relu")
        self.block = Block(16)
        self.out = keras.layers.Dense(CLASSES, activation="softmax", dtype="float32")

    def call(self, x: Any) -> Any:
        return self.out(self.block(self.hidden(x)))


def sequential() -> Any:
    return keras.Sequential(
        [
            keras.Input((WIDTH,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(CLASSES, activation="softmax"),
        ]
    )


def functional() -> Any:
    inputs = keras.Input((WIDTH,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(CLASSES, activation="softmax")(hidden))


def nested() -> Any:
    inner = keras.Sequential(
        [keras.Input((WIDTH,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(16)],
        name="inner",
    )
    inputs = keras.Input((WIDTH,))
    return keras.Model(inputs, keras.layers.Dense(CLASSES, activation="softmax")(inner(inputs)))


def nested_output() -> Any:
    """The nested model is the output: its own last layer stays float32."""
    inner = keras.Sequential(
        [
            keras.Input((16,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(CLASSES, activation="softmax"),
        ],
        name="head",
    )
    inputs = keras.Input((WIDTH,))
    return keras.Model(inputs, inner(keras.layers.Dense(16, activation="relu")(inputs)))


def custom_layer() -> Any:
    inputs = keras.Input((WIDTH,))
    return keras.Model(inputs, keras.layers.Dense(CLASSES, activation="softmax")(Block()(inputs)))


def subclassed() -> Any:
    model = Classifier()
    model(np.zeros((1, WIDTH), np.float32))
    return model


KINDS: dict[str, Callable[[], Any]] = {
    "sequential": sequential,
    "functional": functional,
    "nested": nested,
    "nested_output": nested_output,
    "custom_layer": custom_layer,
    "subclassed": subclassed,
}


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(32, WIDTH)).astype(np.float32), np.arange(32) % CLASSES


@pytest.fixture(params=list(KINDS))
def built(request: Any) -> tuple[Any, Any]:
    """``(source, mixed)``: a compiled model trained one step (so its optimizer holds
    moments), and what a worker builds from its bytes."""
    keras.utils.set_random_seed(0)
    source = KINDS[request.param]()
    source.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    x, y = _data()
    source.train_on_batch(x, y)
    return source, mixed_precision_model(model_to_bytes(source))


def _leaves(model: Any) -> list[Any]:
    return [
        layer
        for layer in flatten_layers(model)
        if not isinstance(layer, (keras.Model, keras.layers.InputLayer))
    ]


def test_every_layer_but_the_outputs_computes_in_float16(built) -> None:
    source, mixed = built
    outputs = _output_layers(mixed) if not isinstance(mixed, Classifier) else {id(mixed.out)}
    dtypes = {layer.path: layer.compute_dtype for layer in _leaves(mixed)}
    assert len(dtypes) == len(_leaves(source))
    for layer in _leaves(mixed):
        expected = "float32" if id(layer) in outputs else "float16"
        assert layer.compute_dtype == expected, dtypes
    assert compute_dtypes(mixed) == ["float16", "float32"]
    assert {v.dtype for v in mixed.weights} == {"float32"}
    x, _ = _data()
    assert keras.backend.standardize_dtype(mixed(x[:2]).dtype) == "float32"
    assert keras.config.dtype_policy().name == "float32"  # the default is restored


def test_the_loss_is_scaled_around_the_users_optimizer(built) -> None:
    source, mixed = built
    assert mixed.optimizer.__class__.__name__ == "LossScaleOptimizer"
    assert loss_scaled(mixed) and not loss_scaled(source)
    assert type(mixed.optimizer.inner_optimizer) is type(source.optimizer)
    # What the worker reads and sets through the wrapper reaches the user's optimizer.
    assert learning_rate(mixed) == pytest.approx(1e-3)
    assert optimizer_kind(mixed) == optimizer_kind(source) == "adaptive"
    set_optimizer_steps(mixed, 7)
    assert optimizer_steps(mixed) == int(mixed.optimizer.inner_optimizer.iterations) == 7


def test_weights_and_optimizer_state_are_the_sources(built) -> None:
    source, mixed = built
    ours, theirs = mixed.get_weights(), source.get_weights()
    assert len(ours) == len(theirs)
    assert all(np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True))
    inner = mixed.optimizer.inner_optimizer.variables
    assert len(inner) == len(source.optimizer.variables)
    for a, b in zip(inner, source.optimizer.variables, strict=True):
        assert np.array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b)), a.path
    assert int(mixed.optimizer.iterations) == 1


def test_a_training_step_runs_with_a_finite_loss(built) -> None:
    _, mixed = built
    x, y = _data()
    before = [np.array(w) for w in mixed.get_weights()]
    loss = float(np.asarray(mixed.train_on_batch(x, y)))
    assert np.isfinite(loss)
    assert any(not np.array_equal(a, b) for a, b in zip(before, mixed.get_weights(), strict=True))


def test_a_subclassed_models_unpinned_output_computes_in_float16() -> None:
    """As under ``keras.config.set_dtype_policy("mixed_float16")``: a layer the class
    does not pin to float32 computes in float16, its output included (documented)."""

    @keras.saving.register_keras_serializable(package="sparkdl_test_precision")
    class Unpinned(keras.Model):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.out = keras.layers.Dense(CLASSES, activation="softmax")

        def call(self, x: Any) -> Any:
            return self.out(x)

    model = Unpinned()
    model(np.zeros((1, WIDTH), np.float32))
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    mixed = mixed_precision_model(model_to_bytes(model))
    assert mixed.out.compute_dtype == "float16" and loss_scaled(mixed)
    x, y = _data()
    assert np.isfinite(float(np.asarray(mixed.train_on_batch(x, y))))
