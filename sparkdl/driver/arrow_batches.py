"""Arrow record batches of bounded bytes for the fit's training job.

Spark hands a ``mapInArrow`` task its partition in record batches of
``spark.sql.execution.arrow.maxRecordsPerBatch`` rows (10,000 by default), whatever
their width. A worker holds one batch in Python at a time while it caches the partition
(:mod:`sparkdl.executor.cache`), so the batch is a fixed cost on top of the partition:
about 30 MB for CIFAR-sized images (3 KB a row), 1.5 GB for 224 x 224 x 3 images. On
a 73 MB partition of 50,000 CIFAR-sized images over 2 workers, that made a worker's
peak grow 1.35 bytes per partition byte; with batches of at most 3,000 rows it grew 1.19-1.21
(``docs/benchmarks/images.md``).

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

from sparkdl.contract.payload import feature_name, label_name

__all__ = ["BATCH_BYTES", "RECORDS_SETTING", "bounded_batches", "records_per_batch", "row_bytes"]

#: The setting lowered: rows per Arrow record batch sent to a Python task.
RECORDS_SETTING = "spark.sql.execution.arrow.maxRecordsPerBatch"
#: About how many bytes of rows a record batch holds for a training task.
BATCH_BYTES = 4 * 1024 * 1024

_lock = threading.Lock()
#: Per session (by ``id``): the session, its own value, and the rows each fit asks for.
_lowered: dict[int, tuple[Any, str, list[int]]] = {}


def records_per_batch(bytes_per_row: int, session_records: int) -> int:
    """Rows per record batch: about :data:`BATCH_BYTES` of rows of ``bytes_per_row``,
    never more than the session's ``session_records`` (0 or less: no limit), at least 1."""
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
    """Inside, the session's Arrow record batches hold about :data:`BATCH_BYTES` of rows
    of ``bytes_per_row`` (:func:`records_per_batch`; fewer when another fit inside this on
    the same session asks for fewer); the session's own setting returns when the last
    such fit leaves.

    Args:
        spark: The session (classic or Spark Connect).
        bytes_per_row: About how many bytes a row of the job's frame takes
            (:func:`row_bytes`).

    Yields:
        The rows per batch this fit asked for.
    """
    key = id(spark)
    with _lock:
        held = _lowered.get(key)
        own = held[1] if held else str(spark.conf.get(RECORDS_SETTING))
        session_records = int(own) if own.lstrip("-").isdigit() else 0
        records = records_per_batch(bytes_per_row, session_records)
        lowered = records != session_records
        if lowered:
            wanted = _lowered.setdefault(key, (spark, own, []))[2]
            wanted.append(records)
            spark.conf.set(RECORDS_SETTING, str(min(wanted)))
    try:
        yield records
    finally:
        if lowered:
            with _lock:
                wanted.remove(records)
                spark.conf.set(RECORDS_SETTING, str(min(wanted)) if wanted else own)
                if not wanted:
                    del _lowered[key]


def _value_bytes(dtype: DataType) -> int:
    """Bytes of one value of ``dtype``: an array's element, a struct's widest array or
    binary field (the one holding a row's values), else eight."""
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
