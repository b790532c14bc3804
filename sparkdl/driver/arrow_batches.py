"""Arrow record batches of bounded bytes for the fit's training job.

Spark hands a ``mapInArrow`` task its partition in record batches of
``spark.sql.execution.arrow.maxRecordsPerBatch`` rows (10,000 by default), whatever
their width. A worker holds one batch in Python at a time while it caches the partition
(:mod:`sparkdl.executor.cache`), so the batch is a fixed cost on top of the partition:
about 30 MB for CIFAR-sized images (3 KB a row), 1.5 GB for 224 x 224 x 3 images. On
a 73 MB partition of 50,000 CIFAR-sized images over 2 workers, that made a worker's
peak grow 1.35 bytes per partition byte over an idle fit's; with batches of about 4 MB,
1.20-1.21 (``docs/benchmarks/images.md``).

:func:`bounded_batches` lowers that setting for the duration of the job, so a batch holds
about :data:`BATCH_BYTES` (never more rows than the session's own setting), and puts
the session's value back after. Spark reads the setting when it plans the job's query
(classic and Spark Connect alike), so it applies to this job; another query planned
meanwhile on the same session only gets smaller batches. Fits running at once on one
session (a :class:`~sparkdl.search.Search`) share one lowering: the setting is the
smallest any of them needs, and the session's own value returns when the last ends.
(Spark 4's ``spark.sql.execution.arrow.maxBytesPerBatch`` bounds bytes directly, but
PySpark 3.5 has no such setting.)

Example:
    >>> records_per_batch(bytes_per_row=3_100, session_records=10_000)
    1353
    >>> records_per_batch(bytes_per_row=40, session_records=10_000)
    10000
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    FloatType,
    IntegerType,
    ShortType,
    StructType,
)

from sparkdl.compat.spark import session_key
from sparkdl.contract.payload import feature_name, label_name

__all__ = ["BATCH_BYTES", "RECORDS_SETTING", "bounded_batches", "records_per_batch", "row_bytes"]

#: The setting lowered: rows per Arrow record batch sent to a Python task.
RECORDS_SETTING = "spark.sql.execution.arrow.maxRecordsPerBatch"
#: Spark's default for it.
SPARK_RECORDS = 10_000
#: About how many bytes of rows a record batch holds for a training task.
BATCH_BYTES = 4 * 1024 * 1024

_log = logging.getLogger(__name__)
_lock = threading.Lock()
#: Per session (:func:`~sparkdl.compat.spark.session_key`): the session's own value
#: (``None``: not set) and the rows each fit inside asks for.
_lowered: dict[str, tuple[str | None, list[int]]] = {}


def records_per_batch(bytes_per_row: int, session_records: int) -> int:
    """Rows per record batch for rows of ``bytes_per_row``.

    Args:
        bytes_per_row: About how many bytes a row takes in Arrow (:func:`row_bytes`).
        session_records: The session's own rows per batch (0 or less: no limit).

    Returns:
        About :data:`BATCH_BYTES` of rows, never more than ``session_records``, at
        least 1.

    Example:
        >>> records_per_batch(bytes_per_row=1_048_576, session_records=10_000)
        4
    """
    rows = max(1, BATCH_BYTES // max(int(bytes_per_row), 1))
    return rows if session_records <= 0 else min(rows, session_records)


def row_bytes(
    schema: StructType,
    widths: Sequence[int],
    label_widths: Sequence[int] = (),
    sparse: Sequence[bool] = (),
) -> int:
    """About how many bytes a row of the prepared frame ``schema`` takes in Arrow.

    A prepared feature or label column holds ``widths[i]`` (``label_widths[j]``)
    values per row, each of its type's size (one byte for Spark's image struct's
    ``data``, four for ``float``, eight for ``double`` and ML vectors); any other
    column counts one value, and so does a sparse input's (``sparse[i]``: its width is
    the vector's size, not what its rows hold).

    Example:
        >>> from pyspark.sql.types import StructField, DoubleType
        >>> schema = StructType([StructField("__sparkdl_features",
        ...                                  ArrayType(DoubleType()))])
        >>> row_bytes(schema, [64])
        512
    """
    kept_sparse = list(sparse) + [False] * len(widths)
    values = {feature_name(i): 1 if kept_sparse[i] else w for i, w in enumerate(widths)}
    values.update({label_name(j): w for j, w in enumerate(label_widths)})
    return sum(max(int(values.get(f.name, 1)), 1) * _value_bytes(f.dataType) for f in schema.fields)


@contextlib.contextmanager
def bounded_batches(spark: Any, bytes_per_row: int) -> Iterator[int]:
    """Inside, the session's Arrow record batches hold about :data:`BATCH_BYTES` of rows.

    Fewer when another fit inside this on the same session asks for fewer; the
    session's own setting (or its absence) returns when the last such fit leaves. A
    session that refuses to show or change the setting (a serverless runtime may)
    keeps its batches, with a log line; this never fails a fit.

    Args:
        spark: The session (classic or Spark Connect).
        bytes_per_row: About how many bytes a row of the job's frame takes
            (:func:`row_bytes`).

    Yields:
        The rows per batch this fit asked for when it lowered the setting, else the
        session's own (read, or Spark's default when unreadable). Another fit inside
        may hold it lower.

    Example:
        >>> with bounded_batches(spark, bytes_per_row=1_048_576) as records:  # doctest: +SKIP
        ...     rows = frame.mapInArrow(train, schema).collect()  # batches of 4 rows
    """
    key = session_key(spark)
    with _lock:
        held = _lowered.get(key)
        readable, own = (True, held[0]) if held else _read(spark)
        session_records = _as_records(own)
        records = records_per_batch(bytes_per_row, session_records)
        lowered = False
        if readable and records != session_records:
            wanted = held[1] if held else []
            if _write(spark, str(min([*wanted, records]))):
                wanted.append(records)
                _lowered[key] = (own, wanted)
                lowered = True
    try:
        yield records if lowered else session_records
    finally:
        if lowered:
            with _lock:
                wanted.remove(records)
                restored = _write(spark, str(min(wanted)) if wanted else own)
                if not wanted and restored:
                    del _lowered[key]  # else the next fit still knows the session's own


def _read(spark: Any) -> tuple[bool, str | None]:
    """Whether the session shows the setting, and its value (``None``: not set)."""
    try:
        value = spark.conf.get(RECORDS_SETTING, None)
    except Exception as exc:  # a server that refuses to show it
        _log.info("record batches keep their size: %s unreadable (%s)", RECORDS_SETTING, exc)
        return False, None
    return True, None if value is None else str(value)


def _write(spark: Any, value: str | None) -> bool:
    """Sets the setting (``None``: unsets it); whether the session took it."""
    try:
        if value is None:
            spark.conf.unset(RECORDS_SETTING)
        else:
            spark.conf.set(RECORDS_SETTING, value)
    except Exception as exc:  # a server that refuses to change it
        _log.warning("could not set %s to %s (%s)", RECORDS_SETTING, value, exc)
        return False
    return True


def _as_records(value: str | None) -> int:
    """The session's rows per batch (Spark's default when not set or not a number)."""
    if value is None:
        return SPARK_RECORDS
    try:
        return int(value.strip())
    except ValueError:
        return SPARK_RECORDS


def _value_bytes(dtype: DataType) -> int:
    """Bytes of one value of ``dtype``: an array's element, a struct's first array or
    binary field (the one holding a row's values, as an image struct's ``data``), else
    eight."""
    if isinstance(dtype, ArrayType):
        return _value_bytes(dtype.elementType)
    if isinstance(dtype, StructType):
        bulk = [f.dataType for f in dtype.fields if isinstance(f.dataType, ArrayType | BinaryType)]
        return _value_bytes(bulk[0]) if bulk else 8
    if isinstance(dtype, BinaryType | ByteType | BooleanType):
        return 1
    if isinstance(dtype, ShortType):
        return 2
    if isinstance(dtype, IntegerType | FloatType | DateType):
        return 4
    return 8
