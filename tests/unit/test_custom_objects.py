"""Custom objects a model names are found on the driver and travel to where they are not
defined (``sparkdl.contract.custom_objects``). The Spark round trip is in test_local_cluster."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path
from typing import Any

import cloudpickle
import keras
import numpy as np
import pytest

from sparkdl.contract import custom_objects, keras_io

PARTS = textwrap.dedent(
    """
    import keras


    @keras.saving.register_keras_serializable(package="unitlib")
    class Twice(keras.layers.Layer):
        def call(self, x):
            return x * 2.0


    def soft(x):
        return keras.ops.softplus(x)


    class Ones(keras.initializers.Initializer):
        def __call__(self, shape, dtype=None):
            return keras.ops.ones(shape, dtype=dtype) * 0.1

        def get_config(self):
            return {}
    """
)


@keras.saving.register_keras_serializable(package="unitnb")
def half_mse(y_true: Any, y_pred: Any) -> Any:
    return keras.losses.mean_squared_error(y_true, y_pred) / 2


class MeanOut(keras.metrics.Mean):
    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> Any:
        return super().update_state(keras.ops.mean(y_pred))


@pytest.fixture
def parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    (tmp_path / "unit_parts.py").write_text(PARTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("unit_parts")
    yield module
    sys.modules.pop("unit_parts", None)


def _model(parts: Any) -> keras.Model:
    model = keras.Sequential(
        [
            keras.Input((3,)),
            keras.layers.Dense(4, activation=parts.soft, kernel_initializer=parts.Ones()),
            parts.Twice(),
            keras.layers.Dense(1),
        ]
    )
    model.compile("sgd", loss=half_mse, metrics=[MeanOut(name="mean_out")])
    return model


def test_every_custom_object_the_config_names_is_found_under_its_lookup_name(parts) -> None:
    found = custom_objects.collect(_model(parts))
    assert found == {
        "unitlib>Twice": parts.Twice,
        "soft": parts.soft,
        "Ones": parts.Ones,
        "unitnb>half_mse": half_mse,
        "MeanOut": MeanOut,
    }


def test_given_objects_are_kept_and_also_keyed_by_their_registered_name(parts) -> None:
    found = custom_objects.collect(_model(parts), {"Twice": parts.Twice})
    assert found["Twice"] is parts.Twice and found["unitlib>Twice"] is parts.Twice


def test_the_users_module_travels_by_value_and_the_model_loads_without_it(parts) -> None:
    model = _model(parts)
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    expected = model.predict(x, verbose=0)
    pickled = custom_objects.dumps(custom_objects.collect(model))
    model_bytes = keras_io.model_to_bytes(model)
    # As on an executor: the module cannot be imported and nothing is registered.
    sys.modules.pop("unit_parts")
    sys.path.remove(str(Path(parts.__file__).parent))
    registry = keras.saving.get_custom_objects()
    saved = {k: registry.pop(k) for k in ("unitlib>Twice", "unitnb>half_mse")}
    try:
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module("unit_parts")
        shipped = cloudpickle.loads(pickled)
        rebuilt = keras_io.model_from_bytes(model_bytes, shipped)
        np.testing.assert_allclose(rebuilt.predict(x, verbose=0), expected, rtol=1e-6)
        assert [type(layer).__name__ for layer in rebuilt.layers] == ["Dense", "Twice", "Dense"]
        with pytest.raises(TypeError, match="Could not locate"):
            keras_io.model_from_bytes(model_bytes)  # what executors did before
    finally:
        registry.update(saved)


def test_a_model_of_builtins_needs_nothing() -> None:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="relu")])
    model.compile("adam", "mse", metrics=["mae"])
    assert custom_objects.collect(model) == {}
    assert custom_objects.dumps({}) is None
