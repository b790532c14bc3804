"""Update codecs: how pushes and answers shrink on the wire, one class per codec.

Every update of every worker crosses the driver's network link. With
``compression=...`` a worker sends, instead of its full update, an encoding of it as a
few plain arrays (the existing wire format: no pickle), and the service answers with an
encoding of the center's change since what that worker holds
(:mod:`sparkdl.server.state.replicas`). A codec has both halves, and both use the same code:

* :meth:`Codec.encode` (worker, and the service for answers): float arrays become a
  few small arrays; integer arrays and arrays of at most :data:`DENSE_BELOW` values
  (biases, normalisation scales: little to gain) travel as they are.
* :meth:`Codec.decode` (service, and the worker for answers): checks every part against
  the model's own shapes and dtypes and the codec's own bounds (a top-k part may hold
  at most the service's ``k`` values, its indices in range and unique) before building
  the dense arrays; anything else raises :class:`CodecError`.

=========  ========================================================  ====================
codec      a float array of n values travels as                      bytes (float32: 4n)
=========  ========================================================  ====================
fp16       float16, scaled by a power of two per array so that its   2n + 4
           largest magnitude is just under 65504
bf16       bfloat16 (float32's range, 8 bits of mantissa)            2n
topk       the ``k = ceil(ratio * n)`` largest magnitudes:           8k (ratio 1%: 0.08n)
           uint32 indices and their values
sign       one bit per value (its sign) and two float32 scales:      n/8 + 8
           the mean magnitude of the positive and of the negative
           values (1-bit SGD, Seide et al. 2014)
int4       4 bits per value (15 steps of its block's largest         n/2 + 4 n/64
           magnitude over 7) and a float32 scale per 64 values
=========  ========================================================  ====================

Whatever an encoding leaves out is not lost: the worker adds it to its next update
(error feedback, :class:`sparkdl.executor.pusher.Pusher`), and the service's answers
carry the center's change against what the worker holds, so what one answer leaves
out the next carries.

Example:
    >>> import numpy as np
    >>> codec = TopK(ratio=0.01)
    >>> update = [np.arange(1000, dtype=np.float32) - 500]
    >>> parts = codec.encode(update)
    >>> [(p.dtype.name, p.size) for p in parts]
    [('uint32', 10), ('float32', 10)]
    >>> dense = codec.decode(parts, [(np.dtype(np.float32), (1000,))])
    >>> int(np.count_nonzero(dense[0])), float(dense[0].min())
    (10, -500.0)
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from sparkdl.errors import ConfigError, SparkDLError
from sparkdl.sync.merges import float_limit, is_float
from sparkdl.sync.registry import Registry
from sparkdl.sync.settings import FitSettings

__all__ = [
    "CODECS",
    "DENSE_BELOW",
    "WHOLE",
    "BFloat16",
    "Codec",
    "CodecError",
    "Compression",
    "Float16",
    "Int4",
    "Sign",
    "TopK",
    "codec_class",
    "follow",
    "resolve_codec",
    "resolve_compression",
]

#: Float arrays of at most this many values travel uncompressed.
DENSE_BELOW = 256
_FP16_MAX = 65504.0
#: ``compression_ratio`` bounds: above a quarter a top-k encoding (index and value per
#: kept value) is no smaller than a float16 array.
MAX_RATIO = 0.25

Spec = tuple[np.dtype[Any], tuple[int, ...]]


class CodecError(SparkDLError, ValueError):
    """An encoded update does not fit the model or the codec's bounds."""


