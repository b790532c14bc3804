"""LARS against the update rule of its paper (You, Gitman and Ginsburg 2017, Algorithm 1),
and LARS and LAMB through a Keras save and load (what ships a model to executors)."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from sparkdl.optimizers import LARS


def _paper(w, grads, *, gamma, m, beta, eta, adapt=True):
    """Algorithm 1, in numpy, for one layer."""
    w, v = w.astype(np.float64), np.zeros_like(w, dtype=np.float64)
    for g in grads:
        g = g.astype(np.float64)
        w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
        local = eta * w_norm / (g_norm + beta * w_norm) if adapt and w_norm > 0 else 1.0
        v = m * v + gamma * local * (g + beta * w)
        w = w - v
    return w


@pytest.mark.parametrize("beta", [0.0, 5e-4])
def test_lars_follows_algorithm_1_of_the_paper(beta: float) -> None:
    rng = np.random.default_rng(0)
    kernel = rng.normal(size=(6, 4)).astype(np.float32)
    bias = np.zeros(4, np.float32)
    steps = [(rng.normal(size=(6, 4)), rng.normal(size=4)) for _ in range(5)]
    opt = LARS(learning_rate=2.0, momentum=0.9, weight_decay=beta, trust_coefficient=0.01)
    variables = [keras.Variable(kernel), keras.Variable(bias)]
    for g_kernel, g_bias in steps:
        opt.apply_gradients(
            [(g_kernel.astype(np.float32), variables[0]), (g_bias.astype(np.float32), variables[1])]
        )
    want_kernel = _paper(kernel, [s[0] for s in steps], gamma=2.0, m=0.9, beta=beta, eta=0.01)
    # A bias (1-D) is not adapted: plain momentum SGD with the decay.
    want_bias = _paper(
        bias, [s[1] for s in steps], gamma=2.0, m=0.9, beta=beta, eta=0.01, adapt=False
    )
    np.testing.assert_allclose(variables[0].numpy(), want_kernel, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(variables[1].numpy(), want_bias, rtol=1e-5, atol=1e-6)
    # The layer-wise rate is what moved the kernel: plain momentum SGD at the same rate
    # ends elsewhere.
    plain = _paper(
        kernel, [s[0] for s in steps], gamma=2.0, m=0.9, beta=beta, eta=0.01, adapt=False
    )
    assert np.abs(plain - want_kernel).max() > 1.0


def test_lars_adapts_vectors_when_asked_and_moves_zero_weights() -> None:
    rng = np.random.default_rng(1)
    bias = rng.normal(size=5).astype(np.float32)
    grads = [rng.normal(size=5) for _ in range(3)]
    opt = LARS(learning_rate=1.0, momentum=0.5, trust_coefficient=0.02, adapt_vectors=True)
    variable = keras.Variable(bias)
    for g in grads:
        opt.apply_gradients([(g.astype(np.float32), variable)])
    want = _paper(bias, grads, gamma=1.0, m=0.5, beta=0.0, eta=0.02)
    np.testing.assert_allclose(variable.numpy(), want, rtol=1e-5, atol=1e-6)
    # A kernel of zeros has no norm to scale by: it takes a plain step (lambda = 1).
    zeros = keras.Variable(np.zeros((2, 2), np.float32))
    LARS(learning_rate=0.1, momentum=0.0).apply_gradients([(np.ones((2, 2), np.float32), zeros)])
    np.testing.assert_allclose(zeros.numpy(), -0.1)


def test_lars_refuses_bad_settings() -> None:
    with pytest.raises(ValueError, match="momentum"):
        LARS(momentum=1.0)
    with pytest.raises(ValueError, match="trust_coefficient"):
        LARS(trust_coefficient=0.0)


@pytest.mark.parametrize(
    "optimizer",
    [
        lambda: LARS(learning_rate=1.5, momentum=0.8, weight_decay=1e-4, trust_coefficient=0.002),
        lambda: keras.optimizers.Lamb(learning_rate=2e-3, weight_decay=0.01),
    ],
    ids=["lars", "lamb"],
)
def test_a_model_compiled_with_a_layer_wise_optimizer_saves_and_loads(tmp_path, optimizer) -> None:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    model.compile(optimizer=optimizer(), loss="mse")
    x = np.random.default_rng(2).normal(size=(64, 3)).astype(np.float32)
    model.fit(x, x.sum(axis=1), epochs=2, verbose=0)
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded.optimizer) is type(model.optimizer)
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-6)
