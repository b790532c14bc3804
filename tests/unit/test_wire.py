from __future__ import annotations

import pickle
import struct

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from sparkdl.protocol import wire

DTYPES = [
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
    np.uint64, np.float16, np.float32, np.float64, ml_dtypes.bfloat16,
]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (1,), (3, 5), (2, 3, 4), (7, 0, 2), (1, 1, 1, 9)])
def test_round_trip_every_dtype_and_shape(dtype: type, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(0)
    array = (rng.standard_normal(shape) * 10).astype(dtype)
    arrays, meta = wire.decode(wire.encode_bytes([array], {"worker": 3, "seq": 9}))
    assert meta == {"worker": 3, "seq": 9}
    assert arrays[0].dtype == np.dtype(dtype)
    assert arrays[0].shape == shape
    np.testing.assert_array_equal(arrays[0], array)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        hnp.arrays(
            dtype=st.sampled_from([np.float32, np.float64, np.int32, np.uint8, np.float16]),
            shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6),
        ),
        max_size=6,
    )
)
def test_round_trip_property(arrays: list[np.ndarray]) -> None:
    decoded, _ = wire.decode(wire.encode_bytes(arrays))
    assert len(decoded) == len(arrays)
    for got, want in zip(decoded, arrays, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_decoded_arrays_are_read_only_views() -> None:
    body = wire.encode_bytes([np.arange(4, dtype=np.float32)])
    arrays, _ = wire.decode(body)
    assert not arrays[0].flags.writeable


def test_non_contiguous_and_big_endian_inputs() -> None:
    base = np.arange(12, dtype=">f8").reshape(3, 4)
    arrays, _ = wire.decode(wire.encode_bytes([base[:, ::2], base.T]))
    np.testing.assert_array_equal(arrays[0], base[:, ::2])
    np.testing.assert_array_equal(arrays[1], base.T)


def test_truncated_and_padded_bodies_are_refused() -> None:
    body = wire.encode_bytes([np.ones((4, 4), np.float32)])
    for cut in (0, 3, 11, len(body) // 2, len(body) - 1):
        with pytest.raises(wire.WireError):
            wire.decode(body[:cut])
    with pytest.raises(wire.WireError, match="does not match"):
        wire.decode(body + b"\0" * 8)


def test_pickle_payload_is_refused() -> None:
    payload = pickle.dumps([np.ones(3)])
    with pytest.raises(wire.WireError, match="pickle is never accepted"):
        wire.decode(payload)


@pytest.mark.parametrize(
    "header",
    [
        b"[]",
        b"{not json",
        b'{"arrays": [{"dtype": "object", "shape": [1]}]}',
        b'{"arrays": [{"dtype": "float32", "shape": [-1]}]}',
        b'{"arrays": [{"dtype": "float32", "shape": "x"}]}',
        b'{"arrays": 5}',
        b'{"arrays": [], "meta": []}',
        b"\xff\xfe",
    ],
)
def test_bad_headers_are_refused(header: bytes) -> None:
    body = struct.pack("<4sB3xI", b"SDLW", 1, len(header)) + header
    body += b"\0" * (-len(body) % 8)
    with pytest.raises(wire.WireError):
        wire.decode(body)


def test_unsupported_dtype_is_refused_on_encode() -> None:
    with pytest.raises(wire.WireError, match="Expected arrays of dtype"):
        wire.encode([np.array(["a"])])


def test_payload_size_matches_encoding() -> None:
    arrays = [np.zeros((3, 3), np.float32), np.zeros(5, np.float16)]
    header_part = len(wire.encode(arrays)[0])
    total = len(wire.encode_bytes(arrays))
    assert total - header_part == wire.payload_size(
        [a.shape for a in arrays], [a.dtype for a in arrays]
    )
