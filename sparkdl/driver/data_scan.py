"""The one scan of a fit's prepared data: rows, widths, label ranges, and every check.

:func:`summarize` runs one Spark aggregation over the prepared columns
(:mod:`sparkdl.contract.payload`'s names), grouped by partition, and refuses, with a message
naming the column and the fix, what training would trip over later: null or NaN
features and labels, rows of unequal width, weights that are not finite and >= 0. What
it finds (:class:`DataSummary`) sizes the fit: rows per worker, the model's input
widths, the label ranges that the model's output is checked against, and the rows of
each partition, from which the driver plans the most rows each worker may join with
(:meth:`DataSummary.planned_rows`).

Example:
    >>> DataSummary(rows=4, widths=(3,), label_widths=(1,), label_mins=(0.0,),
    ...             label_maxs=(1.0,)).width
    3
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sparkdl.contract.payload import WEIGHT, feature_name, label_name, ragged_rows_message
from sparkdl.errors import SchemaError

__all__ = [
    "CHECK_PREFIX",
    "DataSummary",
    "Sources",
    "check_weights",
    "fits_name",
    "shape_name",
    "summarize",
]

#: Columns of a scanned frame that only the scan reads: each input's per-row shape
#: check and its shape in words (:class:`sparkdl.driver.tensors.Layout`).
CHECK_PREFIX = "__sparkdl_check_"


def fits_name(index: int) -> str:
    """The scanned column telling whether each row of input ``index`` has its shape."""
    return f"{CHECK_PREFIX}fits_{index}"


def shape_name(index: int) -> str:
    """The scanned column holding each row's shape of input ``index``, in words."""
    return f"{CHECK_PREFIX}shape_{index}"


#: The scan's group column, and the prefixes of its aggregates combined by min and max.
_PARTITION = "partition"
_MINIMA = ("f_min", "y_min")
_MAXIMA = ("f_max", "y_max")
_VECTOR_JSON = "struct<v:struct<type:tinyint,size:int,indices:array<int>,values:array<double>>>"


