"""Image bytes and shapes on the executors' side: uint8 rows from Arrow binary columns
(sliced ones too), cached and read back as uint8; the driver's shape rules."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from sparkdl.contract.payload import Column, cached_columns
from sparkdl.driver.tensors import SequencePadding, data_dims
from sparkdl.errors import ConfigError, SchemaError
from sparkdl.executor.blocks import convert, row_widths
from sparkdl.executor.cache import PartitionCache


def _images(n: int, width: int) -> tuple[np.ndarray, pa.Array]:
    pixels = np.arange(n * width, dtype=np.uint8).reshape(n, width)
    return pixels, pa.array([p.tobytes() for p in pixels], pa.binary())


def test_binary_rows_are_viewed_as_uint8_without_a_copy_per_row() -> None:
    pixels, column = _images(6, 12)
    sliced = column.slice(2, 3)  # an Arrow slice: its offsets do not start at 0
    got = convert(pa.RecordBatch.from_arrays([sliced], ["x"]), [Column("x", "bytes", 12)])["x"]
    assert got.dtype == np.uint8 and got.shape == (3, 12)
    np.testing.assert_array_equal(got, pixels[2:5])
    assert row_widths(sliced).tolist() == [12, 12, 12]


def test_binary_rows_of_another_width_or_null_are_refused() -> None:
    _, column = _images(2, 12)
    with pytest.raises(SchemaError):
        convert(pa.RecordBatch.from_arrays([column], ["x"]), [Column("x", "bytes", 16)])
    nulls = pa.array([b"\x00" * 4, None], pa.binary())
    with pytest.raises(SchemaError, match="null image"):
        convert(pa.RecordBatch.from_arrays([nulls], ["x"]), [Column("x", "bytes", 4)])


@pytest.mark.parametrize("mode", ["memory", "disk"])
def test_the_cache_keeps_image_bytes_one_byte_a_value(mode: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    inputs, outputs, _ = cached_columns([(2, 2, 3)], [False], ["int"], [1], False, [True])
    assert inputs[0].kind == "bytes" and inputs[0].dtype == np.uint8
    pixels, column = _images(5, 12)
    batch = pa.RecordBatch.from_arrays(
        [column, pa.array(np.arange(5, dtype=np.int32))], [inputs[0].name, outputs[0].name]
    )
    with PartitionCache([*inputs, *outputs], mode=mode, directory=str(tmp_path)) as cache:
        cache.append(batch)
        assert cache.data_bytes == 5 * 12 + 5 * 4
        np.testing.assert_array_equal(cache.read(1, 4)[inputs[0].name], pixels[1:4])


def test_data_dims_drops_only_ones_to_reach_the_rows_rank() -> None:
    assert data_dims((8, 8, 1), 2) == (8, 8)
    assert data_dims((None, 16), 2) == (None, 16)
    assert data_dims((8, 8, 1), 3) == (8, 8, 1)
    assert data_dims((8, 8), 3) is None  # rows deeper than the input
    assert data_dims((8, 4, 2), 2) is None  # no dimension of 1 to drop


def test_padding_makes_only_one_dimensional_inputs_their_length() -> None:
    from sparkdl.driver.data import _padded_length

    post = SequencePadding("post", "post")
    assert _padded_length((10,), post) == 10
    assert _padded_length((8, 8, 1), post) is None  # not a sequence: never padded
    assert _padded_length((None,), SequencePadding(length=7)) == 7
    with pytest.raises(ConfigError, match="length"):
        _padded_length((None,), post)
    with pytest.raises(ConfigError, match="takes 10 values"):
        _padded_length((10,), SequencePadding(length=12))


def test_sequence_padding_settings() -> None:
    assert SequencePadding.of(None) is None
    assert SequencePadding.of("pre") == SequencePadding("pre", "pre")
    given = {"padding": "post", "truncating": "pre", "value": -1, "length": 5}
    assert SequencePadding.of(given).to_setting() == {**given, "value": -1.0}
    for bad in ("end", {"maxlen": 3}, {"length": 0}, {"value": float("nan")}, 3):
        with pytest.raises(ConfigError):
            SequencePadding.of(bad)
