"""``outer_optimizer="model"``: the service steps the center with the model's compiled
Keras optimizer on each synchronous round's mean gradient (:mod:`sparkdl.sync.outer`),
checked against the same optimizer applied in one process; its settings, its plan, its
refused steps and its saved state."""

from __future__ import annotations

import dataclasses
import json

import keras
import numpy as np
import pytest

from sparkdl.config import TrainConfig
from sparkdl.contract import keras_io
from sparkdl.contract.backends import compiled
from sparkdl.contract.plan import FitPlan
from sparkdl.errors import ConfigError
from sparkdl.sync.outer import ModelOptimizerState, OuterOptimizer


def model_outer(optimizer: keras.optimizers.Optimizer, factor: float = 1.0) -> OuterOptimizer:
    """The plan's resolution for a model of one Dense layer and a BatchNormalization."""
    net = keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(2), keras.layers.BatchNormalization()]
    )
    net.compile(optimizer=optimizer, loss="mse")
    return OuterOptimizer("model", 1.0, 0.0).of_model(
        keras_io.optimizer_config(net), keras_io.trainable_flags(net), factor
    )


def center() -> list[np.ndarray]:
    # Dense kernel and bias, BatchNormalization's gamma and beta (trainable), then its
    # moving mean and variance (not trainable).
    rng = np.random.default_rng(0)
    return [rng.normal(size=s).astype(np.float32) for s in [(3, 2), (2,), (2,), (2,), (2,), (2,)]]


def one_process(optimizer: keras.optimizers.Optimizer, start, gradients):  # type: ignore[no-untyped-def]
    """The same optimizer stepping variables in one process, one step per gradient."""
    variables = [keras.Variable(w) for w in start]
    for grads in gradients:
        optimizer.apply([np.asarray(g) for g in grads], variables)
    return [np.array(v) for v in variables]


