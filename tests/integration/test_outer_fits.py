"""Fits with an outer optimizer on the service (``outer_optimizer``, issue SlowMo /
DiLoCo): real Spark local[2], TensorFlow and HTTP. The steps themselves are checked
against a reference in tests/unit/test_outer.py."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from examples.digits import accuracy, digits_model
from sparkdl import KerasEstimator
from sparkdl.server.state import checkpoints

pytestmark = [pytest.mark.spark]

#: The modes and merges an outer optimizer works with.
OUTER_COMBINATIONS = [
    (mode, merge)
    for mode in ("synchronous", "asynchronous", "hogwild")
    for merge in ("average", "delta")
]


def fit(train_df, **settings):  # type: ignore[no-untyped-def]
    settings = {"num_workers": 2, "epochs": 3, "seed": 0, "frequency": 4, **settings}
    return KerasEstimator(model=digits_model(), **settings).fit(train_df)


def same_weights(a, b) -> None:  # type: ignore[no-untyped-def]
    for x, y in zip(a.get_model().get_weights(), b.get_model().get_weights(), strict=True):
        np.testing.assert_array_equal(x, y)


def resumes_differ_without_the_state(train_df, directory, saved, settings) -> None:  # type: ignore[no-untyped-def]
    """A resume from ``saved`` (epoch 2 of ``directory``) to epoch 3 takes its outer
    state: the same resume without it (a checkpoint of the older format) ends with other
    weights after the same first two epochs' history."""
    resumed = fit(train_df, epochs=3, resume=True, **settings)
    os.remove(os.path.join(saved.path, "outer.sdlw"))
    state_file = os.path.join(saved.path, "state.json")
    with open(state_file) as f:
        state = json.load(f)
    del state["outer_pushes"]
    with open(state_file, "w") as f:
        json.dump(state, f)
    for path in os.listdir(directory):  # only epoch 2's checkpoint stays
        if path != os.path.basename(saved.path):
            shutil.rmtree(os.path.join(directory, path))
    fresh = fit(train_df, epochs=3, resume=True, **settings)
    assert resumed.history["loss"][:2] == fresh.history["loss"][:2]
    assert any(
        not np.array_equal(a, b)
        for a, b in zip(
            resumed.get_model().get_weights(), fresh.get_model().get_weights(), strict=True
        )
    )


def test_sgd_at_rate_1_without_momentum_gives_todays_weights(digits) -> None:
    train_df, _, _ = digits
    today = fit(train_df)
    identity = fit(train_df, outer_optimizer="sgd", outer_learning_rate=1.0, outer_momentum=0.0)
    same_weights(today, identity)
    assert identity.history == today.history
    assert identity.fit_report["resolved"]["outer optimizer"].startswith("sgd, learning rate 1")


@pytest.mark.slow
def test_shards_keep_the_outer_state_apart_and_give_one_services_weights(digits) -> None:
    train_df, _, _ = digits
    settings = {"outer_optimizer": "nesterov", "frequency": 8}
    one = fit(train_df, **settings)
    two = fit(train_df, service_shards=2, **settings)
    same_weights(one, two)  # the outer step is element by element, as the merge


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "merge"),
    [
        # The outer optimizer's state and steps on every backend (the compatibility
        # subset): the synchronous fits, which are deterministic; the asynchronous and
        # hogwild ones vary with the threads' timing (0.872 once on PyTorch).
        pytest.param(mode, merge, marks=[pytest.mark.compat] if mode == "synchronous" else [])
        for mode, merge in OUTER_COMBINATIONS
    ],
)
def test_diloco_defaults_reach_accuracy_in_every_mode(digits, mode, merge) -> None:
    """DiLoCo's outer Nesterov (0.7, 0.9) with a sync every 16 batches.

    Synchronous fits are deterministic. The asynchronous and hogwild ones vary with the
    threads' timing: 0.947 to 0.975 in hand runs; in CI runs on 2 cores hogwild reached
    0.914 once (delta) and 0.894 once (average, at e8619a4), so hogwild's bar is 0.88 and
    asynchronous's 0.90 (plain Keras: about 0.97).
    """
    train_df, _, (_, x_test, _, y_test) = digits
    fitted = fit(
        train_df, mode=mode, merge=merge, epochs=20, frequency=16, outer_optimizer="nesterov"
    )
    bar = {"synchronous": 0.93, "hogwild": 0.88}.get(mode, 0.90)
    assert accuracy(fitted.get_model(), x_test, y_test) >= bar


