"""The outer optimizers (:mod:`sparkdl.sync.outer`): the identity case, SlowMo's and
DiLoCo's steps against a reference written out here, Delayed Nesterov over a period of
asynchronous pushes, the store's rounds and pushes, checkpoints and settings."""

from __future__ import annotations

import numpy as np
import pytest

from sparkdl.config import TrainConfig
from sparkdl.errors import ConfigError
from sparkdl.server.state import checkpoints
from sparkdl.server.state.store import WeightStore
from sparkdl.sync.merges import Average, Delta, Update
from sparkdl.sync.outer import OuterOptimizer
from tests.stores import joined


def arrays(*values: float) -> list[np.ndarray]:
    return [np.array(values, np.float64), np.array([3], np.int64)]


def reference(kind: str, lr: float, mu: float, center: np.ndarray, merged: list[np.ndarray]):  # type: ignore[no-untyped-def]
    """SlowMo / DiLoCo written out: one outer step per round's pseudo-gradient."""
    m = np.zeros_like(center)
    out = []
    for new in merged:
        g = center - new
        m = mu * m + g
        center = center - lr * ((g + mu * m) if kind == "nesterov" else m)
        out.append(center)
    return out


def test_sgd_at_rate_1_without_momentum_is_the_merge_itself() -> None:
    outer = OuterOptimizer("sgd", learning_rate=1.0, momentum=0.0)
    state = outer.state(arrays(0, 0), num_workers=2)
    merged = arrays(1.5, -2.0)
    assert state.round(arrays(0, 0), merged) is merged
    assert outer.identity


@pytest.mark.parametrize("kind", ["sgd", "nesterov"])
def test_synchronous_rounds_follow_the_reference(kind) -> None:
    outer = OuterOptimizer(kind, learning_rate=0.7, momentum=0.9)
    rng = np.random.default_rng(0)
    center = [np.zeros(4), np.array([1], np.int64)]
    state = outer.state(center, num_workers=3)
    merges, got = [], []
    for _ in range(5):
        merged = [center[0] + rng.normal(size=4), np.array([7], np.int64)]
        merges.append(merged[0])
        center = state.round(center, merged)
        got.append(center[0])
        assert center[1].tolist() == [7]  # integer weights: the merge's value
    want = reference(kind, 0.7, 0.9, np.zeros(4), merges)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_a_store_steps_on_each_synchronous_round_and_asynchronous_push() -> None:
    outer = OuterOptimizer("nesterov", learning_rate=0.5, momentum=0.5)
    store = joined(WeightStore([np.zeros(2)], num_workers=2, merge=Average(), outer=outer))
    center, m = np.zeros(2), np.zeros(2)
    for step in range(3):
        pushes = [np.full(2, float(step + w)) for w in (0, 1)]
        for w in (0, 1):
            store.push(
                w,
                seq=step + 1,
                attempt=0,
                base_version=step,
                arrays=[pushes[w]],
                samples=5,
                meta={},
            )
        merged = Average().combine(
            [center], [Update(worker=w, arrays=[pushes[w]], samples=5) for w in (0, 1)]
        )[0]
        g = center - merged
        m = 0.5 * m + g
        center = center - 0.5 * (g + 0.5 * m)
        np.testing.assert_allclose(store.weights()[0], center)
    found = store.outer_state()
    assert found is not None and found[1] == 0
    np.testing.assert_allclose(found[0][0], m)
    # Asynchronously (and hogwild): a push alone moves the center by lr times its change.
    for mode in ("asynchronous", "hogwild"):
        alone = joined(
            WeightStore([np.zeros(2)], num_workers=2, merge=Delta(), outer=outer, mode=mode)
        )
        alone.push(0, seq=1, attempt=0, base_version=0, arrays=[np.ones(2)], samples=1, meta={})
        np.testing.assert_allclose(alone.weights()[0], [0.5, 0.5])


@pytest.mark.parametrize("kind", ["sgd", "nesterov"])
def test_delayed_nesterov_moves_a_period_of_pushes_as_one_round(kind) -> None:
    """N asynchronous pushes move the center as one synchronous outer step on their
    summed change (and each push alone by lr times its own)."""
    outer = OuterOptimizer(kind, learning_rate=0.6, momentum=0.8)
    merge = Delta()
    workers = 3
    state = outer.state([np.zeros(3)], num_workers=workers)
    rng = np.random.default_rng(1)
    center = [np.zeros(3)]
    m = np.zeros(3)
    for _ in range(4):  # periods
        start = center[0].copy()
        deltas = [rng.normal(size=3) for _ in range(workers)]
        for i, d in enumerate(deltas):
            before = center[0].copy()
            after = merge.apply(center, Update(worker=i, arrays=[d], samples=1), 0)
            center = state.apply_push(center, after)
            if i < workers - 1:  # within the period: a plain step
                np.testing.assert_allclose(center[0], before + 0.6 * d)
        g = -np.sum(deltas, axis=0)
        m = 0.8 * m + g
        step = (g + 0.8 * m) if kind == "nesterov" else m
        np.testing.assert_allclose(center[0], start - 0.6 * step, atol=1e-12)
    assert state.pushes == 4 * workers