@dataclass(frozen=True)
class DataSummary:
    """What one scan of the prepared data found.

    Attributes:
        rows: Number of rows.
        widths: Number of feature values per row, per model input.
        label_widths: Values per label (1 for a scalar label), per model output.
        label_mins: Smallest label value (scalar labels), per output.
        label_maxs: Largest label value (scalar labels), per output.
        partition_rows: Rows of each partition of the scanned frame, by partition
            index (its last empty partitions left out).
    """

    rows: int
    widths: tuple[int, ...]
    label_widths: tuple[int, ...]
    label_mins: tuple[float | None, ...]
    label_maxs: tuple[float | None, ...]
    partition_rows: tuple[int, ...] = ()

    @property
    def width(self) -> int:
        """Feature values per row of the first input."""
        return self.widths[0]

    def planned_rows(self, workers: int, *, shuffled: bool) -> list[int]:
        """The most training rows each of ``workers`` workers can hold: what it may join
        with (:meth:`sparkdl.server.state.store.WeightStore.plan_rows`).

        Unshuffled, worker ``j`` trains on partition ``j`` of the scanned frame: its
        rows exactly. Shuffled by ``repartition(workers)`` (round robin), each
        partition deals its rows to the workers in turn from some start, so no worker
        gets more than ``ceil(n / workers)`` of a partition's ``n`` rows.

        Example:
            >>> summary = DataSummary(rows=10, widths=(1,), label_widths=(1,),
            ...                       label_mins=(0.0,), label_maxs=(1.0,),
            ...                       partition_rows=(7, 3))
            >>> summary.planned_rows(2, shuffled=False), summary.planned_rows(2, shuffled=True)
            ([7, 3], [6, 6])
        """
        counts = self.partition_rows
        if shuffled:
            return [sum(-(-n // workers) for n in counts)] * workers
        return [counts[j] if j < len(counts) else 0 for j in range(workers)]


def summarize(
    prepared: DataFrame,
    kinds: Sequence[str] | str,
    inputs: int = 1,
    *,
    scan_values: bool = True,
    feature_kinds: Sequence[str] = (),
    weight_source: str | None = None,
    sources: Callable[[], Sources] | None = None,
    shapes: dict[int, tuple[str, str]] | None = None,
) -> DataSummary:
    """Scans the prepared data once and checks it: rows, nulls, NaNs, ragged widths.

    The aggregates run per partition (grouped by ``spark_partition_id()``: the same one
    pass over the data) and are combined here, so the summary also holds each
    partition's rows.

    Args:
        prepared: A DataFrame with the prepared feature and label columns
            (:func:`feature_name`, :func:`label_name`).
        kinds: The label kind of each output (from :func:`label_column`).
        inputs: Number of prepared feature columns.
        scan_values: Look at every feature and label value for nulls and NaNs
            (``TrainConfig.validate``). ``False`` still counts rows and reads widths
            and label ranges, which the fit needs, but skips the pass over every value.
        feature_kinds: Per input, ``"dense"`` (the default), ``"sparse"`` (ML
            vectors kept sparse: their width is the vectors' size and only stored
            values are looked at) or ``"bytes"`` (image bytes: their length is the
            width, and bytes hold no NaN).
        weight_source: The weight column's name when ``prepared`` has :data:`WEIGHT`
            (every weight is checked: finite and >= 0).
        sources: Gives the user's columns behind the prepared ones, for the messages:
            their names, the statement that drops their bad rows, and each input's
            width (called only when there is something to say).

    Raises:
        SchemaError: The data is empty, or has nulls, NaNs or rows of differing width,
            or a weight that is null, NaN, infinite or negative.
    """
    kinds = [kinds] if isinstance(kinds, str) else list(kinds)
    shapes = shapes or {}
    feature_kinds = list(feature_kinds) or ["dense"] * inputs
    aggs = _summary_aggregates(kinds, inputs, scan_values, feature_kinds)
    aggs += [
        F.sum(F.when(~F.col(fits_name(i)), 1).otherwise(0)).alias(f"f_misfit{i}") for i in shapes
    ]
    if WEIGHT in prepared.columns:
        aggs.append(_bad_weights())
    groups = prepared.groupBy(F.spark_partition_id().alias(_PARTITION)).agg(*aggs).collect()
    stats = _combined([g.asDict() for g in groups])
    rows = int(stats["rows"])
    if rows == 0:
        raise SchemaError("The DataFrame is empty: there are no rows to train on.")
    _refuse(prepared, stats, kinds, inputs, feature_kinds, shapes, _Described(sources))
    if stats.get("w_bad"):
        raise SchemaError(_bad_weights_message(int(stats["w_bad"]), rows, weight_source))
    return DataSummary(
        rows=rows,
        widths=tuple(int(stats[f"f_min{i}"]) for i in range(inputs)),
        label_widths=tuple(
            int(stats[f"y_min_w{j}"]) if k == "array" else 1 for j, k in enumerate(kinds)
        ),
        label_mins=tuple(
            None if k == "array" else float(stats[f"y_min{j}"]) for j, k in enumerate(kinds)
        ),
        label_maxs=tuple(
            None if k == "array" else float(stats[f"y_max{j}"]) for j, k in enumerate(kinds)
        ),
        partition_rows=_partition_rows(groups),
    )


def _refuse(
    prepared: DataFrame,
    stats: dict[str, Any],
    kinds: list[str],
    inputs: int,
    feature_kinds: list[str],
    shapes: dict[int, tuple[str, str]],
    described: _Described,
) -> None:
    """Raises the scan's first finding: nulls and NaNs (all of them, each with its
    fix), misshaped rows, rows of unequal width, label arrays of unequal length."""
    problems = _problems(stats, inputs, len(kinds), described)
    if problems:
        fixes = sorted({fix for _, fix in problems if fix})
        how = (
            "Drop them before fit (import pyspark.sql.functions as F):\n  " + "\n  ".join(fixes)
            if fixes
            else "Drop them (df.dropna(), or a filter on isnan)"
        )
        raise SchemaError(
            f"Found {', '.join(p for p, _ in problems)} among {int(stats['rows'])} rows. "
            f"{how}\nor impute them."
        )
    for i, (expected, fix) in shapes.items():
        if stats[f"f_misfit{i}"]:
            raise SchemaError(_misfits(prepared, i, expected, fix, described()))
    for i in range(inputs):
        if stats[f"f_min{i}"] != stats[f"f_max{i}"]:
            raise SchemaError(_ragged(prepared, i, stats, described(), kind=feature_kinds[i]))
    for j, kind in enumerate(kinds):
        if kind == "array" and stats[f"y_min_w{j}"] != stats[f"y_max_w{j}"]:
            raise SchemaError(
                f"Expected every label array to have the same length. Received lengths "
                f"between {stats[f'y_min_w{j}']} and {stats[f'y_max_w{j}']}."
            )


def _combined(groups: list[dict[str, Any]]) -> dict[str, Any]:
    """The per-partition aggregates combined into the whole frame's: counts summed,
    smallest and largest values (nulls skipped, as Spark's ``min`` and ``max`` do)."""
    if not groups:
        return {"rows": 0}
    stats: dict[str, Any] = {}
    for key in groups[0].keys() - {_PARTITION}:
        values = [g[key] for g in groups if g[key] is not None]
        if key.startswith(_MINIMA):
            stats[key] = min(values, default=None)
        elif key.startswith(_MAXIMA):
            stats[key] = max(values, default=None)
        else:
            stats[key] = sum(values)
    return stats


def _partition_rows(groups: list[Any]) -> tuple[int, ...]:
    """Rows per partition index, from the scan's groups (one per non-empty partition)."""
    counts = {int(g[_PARTITION]): int(g["rows"]) for g in groups}
    return tuple(counts.get(p, 0) for p in range(max(counts, default=-1) + 1))


@dataclass(frozen=True)
class Sources:
    """The user's columns behind the prepared ones, as the scan's messages name them.

    Attributes:
        names: Per prepared column (``"f0"``, ``"y0"``...), the user's column(s) in
            words (``"column 'x'"``).
        fixes: Per prepared column, a statement that drops the rows with a null or
            NaN there (:func:`sparkdl.driver.data.drop_statement`).
        widths: Per input, the values a row must have to fit the model (``None``:
            any one width).
        columns: Per prepared column made of one array column, that column as
            ``F.col`` takes it (backticks around a name with a dot).
        sequences: The prepared columns that ``sequence_padding`` would pad (one
            array column feeding an input of one dimension).
    """

    names: dict[str, str] = field(default_factory=dict)
    columns: dict[str, str] = field(default_factory=dict)
    fixes: dict[str, str] = field(default_factory=dict)
    widths: tuple[int | None, ...] = ()
    sequences: frozenset[str] = frozenset()

    def name(self, key: str, fallback: str) -> str:
        return self.names.get(key, fallback)


class _Described:
    """The :class:`Sources` of a scan, built on first use (only a refused frame's
    messages need them)."""

    def __init__(self, make: Callable[[], Sources] | None) -> None:
        self._make = make
        self._sources: Sources | None = None

    def __call__(self) -> Sources:
        if self._sources is None:
            self._sources = self._make() if self._make is not None else Sources()
        return self._sources


def _problems(
    stats: dict[str, Any], inputs: int, outputs: int, described: Callable[[], Sources]
) -> list[tuple[str, str | None]]:
    """The scan's nulls and NaNs, per input and output, in words, each with its fix
    (the sources are asked for only when there is one)."""
    problems: list[tuple[str, str | None]] = []

    def add(count: Any, what: str, key: str, slot: str, several: bool) -> None:
        if count:
            sources = described()
            where = f" ({sources.name(key, slot)})" if several else ""
            problems.append((f"{count} row(s) with {what}{where}", sources.fixes.get(key)))

    for i in range(inputs):
        add(stats[f"f_null{i}"], "null features", f"f{i}", f"input {i}", inputs > 1)
        add(stats.get(f"f_nan{i}"), "NaN or null feature values", f"f{i}", f"input {i}", inputs > 1)
    for j in range(outputs):
        add(stats[f"y_null{j}"], "a null label", f"y{j}", f"output {j}", outputs > 1)
        add(stats.get(f"y_nan{j}"), "a NaN label", f"y{j}", f"output {j}", outputs > 1)
    return problems


def _ragged(
    prepared: DataFrame, index: int, stats: dict[str, Any], sources: Sources, *, kind: str
) -> str:
    """The message for rows of unequal width in input ``index``: its column, how many
    rows differ from the width the model takes (or the narrowest), and the index of the
    first (as ``df.collect()`` lists the rows). One more Spark job, on this path only."""
    smallest, largest = int(stats[f"f_min{index}"]), int(stats[f"f_max{index}"])
    message = ragged_rows_message(smallest, largest)
    if kind == "sparse":  # a vector column's width is its size: not counted again here
        return message
    widths = sources.widths
    expected = widths[index] if index < len(widths) and widths[index] else smallest
    values = F.col(feature_name(index))
    width = F.length(values) if kind == "bytes" else F.size(values)
    bad, row, _ = _first_bad(prepared, width != expected)
    if row is None:
        return message
    column = sources.name(f"f{index}", "the features column")
    raw = sources.columns.get(f"f{index}")
    drop = (
        f" (import pyspark.sql.functions as F):\n"
        f"  df = df.filter(F.size(F.col({raw!r})) == {expected})"
        if raw
        else " with a filter on their size"
    )
    pad = (
        "Pad them to one length (sequence_padding='post' pads token sequences with 0 and "
        "cuts them to the model's input length, as keras.utils.pad_sequences does), or "
        "drop them"
        if f"f{index}" in sources.sequences
        else "Drop them"
    )
    return (
        f"{message} In {column}, {bad} row(s) do not have {expected} values; the first is "
        f"row {row} (counting from 0, as df.collect() lists the rows). {pad}{drop}"
    )


def _misfits(prepared: DataFrame, index: int, expected: str, fix: str, sources: Sources) -> str:
    """The message for rows of input ``index`` whose shape is not the input's: how
    many, the first's index and shape, and the statement that keeps the rows that fit.
    One more Spark job, on this path only."""
    bad, row, shape = _first_bad(prepared, ~F.col(fits_name(index)), F.col(shape_name(index)))
    column = sources.name(f"f{index}", "the features column")
    return (
        f"In {column}, {bad} row(s) do not have the shape the model's input takes, "
        f"{expected}; the first is row {row} (counting from 0, as df.collect() lists "
        f"the rows), of shape {shape}. Keep the rows that fit (import "
        f"pyspark.sql.functions as F):\n  {fix}\nor change the model's keras.Input(shape=...)."
    )


def _first_bad(
    prepared: DataFrame, bad: Column, value: Column | None = None
) -> tuple[int, int | None, Any]:
    """How many rows are ``bad``, the first one's index (as ``df.collect()`` lists the
    rows) and its ``value``: one Spark job."""
    low_bits = (1 << 33) - 1  # monotonically_increasing_id: partition << 33 | position
    # The id is made for every row (a nondeterministic expression under when() would
    # count only the rows it is evaluated on), then kept for the bad ones.
    groups = (
        prepared.select(
            F.spark_partition_id().alias(_PARTITION),
            F.monotonically_increasing_id().alias("id"),
            bad.alias("bad"),
            (value if value is not None else F.lit(None)).alias("value"),
        )
        .groupBy(_PARTITION)
        .agg(
            F.count(F.lit(1)).alias("rows"),
            F.sum(F.col("bad").cast("int")).alias("bad"),
            F.min(F.when(F.col("bad"), F.col("id"))).alias("id"),
            F.min_by(F.col("value"), F.when(F.col("bad"), F.col("id"))).alias("value"),
        )
        .collect()
    )
    count = sum(int(g["bad"] or 0) for g in groups)
    firsts = [g for g in groups if g["id"] is not None]
    if not firsts:
        return count, None, None
    first = min(firsts, key=lambda g: int(g[_PARTITION]))
    before = sum(int(g["rows"]) for g in groups if int(g[_PARTITION]) < int(first[_PARTITION]))
    return count, before + (int(first["id"]) & low_bits), first["value"]


def _summary_aggregates(
    kinds: list[str], inputs: int, scan_values: bool, feature_kinds: list[str]
) -> list[Column]:
    """The aggregate expressions :func:`summarize` runs in its one job."""
    aggs = [F.count(F.lit(1)).alias("rows")]
    for i in range(inputs):
        f = F.col(feature_name(i))
        width, values = F.size(f), f
        if feature_kinds[i] == "bytes":  # an image's bytes: no NaN to look for
            aggs += [
                F.sum(F.when(f.isNull(), 1).otherwise(0)).alias(f"f_null{i}"),
                F.min(F.length(f)).alias(f"f_min{i}"),
                F.max(F.length(f)).alias(f"f_max{i}"),
            ]
            continue
        if feature_kinds[i] == "sparse":  # the vector's fields, through their JSON form
            vector = F.from_json(F.to_json(F.struct(f.alias("v"))), _VECTOR_JSON)["v"]
            values = vector["values"]
            width = F.coalesce(vector["size"], F.size(values))
        aggs += [
            F.sum(F.when(f.isNull(), 1).otherwise(0)).alias(f"f_null{i}"),
            F.min(width).alias(f"f_min{i}"),
            F.max(width).alias(f"f_max{i}"),
        ]
        if scan_values:
            bad_value = F.exists(values, lambda v: v.isNull() | F.isnan(v))
            aggs.append(F.sum(F.when(bad_value, 1).otherwise(0)).alias(f"f_nan{i}"))
    for j, kind in enumerate(kinds):
        y = F.col(label_name(j))
        aggs.append(F.sum(F.when(y.isNull(), 1).otherwise(0)).alias(f"y_null{j}"))
        if kind == "array":
            aggs += [F.min(F.size(y)).alias(f"y_min_w{j}"), F.max(F.size(y)).alias(f"y_max_w{j}")]
            y_bad = F.exists(y, lambda v: v.isNull() | F.isnan(v))
        else:
            aggs += [
                F.min(y).cast("double").alias(f"y_min{j}"),
                F.max(y).cast("double").alias(f"y_max{j}"),
            ]
            y_bad = F.isnan(y) if kind == "float" else F.lit(False)
        if scan_values:
            aggs.append(F.sum(F.when(y_bad, 1).otherwise(0)).alias(f"y_nan{j}"))
    return aggs


def check_weights(prepared: DataFrame, weight_col: str) -> None:
    """Refuses a prepared frame with a null, NaN, infinite or negative :data:`WEIGHT`
    (one Spark job; ``evaluate`` runs it, a fit's :func:`summarize` counts them too).

    Raises:
        SchemaError: Such weights were found.
    """
    row = prepared.agg(F.count(F.lit(1)).alias("rows"), _bad_weights()).first()
    if row is not None and row["w_bad"]:
        raise SchemaError(_bad_weights_message(int(row["w_bad"]), int(row["rows"]), weight_col))


def _bad_weights() -> Column:
    w = F.col(WEIGHT)
    bad = w.isNull() | F.isnan(w) | (w < 0) | (w == float("inf"))
    return F.sum(F.when(bad, 1).otherwise(0)).alias("w_bad")


def _bad_weights_message(bad: int, rows: int, weight_col: str | None) -> str:
    return (
        f"Found {bad} row(s) among {rows} whose weight in weight_col {weight_col!r} is null, "
        "NaN, infinite or negative. Weights must be finite numbers >= 0: filter those "
        "rows or fix their weights first."
    )