@pytest.mark.slow
def test_checkpoints_carry_the_outer_state_and_a_resume_uses_it(digits, tmp_path) -> None:
    train_df, _, _ = digits
    directory = str(tmp_path / "checkpoints")
    settings = {"outer_optimizer": "nesterov", "checkpoint_dir": directory}
    fit(train_df, epochs=2, **settings)
    saved = checkpoints.latest(directory)
    assert saved is not None and saved.epoch == 2 and saved.outer is not None
    momentum = saved.outer[0][: len(saved.weights)]
    assert any(np.abs(m).max() > 0 for m in momentum)  # a real state, not zeros
    resumes_differ_without_the_state(train_df, directory, saved, settings)


def test_an_outer_state_of_another_model_is_refused_with_the_fix(digits, tmp_path) -> None:
    from sparkdl.errors import ConfigError

    train_df, _, _ = digits
    directory = str(tmp_path / "checkpoints")
    weights = digits_model().get_weights()
    wrong = ([np.zeros(3, np.float32)] * (2 * len(weights)), 4)
    checkpoints.write(directory, 1, weights, {"loss": [1.0]}, {}, 1, outer=wrong)
    with pytest.raises(ConfigError, match="outer optimizer state does not match"):
        fit(train_df, epochs=2, resume=True, checkpoint_dir=directory, outer_optimizer="nesterov")


@pytest.mark.slow
@pytest.mark.compat
def test_the_models_own_optimizer_steps_the_center_like_one_process_at_the_global_batch(
    digits,
) -> None:
    """outer_optimizer="model": Adam steps the center once per round on the round's mean
    gradient, so the fit ends where plain Keras does at twice the batch and twice the
    rate (the same rows, other shuffles: within 1.5 points)."""
    import keras

    train_df, _, (x_train, x_test, y_train, y_test) = digits
    fitted = KerasEstimator(
        model=digits_model(),
        num_workers=2,
        epochs=12,
        seed=0,
        outer_optimizer="model",
        frequency="batch",
    ).fit(train_df)
    resolved = fitted.fit_report["resolved"]
    assert resolved["outer optimizer"].startswith("the model's Adam on each round's mean")
    assert resolved["learning rate"].startswith("the service's optimizer steps at 0.006")
    one = digits_model()
    one.optimizer.learning_rate = 0.006
    one.fit(x_train, y_train, batch_size=64, epochs=12, verbose=0)
    reached, plain = accuracy(fitted.get_model(), x_test, y_test), accuracy(one, x_test, y_test)
    assert reached >= 0.95 and reached >= plain - 0.015, (reached, plain)
    # The fitted model keeps the user's optimizer and rate, not the workers' SGD.
    optimizer = fitted.get_model().optimizer
    assert isinstance(optimizer, keras.optimizers.Adam)
    assert float(np.asarray(optimizer.learning_rate)) == pytest.approx(0.003)


@pytest.mark.slow
def test_the_models_optimizer_state_is_checkpointed_and_a_resume_goes_on_from_it(
    digits, tmp_path
) -> None:
    """The checkpoint holds the service's Adam (step count and moments); a resume takes
    it, and without it the resumed fit ends elsewhere."""
    train_df, _, _ = digits
    directory = str(tmp_path / "checkpoints")
    settings = {
        "outer_optimizer": "model",
        "frequency": "batch",
        "checkpoint_dir": directory,
    }
    fit(train_df, epochs=2, **settings)
    saved = checkpoints.latest(directory)
    assert saved is not None and saved.epoch == 2 and saved.outer is not None
    steps = int(np.asarray(saved.outer[0][0]))  # Adam's step count comes first
    assert steps == 2 * 23, steps  # 2 epochs of 23 rounds (719 rows, batches of 32)
    resumes_differ_without_the_state(train_df, directory, saved, settings)


@pytest.mark.slow
def test_a_model_trained_before_goes_on_from_its_optimizers_state(digits, tmp_path) -> None:
    """As model.fit would: the service's Adam starts from the step count and moments
    the model's optimizer holds (45 steps of plain Keras), not from zero."""
    train_df, _, (x_train, _, y_train, _) = digits
    model = digits_model()
    model.fit(x_train, y_train, batch_size=32, epochs=1, verbose=0)  # 45 steps
    directory = str(tmp_path / "checkpoints")
    KerasEstimator(
        model=model,
        num_workers=2,
        epochs=1,
        seed=0,
        outer_optimizer="model",
        frequency="batch",
        checkpoint_dir=directory,
    ).fit(train_df)
    saved = checkpoints.latest(directory)
    assert saved is not None and saved.outer is not None
    assert int(np.asarray(saved.outer[0][0])) == 45 + 23  # and one epoch of 23 rounds
