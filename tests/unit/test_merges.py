from __future__ import annotations

import numpy as np
import pytest

from sparkdl.config import TrainConfig
from sparkdl.errors import ConfigError
from sparkdl.sync.merges import Average, Delta, Elastic, Update, merge_class
from sparkdl.sync.settings import FitSettings


def resolve(name: str, num_workers: int = 1, **settings: object):  # type: ignore[no-untyped-def]
    config = TrainConfig(mode="asynchronous", merge=name, **settings)  # type: ignore[arg-type]
    return merge_class(name).resolve(FitSettings(config.to_dict(), num_workers=num_workers))


def test_average_is_weighted_by_samples() -> None:
    center = [np.zeros((2, 2), np.float32), np.zeros(3, np.float32)]
    ups = [
        Update(
            worker=0,
            arrays=[np.full((2, 2), 1.0, np.float32), np.array([1, 2, 3], np.float32)],
            samples=10,
        ),
        Update(
            worker=1,
            arrays=[np.full((2, 2), 4.0, np.float32), np.array([4, 5, 6], np.float32)],
            samples=30,
        ),
    ]
    out = Average().combine(center, ups)
    np.testing.assert_allclose(out[0], np.full((2, 2), 3.25))
    np.testing.assert_allclose(out[1], [3.25, 4.25, 5.25])
    assert out[0].dtype == np.float32


def test_zero_sample_workers_weigh_nothing() -> None:
    ups = [
        Update(worker=0, arrays=[np.array([2.0], np.float32)], samples=5),
        Update(worker=1, arrays=[np.array([100.0], np.float32)], samples=0),
    ]
    assert Average().combine([np.zeros(1, np.float32)], ups)[0].tolist() == [2.0]


def test_all_zero_samples_takes_plain_mean() -> None:
    ups = [
        Update(worker=0, arrays=[np.array([2.0])], samples=0),
        Update(worker=1, arrays=[np.array([4.0])], samples=0),
    ]
    assert Average().combine([np.zeros(1)], ups)[0].tolist() == [3.0]


def test_integer_state_is_not_averaged() -> None:
    ups = [
        Update(worker=0, arrays=[np.array([7], np.int64)], samples=1),
        Update(worker=1, arrays=[np.array([9], np.int64)], samples=1),
    ]
    out = Average().combine([np.zeros(1, np.int64)], ups)
    assert out[0].dtype == np.int64 and out[0].tolist() == [7]


def test_float16_weights_keep_their_dtype() -> None:
    ups = [Update(worker=0, arrays=[np.array([1.5], np.float16)], samples=1)]
    out = Average().combine([np.zeros(1, np.float16)], ups)
    assert out[0].dtype == np.float16 and out[0].tolist() == [1.5]


def test_merge_class() -> None:
    assert merge_class("average") is Average
    with pytest.raises(ConfigError, match="merge"):
        merge_class("median")


def _up(worker: int, values: list[float], samples: int = 1, base: int = 0) -> Update:
    return Update(
        worker=worker, arrays=[np.array(values, np.float32)], samples=samples, base_version=base
    )


def test_delta_sync_adds_the_sample_weighted_mean_delta() -> None:
    center = [np.array([1.0, 1.0], np.float32)]
    out = Delta().combine(center, [_up(0, [4.0, 0.0], 1), _up(1, [0.0, 8.0], 3)])
    np.testing.assert_array_equal(out[0], [2.0, 7.0])  # 1 + (4*1 + 0*3)/4, 1 + (0 + 24)/4
    assert center[0].tolist() == [1.0, 1.0]


def test_delta_async_staleness_none_and_inverse() -> None:
    center = [np.array([10.0], np.float32)]
    assert Delta().apply(center, _up(0, [6.0], base=2), version=8)[0].tolist() == [16.0]
    inverse = Delta(staleness="inverse")
    assert inverse.apply(center, _up(0, [6.0], base=2), version=8)[0].tolist() == [11.0]
    assert inverse.apply(center, _up(0, [6.0], base=7), version=8)[0].tolist() == [16.0]
    assert inverse.apply(center, _up(0, [6.0], base=8), version=8)[0].tolist() == [16.0]
    assert center[0].tolist() == [10.0]  # apply never changes the center it was given


def test_sync_easgd_sums_the_elastic_differences() -> None:
    # Two workers at w = [3, 5] and [-1, 1] against center [1, 1], alpha = 0.25:
    # d0 = 0.25 * ([3, 5] - [1, 1]) = [0.5, 1.0]; d1 = 0.25 * ([-1, 1] - [1, 1]) = [-0.5, 0]
    center = [np.array([1.0, 1.0], np.float32)]
    out = Elastic().combine(center, [_up(0, [0.5, 1.0]), _up(1, [-0.5, 0.0])])
    np.testing.assert_array_equal(out[0], [1.0, 2.0])


def test_async_average_moves_the_center_by_one_share() -> None:
    rule = Average(share=0.25)
    out = rule.apply([np.array([8.0], np.float32)], _up(0, [0.0]), version=0)
    assert out[0].tolist() == [6.0]  # 8 + (0 - 8) / 4
    unchanged = rule.apply([np.array([8.0], np.float32)], _up(0, [0.0], samples=0), version=0)
    assert unchanged[0].tolist() == [8.0]  # a push with no samples only reports


