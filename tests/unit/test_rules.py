from __future__ import annotations

import numpy as np
import pytest

from sparkdl.errors import ConfigError
from sparkdl.server.rules import AverageRule, Update, make_rule


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
    out = AverageRule().combine(center, ups)
    np.testing.assert_allclose(out[0], np.full((2, 2), 3.25))
    np.testing.assert_allclose(out[1], [3.25, 4.25, 5.25])
    assert out[0].dtype == np.float32


def test_zero_sample_workers_weigh_nothing() -> None:
    ups = [
        Update(worker=0, arrays=[np.array([2.0], np.float32)], samples=5),
        Update(worker=1, arrays=[np.array([100.0], np.float32)], samples=0),
    ]
    assert AverageRule().combine([np.zeros(1, np.float32)], ups)[0].tolist() == [2.0]


def test_all_zero_samples_takes_plain_mean() -> None:
    ups = [
        Update(worker=0, arrays=[np.array([2.0])], samples=0),
        Update(worker=1, arrays=[np.array([4.0])], samples=0),
    ]
    assert AverageRule().combine([np.zeros(1)], ups)[0].tolist() == [3.0]


def test_integer_state_is_not_averaged() -> None:
    ups = [
        Update(worker=0, arrays=[np.array([7], np.int64)], samples=1),
        Update(worker=1, arrays=[np.array([9], np.int64)], samples=1),
    ]
    out = AverageRule().combine([np.zeros(1, np.int64)], ups)
    assert out[0].dtype == np.int64 and out[0].tolist() == [7]


def test_float16_weights_keep_their_dtype() -> None:
    ups = [Update(worker=0, arrays=[np.array([1.5], np.float16)], samples=1)]
    out = AverageRule().combine([np.zeros(1, np.float16)], ups)
    assert out[0].dtype == np.float16 and out[0].tolist() == [1.5]


def test_make_rule() -> None:
    assert isinstance(make_rule("average"), AverageRule)
    with pytest.raises(ConfigError, match="merge"):
        make_rule("median")
