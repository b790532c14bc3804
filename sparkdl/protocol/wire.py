"""Binary wire format for lists of arrays: a small JSON header, then raw buffers.

No pickle anywhere: a message is ``MAGIC | version | header length | JSON header |
padding | buffers``. The header names each array's dtype and shape plus free-form
metadata (worker id, sequence number, round...). Decoding checks every length against
the header, so a truncated or padded body is refused, and returns zero-copy views.

Layout (little-endian)::

    0   4 bytes   b"SDLW"
    4   1 byte    format version (1)
    5   3 bytes   reserved, zero
    8   uint32    header length H
    12  H bytes   UTF-8 JSON {"arrays": [{"dtype": "float32", "shape": [3, 4]}, ...],
                              "meta": {...}}
    ..  pad to a multiple of 8, then each buffer, each padded to a multiple of 8

Example:
    >>> import numpy as np
    >>> from sparkdl.protocol import wire
    >>> body = wire.encode_bytes([np.ones((2, 3), np.float32)], {"worker": 0})
    >>> arrays, meta = wire.decode(body)
    >>> arrays[0].shape, meta["worker"]
    ((2, 3), 0)
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from sparkdl.errors import SparkDLError

__all__ = [
    "CONTENT_TYPE",
    "MAX_HEADER_BYTES",
    "WireError",
    "decode",
    "encode",
    "encode_bytes",
    "payload_size",
]

CONTENT_TYPE = "application/x-sparkdl-arrays"
MAGIC = b"SDLW"
VERSION = 1
MAX_HEADER_BYTES = 4 << 20
MAX_ARRAYS = 100_000
_PREFIX = struct.Struct("<4sB3xI")
_ALIGN = 8

_ALLOWED_DTYPES: dict[str, np.dtype[Any]] = {
    name: np.dtype(name)
    for name in (
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
    )
}
try:  # bfloat16 comes with ml_dtypes, a dependency of Keras and TensorFlow.
    import ml_dtypes

    _ALLOWED_DTYPES["bfloat16"] = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes ships with keras
    pass


class WireError(SparkDLError, ValueError):
    """A message does not follow the wire format (bad magic, lengths, dtypes...)."""


def encode(arrays: Sequence[np.ndarray], meta: dict[str, Any] | None = None) -> list[Any]:
    """Encodes arrays and metadata as a list of buffers to send one after another.

    The array buffers are not copied when the arrays are C-contiguous little-endian.

    Args:
        arrays: Arrays of the allowed dtypes (bool, ints, float16/32/64, bfloat16).
        meta: JSON-serialisable metadata.

    Returns:
        A list of ``bytes`` / ``memoryview`` chunks; ``b"".join(chunks)`` is the message.

    Raises:
        WireError: An array has a dtype the format does not carry.

    Example:
        >>> import numpy as np
        >>> chunks = encode([np.zeros(4, np.float32)])
        >>> sum(len(c) for c in chunks) % 8
        0
    """
    specs = []
    buffers: list[Any] = []
    for array in arrays:
        array = np.asarray(array)
        name = _dtype_name(array.dtype)
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        array = np.require(array, requirements="C")  # keeps 0-d arrays 0-d
        specs.append({"dtype": name, "shape": list(array.shape)})
        buffers.append(array.reshape(-1).view(np.uint8).data if array.size else b"")
    header = json.dumps({"arrays": specs, "meta": meta or {}}, separators=(",", ":")).encode()
    head = _PREFIX.pack(MAGIC, VERSION, len(header)) + header
    chunks: list[Any] = [head + b"\0" * _pad(len(head))]
    for buf in buffers:
        if len(buf):
            chunks.append(buf)
        if _pad(len(buf)):
            chunks.append(b"\0" * _pad(len(buf)))
    return chunks


def encode_bytes(arrays: Sequence[np.ndarray], meta: dict[str, Any] | None = None) -> bytes:
    """Like :func:`encode` but returns one ``bytes`` object.

    Example:
        >>> import numpy as np
        >>> encode_bytes([np.zeros(1, np.float32)])[:4]
        b'SDLW'
    """
    return b"".join(encode(arrays, meta))


def payload_size(shapes: Sequence[tuple[int, ...]], dtypes: Sequence[Any]) -> int:
    """Bytes the array buffers of a message take (without header), padding included.

    Example:
        >>> payload_size([(3,)], ["float32"])
        16
    """
    total = 0
    for shape, dtype in zip(shapes, dtypes, strict=True):
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        total += n + _pad(n)
    return total


def decode(body: bytes | bytearray | memoryview) -> tuple[list[np.ndarray], dict[str, Any]]:
    """Decodes a message into read-only array views and its metadata.

    Args:
        body: A complete message as made by :func:`encode`.

    Returns:
        ``(arrays, meta)``; the arrays are views into ``body`` (no copy).

    Raises:
        WireError: The message is truncated, too long, or its header is invalid.

    Example:
        >>> import numpy as np
        >>> decode(encode_bytes([np.arange(3, dtype=np.int32)]))[0][0].tolist()
        [0, 1, 2]
    """
    view = memoryview(body).cast("B")
    if len(view) < _PREFIX.size:
        raise WireError(
            f"Message of {len(view)} bytes is shorter than the {_PREFIX.size}-byte prefix."
        )
    magic, version, header_len = _PREFIX.unpack_from(view, 0)
    if magic != MAGIC:
        raise WireError(
            f"Expected the message to start with {MAGIC!r} (sparkdl wire format). Received: "
            f"{bytes(magic)!r}. Send arrays with sparkdl.protocol.wire.encode; "
            "pickle is never accepted."
        )
    if version != VERSION:
        raise WireError(f"Expected wire format version {VERSION}. Received: {version}")
    if header_len > MAX_HEADER_BYTES or _PREFIX.size + header_len > len(view):
        raise WireError(
            f"Header length {header_len} exceeds the message ({len(view)} bytes) or the "
            f"{MAX_HEADER_BYTES}-byte bound."
        )
    try:
        header = json.loads(bytes(view[_PREFIX.size : _PREFIX.size + header_len]))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise WireError(f"Header is not valid UTF-8 JSON: {exc}") from None
    if not isinstance(header, dict):
        raise WireError("Expected the header to be a JSON object.")
    specs = header.get("arrays")
    meta = header.get("meta", {})
    if not isinstance(specs, list) or len(specs) > MAX_ARRAYS:
        raise WireError(f"Expected header['arrays'] to be a list of at most {MAX_ARRAYS} entries.")
    if not isinstance(meta, dict):
        raise WireError("Expected header['meta'] to be a JSON object.")
    offset = _PREFIX.size + header_len
    offset += _pad(offset)
    arrays = []
    for i, spec in enumerate(specs):
        dtype, shape = _parse_spec(i, spec)
        count = 1
        for dim in shape:
            count *= dim
        nbytes = count * dtype.itemsize
        if offset + nbytes > len(view):
            raise WireError(
                f"Message truncated: array {i} needs bytes up to {offset + nbytes}, "
                f"the message has {len(view)}."
            )
        array = np.frombuffer(view, dtype=dtype, count=count, offset=offset).reshape(shape)
        arrays.append(array)
        offset += nbytes + _pad(nbytes)
    if offset != len(view):
        raise WireError(
            f"Message length {len(view)} does not match its header, which describes {offset} bytes."
        )
    return arrays, meta


def _dtype_name(dtype: np.dtype[Any]) -> str:
    name = dtype.name
    if name not in _ALLOWED_DTYPES:
        raise WireError(
            f"Expected arrays of dtype {sorted(_ALLOWED_DTYPES)}. Received: dtype={dtype}"
        )
    return name


def _parse_spec(index: int, spec: Any) -> tuple[np.dtype[Any], tuple[int, ...]]:
    if not isinstance(spec, dict):
        raise WireError(f"Array spec {index} must be an object with 'dtype' and 'shape'.")
    name = spec.get("dtype")
    dtype = _ALLOWED_DTYPES.get(name) if isinstance(name, str) else None
    if dtype is None:
        raise WireError(
            f"Array {index}: expected dtype in {sorted(_ALLOWED_DTYPES)}. "
            f"Received: {repr(name)[:60]}"
        )
    shape = spec.get("shape")
    if (
        not isinstance(shape, list)
        or len(shape) > 32
        or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**40 for d in shape)
    ):
        raise WireError(
            f"Array {index}: expected shape to be a list of non-negative ints. "
            f"Received: {repr(shape)[:60]}"
        )
    return dtype, tuple(shape)


def _pad(n: int) -> int:
    return -n % _ALIGN