def test_async_average_adds_its_share_of_what_the_worker_learned_since_its_copy() -> None:
    """Resolved for an asynchronous fit, averaging pushes differences: a stale push moves
    the center by its share of the worker's progress, and does not pull the center back
    toward the older copy the worker trained from (a running average of weights would:
    0.5 * 4 + 0.5 * 3 = 3.5 here)."""
    rule = resolve("average", num_workers=2)
    assert rule.relative and not rule.pushes_weights
    seen, local = [np.array([1.0], np.float32)], [np.array([3.0], np.float32)]
    pushed = rule.outgoing(local, seen)
    assert pushed[0].tolist() == [2.0]
    out = rule.apply([np.array([4.0], np.float32)], _up(0, pushed[0].tolist()), version=3)
    assert out[0].tolist() == [5.0]
    # Synchronous rounds start from one center: workers push their weights.
    config = TrainConfig(merge="average")
    sync = Average.resolve(FitSettings(config.to_dict(), num_workers=2, synchronous=True))
    assert not sync.relative and sync.pushes_weights
    assert sync.outgoing(local, seen)[0].tolist() == [3.0]


def test_in_place_forms_match_the_copying_forms() -> None:
    rules = [Average(share=1 / 3), Delta(), Delta(staleness="inverse"), Elastic()]
    for rule in rules:
        center = [np.array([2.0, -4.0], np.float32), np.array([5], np.int64)]
        update = Update(
            worker=1,
            arrays=[np.array([1.0, 3.0], np.float32), np.array([9], np.int64)],
            samples=2,
            base_version=1,
        )
        copied = rule.apply(center, update, version=5)
        live = [c.copy() for c in center]
        rule.apply_in_place(live, update, version=5)
        for a, b in zip(copied, live, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6)
        assert copied[1].tolist() == [9] and copied[1].dtype == np.int64


def test_worker_side_of_each_merge() -> None:
    center = [np.array([1.0, 1.0], np.float32)]
    local = [np.array([3.0, 5.0], np.float32)]
    answer = [np.array([2.0, 2.0], np.float32)]
    average = Average()
    pushed = average.outgoing(local, center)
    assert pushed[0].tolist() == [3.0, 5.0]
    assert average.incoming(local, pushed, answer)[0].tolist() == [2.0, 2.0]
    delta = Delta()
    pushed = delta.outgoing(local, center)
    assert pushed[0].tolist() == [2.0, 4.0]
    assert delta.incoming(local, pushed, answer)[0].tolist() == [2.0, 2.0]
    assert delta.outgoing(local, answer)[0].tolist() == [1.0, 3.0]  # now against the answer
    elastic = Elastic(alpha=0.25)
    pushed = elastic.outgoing(local, center)
    assert pushed[0].tolist() == [0.5, 1.0]
    moved = elastic.incoming(local, pushed, answer)
    assert moved[0].tolist() == [2.5, 4.0]  # w - d, not the center
    assert elastic.outgoing(moved, answer)[0].tolist() == [0.125, 0.5]


def test_overlapped_worker_side_keeps_the_progress_made_during_the_push() -> None:
    """overlap: push, train on, then fold in the answer (hand-computed)."""
    center = [np.array([1.0, 1.0], np.float32), np.array([7], np.int64)]
    at_push = [np.array([3.0, 5.0], np.float32), np.array([8], np.int64)]
    later = [np.array([4.0, 4.0], np.float32), np.array([9], np.int64)]  # trained on
    answer = [np.array([2.0, 2.0], np.float32), np.array([8], np.int64)]
    delta = Delta(scale=0.5)
    pushed = delta.outgoing(at_push, center)
    assert pushed[0].tolist() == [1.0, 2.0]
    assert delta.moved(at_push, pushed) is at_push  # keeps its weights
    settled = delta.settle(later, at_push, answer)
    assert settled[0].tolist() == [3.0, 1.0]  # answer + (later - at_push)
    assert settled[1].tolist() == [8]  # integer state: the answer's
    # The next delta is against the answer: exactly the progress not pushed yet.
    assert delta.outgoing(settled, answer)[0].tolist() == [0.5, -0.5]
    average = Average()
    assert average.settle(later, at_push, answer)[0].tolist() == [3.0, 1.0]
    elastic = Elastic(alpha=0.25)
    pushed = elastic.outgoing(at_push, center)
    assert pushed[0].tolist() == [0.5, 1.0]
    moved = elastic.moved(at_push, pushed)
    assert moved[0].tolist() == [2.5, 4.0] and moved[1].tolist() == [8]  # w - d at once
    assert elastic.settle(later, moved, answer)[0].tolist() == [4.0, 4.0]  # keeps its own
    assert elastic.outgoing(later, answer)[0].tolist() == [0.5, 0.5]  # against the new center


def test_resolve_builds_each_merge() -> None:
    assert resolve("delta", staleness="inverse") == Delta(staleness="inverse", scale=1.0)
    assert resolve("elastic", num_workers=2).alpha == pytest.approx(0.45)
    assert resolve("elastic", elastic_alpha=0.3).alpha == pytest.approx(0.3)
    assert resolve("average", num_workers=4).share == 0.25
    with pytest.raises(ConfigError, match="staleness"):
        Delta(staleness="sometimes")
    with pytest.raises(ConfigError, match="staleness"):
        TrainConfig(merge="delta", staleness="sometimes")
