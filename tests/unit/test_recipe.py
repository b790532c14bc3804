"""The learning-rate recipe: which factor each mode x merge takes, what ``"auto"`` picks
for each optimizer, the warm-up ramp, the settings' checks, and the worker's callback on
a real Keras model."""

from __future__ import annotations

import logging

import keras
import numpy as np
import pytest

from sparkdl import ConfigError, TrainConfig
from sparkdl.contract import keras_io
from sparkdl.contract.plan import FitPlan
from sparkdl.executor.rate import ScaledRate, ShortBatchRate
from sparkdl.sync.recipe import LearningRateRecipe


def _plan(**settings) -> FitPlan:
    return FitPlan.resolve(
        TrainConfig(**settings), num_workers=8, rows=8000, threads=1, service_host="127.0.0.1"
    )


@pytest.mark.parametrize(
    ("mode", "merge", "frequency", "linear"),
    [
        ("synchronous", "average", "epoch", 8.0),
        ("synchronous", "delta", 4, 8.0),  # the round's deltas are averaged
        ("asynchronous", "average", "batch", 8.0),  # each push moves the center 1/8
        ("asynchronous", "delta", "epoch", 8.0),  # deltas are divided by 8
        ("hogwild", "delta", "batch", 8.0),
        ("synchronous", "elastic", "epoch", 9.0),  # the center moves n/(n+1) of a step
        ("hogwild", "elastic", 4, 9.0),
    ],
)
def test_the_factor_is_how_much_farther_one_process_moves(
    mode: str, merge: str, frequency, linear: float
) -> None:
    settings = {"mode": mode, "merge": merge, "frequency": frequency}
    assert _plan(**settings, lr_scaling="linear").lr_recipe.factor == linear
    assert _plan(**settings, lr_scaling="sqrt").lr_recipe.factor == pytest.approx(linear**0.5)
    assert _plan(**settings, lr_scaling=None).lr_recipe == LearningRateRecipe()


def test_deltas_added_in_full_need_no_scaling() -> None:
    downpour = {"mode": "asynchronous", "merge": "delta", "frequency": 4, "delta_scale": 1.0}
    assert _plan(**downpour, lr_scaling="linear").lr_recipe.factor == 1.0


@pytest.mark.parametrize(
    ("optimizer", "expected"),
    [
        (keras.optimizers.SGD(0.1), 8.0),  # linear
        (keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True), 8.0),
        (keras.optimizers.Adam(1e-3), 8.0),  # linear in synchronous rounds
        (keras.optimizers.RMSprop(1e-3), 8.0),
        (keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9)), 1.0),
    ],
    ids=["sgd", "nesterov", "adam", "rmsprop", "schedule"],
)
def test_auto_is_the_default_and_picks_by_the_models_optimizer(optimizer, expected, caplog) -> None:
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=optimizer, loss="mse")
    kind = keras_io.optimizer_kind(model)
    with caplog.at_level(logging.WARNING, logger="sparkdl.sync.recipe"):
        plan = FitPlan.resolve(
            TrainConfig(), num_workers=8, rows=8000, threads=1, service_host="h", optimizer=kind
        )
    assert plan.lr_recipe.factor == pytest.approx(expected)
    # A schedule is left as it is, and the warning names the factor to apply by hand.
    assert ("multiply the schedule's rates by 8" in caplog.text) == (kind == "scheduled")
    plan.lr_recipe.check_model(scheduled=kind == "scheduled")
    # Asynchronous pushes: an adaptive optimizer keeps the square root.
    asynchronous = FitPlan.resolve(
        TrainConfig(mode="asynchronous"),
        num_workers=8,
        rows=8000,
        threads=1,
        service_host="h",
        optimizer=kind,
    )
    want = expected**0.5 if kind == "adaptive" else expected
    assert asynchronous.lr_recipe.factor == pytest.approx(want)


def test_the_warm_up_ramps_from_the_models_rate_to_the_scaled_one() -> None:
    recipe = LearningRateRecipe.resolve("linear", 1.5, lr_factor=4)
    rates = [recipe.rate(0.1, step, steps_per_epoch=10) for step in range(0, 20)]
    assert rates[0] == pytest.approx(0.1)
    assert rates[5] == pytest.approx(0.1 * (1 + 3 * 5 / 15))
    assert (np.diff(rates[:16]) > 0).all()
    assert rates[15:] == [pytest.approx(0.4)] * 5


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"lr_scaling": "cubic"}, "lr_scaling"),
        ({"lr_scaling": "linear", "warmup_epochs": -1}, "warmup_epochs"),
        ({"lr_scaling": "linear", "warmup_epochs": float("nan")}, "warmup_epochs"),
        ({"lr_scaling": "linear", "warmup_epochs": True}, "warmup_epochs"),
        ({"lr_scaling": None, "warmup_epochs": 2}, "set lr_scaling"),
    ],
)
def test_bad_recipe_settings_are_refused(settings, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**settings)


def test_a_schedule_cannot_be_scaled_and_says_what_to_do() -> None:
    recipe = LearningRateRecipe.resolve("linear", 0, lr_factor=4)
    with pytest.raises(ConfigError, match="LearningRateSchedule"):
        recipe.check_model(scheduled=True)
    recipe.check_model(scheduled=False)
    LearningRateRecipe().check_model(scheduled=True)  # no recipe: nothing to scale