def test_the_outer_state_round_trips_through_a_checkpoint(tmp_path) -> None:
    outer = OuterOptimizer("nesterov")
    state = outer.state([np.zeros(2, np.float32), np.zeros(1, np.int64)], num_workers=2)
    state.round(
        [np.zeros(2, np.float32), np.zeros(1, np.int64)],
        [np.ones(2, np.float32), np.ones(1, np.int64)],
    )
    saved = (state.arrays(), 5)
    checkpoints.write(
        str(tmp_path), 3, [np.ones(2, np.float32)], {"loss": [1.0]}, {}, 2, outer=saved
    )
    found = checkpoints.latest(str(tmp_path))
    assert found is not None and found.outer is not None and found.outer[1] == 5
    for a, b in zip(found.outer[0], saved[0], strict=True):
        np.testing.assert_array_equal(a, b)
    restored = outer.state(
        [np.zeros(2, np.float32), np.zeros(1, np.int64)],
        num_workers=2,
        arrays=found.outer[0],
        pushes=5,
    )
    np.testing.assert_array_equal(restored.momentum[0], state.momentum[0])
    with pytest.raises(ValueError, match="does not match the model's weights"):
        outer.state([np.zeros(3, np.float32)], num_workers=2, arrays=found.outer[0])
    # Without an outer optimizer nothing is written beside the weights.
    checkpoints.write(str(tmp_path / "plain"), 1, [np.ones(2)], {}, {}, 1)
    plain = checkpoints.latest(str(tmp_path / "plain"))
    assert plain is not None and plain.outer is None


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"outer_optimizer": "adam"}, "Expected outer_optimizer to be None or one of"),
        ({"outer_momentum": 0.5}, "outer_momentum is set but outer_optimizer is None"),
        ({"outer_learning_rate": 0.5}, "outer_learning_rate is set but outer_optimizer"),
        ({"outer_optimizer": "sgd", "merge": "elastic"}, "Use merge='average' or 'delta'"),
        ({"outer_optimizer": "sgd", "outer_learning_rate": 0}, "finite number > 0"),
        ({"outer_optimizer": "sgd", "outer_learning_rate": float("nan")}, "finite number > 0"),
        ({"outer_optimizer": "sgd", "outer_momentum": 1.0}, r"in \[0, 1\)"),
        ({"outer_optimizer": "sgd", "outer_momentum": True}, r"in \[0, 1\)"),
    ],
)
def test_bad_outer_settings_name_the_fix(settings, message) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**settings)


def test_the_plan_resolves_diloco_defaults_and_says_so() -> None:
    from sparkdl.contract.plan import FitPlan

    plan = FitPlan.resolve(
        TrainConfig(outer_optimizer="nesterov", frequency=16),
        num_workers=4,
        rows=1000,
        threads=1,
        service_host="127.0.0.1",
    )
    assert plan.outer == OuterOptimizer("nesterov", 0.7, 0.9)
    assert plan.describe(0.01)["outer optimizer"].startswith("nesterov, learning rate 0.7")
    sgd = FitPlan.resolve(
        TrainConfig(mode="asynchronous", outer_optimizer="sgd", outer_momentum=0.0),
        num_workers=4,
        rows=1000,
        threads=1,
        service_host="127.0.0.1",
    )
    assert sgd.outer == OuterOptimizer("sgd", 0.7, 0.0)
    assert "Delayed Nesterov" in sgd.describe(0.01)["outer optimizer"]


def test_an_outer_step_past_the_dtypes_range_is_refused_and_nothing_changes() -> None:
    from sparkdl.server.state.errors import StoreError

    outer = OuterOptimizer("sgd", learning_rate=1e4, momentum=0.0)
    store = joined(
        WeightStore(
            [np.ones(4, np.float16)], num_workers=2, merge=Delta(), outer=outer, mode="asynchronous"
        )
    )
    with pytest.raises(StoreError, match="outer_learning_rate or outer_momentum"):
        store.push(
            0,
            seq=1,
            attempt=0,
            base_version=0,
            arrays=[np.full(4, 10, np.float16)],
            samples=1,
            meta={},
        )
    np.testing.assert_array_equal(store.weights()[0], np.ones(4, np.float16))
    assert store.version == 0
    # Synchronous: the round is taken, so the fit is aborted with the same reason.
    sync = joined(WeightStore([np.ones(4, np.float16)], num_workers=1, merge=Delta(), outer=outer))
    with pytest.raises(StoreError):
        sync.push(
            0,
            seq=1,
            attempt=0,
            base_version=0,
            arrays=[np.full(4, 10, np.float16)],
            samples=1,
            meta={},
        )
    assert "outer_learning_rate" in (sync.status()["aborted"] or "")