class Codec(abc.ABC):
    """A codec: both halves. Subclasses are frozen dataclasses of their settings."""

    #: The name users pass as ``compression=``.
    name: ClassVar[str] = ""

    @classmethod
    def resolve(cls, settings: FitSettings) -> Codec:
        """The codec of pushes with its settings resolved on the driver (a codec with
        settings reads them by name, as top-k reads ``compression_ratio``)."""
        return cls()

    def answer_codec(self, settings: FitSettings) -> Codec:
        """The codec of the service's answers: this one, unless the center's change
        between two answers needs more room than one push (top-k: :class:`Compression`).
        """
        return self

    def encode(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The wire arrays of ``arrays`` (each array's parts, in order)."""
        parts: list[np.ndarray] = []
        for array in arrays:
            array = np.asarray(array)
            if self._compressed(array.dtype, array.size):
                parts.extend(self._encode(array.reshape(-1)))
            else:
                parts.append(array)
        return parts

    def decode(self, parts: Sequence[np.ndarray], specs: Sequence[Spec]) -> list[np.ndarray]:
        """The dense arrays of the dtypes and shapes ``specs`` that ``parts`` encode.

        Raises:
            CodecError: The parts do not encode arrays of ``specs`` with this codec.
        """
        counts = [self._parts(np.dtype(d), math.prod(s)) for d, s in specs]
        if len(parts) != sum(counts):
            raise CodecError(
                f"expected {sum(counts)} arrays for {len(specs)} weights compressed with "
                f"{self.name!r}, received {len(parts)}"
            )
        out, at = [], 0
        for i, ((dtype, shape), count) in enumerate(zip(specs, counts, strict=True)):
            dtype, size = np.dtype(dtype), math.prod(shape)
            own = list(parts[at : at + count])
            at += count
            if self._compressed(dtype, size):
                try:
                    out.append(self._decode(own, dtype, size).reshape(shape))
                except CodecError as exc:
                    raise CodecError(f"weight {i}: {exc}") from None
            else:
                _expect(own[0], dtype, shape, f"weight {i}")
                out.append(own[0])
        return out

    def encoded_bytes(self, specs: Sequence[Spec]) -> int:
        """Bytes of the arrays an update of ``specs`` encodes to (headers aside)."""
        total = 0
        for dtype, shape in specs:
            dtype, size = np.dtype(dtype), math.prod(shape)
            total += (
                self._bytes(dtype, size) if self._compressed(dtype, size) else size * dtype.itemsize
            )
        return total

    def _compressed(self, dtype: np.dtype[Any], size: int) -> bool:
        return size > DENSE_BELOW and is_float(np.empty(0, dtype))

    def _parts(self, dtype: np.dtype[Any], size: int) -> int:
        return self.parts_per_array if self._compressed(dtype, size) else 1

    #: Wire arrays per compressed array.
    parts_per_array: ClassVar[int] = 1

    @abc.abstractmethod
    def _encode(self, flat: np.ndarray) -> list[np.ndarray]:
        """The parts of one flat float array."""

    @abc.abstractmethod
    def _decode(self, parts: list[np.ndarray], dtype: np.dtype[Any], size: int) -> np.ndarray:
        """The flat array of ``dtype`` and ``size`` the parts encode (checked)."""

    @abc.abstractmethod
    def _bytes(self, dtype: np.dtype[Any], size: int) -> int:
        """Bytes of one compressed array's parts."""


#: Every codec by name; ``@CODECS.register`` adds one.
CODECS: Registry[type[Codec]] = Registry("compression")
codec_class = CODECS.get


@dataclass(frozen=True)
class Compression:
    """The codecs of one fit, resolved on the driver: pushes in ``push``, answers in
    ``answer``.

    They differ for top-k only: between two answers to a worker the center moves by
    every worker's pushes, each ``k`` values, so answers keep ``num_workers`` times as
    many values (at most :data:`MAX_RATIO` of each array): with ``merge="delta"`` or
    ``"elastic"`` the center's change is then sent whole, not cut to one push's worth.
    """

    push: Codec
    answer: Codec

    @classmethod
    def resolve(cls, settings: FitSettings) -> Compression:
        """Both directions' codecs of ``settings.compression`` (a codec's name).

        Example:
            >>> settings = FitSettings({"compression": "fp16"}, num_workers=2)
            >>> Compression.resolve(settings).answer
            Float16()
        """
        push = codec_class(settings.compression).resolve(settings)
        return cls(push, push.answer_codec(settings))


@dataclass(frozen=True)
class Whole(Codec):
    """No encoding: every array travels as it is, checked against its spec.

    A worker's closing push sends its update whole (:data:`WHOLE`), so what error
    feedback still held locally reaches the center before the fit ends.

    Example:
        >>> parts = WHOLE.encode([np.ones(1000, np.float32)])
        >>> dense = WHOLE.decode(parts, [(np.dtype(np.float32), (1000,))])
        >>> parts[0].size, float(dense[0].sum())
        (1000, 1000.0)
    """

    name = "whole"

    def _compressed(self, dtype: np.dtype[Any], size: int) -> bool:
        return False

    def _encode(self, flat: np.ndarray) -> list[np.ndarray]:
        return [flat]

    def _decode(self, parts: list[np.ndarray], dtype: np.dtype[Any], size: int) -> np.ndarray:
        return parts[0]

    def _bytes(self, dtype: np.dtype[Any], size: int) -> int:
        return size * dtype.itemsize


#: The identity codec of a push sent whole (``meta["whole"]``).
WHOLE = Whole()


def resolve_codec(name: str | None, ratio: float) -> Codec | None:
    """The codec for ``compression=name`` (``None``: no compression).

    Example:
        >>> resolve_codec("topk", 0.05)
        TopK(ratio=0.05)
    """
    if name is None:
        return None
    return codec_class(name).resolve(FitSettings({"compression_ratio": ratio}))


def resolve_compression(name: str | None, ratio: float, num_workers: int) -> Compression | None:
    """Both directions' codecs for ``compression=name`` over ``num_workers`` workers
    (:meth:`Compression.resolve` of those settings).

    Example:
        >>> resolve_compression("topk", 0.01, 4).answer
        TopK(ratio=0.04)
    """
    if name is None:
        return None
    values = {"compression": name, "compression_ratio": ratio}
    return Compression.resolve(FitSettings(values, num_workers=num_workers))


class _Sixteen(Codec):
    """Shared by the 16-bit casts: 16-bit float arrays travel as they are."""

    def _compressed(self, dtype: np.dtype[Any], size: int) -> bool:
        return is_float(np.empty(0, dtype)) and dtype.itemsize > 2


@CODECS.register
@dataclass(frozen=True)
class Float16(_Sixteen):
    """IEEE half precision (11 significant bits), each array scaled by a power of two
    so that its largest magnitude lands just under float16's largest value (65504):
    the tiny changes of a step keep their 11 bits instead of falling into float16's
    subnormals (below 6.1e-5), which keep few bits and which numpy converts 20 times
    slower. The scale is exact both ways; it travels as one float32 per array."""

    name: ClassVar[str] = "fp16"
    parts_per_array: ClassVar[int] = 2

    def _encode(self, flat: np.ndarray) -> list[np.ndarray]:
        flat = flat.astype(np.float32, copy=False)
        largest = float(np.max(np.abs(flat))) if flat.size else 0.0
        exponent = 0
        if 0.0 < largest < math.inf:
            exponent = min(max(math.floor(math.log2(_FP16_MAX / largest)), -126), 126)
            while largest * 2.0**exponent > _FP16_MAX:  # log2's rounding, at the edge
                exponent -= 1
        scaled = flat * np.float32(2.0**exponent) if exponent else flat
        if not 0.0 <= largest < math.inf:  # NaN or inf: saturate; the service refuses NaN
            scaled = np.clip(scaled, -_FP16_MAX, _FP16_MAX)
        with np.errstate(over="ignore"):
            values = scaled.astype(np.float16)
        return [values, np.array([2.0**-exponent], np.float32)]

    def _decode(self, parts: list[np.ndarray], dtype: np.dtype[Any], size: int) -> np.ndarray:
        values, scale = parts
        _expect(values, np.dtype(np.float16), (size,), "values")
        _expect(scale, np.dtype(np.float32), (1,), "scale")
        if not (np.isfinite(scale).all() and (scale > 0).all()):
            raise CodecError("the scale must be finite and > 0")
        with np.errstate(over="ignore"):  # an overflow is refused as inf by the store
            return (values.astype(np.float32) * scale[0]).astype(dtype, copy=False)

    def _bytes(self, dtype: np.dtype[Any], size: int) -> int:
        return 2 * size + 4


@CODECS.register
@dataclass(frozen=True)
class BFloat16(_Sixteen):
    """bfloat16: float32's range (nothing to scale) with 8 significant bits."""

    name: ClassVar[str] = "bf16"

    def _encode(self, flat: np.ndarray) -> list[np.ndarray]:
        wire = _bfloat16()
        limit = float_limit(wire)
        if float_limit(flat.dtype) > limit:  # saturate rather than overflow to inf
            flat = np.clip(flat, -limit, limit)
        return [flat.astype(wire)]

    def _decode(self, parts: list[np.ndarray], dtype: np.dtype[Any], size: int) -> np.ndarray:
        _expect(parts[0], _bfloat16(), (size,), "values")
        return parts[0].astype(dtype)

    def _bytes(self, dtype: np.dtype[Any], size: int) -> int:
        return 2 * size


@CODECS.register
@dataclass(frozen=True)
class TopK(Codec):
    """The ``k`` values of largest magnitude (Aji and Heafield 2017; Lin et al. 2018)."""

    name: ClassVar[str] = "topk"
    parts_per_array: ClassVar[int] = 2
    ratio: float = 0.01

    def __post_init__(self) -> None:
        if isinstance(self.ratio, bool) or not (
            isinstance(self.ratio, (int, float)) and 0 < self.ratio <= MAX_RATIO
        ):
            raise ConfigError(
                f"Expected compression_ratio to be a number in (0, {MAX_RATIO}] (the "
                f"fraction of each array's values a top-k update keeps). Received: "
                f"compression_ratio={self.ratio!r}"
            )

    @classmethod
    def resolve(cls, settings: FitSettings) -> Codec:
        return cls(ratio=settings.compression_ratio)

    def answer_codec(self, settings: FitSettings) -> Codec:
        # Between two answers to a worker the center moves by every worker's pushes.
        return TopK(ratio=min(MAX_RATIO, self.ratio * max(settings.num_workers, 1)))

    def k(self, size: int) -> int:
        """Values kept of an array of ``size``."""
        return max(1, math.ceil(self.ratio * size))

    def _encode(self, flat: np.ndarray) -> list[np.ndarray]:
        k = self.k(flat.size)
        top = np.argpartition(np.abs(flat), flat.size - k)[flat.size - k :]
        top.sort()  # ascending indices: the decoder's scatter walks memory in order
        return [top.astype(_index_dtype(flat.size)), flat[top]]

    def _decode(self, parts: list[np.ndarray], dtype: np.dtype[Any], size: int) -> np.ndarray:
        indices, values = parts
        count = indices.size
        if count > self.k(size):
            raise CodecError(f"{count} values sent, at most {self.k(size)} kept of {size}")
        _expect(indices, _index_dtype(size), (count,), "indices")
        _expect(values, dtype, (count,), "values")
        if count and int(indices.max()) >= size:
            raise CodecError(f"an index is {int(indices.max())}, beyond the {size} values")
        if np.unique(indices).size != count:
            raise CodecError("indices repeat")
        dense = np.zeros(size, dtype)
        dense[indices] = values
        return dense

    def _bytes(self, dtype: np.dtype[Any], size: int) -> int:
        return self.k(size) * (_index_dtype(size).itemsize + dtype.itemsize)


@CODECS.register
@dataclass(frozen=True)
class Sign(Codec):
    """One bit per value and two scales per array (1-bit SGD, Seide et al. 2014): a
    value comes back as the mean magnitude of the values of its sign."""

    name: ClassVar[str] = "sign"
    parts_per_array: ClassVar[int] = 2

    def _encode(self, flat: np.ndarray) -> list[np.ndarray]:
        positive = flat >= 0
        count = int(np.count_nonzero(positive))
        # The sums of the positive and of the negative values, from two passes in
        # float64 (no copies of either side).
        total = float(flat.sum(dtype=np.float64))
        magnitude = float(np.abs(flat).sum(dtype=np.float64))
        up = (magnitude + total) / 2 / count if count else 0.0
        down = (magnitude - total) / 2 / (flat.size - count) if count < flat.size else 0.0
        limit = float_limit(np.float32)  # a change near float32's range: saturate
        scales = np.clip([up, down], 0.0, limit)
        return [np.packbits(positive), scales.astype(np.float32)]

    def _decode(self, parts: list[np.ndarray], dtype: np.dtype[Any], size: int) -> np.ndarray:
        bits, scales = parts
        _expect(bits, np.dtype(np.uint8), ((size + 7) // 8,), "sign bits")
        _expect(scales, np.dtype(np.float32), (2,), "scales")
        if not (np.isfinite(scales).all() and (scales >= 0).all()):
            raise CodecError("the scales must be finite and >= 0")
        positive = np.unpackbits(bits, count=size).view(bool)
        up, down = scales.astype(dtype)
        return np.where(positive, up, -down)

    def _bytes(self, dtype: np.dtype[Any], size: int) -> int:
        return (size + 7) // 8 + 8


@CODECS.register
@dataclass(frozen=True)
class Int4(Codec):
    """4 bits per value and one float32 scale per block of :attr:`block` values: each
    block's values are rounded to the nearest of the 15 steps ``-7..7`` times the
    block's largest magnitude over 7 (the 4-bit outer gradients of Streaming DiLoCo).
    A value comes back within half a step of what was sent; error feedback carries the
    rest into the next update. A block holding NaN gets a NaN scale, which the service
    refuses, as it refuses NaN in any update.

    Example:
        >>> parts = Int4().encode([np.linspace(-7, 7, 300, dtype=np.float32)])
        >>> [(p.dtype.name, p.size) for p in parts]
        [('uint8', 150), ('float32', 5)]
        >>> dense = Int4().decode(parts, [(np.dtype(np.float32), (300,))])
        >>> float(np.abs(dense[0] - np.linspace(-7, 7, 300)).max()) <= 0.5
        True
    """

    name: ClassVar[str] = "int4"
    parts_per_array: ClassVar[int] = 2
    #: Values per scale.
    block: ClassVar[int] = 64

    def _encode(self, flat: np.ndarray) -> list[np.ndarray]:
        size, block = flat.size, self.block
        blocks = -(-size // block)
        padded = np.zeros(blocks * block, np.float32)
        limit = min(float_limit(np.float32), float_limit(flat.dtype))
        if float_limit(flat.dtype) > limit:  # float64: saturate before the cast
            flat = np.clip(flat, -limit, limit)
        padded[:size] = flat
        np.clip(padded, -limit, limit, out=padded)  # inf saturates; NaN stays NaN
        rows = padded.reshape(blocks, block)
        scales = np.max(np.abs(rows), axis=1) / np.float32(7.0)
        safe = np.where(scales > 0, scales, np.float32(1.0))
        with np.errstate(invalid="ignore"):
            steps = np.nan_to_num(np.rint(rows / safe[:, None]), nan=0.0)
        codes = (np.clip(steps, -7, 7) + 8).astype(np.uint8).reshape(-1)[: size + size % 2]
        return [(codes[0::2] << 4) | codes[1::2], scales.astype(np.float32)]

    def _decode(self, parts: list[np.ndarray], dtype: np.dtype[Any], size: int) -> np.ndarray:
        packed, scales = parts
        blocks = -(-size // self.block)
        _expect(packed, np.dtype(np.uint8), ((size + 1) // 2,), "4-bit values")
        _expect(scales, np.dtype(np.float32), (blocks,), "block scales")
        if not (np.isfinite(scales).all() and (scales >= 0).all()):
            raise CodecError("the block scales must be finite and >= 0")
        codes = np.empty(2 * packed.size, np.int8)
        codes[0::2] = packed >> 4
        codes[1::2] = packed & 15
        if not codes[:size].all():  # 0 (step -8) is no step of the encoder's 15
            raise CodecError("a 4-bit code is 0, outside the steps -7..7")
        steps = codes[:size].astype(np.float32) - np.float32(8.0)
        return (steps * np.repeat(scales, self.block)[:size]).astype(dtype, copy=False)

    def _bytes(self, dtype: np.dtype[Any], size: int) -> int:
        return (size + 1) // 2 + 4 * -(-size // self.block)


def follow(copy: Sequence[np.ndarray], change: Sequence[np.ndarray]) -> list[np.ndarray]:
    """``copy`` moved by a decoded ``change`` (an integer array: the change's value),
    as the worker and the service both compute it, so both hold the same copy.

    Example:
        >>> moved = follow([np.ones(2, np.float32), np.array([3])],
        ...                [np.ones(2, np.float32), np.array([5])])
        >>> moved[0].tolist(), moved[1].tolist()
        ([2.0, 2.0], [5])
    """
    return [c + d if is_float(d) else d for c, d in zip(copy, change, strict=True)]


def _bfloat16() -> np.dtype[Any]:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def _index_dtype(size: int) -> np.dtype[Any]:
    return np.dtype(np.uint32 if size <= 2**32 else np.uint64)


def _expect(array: np.ndarray, dtype: np.dtype[Any], shape: tuple[int, ...], what: str) -> None:
    if array.dtype != dtype or tuple(array.shape) != tuple(shape):
        raise CodecError(
            f"expected {what} of dtype {dtype} and shape {tuple(shape)}, received dtype "
            f"{array.dtype} and shape {tuple(array.shape)}"
        )
