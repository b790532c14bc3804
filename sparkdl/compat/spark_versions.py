"""What differs between the PySpark versions sparkdl runs on (3.5, 4.0 and 4.1).

Each function gives one behaviour on every supported version, from the public API the
running PySpark has:

* :func:`inheritable_thread`: a driver thread that carries the caller's local
  properties (job group, description) and, on PySpark 4, the session's job tags
  (``InheritableThread(session=...)``, new in 4.0; 3.5 has no job tags on a classic
  session, so there is nothing more to carry).
* :func:`arrow_scalar_udf`: a scalar UDF over Arrow arrays. PySpark 4.1 has
  ``functions.arrow_udf``; before it, a scalar iterator ``pandas_udf`` whose pandas
  Series are turned back into Arrow arrays (:func:`series_to_arrow`) before the same
  function runs, and its Arrow results into Series. The rows and the results are the
  same but where pandas cannot tell a null from NaN: a null scalar float argument
  arrives as NaN, and a NaN result goes back as null. The detour through pandas costs
  time (``benchmarks/transform.py``).
* :func:`frame_from_arrow`: a DataFrame from a ``pyarrow.Table``
  (``createDataFrame`` takes one from 4.0; on 3.5 through pandas with Arrow on).
* :func:`try_int` and :func:`array_argmax`: ``Column.try_cast`` and
  ``array_position`` with a column for its value are PySpark 4; on 3.5 the same results
  from a range check and a higher-order function.

Example:
    >>> spark_version() >= (3, 5)
    True
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType

__all__ = [
    "array_argmax",
    "arrow_scalar_udf",
    "arrow_type",
    "frame_from_arrow",
    "has_arrow_udf",
    "inheritable_thread",
    "series_to_arrow",
    "spark_version",
    "try_int",
]


def spark_version() -> tuple[int, int]:
    """``(major, minor)`` of the PySpark this process imports."""
    import pyspark

    found = re.match(r"(\d+)\.(\d+)", pyspark.__version__)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def inheritable_thread(
    target: Callable[[], None], *, name: str, session: SparkSession | None
) -> threading.Thread:
    """A daemon thread (not started) that runs ``target`` with the caller's local
    properties and, on PySpark 4, ``session``'s job tags.

    Example:
        >>> thread = inheritable_thread(lambda: None, name="t", session=None)
        >>> thread.daemon
        True
    """
    from pyspark import InheritableThread

    if session is not None and spark_version() >= (4, 0):
        return InheritableThread(target=target, name=name, daemon=True, session=session)
    return InheritableThread(target=target, name=name, daemon=True)


def has_arrow_udf() -> bool:
    """Whether PySpark has ``functions.arrow_udf`` (4.1 and later)."""
    import pyspark.sql.functions as functions

    return hasattr(functions, "arrow_udf")


def arrow_scalar_udf(
    function: Callable[[Iterator[Any]], Iterator[Any]],
    return_type: DataType,
    argument_types: Callable[[], Sequence[DataType]],
) -> Callable[..., Any]:
    """A scalar UDF that runs ``function`` over an iterator of Arrow arrays (a tuple of
    them for several arguments) yielding one Arrow array per batch.

    Args:
        function: The batch function, typed for ``arrow_udf`` (its hints name the kind).
        return_type: The UDF's Spark type.
        argument_types: Gives the Spark types of the columns it takes, in order; called
            only before 4.1 (the Arrow types the pandas Series are turned back into), so
            4.1 pays no analysis of the columns.
    """
    if has_arrow_udf():
        from pyspark.sql.functions import arrow_udf

        return arrow_udf(function, return_type)  # type: ignore[call-overload]
    return _pandas_udf(function, return_type, [arrow_type(t) for t in argument_types()])


def arrow_type(spark_type: DataType) -> pa.DataType:
    """The Arrow type Spark sends a column of ``spark_type`` as (a user-defined type,
    such as ML vectors, as its SQL type).

    Example:
        >>> from pyspark.ml.linalg import VectorUDT
        >>> str(arrow_type(VectorUDT()).field("indices").type.value_type)
        'int32'
    """
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import UserDefinedType

    if isinstance(spark_type, UserDefinedType):
        spark_type = spark_type.sqlType()
    return to_arrow_type(spark_type)


def series_to_arrow(series: Any, arrow: pa.DataType) -> pa.Array:
    """A pandas Series (or, for a struct column, a DataFrame) as PySpark's
    ``pandas_udf`` hands it over, back as the Arrow array of type ``arrow`` Spark sent.

    Example:
        >>> import pandas as pd, numpy as np, pyarrow as pa
        >>> rows = pd.Series([np.array([1.0, 2.0]), None])
        >>> series_to_arrow(rows, pa.list_(pa.float32())).to_pylist()
        [[1.0, 2.0], None]
    """
    import pandas as pd
    import pyarrow as pa

    if isinstance(series, pd.DataFrame):  # a struct column: one Series per field
        fields = [series_to_arrow(series[f.name], f.type) for f in arrow]
        mask = pa.array(series.isna().all(axis=1).to_numpy())
        return pa.StructArray.from_arrays(fields, fields=list(arrow), mask=mask)
    # pandas marks a null as NaN in a numeric Series (ints come as floats), as None in an
    # object one: NaN means null for an int field; a float NaN and the values of arrays
    # stay what they are (a null float scalar cannot be told from NaN: it stays NaN).
    nan_is_null = pa.types.is_integer(arrow) or pa.types.is_boolean(arrow)
    return pa.array(series, type=arrow, from_pandas=nan_is_null)


def frame_from_arrow(spark: SparkSession, table: pa.Table) -> DataFrame:
    """``spark.createDataFrame(table)``, on every supported PySpark.

    PySpark 4 takes the table itself (a local relation, read by no Python worker); 3.5
    takes it through pandas with Arrow on for this call (the same rows and types).
    """
    if spark_version() >= (4, 0):
        return spark.createDataFrame(table)
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = from_arrow_schema(table.schema)
    with _conf(spark, "spark.sql.execution.arrow.pyspark.enabled", "true"):
        return spark.createDataFrame(table.to_pandas(), schema=schema)


def try_int(column: Column) -> Column:
    """``column`` (a number) as an ``int``, or null where it does not fit one (NaN, out of
    range): ``Column.try_cast("int")`` on every supported PySpark."""
    if spark_version() >= (4, 0):
        return column.try_cast("int")
    from pyspark.sql import functions as F

    wide = column.cast("double")  # a float column's bound would round to 2^31
    fits = wide.between(F.lit(-(2.0**31)), F.lit(2.0**31 - 1))  # NaN sorts above: no
    return F.when(fits, column.cast("int"))


def array_argmax(column: Column) -> Column:
    """The 0-based position of the first largest value of an array column (null
    elements skipped), null for a null, empty or all-null array:
    ``array_position(a, array_max(a)) - 1`` on every supported PySpark."""
    from pyspark.sql import functions as F

    if spark_version() >= (4, 0):
        return F.array_position(column, F.array_max(column)).cast("int") - 1
    last = F.greatest(F.size(column) - 1, F.lit(0))

    def better(kept: Column, i: Column) -> Column:  # null elements are skipped
        value, best = F.element_at(column, i + 1), F.element_at(column, kept + 1)
        return F.when(value.isNotNull() & (best.isNull() | (value > best)), i).otherwise(kept)

    best = F.aggregate(F.sequence(F.lit(0), last), F.lit(0), better)
    return F.when(F.array_max(column).isNotNull(), best.cast("int"))


# ---------------------------------------------------------------------- helpers
def _pandas_udf(
    function: Callable[[Iterator[Any]], Iterator[Any]],
    return_type: DataType,
    arrow_types: Sequence[pa.DataType],
) -> Callable[..., Any]:
    """PySpark < 4.1: ``function`` behind a scalar iterator ``pandas_udf``."""
    import pandas as pd
    from pyspark.sql.functions import pandas_udf

    arguments = len(arrow_types)

    def as_arrow(batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            if arguments == 1:
                yield series_to_arrow(batch, arrow_types[0])
            else:
                yield tuple(map(series_to_arrow, batch, arrow_types))

    def scored(batches: Iterator[Any]) -> Iterator[Any]:
        for array in function(as_arrow(batches)):
            yield _arrow_to_pandas(array)

    arg: Any = pd.Series if arguments == 1 else tuple[pd.Series, ...]
    scored.__annotations__ = {"batches": Iterator[arg], "return": Iterator[pd.Series]}
    return pandas_udf(scored, return_type)  # type: ignore[call-overload]


def _arrow_to_pandas(array: pa.Array) -> Any:
    """A result array as ``pandas_udf`` returns it: a Series, or a DataFrame for a
    struct (one column per field)."""
    import pandas as pd
    import pyarrow as pa

    if pa.types.is_struct(array.type):  # a null struct row: every field null
        fields = zip(array.type, array.flatten(), strict=True)
        return pd.DataFrame({field.name: part.to_pandas() for field, part in fields})
    return array.to_pandas()


@contextlib.contextmanager
def _conf(spark: SparkSession, key: str, value: str) -> Iterator[None]:
    """``key`` set to ``value`` in the session while inside, then as it was."""
    before = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)
