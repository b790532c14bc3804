from __future__ import annotations

import keras
import numpy as np
import pytest

from sparkdl.executor.backends import backend_for
from sparkdl.executor.weight_access import WeightAccess


def _model() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((5,)),
            keras.layers.Dense(4, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.Dense(3),
        ]
    )
    model.compile(optimizer="adam", loss="mse")
    return model


def _access(model: keras.Model) -> WeightAccess:
    """What a worker uses (the TensorFlow backend's one op per variable)."""
    return backend_for(keras.backend.backend()).weight_access(model)


def test_reads_and_writes_what_keras_does() -> None:
    model = _model()
    access = _access(model)
    assert access.fast
    for got, want in zip(access.get(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
    new = [np.full(w.shape, i + 0.5, w.dtype) for i, w in enumerate(model.get_weights())]
    access.set(new)
    for got, want in zip(model.get_weights(), new, strict=True):
        np.testing.assert_array_equal(got, want)
    assert len(access.get()) == len(model.weights)  # moving statistics included


def test_read_is_a_snapshot_and_write_copies() -> None:
    model = _model()
    access = _access(model)
    before = access.get()
    kept = [w.copy() for w in before]
    x = np.random.default_rng(0).normal(size=(64, 5)).astype(np.float32)
    model.fit(x, x[:, :3], epochs=1, batch_size=16, verbose=0)  # updates in place
    for a, b in zip(before, kept, strict=True):
        np.testing.assert_array_equal(a, b)
    # TensorFlow adopts a 64-byte aligned numpy buffer rather than copy it: write from
    # one, then change it, and the model must not see the change.
    raw = np.empty(kept[0].nbytes + 64, np.uint8)
    start = -raw.ctypes.data % 64
    aligned = raw[start : start + kept[0].nbytes].view(kept[0].dtype).reshape(kept[0].shape)
    aligned[...] = kept[0]
    access.set([aligned, *kept[1:]])
    aligned[...] = 99.0
    assert not np.any(model.get_weights()[0] == 99.0)
    model.fit(x, x[:, :3], epochs=1, batch_size=16, verbose=0)  # in-place updates
    assert not np.any(aligned != 99.0)  # ... never reach the caller's array


def test_the_model_trains_on_from_written_weights() -> None:
    model = _model()
    access = _access(model)
    x = np.random.default_rng(1).normal(size=(32, 5)).astype(np.float32)
    model.fit(x, x[:, :3], epochs=1, verbose=0)
    start = [np.zeros_like(w) for w in model.get_weights()]
    access.set(start)
    model.fit(x, x[:, :3], epochs=1, verbose=0)
    assert any(np.any(w != 0) for w in access.get())


def test_wrong_count_is_refused() -> None:
    access = _access(_model())
    with pytest.raises(ValueError, match="weight arrays"):
        access.set(access.get()[:-1])