@pytest.mark.parametrize(
    "make",
    [
        lambda: keras.optimizers.Adam(0.01),
        lambda: keras.optimizers.RMSprop(0.01, momentum=0.5),
        lambda: keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
        lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1, clipnorm=0.5),
    ],
)
@pytest.mark.parametrize("compile", [None, compiled], ids=["eager", "compiled"])
def test_each_round_is_one_step_of_the_compiled_optimizer_on_the_mean_gradient(
    make, compile
) -> None:
    outer = model_outer(make())
    c = center()
    state = outer.state(c, num_workers=2, compile=compile)
    rng = np.random.default_rng(1)
    trainable, steps = c[:4], []
    for _ in range(3):
        grads = [rng.normal(size=w.shape).astype(np.float32) for w in trainable]
        moved = [rng.normal(size=w.shape).astype(np.float32) for w in c[4:]]
        # The workers stepped with SGD at rate 1: the merge gives center - gradient.
        merged = [w - g for w, g in zip(trainable, grads, strict=True)] + moved
        c = state.round(c, merged)
        steps.append(grads)
        # Moving statistics take the merge's result; the optimizer never touches them.
        for got, want in zip(c[4:], moved, strict=True):
            np.testing.assert_array_equal(got, want)
        trainable = c[:4]
    expected = one_process(make(), center()[:4], steps)
    for got, want in zip(c[:4], expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_rate_is_the_compiled_one_times_the_recipes_factor_and_follows_the_driver() -> None:
    outer = model_outer(keras.optimizers.SGD(0.1), factor=4.0)
    c = center()
    state = outer.state(c, num_workers=4)
    ones = [np.ones_like(w) for w in c]
    merged = [w - g for w, g in zip(c, ones, strict=True)]
    after = state.round(c, merged)
    np.testing.assert_allclose(after[0], c[0] - 0.4, rtol=1e-6)  # 0.1 x 4
    state.set_learning_rate(0.01)  # ReduceLROnPlateau on the driver
    merged = [w - g for w, g in zip(after, ones, strict=True)]
    again = state.round(after, merged)
    np.testing.assert_allclose(again[0], after[0] - 0.04, rtol=1e-5)


def test_a_refused_round_leaves_the_optimizer_as_it_was() -> None:
    state = model_outer(keras.optimizers.Adam(0.01)).state(center(), num_workers=2)
    before = state.arrays()

    def refuse(_: list[np.ndarray]) -> None:
        raise OverflowError("refused")

    c = center()
    with pytest.raises(OverflowError):
        state.round(c, [w - 1 for w in c], refuse)
    for got, want in zip(state.arrays(), before, strict=True):
        np.testing.assert_array_equal(got, want)


def test_the_saved_state_resumes_the_same_steps_and_another_models_is_refused() -> None:
    outer = model_outer(keras.optimizers.Adam(0.01))
    c = center()
    first = outer.state(c, num_workers=2)
    merged = [w - 0.5 for w in c]
    c1 = first.round(c, merged)
    saved, pushes = first.snapshot()
    assert [tuple(a.shape) for a in saved] == outer.state_shapes(c)
    resumed = outer.state(c1, num_workers=2, arrays=saved, pushes=pushes)
    merged = [w - 0.25 for w in c1]
    for a, b in zip(first.round(c1, merged), resumed.round(c1, merged), strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="does not match the model's weights"):
        outer.state(c, num_workers=2, arrays=saved[:-1])


def test_a_scheduled_rate_runs_on_the_services_steps_unscaled() -> None:
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
    outer = model_outer(keras.optimizers.SGD(schedule), factor=2.0)
    c = center()
    state = outer.state(c, num_workers=2)
    c1 = state.round(c, [w - 1 for w in c])
    c2 = state.round(c1, [w - 1 for w in c1])
    np.testing.assert_allclose(c[0] - c1[0], 0.1, rtol=1e-5)
    np.testing.assert_allclose(c1[0] - c2[0], 0.05, rtol=1e-5)


@pytest.mark.parametrize(
    ("settings", "message", "fix"),
    [
        (
            {"mode": "asynchronous", "frequency": "batch"},
            "Set mode='synchronous'",
            {"frequency": "batch"},
        ),
        ({}, "Set frequency='batch'", {"frequency": "batch"}),
        ({"frequency": 4}, "Set frequency='batch'", {"frequency": 1}),
        (
            {"frequency": "batch", "outer_learning_rate": 0.5},
            "Drop outer_learning_rate",
            {"frequency": "batch"},
        ),
        (
            {"frequency": "batch", "sync_fragments": 2},
            "Drop sync_fragments",
            {"frequency": "batch"},
        ),
        (
            {"frequency": "batch", "warmup_epochs": 1.0},
            "Drop warmup_epochs",
            {"frequency": "batch"},
        ),
        (
            {"frequency": "batch", "service_shards": 2},
            "Drop service_shards",
            {"frequency": "batch"},
        ),
    ],
)
def test_settings_it_cannot_take_are_refused_with_a_fix_that_works(settings, message, fix) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainConfig(outer_optimizer="model", **settings)
    TrainConfig(outer_optimizer="model", **fix)


def test_the_plan_moves_the_recipes_factor_to_the_service_and_says_so() -> None:
    net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    net.compile(optimizer=keras.optimizers.Adam(0.001), loss="mse")
    plan = FitPlan.resolve(
        TrainConfig(outer_optimizer="model", frequency="batch"),
        num_workers=4,
        rows=1000,
        threads=1,
        service_host="127.0.0.1",
        optimizer="adaptive",
        optimizer_config=keras_io.optimizer_config(net),
        trainable=keras_io.trainable_flags(net),
    )
    assert plan.outer is not None and plan.outer.steps_model
    assert plan.outer.rate_factor == 4.0 and plan.outer.trainable == (True, True)
    assert json.loads(plan.outer.config)["class_name"] == "Adam"
    lines = plan.describe(0.001)
    assert lines["learning rate"].startswith("the service's optimizer steps at 0.004")
    assert "workers take plain gradient steps (SGD, rate 1)" in lines["learning rate"]
    assert lines["outer optimizer"].startswith("the model's Adam on each round's mean gradient")
    assert isinstance(
        plan.outer.state([w.numpy() for w in net.weights], num_workers=4), ModelOptimizerState
    )


def test_a_store_steps_with_the_model_optimizer_and_a_failing_step_aborts_the_fit() -> None:
    """Through a real store: a round's result is one compiled SGD step on the mean of the
    workers' gradients; a step that raises aborts the fit with its cause (no worker waits
    for a round that will never merge)."""
    from sparkdl.server.state.errors import StoreError
    from sparkdl.server.state.store import WeightStore
    from sparkdl.sync.merges import Average
    from tests.stores import joined

    net = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False)])
    net.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    outer = OuterOptimizer("model", 1.0, 0.0).of_model(
        keras_io.optimizer_config(net), keras_io.trainable_flags(net), 1.0
    )
    start = [np.zeros((2, 1), np.float32)]
    store = joined(WeightStore(start, num_workers=2, merge=Average(), outer=outer))

    def push_round(version: int, grads: tuple[float, float]) -> None:
        for w in (0, 1):  # each worker stepped with SGD at rate 1: center - gradient
            moved = store.weights()[0] - grads[w]
            store.push(
                w,
                seq=version + 1,
                attempt=0,
                base_version=version,
                arrays=[moved],
                samples=5,
                meta={},
            )

    push_round(0, (1.0, 3.0))  # mean gradient 2, at rate 0.5: -1
    np.testing.assert_allclose(store.weights()[0], np.full((2, 1), -1.0))
    store.set_learning_rate(0.25)  # ReduceLROnPlateau on the driver: the service's rate
    push_round(1, (2.0, 2.0))  # mean gradient 2, at rate 0.25: -0.5
    np.testing.assert_allclose(store.weights()[0], np.full((2, 1), -1.5))
    assert store.outer is not None

    def fail(bases, grads):  # type: ignore[no-untyped-def]
        raise RuntimeError("no such op")

    store.outer._step = fail  # type: ignore[attr-defined]
    with pytest.raises(StoreError, match="outer optimizer failed to step: RuntimeError"):
        push_round(2, (1.0, 1.0))
    assert "no such op" in str(store.status().get("aborted"))
    np.testing.assert_allclose(store.weights()[0], np.full((2, 1), -1.5))