def test_the_workers_callback_sets_the_scaled_rate_each_batch_and_rebases() -> None:
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    rate = ScaledRate(LearningRateRecipe(factor=4.0, warmup_epochs=1.0), steps_per_epoch=4)
    seen: list[float] = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda b, logs: seen.append(float(model.optimizer.learning_rate))
    )
    x = np.zeros((16, 2), np.float32)
    model.fit(
        x, x[:, :1], batch_size=2, epochs=1, steps_per_epoch=6, callbacks=[rate, record], verbose=0
    )
    np.testing.assert_allclose(seen, [0.01, 0.0175, 0.025, 0.0325, 0.04, 0.04], rtol=1e-6)
    rate.rebase(0.001)  # ReduceLROnPlateau on the driver lowered the model's rate
    assert float(model.optimizer.learning_rate) == pytest.approx(0.004)


def test_an_epochs_short_last_batch_steps_by_its_share_of_rows() -> None:
    """10 rows in batches of 4: the third batch holds 2 rows and steps at half the rate,
    after the scaled rate of the recipe; the rate is back before the next epoch."""
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    rate = ScaledRate(LearningRateRecipe(factor=4.0), steps_per_epoch=3)
    seen = _rates_seen(model, x=np.ones((10, 1), np.float32), batch_size=4, epochs=2,
                       callbacks=[rate, ShortBatchRate(rows=10, batch_size=4)])  # fmt: skip
    np.testing.assert_allclose(seen, [0.04, 0.04, 0.02] * 2, rtol=1e-6)
    assert float(model.optimizer.learning_rate) == pytest.approx(0.04)


def test_an_epoch_of_one_short_batch_steps_by_its_rows_too() -> None:
    """A partition smaller than a batch, or the rows a resumed epoch has left."""
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    seen = _rates_seen(model, x=np.ones((3, 1), np.float32), batch_size=4, epochs=1,
                       callbacks=[ShortBatchRate(rows=3, batch_size=4)])  # fmt: skip
    np.testing.assert_allclose(seen, [0.0075], rtol=1e-6)


@pytest.mark.parametrize(
    ("rows", "compile_settings", "scheduled"),
    [
        (8, {}, False),  # every batch full
        (10, {"steps_per_execution": 2}, False),  # the short batch shares a call
        (10, {}, True),  # a schedule's rate cannot be set
        (10, {"loss": keras.losses.MeanSquaredError(reduction="sum")}, False),  # summed
    ],
)
def test_the_short_batch_rate_leaves_alone_what_it_cannot_or_need_not_scale(
    rows: int, compile_settings: dict, scheduled: bool
) -> None:
    rate = keras.optimizers.schedules.ExponentialDecay(0.01, 10, 0.9) if scheduled else 0.01
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(rate), **{"loss": "mse", **compile_settings})
    seen = _rates_seen(model, x=np.ones((rows, 1), np.float32), batch_size=4, epochs=1,
                       callbacks=[ShortBatchRate(rows=rows, batch_size=4)])  # fmt: skip
    assert len(seen) >= 2 and max(seen) == pytest.approx(min(seen), rel=0.2), seen


def _rates_seen(model, *, x, batch_size: int, epochs: int, callbacks: list) -> list[float]:  # type: ignore[no-untyped-def]
    """The optimizer's rate at each batch's start, after ``callbacks`` set it."""
    seen: list[float] = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda b, logs: seen.append(float(model.optimizer.learning_rate))
    )
    model.fit(x, x, batch_size=batch_size, epochs=epochs, shuffle=False,
              callbacks=[*callbacks, record], verbose=0)  # fmt: skip
    return seen


def test_a_schedule_under_auto_keeps_textbook_deltas_and_refuses_a_warm_up() -> None:
    """Nothing makes up for divided deltas when "auto" leaves a schedule alone, so they
    are added in full; a warm-up has no rate to ramp."""
    downpour = {"mode": "asynchronous", "merge": "delta", "frequency": 4}
    plan = FitPlan.resolve(
        TrainConfig(**downpour),
        num_workers=4,
        rows=8000,
        threads=1,
        service_host="h",
        optimizer="scheduled",
    )
    assert plan.merge.scale == 1.0 and not plan.lr_recipe.active  # type: ignore[attr-defined]
    warm = FitPlan.resolve(
        TrainConfig(**downpour, warmup_epochs=1),
        num_workers=4,
        rows=8000,
        threads=1,
        service_host="h",
        optimizer="scheduled",
    )
    with pytest.raises(ConfigError, match="warmup_epochs=1 ramps"):
        warm.lr_recipe.check_model(scheduled=True)
    with pytest.raises(ConfigError, match="optimizer kind"):
        FitPlan.resolve(
            TrainConfig(), num_workers=2, rows=80, threads=1, service_host="h", optimizer="lbfgs"
        )


def test_a_callable_rate_is_left_alone_like_a_schedule() -> None:
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(lambda: 0.1), loss="mse")
    assert keras_io.optimizer_kind(model) == "scheduled"


def test_a_merge_that_does_not_say_is_not_scaled() -> None:
    from sparkdl.sync.merges import Merge

    assert Merge.lr_factor(object(), 8, False) == 1.0  # type: ignore[arg-type]
