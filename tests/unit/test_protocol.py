"""The sync protocol's seams: a new merge is one class, a schedule is plain arithmetic."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pytest

from sparkdl.config import TrainConfig
from sparkdl.contract.plan import FitPlan
from sparkdl.errors import ConfigError
from sparkdl.server.state.store import WeightStore
from sparkdl.sync import merges
from sparkdl.sync.merges import Merge, Update
from sparkdl.sync.modes import Asynchronous, Hogwild, Standing, Synchronous
from sparkdl.sync.schedule import EpochEnd, Schedule
from sparkdl.sync.settings import FitSettings
from tests.stores import joined


@pytest.fixture
def median() -> Iterator[type[Merge]]:
    """A merge defined only here: the element-wise median of a round's weights."""

    @merges.register
    @dataclass(frozen=True)
    class Median(Merge):
        name: ClassVar[str] = "median"

        @classmethod
        def resolve(cls, settings: FitSettings) -> Median:
            return cls()

        def combine(self, center: Sequence[np.ndarray], updates: Sequence[Update]) -> list:
            return [
                np.median([u.arrays[i] for u in updates], axis=0).astype(c.dtype)
                for i, c in enumerate(center)
            ]

        def _step(self, center: np.ndarray, pushed: np.ndarray, update: Update, v: int) -> None:
            center[...] = (center + pushed) / 2

    yield Median
    merges.MERGES.unregister("median")


def test_a_merge_registered_in_a_test_runs_a_whole_fit_plan(median: type[Merge]) -> None:
    config = TrainConfig(merge="median", epochs=2)
    plan = FitPlan.resolve(config, num_workers=3, rows=30, threads=1, service_host="127.0.0.1")
    assert isinstance(plan.merge, median) and plan.mode.name == "synchronous"
    store = joined(WeightStore([np.zeros(2, np.float32)], num_workers=3, merge=plan.merge))
    for worker, value in enumerate([1.0, 7.0, 2.0]):
        target = store.push(
            worker,
            seq=1,
            attempt=0,
            base_version=0,
            arrays=[np.full(2, value, np.float32)],
            samples=10,
            meta={},
        )
    result = store.pull(target, wait=1.0)
    assert result is not None
    weights, version = result
    assert version == 1 and weights[0].tolist() == [2.0, 2.0]
    assert store.status()["merge"] == "median"
    # Its worker half is the default one: push the weights, continue from the answer.
    local = [np.ones(2, np.float32)]
    assert plan.merge.outgoing(local, weights)[0].tolist() == [1.0, 1.0]
    hogwild = joined(
        WeightStore([np.zeros(2, np.float32)], num_workers=1, merge=plan.merge, mode=Hogwild())
    )
    hogwild.push(
        0,
        seq=1,
        attempt=0,
        base_version=0,
        arrays=[np.full(2, 4.0, np.float32)],
        samples=1,
        meta={},
    )
    assert hogwild.weights()[0].tolist() == [2.0, 2.0]


def test_unknown_merge_and_mode_names_fail_on_the_driver() -> None:
    with pytest.raises(ConfigError, match="merge"):
        TrainConfig(merge="median")
    with pytest.raises(ConfigError, match="mode"):
        TrainConfig(mode="turbo")


