"""Asynchronous and hogwild fits end to end on digits: real Spark local[2], TensorFlow and
HTTP (every mode x merge against plain Keras: tests/integration/test_parity.py)."""

from __future__ import annotations

import pytest

from benchmarks.idle_connections import Siege, free_port
from examples.digits import accuracy, digits_model
from sparkdl import KerasEstimator
from tests.integration.failure_fit import slow_loss

pytestmark = [pytest.mark.spark]

#: Epochs of the accuracy tests below (Adam, a floor of 0.95). With the learning-rate
#: recipe on by default, asynchronous digits fits at 20 epochs ended at 0.9639-0.9778
#: over seeds 0-2 in every mode x merge (benchmarks/digits.py). Parity with plain Keras
#: after the same epochs is tests/integration/test_parity.py.
EPOCHS = 20


@pytest.mark.compat
@pytest.mark.slow  # a load test: 256 hostile connections for every batch's round trip
@pytest.mark.parametrize(("mode", "merge"), [("asynchronous", "delta"), ("hogwild", "elastic")])
def test_waiting_for_every_answer_also_reaches_accuracy(digits, mode, merge) -> None:
    """overlap=False: each push waits for its answer before training goes on.

    Meanwhile 128 connections without the token sit idle on the fit's port and 128
    send a header byte a second (``benchmarks/idle_connections.py``): every batch's
    round trip still gets through.
    """
    train_df, _, (_, x_test, _, y_test) = digits
    port = free_port()
    with Siege("127.0.0.1", port, idle=128, trickle=128, seconds=300) as siege:
        fitted = KerasEstimator(
            model=digits_model(),
            mode=mode,
            merge=merge,
            frequency="batch",
            overlap=False,
            num_workers=2,
            epochs=EPOCHS,
            seed=0,
            port=port,
        ).fit(train_df)
    assert siege.figures.opened >= 256
    assert accuracy(fitted.get_model(), x_test, y_test) >= 0.95
    report = fitted.fit_report
    assert not any(w["overlap"] for w in report["workers"])
    assert report["service"]["version"] == sum(w["syncs"] for w in report["workers"])
    assert report["service"]["samples_seen"] == EPOCHS * 1437


#: Cross-entropy that sleeps 40 ms per batch in partition 0 only.
_slow_loss = slow_loss(0, 0.04)


@pytest.mark.slow  # three fits with a worker slowed on purpose (fast tier: 6 minutes)
@pytest.mark.parametrize("mode", ["asynchronous", "hogwild", "synchronous"])
def test_a_slow_worker_does_not_slow_the_other(digits, mode) -> None:
    train_df, _, _ = digits
    model = digits_model()
    model.compile(optimizer="adam", loss=_slow_loss, metrics=["accuracy"], jit_compile=False)
    fitted = KerasEstimator(
        model=model,
        mode=mode,
        frequency="batch",
        num_workers=2,
        epochs=3,
        seed=0,
        custom_objects={"slow_loss": _slow_loss},
    ).fit(train_df)
    workers = fitted.fit_report["service"]["workers"]
    slow, fast = workers["0"], workers["1"]
    assert slow["pushes"] == fast["pushes"] == 3 * 23  # both finished every update
    fast_rate = (fast["pushes"] - 1) / (fast["last_push"] - fast["first_push"])
    slow_rate = (slow["pushes"] - 1) / (slow["last_push"] - slow["first_push"])
    if mode == "synchronous":  # the contrast: barrier rounds hold worker 1 back
        assert slow_rate < 25 and fast_rate < 1.3 * slow_rate, (fast_rate, slow_rate)
        return
    # A 40 ms sleep per batch holds worker 0 under 25 updates/s; worker 1 pushes at its
    # own pace instead of waiting for it, and finishes well before it.
    assert slow_rate < 25
    assert fast_rate > 2 * slow_rate, (fast_rate, slow_rate)
    assert fast["last_push"] < slow["last_push"] - 1.0


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_asynchronous_workers_may_outnumber_task_slots(digits) -> None:
    train_df, _, (_, x_test, _, y_test) = digits
    fitted = KerasEstimator(
        model=digits_model(),
        mode="asynchronous",
        frequency=4,
        num_workers=3,  # local[2] has 2 slots: Spark queues the third task
        epochs=EPOCHS,
        seed=0,
    ).fit(train_df)
    assert len(fitted.fit_report["workers"]) == 3
    assert sum(w["rows"] for w in fitted.fit_report["workers"]) == 1437
    assert len(fitted.history["loss"]) == EPOCHS
    assert accuracy(fitted.get_model(), x_test, y_test) >= 0.95


@pytest.mark.compat
def test_mixed_precision_workers_compute_in_float16(digits) -> None:
    train_df, _, (_, x_test, _, y_test) = digits
    fitted = KerasEstimator(
        model=digits_model(), mixed_precision=True, num_workers=2, epochs=20, seed=0
    ).fit(train_df)
    for worker in fitted.fit_report["workers"]:
        assert worker["compute_dtypes"] == ["float16", "float32"]  # hidden / output layer
        assert worker["loss_scaled"]  # a LossScaleOptimizer around the model's Adam
    model = fitted.get_model()
    assert {layer.compute_dtype for layer in model.layers} == {"float32"}
    assert type(model.optimizer).__name__ == "Adam"
    assert accuracy(model, x_test, y_test) >= 0.95
