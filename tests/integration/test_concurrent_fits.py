"""Two fits at once from two threads of one driver share nothing by accident: each has
its own job group, service (port, token, store), followers and result, and both train
to the accuracy a fit alone reaches (real Spark local[2], TensorFlow and HTTP)."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from examples.digits import accuracy, digits_model
from sparkdl import KerasEstimator

pytestmark = [pytest.mark.spark, pytest.mark.slow]

#: The digits bar of a fit alone after 20 epochs (tests/integration/test_sync_training.py,
#: tests/integration/test_async_training.py).
EPOCHS = 20


def test_two_fits_at_once_from_two_threads_both_reach_accuracy(digits) -> None:
    """local[2] has two task slots: one synchronous fit (a barrier stage of one task)
    and one asynchronous fit (an ordinary task) of one worker each, started together,
    each with a driver callback (its followers: callbacks, Spark UI marks, canceller)."""
    train_df, _, (_, x_test, _, y_test) = digits
    settings = {
        "synchronous": {"mode": "synchronous", "seed": 0},
        "asynchronous": {"mode": "asynchronous", "merge": "delta", "frequency": 4, "seed": 1},
    }
    results: dict[str, Any] = {}
    # Each fit's driver callback records the losses it sees: its own fit's only.
    seen: dict[str, list[float]] = {name: [] for name in settings}
    spans: dict[str, tuple[float, float]] = {}
    start = threading.Barrier(len(settings))

    def fit(name: str) -> None:
        import keras

        record = keras.callbacks.LambdaCallback(
            on_epoch_end=lambda epoch, logs: seen[name].append(logs["loss"])
        )
        try:
            estimator = KerasEstimator(
                model=digits_model(),
                num_workers=1,
                epochs=EPOCHS,
                callbacks=[record],
                **settings[name],
            )
            start.wait(timeout=120)
            began = time.monotonic()
            results[name] = estimator.fit(train_df)
            spans[name] = (began, time.monotonic())
        except BaseException as exc:  # reported below, in the test's thread
            results[name] = exc

    threads = [threading.Thread(target=fit, args=(name,), name=name) for name in settings]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=900)
    assert not any(thread.is_alive() for thread in threads), "a fit did not end in 15 min"
    for name, result in results.items():
        if isinstance(result, BaseException):
            raise AssertionError(f"the {name} fit failed") from result

    # The fits did run at once.
    assert max(b for b, _ in spans.values()) < min(e for _, e in spans.values()), spans
    fitted = [results[name] for name in settings]
    reports = [model.fit_report for model in fitted]
    # Each its own job group and service.
    assert reports[0]["job_group"] != reports[1]["job_group"]
    assert reports[0]["service_url"] != reports[1]["service_url"]
    for name, model, report in zip(settings, fitted, reports, strict=True):
        assert report["service"]["epochs_done"] == EPOCHS
        assert len(report["workers"]) == 1 and report["workers"][0]["rows"] == 1437
        assert len(model.history["loss"]) == EPOCHS
        assert seen[name] == pytest.approx(model.history["loss"]), name
        assert accuracy(model.get_model(), x_test, y_test) >= 0.95, name
    # Two models, each with its own weights.
    assert fitted[0] is not fitted[1]
    first, second = (model.get_model().get_weights() for model in fitted)
    assert not all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))
