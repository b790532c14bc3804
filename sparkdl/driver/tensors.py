"""Nested arrays, Spark's image struct and token sequences as flat prepared columns.

Executors read every dense feature as one flat Arrow list per row and view a batch as
a numpy array without a per-row loop (:mod:`sparkdl.executor.blocks`); the model's
input shape is restored by a reshape. So the shapes Spark holds are flattened here, on
the JVM side, and each one comes with a per-row check that the row has the shape the
model's input takes (:class:`Layout`): the fit's data scan counts the rows that fail it
and names the first, and ``transform`` raises on them, so a row is never silently
reshaped into another shape.

* **Nested arrays** (``array<array<...<numeric>>>``): flattened level by level; every
  level's arrays must have the input's length there (a level the input leaves open
  must have one length within a row). A row of rank ``r`` feeds an input of rank ``r``,
  or of a higher rank whose extra dimensions are 1 (an ``(8, 8)`` image for an
  ``(8, 8, 1)`` input).
* **Images** (the struct of ``spark.read.format("image")``: origin, height, width,
  nChannels, mode, data): the ``data`` bytes travel as they are and feed an input of
  shape ``(height, width, nChannels)`` as uint8, in Spark's channel order (BGR, as
  OpenCV stores it), one byte per value.
* **Token sequences** (``array<numeric>`` of varying length): padded or truncated to
  the input's length when the user asks for it (:class:`SequencePadding`, Keras's
  ``pad_sequences`` conventions), never otherwise.

Example:
    >>> from pyspark.sql.types import ArrayType, FloatType
    >>> nested_rank(ArrayType(ArrayType(FloatType())))
    2
    >>> data_dims((8, 8, 1), 2)
    (8, 8)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    FloatType,
    IntegerType,
    NumericType,
    StringType,
    StructType,
)

from sparkdl.errors import ConfigError, SchemaError

__all__ = [
    "IMAGE_MODES",
    "Layout",
    "SequencePadding",
    "data_dims",
    "image_layout",
    "is_image",
    "nested_layout",
    "nested_rank",
    "padded",
]

#: The image source's modes (OpenCV types) of 8-bit images, and their channels.
IMAGE_MODES = {0: 1, 16: 3, 24: 4}
_IMAGE_FIELDS = {
    "origin": StringType,
    "height": IntegerType,
    "width": IntegerType,
    "nChannels": IntegerType,
    "mode": IntegerType,
    "data": BinaryType,
}


@dataclass(frozen=True)
class Layout:
    """How one user column becomes one prepared column.

    Attributes:
        expr: The prepared values: a flat ``array<float>``, or an image's bytes.
        kind: ``"dense"`` (float32 values) or ``"bytes"`` (uint8 values).
        fits: Per row, whether it has the shape the model's input takes (null rows
            count as fitting: the scan counts them as nulls); ``None``: the row's
            width says it all.
        shape: Per row, its shape in words, for messages (``None`` with ``fits``).
        expected: The shape a row must have, in words.
        fix: A statement that keeps only the rows that fit, as pasted after
            ``import pyspark.sql.functions as F``.
    """

    expr: Column
    kind: str = "dense"
    fits: Column | None = None
    shape: Column | None = None
    expected: str = ""
    fix: str = ""

    def guarded(self, column: str) -> Column:
        """``expr``, raising at a row that does not fit (what ``transform`` scores:
        a misshaped row would be reshaped into another shape otherwise)."""
        if self.fits is None or self.shape is None:
            return self.expr
        message = F.concat(
            F.lit(f"sparkdl: a row of {column} has the shape "),
            self.shape,
            F.lit(f"; the model's input takes {self.expected}. Keep the rows that fit: "),
            F.lit(self.fix),
        )
        return F.when(self.fits, self.expr).otherwise(F.raise_error(message))


@dataclass(frozen=True)
class SequencePadding:
    """How token sequences of varying length are made one length, as Keras's
    ``keras.utils.pad_sequences`` does.

    Attributes:
        padding: ``"pre"`` or ``"post"``: where the values are added to short rows.
        truncating: ``"pre"`` or ``"post"``: where values are cut from long rows.
        value: The value added.
        length: The length rows are made; ``None``: the input's, or the longest row
            when the input leaves its length open.

    Example:
        >>> SequencePadding.of("post")
        SequencePadding(padding='post', truncating='post', value=0.0, length=None)
    """

    padding: str = "pre"
    truncating: str = "pre"
    value: float = 0.0
    length: int | None = None

    def __post_init__(self) -> None:
        for name in ("padding", "truncating"):
            if getattr(self, name) not in ("pre", "post"):
                raise ConfigError(
                    f"Expected sequence_padding's {name} to be 'pre' or 'post'. "
                    f"Received: {getattr(self, name)!r}"
                )
        if self.length is not None and (not isinstance(self.length, int) or self.length < 1):
            raise ConfigError(
                f"Expected sequence_padding's length to be a positive int. Received: "
                f"{self.length!r}"
            )
        if not isinstance(self.value, (int, float)) or not math.isfinite(self.value):
            raise ConfigError(
                f"Expected sequence_padding's value to be a finite number. Received: {self.value!r}"
            )

    @classmethod
    def of(cls, setting: Any) -> SequencePadding | None:
        """The padding a ``sequence_padding`` setting asks for: ``None``, ``"pre"`` or
        ``"post"`` (padding and truncating there, value 0), or a dict of the fields.

        Raises:
            ConfigError: The setting is none of those.
        """
        if setting is None or isinstance(setting, SequencePadding):
            return setting
        if setting in ("pre", "post"):
            return cls(setting, setting)
        if isinstance(setting, dict):
            unknown = sorted(set(setting) - {"padding", "truncating", "value", "length"})
            if unknown:
                raise ConfigError(
                    f"sequence_padding takes the keys 'padding', 'truncating', 'value' and "
                    f"'length'. Received unknown keys: {unknown}"
                )
            return cls(**setting)
        raise ConfigError(
            "Expected sequence_padding to be None, 'pre', 'post' or a dict such as "
            "{'padding': 'post', 'truncating': 'post', 'value': 0, 'length': 100}. "
            f"Received: {setting!r}"
        )

    def to_setting(self) -> dict[str, Any]:
        """The dict form (what the estimator's Param holds and a saved stage keeps)."""
        return {
            "padding": self.padding,
            "truncating": self.truncating,
            "value": float(self.value),
            "length": self.length,
        }


def nested_rank(dtype: DataType | None) -> int:
    """Levels of arrays around numbers in ``dtype`` (0: not an array of numbers).

    Example:
        >>> from pyspark.sql.types import ArrayType, DoubleType, StringType
        >>> nested_rank(ArrayType(ArrayType(ArrayType(DoubleType())))), nested_rank(StringType())
        (3, 0)
    """
    rank = 0
    while isinstance(dtype, ArrayType):
        dtype, rank = dtype.elementType, rank + 1
    return rank if rank and isinstance(dtype, (NumericType, BooleanType)) else 0


def data_dims(shape: Sequence[int | None], rank: int) -> tuple[int | None, ...] | None:
    """The per-row shape a column of ``rank`` nested levels must have to feed an input
    of per-sample ``shape`` (``None`` where the input leaves a length open), or
    ``None`` when it cannot: ``shape`` itself, or ``shape`` without dimensions of 1
    (trailing ones first: a channel axis) down to ``rank`` dimensions.

    Example:
        >>> data_dims((28, 28, 1), 2), data_dims((1, 28, 28), 2), data_dims((64,), 2)
        ((28, 28), (28, 28), None)
    """
    dims = list(shape)
    if len(dims) < rank:
        return None
    for ones in (reversed(range(len(dims))), range(len(dims))):
        for i in list(ones):
            if len(dims) > rank and i < len(dims) and dims[i] == 1:
                del dims[i]
    return tuple(dims) if len(dims) == rank else None


def flattened(column: Column, rank: int) -> Column:
    """A nested array column as one flat ``array<float>`` per row."""
    for _ in range(rank - 1):
        column = F.flatten(column)
    return column.cast(ArrayType(FloatType()))


def _level_sizes(column: Column, level: int) -> Column:
    """The sizes of every array at ``level`` (1: the row's elements) within a row."""
    inner = column
    for _ in range(level - 1):
        inner = F.flatten(inner)
    # A null inner array counts as -1 values (size's legacy answer) whatever ANSI says,
    # so that it never fits.
    return F.transform(inner, lambda a: F.coalesce(F.size(a), F.lit(-1)))


def nested_layout(
    column: Column, rank: int, dims: Sequence[int | None], ref: str, name: str
) -> Layout:
    """The layout of a nested array column of ``rank`` levels whose rows must have the
    shape ``dims`` (from :func:`data_dims`).

    Args:
        column: The user's column.
        rank: Its levels of arrays.
        dims: The per-row shape required (``None``: any one length within a row).
        ref: The column as a pasted ``F.col(...)`` takes it.
        name: The column in words, for messages.
    """
    checks, words = [], [F.size(column).cast("string")]
    if dims[0] is not None:
        checks.append(F.size(column) == F.lit(dims[0]))
    for level in range(1, rank):
        sizes = _level_sizes(column, level)
        low, high = F.array_min(sizes), F.array_max(sizes)
        same = F.coalesce(low == high, F.lit(True))  # no arrays at this level: nothing to say
        if dims[level] is not None:
            same = same & F.coalesce(low == F.lit(dims[level]), F.lit(True))
        checks.append(same)
        words.append(
            F.when(low.isNull(), F.lit("0"))
            .when(low == high, low.cast("string"))
            .otherwise(F.concat(low.cast("string"), F.lit(".."), high.cast("string")))
        )
    fits = checks[0]
    for check in checks[1:]:
        fits = fits & check
    expected = "(" + ", ".join("any" if d is None else str(d) for d in dims) + ")"
    return Layout(
        expr=flattened(column, rank),
        fits=column.isNull() | fits,
        shape=F.concat(F.lit("("), F.concat_ws(", ", *words), F.lit(")")),
        expected=expected,
        fix=_nested_filter(ref, rank, dims),
    )


def _nested_filter(ref: str, rank: int, dims: Sequence[int | None]) -> str:
    """A pasted filter keeping the rows of shape ``dims`` (open lengths unchecked)."""
    col = f"F.col({ref!r})"
    parts = [f"(F.size({col}) == {dims[0]})"] if dims[0] is not None else []
    inner = col
    for level in range(1, rank):
        if dims[level] is not None:
            parts.append(f"F.forall({inner}, lambda a: F.size(a) == {dims[level]})")
        inner = f"F.flatten({inner})"
    return f"df = df.filter({' & '.join(parts) or 'F.lit(True)'})"


def is_image(dtype: DataType | None) -> bool:
    """Whether ``dtype`` is the struct of Spark's image data source."""
    if not isinstance(dtype, StructType):
        return False
    fields = {f.name: f.dataType for f in dtype.fields}
    return all(isinstance(fields.get(n), t) for n, t in _IMAGE_FIELDS.items())


def image_dims(shape: Sequence[int | None], name: str) -> tuple[int, int, int]:
    """The ``(height, width, channels)`` an image column must have for an input of
    per-sample ``shape``: ``(h, w, c)``, or ``(h, w)`` for one channel.

    Raises:
        SchemaError: The input is not an image's shape, or leaves a length open.
    """
    dims = tuple(shape)
    if len(dims) == 2:
        dims = (*dims, 1)
    if len(dims) != 3 or any(d is None for d in dims) or dims[2] not in (1, 3, 4):
        raise SchemaError(
            f"{name} holds images (Spark's image source), which feed an input of shape "
            f"(height, width, channels) with 1, 3 or 4 channels. The model's input has "
            f"the shape {(None, *shape)}. Give the model keras.Input((height, width, "
            "channels)) with the images' size, or resize the images to it first."
        )
    return int(dims[0]), int(dims[1]), int(dims[2])  # type: ignore[arg-type]


def image_layout(column: Column, dims: tuple[int, int, int], ref: str) -> Layout:
    """The layout of an image-struct column whose images must be ``dims``
    (height, width, channels) in an 8-bit mode."""
    h, w, c = dims
    modes = [m for m, channels in IMAGE_MODES.items() if channels == c]
    fits = (
        (column["height"] == h)
        & (column["width"] == w)
        & (column["nChannels"] == c)
        & column["mode"].isin(modes)
        & (F.length(column["data"]) == h * w * c)
    )
    shape = F.concat(
        F.lit("("),
        F.concat_ws(
            ", ",
            column["height"].cast("string"),
            column["width"].cast("string"),
            column["nChannels"].cast("string"),
        ),
        F.lit(") (mode "),
        column["mode"].cast("string"),
        F.lit(", origin "),
        F.coalesce(column["origin"], F.lit("?")),
        F.lit(")"),
    )
    col = f"F.col({ref!r})"
    fix = (
        f"df = df.filter(({col}.height == {h}) & ({col}.width == {w}) & "
        f"({col}.nChannels == {c}) & {col}.mode.isin({modes}) & "
        f"(F.length({col}.data) == {h * w * c}))  # or resize the images first"
    )
    return Layout(
        expr=column["data"],
        kind="bytes",
        # A null field fails the check (a null check would count as fitting).
        fits=column.isNull() | column["data"].isNull() | F.coalesce(fits, F.lit(False)),
        shape=shape,
        expected=f"({h}, {w}, {c}) in an 8-bit mode",
        fix=fix,
    )


def padded(column: Column, length: int, padding: SequencePadding) -> Column:
    """``column`` (an array) made ``length`` long: values cut from its ``truncating``
    end, ``padding.value`` added at its ``padding`` end, as ``pad_sequences`` does."""
    size = F.size(column)
    if padding.truncating == "pre":  # keep the last values
        kept = F.slice(column, F.greatest(size - length + 1, F.lit(1)), length)
    else:
        kept = F.slice(column, 1, length)
    fill = F.array_repeat(
        F.lit(float(padding.value)).cast("float"),
        F.greatest(F.lit(length) - F.size(kept), F.lit(0)),
    )
    kept = kept.cast(ArrayType(FloatType()))
    made = F.concat(fill, kept) if padding.padding == "pre" else F.concat(kept, fill)
    return F.when(column.isNull(), F.lit(None)).otherwise(made)