class _Recorder:
    """A pusher that records each sync's index and whether it closes an epoch."""

    def __init__(self) -> None:
        self.syncs: list[tuple[int, bool]] = []
        self.control: dict = {}  # type: ignore[type-arg]

    def push(self, samples, meta, *, wait, whole=False, index=0):  # type: ignore[no-untyped-def]
        self.syncs.append((index, "epoch_logs" in meta))
        return False


def test_synchronous_fragments_close_every_workers_epoch_on_the_same_round() -> None:
    """A short partition pads before its closing sync (closing_last): at every sync
    index every worker pushes the same kind of sync, so each fragment's rounds hold
    the same workers."""
    from sparkdl.executor.callback import SyncCallback
    from sparkdl.sync.schedule import Schedule, rounds_per_epoch, steps_for

    rows = [95, 41]  # 10 and 5 batches of 10: 2 and 1 mid syncs every 4 batches
    rounds = rounds_per_epoch([steps_for(r, 10) for r in rows], 4)
    seen = []
    for n in rows:
        recorder = _Recorder()
        schedule = Schedule(rows=n, batch_size=10, frequency=4, rounds=rounds, closing_last=True)
        callback = SyncCallback(recorder, schedule, last_epoch=2)  # type: ignore[arg-type]
        for epoch in range(2):
            callback.on_epoch_begin(epoch)
            for batch in range(steps_for(n, 10)):
                callback.on_train_batch_end(batch, {})
            callback.on_epoch_end(epoch, {})
        seen.append(recorder.syncs)
    assert seen[0] == seen[1]
    assert seen[0] == [(0, False), (1, False), (2, True)] * 2


def test_a_refused_step_leaves_the_outer_state_as_it_was() -> None:
    from sparkdl.server.state.errors import StoreError

    outer = OuterOptimizer("nesterov", learning_rate=1e4, momentum=0.9)
    store = joined(
        WeightStore(
            [np.ones(4, np.float16)], num_workers=1, merge=Delta(), outer=outer, mode="asynchronous"
        )
    )
    assert store.outer is not None
    before = store.outer.snapshot()
    for seq in (1, 2):  # a period of one push: the momentum would change too
        with pytest.raises(StoreError, match="outer optimizer's state are unchanged"):
            store.push(
                0,
                seq=seq,
                attempt=0,
                base_version=0,
                arrays=[np.full(4, 10, np.float16)],
                samples=1,
                meta={},
            )
    after = store.outer.snapshot()
    assert after[1] == before[1] == 0
    for a, b in zip(after[0], before[0], strict=True):
        np.testing.assert_array_equal(a, b)


def test_16_bit_weights_step_in_float32_where_the_result_fits() -> None:
    """A pseudo-gradient of float16 weights may pass float16's range (65504) while the
    step's result fits: the step is computed in float32."""
    outer = OuterOptimizer("sgd", learning_rate=0.5, momentum=0.0)
    center = [np.array([30000.0], np.float16)]
    state = outer.state(center, num_workers=1)
    new = state.round(center, [np.array([-40000.0], np.float16)])
    assert new[0].dtype == np.float16 and float(new[0][0]) == -5000.0


def test_the_plan_warns_of_amplified_full_size_deltas_and_useless_fragments(caplog) -> None:
    from sparkdl.contract.plan import FitPlan

    def plan(**settings):  # type: ignore[no-untyped-def]
        return FitPlan.resolve(
            TrainConfig(**settings), num_workers=4, rows=1000, threads=1, service_host="x"
        )

    with caplog.at_level("WARNING", logger="sparkdl.driver.fit"):
        plan(mode="asynchronous", outer_optimizer="nesterov", lr_scaling=None, frequency=4)
        plan(
            mode="asynchronous",
            outer_optimizer="sgd",
            outer_learning_rate=1.0,
            outer_momentum=0.0,
            lr_scaling=None,
            frequency=4,
        )  # the identity: quiet
        plan(sync_fragments=2, frequency=500)  # 250 rows a worker: no mid-epoch sync
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert "amplifies each asynchronous delta" in messages[0]
    assert "fragments only add requests" in messages[1]