def test_models_it_cannot_step_are_refused_on_the_driver_with_a_fix_that_works() -> None:
    def net(**dense):  # type: ignore[no-untyped-def]
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, **dense)])
        return model

    several = net()
    several.compile(optimizer="adam", loss="mse", steps_per_execution=2)
    with pytest.raises(ConfigError, match="Compile with steps_per_execution=1"):
        keras_io.check_model_outer(several, keras_io.optimizer_config(several))
    several.compile(optimizer="adam", loss="mse", steps_per_execution=1)
    keras_io.check_model_outer(several, keras_io.optimizer_config(several))

    constrained = net(kernel_constraint=keras.constraints.NonNeg())
    constrained.compile(optimizer="adam", loss="mse")
    with pytest.raises(ConfigError, match="Drop the constraint"):
        keras_io.check_model_outer(constrained, keras_io.optimizer_config(constrained))
    plain = net()
    plain.compile(optimizer="adam", loss="mse")
    keras_io.check_model_outer(plain, keras_io.optimizer_config(plain))


@keras.saving.register_keras_serializable(package="sparkdl_tests")
class RegisteredAdam(keras.optimizers.Adam):
    pass


def test_an_optimizer_class_keras_cannot_rebuild_is_refused_and_registering_it_works() -> None:
    class UnregisteredAdam(keras.optimizers.Adam):  # not found by its module's name
        pass

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=UnregisteredAdam(0.01), loss="mse")
    with pytest.raises(ConfigError, match="register_keras_serializable"):
        keras_io.check_model_outer(model, keras_io.optimizer_config(model))
    model.compile(optimizer=RegisteredAdam(0.01), loss="mse")
    config = keras_io.optimizer_config(model)
    keras_io.check_model_outer(model, config)
    outer = OuterOptimizer("model", 1.0, 0.0).of_model(config, keras_io.trainable_flags(model), 1.0)
    state = outer.state([w.numpy() for w in model.weights], num_workers=2)
    assert type(state._keras).__name__ == "RegisteredAdam"  # type: ignore[attr-defined]


