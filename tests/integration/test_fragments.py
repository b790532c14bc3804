"""Fits that sync one fragment of the weights at a time (``sync_fragments``, Streaming
DiLoCo): real Spark local[2], TensorFlow and HTTP."""

from __future__ import annotations

import pytest

from examples.digits import accuracy, digits_model
from sparkdl import KerasEstimator
from sparkdl.errors import ConfigError

pytestmark = [pytest.mark.spark]


def fit(train_df, **settings):  # type: ignore[no-untyped-def]
    settings = {"num_workers": 2, "epochs": 8, "seed": 0, "frequency": 4, **settings}
    return KerasEstimator(model=digits_model(), **settings).fit(train_df)


def pushed(fitted) -> int:  # type: ignore[no-untyped-def]
    return sum(w["push_bytes"] for w in fitted.fit_report["workers"])


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_synchronous_fragments_push_one_part_a_sync_and_train(digits) -> None:
    train_df, _, (_, x_test, _, y_test) = digits
    whole = fit(train_df)
    halves = fit(train_df, sync_fragments=2)
    assert accuracy(halves.get_model(), x_test, y_test) >= 0.93
    # 6 syncs an epoch: 5 carry one half, the closing one both: (5 / 2 + 1) / 6 = 0.58.
    assert pushed(halves) < 0.7 * pushed(whole)
    assert len(halves.history["loss"]) == 8
    service = halves.fit_report["service"]
    assert [s["shard"] for s in service["shards"]] == [0, 1]
    assert all(s["epochs_done"] == 8 for s in service["shards"])
    assert "one of 2 fragments a sync" in halves.fit_report["resolved"]["workers"]
    assert [w["syncs"] for w in halves.fit_report["workers"]] == [48, 48]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "merge"),
    [(m, g) for m in ("synchronous", "asynchronous", "hogwild") for g in ("average", "delta")],
)
def test_fragments_with_diloco_and_4_bit_updates_train_in_every_mode(digits, mode, merge) -> None:
    train_df, _, (_, x_test, _, y_test) = digits
    fitted = fit(
        train_df,
        mode=mode,
        merge=merge,
        epochs=20,
        frequency=8,
        sync_fragments=2,
        outer_optimizer="nesterov",
        compression="int4",
    )
    # The three together, the most lossy: 0.914 to 0.975 measured on an idle machine
    # (5 runs of the asynchronous and hogwild cases); asynchronous delta reached 0.867
    # once in CI, where the loaded machine lets one worker run far ahead of the other
    # and its stale deltas meet the outer momentum. Plain Keras: 0.97; chance: 0.1.
    assert accuracy(fitted.get_model(), x_test, y_test) >= 0.85


@pytest.mark.slow
def test_fragments_in_the_cluster_train(digits) -> None:
    train_df, _, (_, x_test, _, y_test) = digits
    fitted = fit(train_df, service_placement="cluster", sync_fragments=2, epochs=12)
    assert accuracy(fitted.get_model(), x_test, y_test) >= 0.93
    assert len(fitted.fit_report["service"]["shards"]) == 2


def test_fragments_and_other_shards_are_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match="service_shards=3 must be 1 or 2"):
        KerasEstimator(model=digits_model(), sync_fragments=2, service_shards=3, frequency=8)
    for bad in (0, 65, 1.5, True):
        with pytest.raises(ConfigError, match=r"sync_fragments to be an int in \[1, 64\]"):
            KerasEstimator(model=digits_model(), sync_fragments=bad, frequency=8)
    with pytest.raises(ConfigError, match="Set frequency to a number of batches"):
        KerasEstimator(model=digits_model(), sync_fragments=2)  # frequency="epoch"
