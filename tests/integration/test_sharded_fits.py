"""Fits with a sharded parameter service (``service_shards``): real Spark local[2],
TensorFlow and HTTP. The service-level checks (every merge and codec against one
service, aborts, refusals) are in tests/integration/test_sharded_service.py."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.digits import COMBINATIONS
from examples.digits import accuracy, digits_model
from sparkdl import KerasEstimator
from sparkdl.errors import ConfigError

pytestmark = [pytest.mark.spark]


def fit(train_df, shards: int, **settings):  # type: ignore[no-untyped-def]
    settings = {"num_workers": 2, "epochs": 3, "seed": 0, "frequency": 4, **settings}
    return KerasEstimator(model=digits_model(), service_shards=shards, **settings).fit(train_df)


@pytest.mark.parametrize(
    "merge",
    [
        "average",
        pytest.param("delta", marks=pytest.mark.slow),
        pytest.param("elastic", marks=pytest.mark.slow),
    ],
)
@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_synchronous_shards_give_the_weights_of_one_service(digits, merge) -> None:
    train_df, _, _ = digits
    one = fit(train_df, 1, merge=merge)
    three = fit(train_df, 3, merge=merge)
    for a, b in zip(one.get_model().get_weights(), three.get_model().get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert three.history == one.history
    service = three.fit_report["service"]
    shards = service["shards"]
    assert [s["shard"] for s in shards] == [0, 1, 2]
    assert len({s["version"] for s in shards}) == 1
    assert three.fit_report["resolved"]["service"].endswith(", 3 shards")
    # Every shard carried about a third of the bytes one service carried.
    alone = one.fit_report["service"]["traffic"]["bytes_in"]
    assert max(s["traffic"]["bytes_in"] for s in shards) < 0.45 * alone
    assert (
        sum(s["traffic"]["requests"] for s in shards)
        == 3 * one.fit_report["service"]["traffic"]["requests"]
    )
    if merge == "average":
        # Shard j in the cluster, beside worker j: the same weights again.
        hosted = fit(train_df, 2, merge=merge, service_placement="cluster")
        for a, b in zip(
            one.get_model().get_weights(), hosted.get_model().get_weights(), strict=True
        ):
            np.testing.assert_array_equal(a, b)
        assert hosted.history == one.history
        assert [s["shard"] for s in hosted.fit_report["service"]["shards"]] == [0, 1]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "merge", "extra"),
    COMBINATIONS,
    ids=[f"{m}-{g}" + "".join(f"-{v}" for v in e.values()) for m, g, e in COMBINATIONS],
)
def test_every_mode_and_merge_reaches_accuracy_on_shards(digits, mode, merge, extra) -> None:
    train_df, _, (_, x_test, _, y_test) = digits
    fitted = fit(train_df, 2, mode=mode, merge=merge, epochs=20, frequency="epoch", **extra)
    assert accuracy(fitted.get_model(), x_test, y_test) >= 0.95
    assert len(fitted.fit_report["service"]["shards"]) == 2


@pytest.mark.slow
def test_compressed_shards_reach_accuracy(digits) -> None:
    train_df, _, (_, x_test, _, y_test) = digits
    fitted = fit(train_df, 3, mode="asynchronous", merge="delta", epochs=20, compression="topk")
    assert accuracy(fitted.get_model(), x_test, y_test) >= 0.95
    assert all(w["push_bytes"] > 0 for w in fitted.fit_report["workers"])


@pytest.mark.slow
def test_callbacks_stop_a_sharded_fit_and_checkpoints_resume_it(digits, tmp_path) -> None:
    import keras

    train_df, _, _ = digits

    def stop_after_second(epoch, logs):  # type: ignore[no-untyped-def]
        if epoch == 1:
            stopper.model.stop_training = True

    stopper = keras.callbacks.LambdaCallback(on_epoch_end=stop_after_second)
    checkpoints = str(tmp_path / "checkpoints")
    first = fit(
        train_df,
        2,
        mode="asynchronous",
        merge="delta",
        epochs=30,
        callbacks=[stopper],
        checkpoint_dir=checkpoints,
    )
    done = len(first.history["loss"])
    assert 2 <= done <= 3  # one epoch ahead of the callbacks at most
    resumed = fit(
        train_df,
        2,
        mode="asynchronous",
        merge="delta",
        epochs=done + 1,
        checkpoint_dir=checkpoints,
        resume=True,
    )
    assert resumed.history["loss"][:done] == pytest.approx(first.history["loss"])
    assert len(resumed.history["loss"]) == done + 1


def test_bad_shard_settings_are_refused_with_the_fix(digits) -> None:
    train_df, _, _ = digits
    for bad in (0, -1, 65, 2.0, True):
        with pytest.raises(ConfigError, match=r"service_shards to be an int in \[1, 64\]"):
            KerasEstimator(model=digits_model(), service_shards=bad)
    with pytest.raises(ConfigError, match="beyond 65535"):
        KerasEstimator(model=digits_model(), service_shards=4, port=65533)
    with pytest.raises(ConfigError, match="needs a worker to host each shard"):
        fit(train_df, 3, service_placement="cluster")