def test_a_round_of_no_change_takes_no_step_as_keras_skips_an_overflowed_one() -> None:
    state = model_outer(keras.optimizers.Adam(0.01)).state(center(), num_workers=2)
    c = center()
    c1 = state.round(c, [w - 0.5 for w in c])
    before = state.arrays()
    same = state.round(c1, list(c1))  # every worker's loss scale skipped its step
    for got, want in zip(same, c1, strict=True):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(state.arrays(), before, strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_loss_scale_factor_is_not_undone_on_the_service() -> None:
    scaled = model_outer(keras.optimizers.SGD(0.1, loss_scale_factor=128.0))
    c = center()
    after = scaled.state(c, num_workers=2).round(c, [w - 1 for w in c])
    np.testing.assert_allclose(after[0], c[0] - 0.1, rtol=1e-5)


def test_a_restored_state_steps_at_the_compiled_rate_times_this_fits_factor() -> None:
    two = model_outer(keras.optimizers.SGD(0.1), factor=2.0)
    c = center()
    saved = two.state(c, num_workers=2).arrays()  # its rate variable holds 0.2
    four = model_outer(keras.optimizers.SGD(0.1), factor=4.0)
    after = four.state(c, num_workers=4, arrays=saved).round(c, [w - 1 for w in c])
    np.testing.assert_allclose(after[0], c[0] - 0.4, rtol=1e-5)


def test_validation_sees_the_center_and_training_goes_on_from_the_local_weights() -> None:
    """The epoch's closing round comes after Keras validates, when the local weights are
    the center less the last batch's raw gradient: the callback validates the center."""
    from sparkdl.executor.callback import SyncCallback

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    local = [np.ones_like(w) for w in model.get_weights()]
    model.set_weights(local)

    class Center:  # the one attribute validation reads from the worker's pusher
        center = [np.zeros_like(w) for w in local]

    sync = SyncCallback(Center(), None, service_rate=True)  # type: ignore[arg-type]
    sync.set_model(model)
    sync.on_test_begin()
    assert all(not np.any(w) for w in model.get_weights())
    sync.on_test_end()
    for got, want in zip(model.get_weights(), local, strict=True):
        np.testing.assert_array_equal(got, want)


def _muon_model() -> keras.Model:
    """An embedding, a hidden and an output layer, compiled with Muon leaving the
    output layer (and, by default, embeddings) to its AdamW."""
    keras.utils.set_random_seed(0)
    net = keras.Sequential(
        [
            keras.Input((4,), dtype="int32"),
            keras.layers.Embedding(10, 3),
            keras.layers.Flatten(),
            keras.layers.Dense(5, name="hidden"),
            keras.layers.Dense(2, name="out"),
        ]
    )
    net.compile(optimizer=keras.optimizers.Muon(0.05, exclude_layers=["out"]), loss="mse")
    return net


@pytest.mark.parametrize("compile", [None, compiled], ids=["eager", "compiled"])
def test_an_optimizer_that_treats_weights_by_layer_sees_the_models_weight_paths(
    compile,
) -> None:
    """Muon steps 2-D kernels by its orthogonalised update and leaves embeddings and
    the layers of ``exclude_layers`` to AdamW, by each weight's path. The service's
    copies of the weights carry the model's paths, so each weight gets the update it
    gets in ``model.fit``; with copies named otherwise (as before) the embedding and
    the output kernel took Muon's update."""
    net = _muon_model()
    flags, paths = keras_io.trainable_flags(net), keras_io.weight_paths(net)
    assert paths[0].endswith("embeddings") and paths[3].endswith("out/kernel"), paths
    start = [np.asarray(w) for w in net.get_weights()]
    rng = np.random.default_rng(3)
    steps = [[rng.normal(size=w.shape).astype(np.float32) for w in start] for _ in range(3)]

    def rounds(outer: OuterOptimizer) -> list[np.ndarray]:
        state, c = outer.state(start, num_workers=2, compile=compile), list(start)
        for grads in steps:
            c = state.round(c, [w - g for w, g in zip(c, grads, strict=True)])
        return c

    config = keras_io.optimizer_config(net)
    model = OuterOptimizer("model", 1.0, 0.0)
    got = rounds(model.of_model(config, flags, 1.0, paths))
    reference = _muon_model()  # the compiled optimizer on the model's own variables
    for grads in steps:
        reference.optimizer.apply([np.asarray(g) for g in grads], reference.trainable_variables)
    for mine, want in zip(got, reference.get_weights(), strict=True):
        np.testing.assert_allclose(mine, want, rtol=1e-5, atol=1e-6)
    unnamed = rounds(model.of_model(config, flags, 1.0))  # copies named weight_i
    assert not np.allclose(unnamed[0], got[0])  # the embedding took Muon's step
    assert not np.allclose(unnamed[3], got[3])  # and so did the excluded output kernel


@pytest.mark.parametrize("written", ["nesterov", "model"])
def test_a_checkpoint_of_another_outer_optimizer_is_refused_naming_the_one_to_resume_with(
    tmp_path, written
) -> None:
    """A checkpoint holds its outer optimizer's state (Nesterov's momentum, or the
    model's optimizer variables): resumed under another outer optimizer (or none), that
    state cannot apply, and the message names the setting to resume with, which works."""
    from sparkdl.estimator import _checkpoint_to_resume
    from sparkdl.server.state import checkpoints

    weights = [np.zeros((3, 2), np.float32), np.zeros(2, np.float32)]
    saved = TrainConfig(
        checkpoint_dir=str(tmp_path), outer_optimizer=written, frequency="batch", epochs=4
    )
    checkpoints.write(
        str(tmp_path),
        2,
        weights,
        {"loss": [1.0, 0.5]},
        saved.to_dict(),
        keep=3,
        outer=([np.zeros((3, 2), np.float32)], 46),
    )
    other = "model" if written == "nesterov" else "nesterov"
    config = dataclasses.replace(saved, outer_optimizer=other, resume=True)
    with pytest.raises(ConfigError, match=f"resume with outer_optimizer='{written}'"):
        _checkpoint_to_resume(config)
    # Without an outer optimizer the fit goes on without the state (the fit logs it).
    assert _checkpoint_to_resume(dataclasses.replace(saved, outer_optimizer=None, resume=True))
    fixed = _checkpoint_to_resume(dataclasses.replace(saved, resume=True))
    assert fixed is not None and fixed.epoch == 2 and fixed.outer is not None
    assert fixed.outer[1] == 46


def test_a_weights_copy_takes_the_models_path_inside_a_name_scope_of_the_caller() -> None:
    """A fit started inside ``keras.name_scope`` (the driver builds the state's shapes
    in the caller's thread) still gives each copy the model weight's own path."""
    from sparkdl.sync.outer import _mirror

    with keras.name_scope("user"):
        assert _mirror(np.zeros(2, np.float32), "net/dense/kernel").path == "net/dense/kernel"
