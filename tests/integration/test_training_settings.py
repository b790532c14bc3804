"""Keras's training settings are honoured as in ``model.fit``, or refused on the driver
naming the setting. Real Spark (local[2]) and TensorFlow on digits."""

from __future__ import annotations

import keras
import pytest

from examples.digits import digits_arrays
from sparkdl import ConfigError, KerasEstimator

pytestmark = [pytest.mark.spark]


def _model(optimizer: keras.optimizers.Optimizer, **compile_kwargs: object) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(32, "relu"), keras.layers.Dense(10, "softmax")]
    )
    model.compile(
        optimizer, "sparse_categorical_crossentropy", metrics=["accuracy"], **compile_kwargs
    )
    return model


def _accuracy(model: keras.Model) -> float:
    _, x_test, _, y_test = digits_arrays()
    return float((model.predict(x_test, verbose=0).argmax(axis=1) == y_test).mean())


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_steps_per_execution_jit_compile_and_clipping_train(digits) -> None:
    train_df = digits[0]
    model = _model(
        keras.optimizers.Adam(0.003, clipnorm=1.0), steps_per_execution=4, jit_compile=True
    )
    fitted = KerasEstimator(
        model=model, mode="asynchronous", frequency="batch", num_workers=2, epochs=6, seed=0
    ).fit(train_df)
    trained = fitted.get_model()
    config = trained.get_compile_config()
    assert config["steps_per_execution"] == 4 and config["jit_compile"] is True
    assert trained.optimizer.clipnorm == 1.0
    assert _accuracy(trained) >= 0.9
    assert fitted.history["loss"][-1] < fitted.history["loss"][0]


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_a_learning_rate_schedule_counts_steps_across_syncs_and_resumes(digits, tmp_path) -> None:
    train_df = digits[0]
    x_train, _, y_train, _ = digits_arrays()
    steps = -(-len(x_train) // 32)  # one worker takes plain Keras's steps per epoch

    def schedule() -> keras.optimizers.schedules.LearningRateSchedule:
        return keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=20, decay_rate=0.8)

    plain = _model(keras.optimizers.SGD(schedule()))
    plain.fit(x_train, y_train, epochs=4, batch_size=32, verbose=0)
    settings = {"mode": "synchronous", "num_workers": 1, "batch_size": 32, "seed": 0}
    first = KerasEstimator(
        model=_model(keras.optimizers.SGD(schedule())),
        epochs=2,
        checkpoint_dir=str(tmp_path),
        **settings,
    ).fit(train_df)
    assert first.fit_report["workers"][0]["optimizer_steps"] == 2 * steps
    resumed = KerasEstimator(
        model=_model(keras.optimizers.SGD(schedule())),
        epochs=4,
        checkpoint_dir=str(tmp_path),
        resume=True,
        **settings,
    ).fit(train_df)
    report = resumed.fit_report["workers"][0]
    # The schedule went on from the checkpoint's step, as plain Keras's did in one fit.
    assert report["optimizer_steps"] == 4 * steps == int(plain.optimizer.iterations.numpy())
    expected_rate = float(schedule()(4 * steps))
    assert report["learning_rate"] == pytest.approx(expected_rate, rel=1e-5)
    assert int(resumed.get_model().optimizer.iterations.numpy()) == 4 * steps
    assert abs(_accuracy(resumed.get_model()) - _accuracy(plain)) < 0.05


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_gradient_accumulation_trains_and_a_pretrained_count_goes_on(digits) -> None:
    train_df = digits[0]
    accumulating = KerasEstimator(
        model=_model(keras.optimizers.Adam(0.003, gradient_accumulation_steps=2)),
        num_workers=2,
        epochs=3,
        seed=0,
    ).fit(train_df)
    assert accumulating.history["loss"][-1] < accumulating.history["loss"][0]
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=20, decay_rate=0.8)
    pretrained = _model(keras.optimizers.SGD(schedule))
    pretrained.optimizer.iterations.assign(100)  # as after an earlier model.fit
    fitted = KerasEstimator(
        model=pretrained, mode="synchronous", num_workers=1, epochs=1, batch_size=32
    ).fit(train_df)
    steps = -(-len(digits_arrays()[0]) // 32)
    assert fitted.fit_report["workers"][0]["optimizer_steps"] == 100 + steps


def test_settings_a_distributed_fit_cannot_honour_are_refused_by_name(digits) -> None:
    train_df = digits[0]
    with pytest.raises(ConfigError, match="use_ema"):
        KerasEstimator(model=_model(keras.optimizers.Adam(use_ema=True))).fit(train_df)
    for name in ("validation_freq", "initial_epoch"):
        with pytest.raises(ConfigError, match=f"Unknown setting '{name}'"):
            KerasEstimator(model=_model(keras.optimizers.Adam()), **{name: 2})


@pytest.mark.compat
def test_a_lars_model_trains_with_the_recipe_and_keeps_the_users_rate(digits) -> None:
    """sparkdl.LARS reaches the executors (registered on import); ``lr_scaling`` makes
    the workers train at the scaled rate while the fitted model keeps the user's."""
    from sparkdl import LARS

    fitted = KerasEstimator(
        model=_model(LARS(0.5, momentum=0.9, trust_coefficient=0.01)),
        mode="synchronous",
        frequency="batch",
        num_workers=2,
        epochs=4,
        batch_size=32,
        seed=0,
        lr_scaling="sqrt",
        warmup_epochs=0.5,
    ).fit(digits[0])
    trained = fitted.get_model()
    assert type(trained.optimizer) is LARS
    assert trained.optimizer.get_config()["trust_coefficient"] == 0.01
    assert float(trained.optimizer.learning_rate) == pytest.approx(0.5)
    for worker in fitted.fit_report["workers"]:
        assert worker["learning_rate"] == pytest.approx(0.5 * 2**0.5, rel=1e-6)
    assert _accuracy(trained) >= 0.9


def test_a_schedule_is_not_scaled_behind_the_users_back(digits) -> None:
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=20, decay_rate=0.8)
    estimator = KerasEstimator(
        model=_model(keras.optimizers.SGD(schedule)), num_workers=2, lr_scaling="linear"
    )
    with pytest.raises(ConfigError, match=r"LearningRateSchedule.*factor yourself \(2 here\)"):
        estimator.fit(digits[0])
