"""The shard layout: every element in exactly one shard, parts of about equal bytes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkdl.errors import ConfigError
from sparkdl.sync.shards import ShardLayout

shapes = st.lists(
    st.lists(st.integers(1, 40), min_size=0, max_size=3).map(tuple), min_size=1, max_size=8
)


@settings(max_examples=200, deadline=None)
@given(shapes=shapes, data=st.data())
def test_split_then_join_is_the_identity_and_no_shard_is_empty(shapes, data) -> None:
    rows = sum(s[0] if s else 1 for s in shapes)
    k = data.draw(st.integers(1, min(rows, 12)))
    dtypes = data.draw(
        st.lists(
            st.sampled_from(["float32", "float16", "int64"]),
            min_size=len(shapes),
            max_size=len(shapes),
        )
    )
    layout = ShardLayout.plan(list(zip(shapes, dtypes, strict=True)), k)
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=s).astype(d) for s, d in zip(shapes, dtypes, strict=True)]
    parts = layout.split(arrays)
    assert len(parts) == k and all(parts)
    # Each part is a view of its variable's rows: no copy on the way out.
    for pieces, arrays_of_shard in zip(layout.shards, parts, strict=True):
        for piece, part in zip(pieces, arrays_of_shard, strict=True):
            if arrays[piece.variable].ndim:
                assert np.shares_memory(part, arrays[piece.variable])
    back = layout.join(parts)
    for a, b in zip(arrays, back, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)
    assert ShardLayout.from_json(layout.to_json()) == layout


def test_shards_are_balanced_by_bytes_and_small_variables_stay_whole() -> None:
    # A transformer-like list: big matrices, small biases and norms.
    specs = []
    for _ in range(6):
        specs += [
            ((1024, 1024), "float32"),
            ((1024,), "float32"),
            ((1024, 4096), "float32"),
            ((4096,), "float32"),
            ((1024,), "float32"),
        ]
    for k in (2, 4, 8, 16):
        layout = ShardLayout.plan(specs, k)
        sizes = layout.shard_bytes([4] * len(specs))
        target = sum(sizes) / k
        assert max(sizes) <= 1.01 * target and min(sizes) >= 0.99 * target, (k, sizes)
        for pieces in layout.shards:
            for piece in pieces:
                shape = layout.shapes[piece.variable]
                if len(shape) == 1:  # biases and norms are never cut
                    assert (piece.start, piece.stop) == (0, shape[0])


def test_a_model_with_fewer_rows_than_shards_is_refused() -> None:
    with pytest.raises(ConfigError, match="service_shards=4 is more than"):
        ShardLayout.plan([((2, 3), "float32"), ((), "float32")], 4)
    scalars = ShardLayout.plan([((), "float32")] * 3, 3)
    assert [len(s) for s in scalars.shards] == [1, 1, 1]