def test_plan_resolves_each_default_once() -> None:
    def plan(**settings: Any) -> FitPlan:
        config = TrainConfig(**settings)
        return FitPlan.resolve(config, num_workers=2, rows=200, threads=3, service_host="h")

    whole = plan(mode="asynchronous", merge="delta", batch_size=10)
    assert whole.whole_epoch and whole.merge.scale == 0.5 and whole.overlap  # type: ignore[attr-defined]
    # 100 rows a worker, 10 steps an epoch: every 16 batches still spans an epoch.
    assert plan(mode="asynchronous", merge="delta", batch_size=10, frequency=16).whole_epoch
    partial = plan(mode="asynchronous", merge="delta", batch_size=10, frequency=4)
    # The learning-rate recipe makes up for dividing the deltas; without it, a delta
    # that spans less than an epoch is added in full (textbook Downpour).
    assert not partial.whole_epoch and partial.merge.scale == 0.5  # type: ignore[attr-defined]
    assert partial.lr_recipe.factor == 2.0
    textbook = plan(mode="asynchronous", merge="delta", batch_size=10, frequency=4, lr_scaling=None)
    assert textbook.merge.scale == 1.0  # type: ignore[attr-defined]
    assert plan(mode="synchronous", merge="delta").merge.scale == 1.0  # type: ignore[attr-defined]
    assert plan(merge="elastic").merge.alpha == pytest.approx(0.45)  # type: ignore[attr-defined]
    assert plan().threads == 3 and plan(threads_per_worker=1).threads == 1
    assert plan().service_host == "h" and plan(service_host="x").service_host == "x"
    assert plan(frequency="batch").frequency == 1 and plan().frequency is None
    with pytest.raises(ConfigError, match="backup_workers=2"):
        plan(backup_workers=2)


def test_the_plan_travels_as_plain_data() -> None:
    import pickle

    plan = FitPlan.resolve(
        TrainConfig(mode="hogwild", merge="elastic"),
        num_workers=4,
        rows=10,
        threads=1,
        service_host="127.0.0.1",
    )
    assert pickle.loads(pickle.dumps(plan)) == plan


def test_schedule_points_within_an_epoch() -> None:
    # 95 rows, batches of 10: 10 steps; every 4 batches: syncs after 4 and 8, then the
    # closing one. Three rounds an epoch.
    s = Schedule(rows=95, batch_size=10, frequency=4, rounds=3)
    assert (s.steps, s.mid_rounds) == (10, 2)
    assert [s.due(step) for step in range(1, 11)] == [0, 0, 0, 1, 1, 1, 1, 2, 2, 2]
    assert s.seen(10) == 95 and s.step_of(95) == 10
    assert s.epoch_end(done=2) == EpochEnd(mid=0, closes=True, padding=0)
    # Epoch ends before its mid syncs were made (stop_training): they come first.
    assert s.epoch_end(done=0) == EpochEnd(mid=2, closes=True, padding=0)


def test_a_short_partition_pads_its_epochs_with_empty_rounds() -> None:
    # Synchronous: the longest partition has 10 steps, so 3 rounds at every 4 batches;
    # a worker with 2 steps makes no mid sync, closes, then pads 2 rounds.
    rounds = Synchronous().rounds_per_epoch(2, [10, 2], frequency=4)
    short = Schedule(rows=20, batch_size=10, frequency=4, rounds=rounds)
    assert rounds == 3 and short.epoch_end(done=0) == EpochEnd(mid=0, closes=True, padding=2)
    # Asynchronous workers never wait for each other: no padding.
    own = Asynchronous().rounds_per_epoch(2, [10, 2], frequency=4)
    assert Schedule(rows=20, batch_size=10, frequency=4, rounds=own).epoch_end(0).padding == 0
    # A worker with no rows still takes part in every round.
    empty = Schedule(rows=0, batch_size=10, frequency=4, rounds=rounds)
    assert empty.epoch_end(done=0) == EpochEnd(mid=0, closes=True, padding=2)


def test_resume_points_of_each_mode() -> None:
    s = Schedule(rows=230, batch_size=10, frequency=4, rounds=6)  # 23 steps
    # Synchronous: version 15 = 2 whole epochs + 3 rounds = 12 batches into epoch 2.
    assert Synchronous().resume(s, Standing(0, 15, None)) == (2, 12, 3)
    assert Synchronous().resume(s, Standing(5, 6, None)) == (6, 0, 0)
    # Asynchronous: after its own last applied push.
    assert Asynchronous().resume(s, Standing(0, 99, (1, 9))) == (1, 9, 2)
    assert Asynchronous().resume(s, Standing(0, 99, (1, 23))) == (2, 0, 0)
    assert Asynchronous().resume(s, Standing(3, 0, None)) == (3, 0, 0)
