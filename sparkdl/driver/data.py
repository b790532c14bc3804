"""DataFrame columns to model inputs: schema checks, one validation scan, Arrow to numpy.

Features become one ``array<float>`` column on the JVM side (ML vectors through
``vector_to_array``, numeric column lists through ``array``), so executors receive
plain Arrow lists they can view as a 2-D numpy array without a per-row loop. An ML
vector column that feeds a model input built with ``keras.Input(..., sparse=True)``,
or one of :data:`SPARSE_MIN_WIDTH` values or more (hashed or counted text) whose first
rows store at most half of their values, travels as the vectors themselves (Arrow
``struct<type, size, indices, values>``) and stays sparse on the executors.

Example:
    >>> from sparkdl.driver.data import label_kind
    >>> from pyspark.sql.types import IntegerType
    >>> label_kind(IntegerType())
    'int'
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.ml.functions import vector_to_array
from pyspark.ml.linalg import VectorUDT
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    FloatType,
    NumericType,
    StringType,
)

from sparkdl.compat.spark_versions import array_argmax, try_int
from sparkdl.contract import keras_io
from sparkdl.contract.payload import WEIGHT, feature_name, label_name
from sparkdl.driver import shared_scans, tensors
from sparkdl.driver.data_scan import (
    CHECK_PREFIX,
    DataSummary,
    Sources,
    fits_name,
    shape_name,
    summarize,
)
from sparkdl.driver.tensors import Layout, SequencePadding
from sparkdl.errors import ConfigError, SchemaError

__all__ = [
    "SPARSE_MIN_WIDTH",
    "ColumnTypeError",
    "Prepared",
    "feature_columns",
    "feature_layout",
    "label_column",
    "label_columns",
    "label_kind",
    "model_features",
    "prepare",
]

#: An ML vector column feeding a model input this wide (or wider) stays sparse.
SPARSE_MIN_WIDTH = 4096
_VECTOR_SIZES = "struct<v:struct<size:int,values:array<double>>>"


class ColumnTypeError(SchemaError, TypeError):
    """A column has a type sparkdl cannot feed to a model (e.g. strings)."""


@dataclass(frozen=True)
class Prepared:
    """The validated input of a fit: one prepared column per model input and output.

    Attributes:
        frame: The prepared columns (:func:`feature_name`, :func:`label_name`).
        summary: What the scan found.
        label_kinds: The kind of each label (:func:`label_kind`).
        input_shapes: Per-sample shape of each model input.
        sparse: Whether each feature column is ML vectors kept sparse.
        seconds: Seconds the checks took (the scan is one Spark job).
        weighted: Whether ``frame`` has the :data:`WEIGHT` column.
        label_shapes: Per-sample shape of each output's label (``()``: a scalar).
        feature_kinds: Per input, ``"dense"``, ``"sparse"`` or ``"bytes"`` (images).
        padding: How token sequences were made one length (``None``: they were not).
    """

    frame: DataFrame
    summary: DataSummary
    label_kinds: tuple[str, ...]
    input_shapes: tuple[tuple[int, ...], ...]
    sparse: tuple[bool, ...] = ()
    seconds: float = 0.0
    weighted: bool = False
    label_shapes: tuple[tuple[int, ...], ...] = ()
    feature_kinds: tuple[str, ...] = ()
    padding: SequencePadding | None = None


def prepare(
    df: DataFrame,
    model: Any,
    features_col: Any,
    label_col: Any,
    *,
    validate: bool = True,
    sparse: Sequence[bool] | None = None,
    weight_col: str | None = None,
    class_weight: dict[Any, float] | None = None,
    weighted: bool = False,
    padding: SequencePadding | None = None,
) -> Prepared:
    """Checks the model and the data and selects the prepared columns.

    A model with several inputs takes ``features_col`` as a list (one column per input,
    in order) or a dict from input name to column; ``label_col`` likewise for several
    outputs.

    Runs one Spark job (an aggregate) to count rows and find nulls, NaNs and ragged rows;
    ``validate=False`` skips its look at every value for NaNs. ``sparse`` gives each
    input's sparse-or-dense choice (validation data takes the training data's);
    ``None`` makes it (:func:`model_features`).

    ``weight_col`` (a numeric column) and ``class_weight`` (``{class: weight}`` over the
    single output's label) make the :data:`WEIGHT` column, as ``model.fit``'s
    ``sample_weight`` and ``class_weight``; ``weighted`` adds it (all 1) without either,
    so that validation rows travel beside weighted training rows.

    Nested arrays and images are checked row by row against the input's shape, and
    ``padding`` makes token sequences of varying length one length
    (:mod:`sparkdl.driver.tensors`).

    Raises:
        SchemaError: A column is missing or has a wrong type, or the data is bad.
        ModelError: The model is not compiled, or its input does not fit the features.
    """
    started = time.perf_counter()
    keras_io.check_compiled(model)
    if not isinstance(df, DataFrame):
        raise ColumnTypeError(f"Expected a pyspark.sql.DataFrame. Received: {type(df).__name__}")
    layouts = model_features(df, model, features_col, decided=sparse, padding=padding)
    labels = label_columns(df, label_col, keras_io.output_names(model))
    keras_io.check_input_structure(model)  # before the scan's job
    weight = weight_column(df, labels, weight_col, class_weight, weighted)
    prepared = [
        *[f.expr.alias(feature_name(i)) for i, f in enumerate(layouts)],
        *[y.alias(label_name(j)) for j, (y, _) in enumerate(labels)],
        *([weight.alias(WEIGHT)] if weight is not None else []),
    ]
    checked = df.select(
        *prepared, *_shape_checks(layouts)
    )  # the shape checks are read by the scan only
    kinds = tuple(kind for _, kind in labels)
    feature_kinds = tuple(f.kind for f in layouts)
    summary = _scan(
        checked,
        kinds,
        layouts,
        feature_kinds,
        validate,
        weight_col if weight is not None else None,
        lambda: _sources(df, model, features_col, label_col),
    )
    shapes = tuple(
        keras_io.resolve_input_shape(model, width, i) for i, width in enumerate(summary.widths)
    )
    label_shapes = _label_shapes(model, kinds, summary, bool(class_weight))
    frame = checked.select(*[c for c in checked.columns if not c.startswith(CHECK_PREFIX)])
    return Prepared(
        frame,
        summary,
        kinds,
        shapes,
        tuple(f.kind == "sparse" for f in layouts),
        time.perf_counter() - started,
        weighted=weight is not None,
        label_shapes=label_shapes,
        feature_kinds=feature_kinds,
        padding=padding,
    )


def _scan(
    checked: DataFrame,
    kinds: tuple[str, ...],
    layouts: Sequence[Layout],
    feature_kinds: tuple[str, ...],
    validate: bool,
    weight_source: str | None,
    sources: Any,
) -> DataSummary:
    """The data scan of a prepared frame (with its shape checks), shared by the trials
    of a search that prepare the same frame (:mod:`sparkdl.driver.shared_scans`)."""
    checks = {i: (f.expected, f.fix) for i, f in enumerate(layouts) if f.fits is not None}
    key = shared_scans.frame_key(
        checked, kinds, validate, feature_kinds, weight_source, tuple(sorted(checks.items()))
    )
    return shared_scans.summary(
        key,
        lambda: summarize(
            checked,
            kinds,
            len(layouts),
            scan_values=validate,
            feature_kinds=feature_kinds,
            weight_source=weight_source,
            sources=sources,
            shapes=checks,
        ),
    )


def _shape_checks(layouts: Sequence[Layout]) -> list[Column]:
    """The per-row shape checks of the inputs that have one, and each row's shape in
    words, as the columns the data scan reads (:func:`~sparkdl.driver.data_scan.fits_name`)."""
    return [
        c
        for i, f in enumerate(layouts)
        if f.fits is not None and f.shape is not None
        for c in (f.fits.alias(fits_name(i)), f.shape.alias(shape_name(i)))
    ]


def _label_shapes(
    model: Any, kinds: tuple[str, ...], summary: DataSummary, class_weighted: bool
) -> tuple[tuple[int, ...], ...]:
    """Each output's per-sample label shape, its labels checked against the model's
    loss and output.

    Raises:
        SchemaError: Labels that do not fit, or ``class_weight`` on labels with a class
            per position.
    """
    for j, kind in enumerate(kinds):
        keras_io.check_labels(
            model,
            kind,
            summary.label_widths[j],
            summary.label_mins[j],
            summary.label_maxs[j],
            index=j,
        )
    shapes = tuple(
        keras_io.label_shape(model, kind, summary.label_widths[j], j)
        for j, kind in enumerate(kinds)
    )
    if class_weighted and len(shapes[0]) > 1:
        raise SchemaError(
            f"class_weight weighs a row by its one class; these labels have the shape "
            f"{shapes[0]} (a class per position). Use weight_col with per-row weights."
        )
    return shapes


def weight_column(
    df: DataFrame,
    labels: Sequence[tuple[Column, str]],
    weight_col: str | None,
    class_weight: dict[Any, float] | None,
    weighted: bool = False,
) -> Column | None:
    """The per-row weight expression (float), or ``None`` for an unweighted fit.

    A class's weight goes to rows whose label is that class, as Keras's ``class_weight``
    finds it: an int label, a float label rounded, a one-hot label's arg-max; a class
    left out of ``class_weight`` weighs 1.

    Raises:
        SchemaError: ``weight_col`` is missing or not numeric, or ``class_weight`` is
            given for a model with several outputs.
    """
    from sparkdl.config import class_weights

    if weight_col:
        dtype = _column_type(df, weight_col, "weight_col")
        if not _numeric(dtype):
            raise ColumnTypeError(
                f"Expected weight_col {weight_col!r} to be a numeric column. Received "
                f"{dtype.simpleString()}."
            )
        return F.col(_quote(weight_col)).cast("float")
    if class_weight:
        if len(labels) != 1:
            raise SchemaError(
                f"class_weight is for models with one output; this one has {len(labels)} "
                "(Keras's fit refuses it too). Use weight_col with per-row weights instead."
            )
        label, kind = labels[0]
        # Keras rounds half to even (np.round); a NaN or huge label finds no class.
        if kind == "array":
            # A one-hot (or probability) label: its arg-max; one value: that value.
            index = F.when(F.size(label) == 1, try_int(F.bround(label[0]))).otherwise(
                array_argmax(label)
            )
        else:
            index = try_int(F.bround(label))
        pairs = [
            item
            for k, w in sorted(class_weights(class_weight).items())
            for item in (F.lit(k), F.lit(float(w)))
        ]
        return F.coalesce(F.element_at(F.create_map(*pairs), index), F.lit(1.0)).cast("float")
    return F.lit(1.0).cast("float") if weighted else None


def model_features(
    df: DataFrame,
    model: Any,
    features_col: Any,
    *,
    decided: Sequence[bool] | None = None,
    sample: bool = True,
    padding: SequencePadding | None = None,
) -> list[Layout]:
    """How each of ``model``'s inputs is read from ``df``: its prepared expression, its
    kind (``"dense"``, ``"sparse"``: ML vectors kept sparse, ``"bytes"``: images) and
    the per-row shape check of nested arrays and images (:mod:`sparkdl.driver.tensors`).

    An ML vector column stays sparse for an input built with ``sparse=True``, and for
    one :data:`SPARSE_MIN_WIDTH` wide or wider unless its first rows store more than
    half of their values (DenseVectors: CSR would hold an index beside every value;
    one small Spark job looks, unless ``sample`` is false: scoring converts one batch
    at a time either way).

    Args:
        df: The input DataFrame.
        model: The Keras model.
        features_col: As :func:`feature_columns` takes it.
        decided: Per input, a choice made before (the training data's, for the
            validation data); ``None`` decides here.
        sample: Whether to look at the first rows of a wide vector column.
        padding: How token sequences of varying length are made the input's length
            (``sequence_padding``); ``None``: they are not.

    Raises:
        SchemaError: The columns do not match the model's inputs.
    """
    names = keras_io.input_names(model)
    order = keras_io.written_order(model)
    shapes = keras_io.input_dims(model)
    keys = keras_io.input_keys(model)
    if decided is not None:
        return feature_columns(
            df,
            features_col,
            names,
            sparse=list(decided),
            order=order,
            shapes=shapes,
            padding=padding,
            keys=keys,
        )
    wants = [keras_io.prefers_sparse(model, i, SPARSE_MIN_WIDTH) for i in range(len(names))]
    takes = keras_io.sparse_inputs(model) or [False] * len(names)
    layouts = feature_columns(
        df,
        features_col,
        names,
        sparse=wants,
        order=order,
        shapes=shapes,
        padding=padding,
        keys=keys,
    )
    for i, layout in enumerate(layouts):
        if (
            layout.kind == "sparse"
            and sample
            and not takes[i]
            and _mostly_dense(df.select(layout.expr))
        ):
            layouts[i] = Layout(vector_to_array(layout.expr, dtype="float32"))
    return layouts


def feature_columns(
    df: DataFrame,
    features: Any,
    input_names: Sequence[str],
    *,
    sparse: Sequence[bool] = (),
    order: Sequence[int] = (),
    shapes: Sequence[Sequence[int | None]] = (),
    padding: SequencePadding | None = None,
    keys: dict[str, int] | None = None,
) -> list[Layout]:
    """How each model input is read: one :class:`~sparkdl.driver.tensors.Layout` each.

    Args:
        df: The input DataFrame.
        features: For a one-input model, what :func:`feature_layout` takes. For a model
            with several inputs, a list of columns (one per input, in the order the
            model's inputs were written: a dict of inputs in its keys' order) or a dict
            from input name to column.
        input_names: The model's input names, in ``model.inputs`` order.
        sparse: Per input, whether an ML vector column should stay sparse.
        order: The positions in ``input_names`` of the inputs as written
            (:func:`~sparkdl.contract.keras_io.written_order`); empty: that order.
        shapes: Per input, its per-sample shape (``None`` for an open length); empty:
            unknown (nested arrays and images then need a built model).
        padding: As :func:`model_features` takes it.
        keys: A dict model's input keys and their positions (a ``features`` dict may
            name inputs by them).

    Raises:
        SchemaError: The columns do not match the model's inputs.
    """
    columns = _feature_slots(features, input_names, order, keys)
    wants = list(sparse) or [False] * len(columns)
    keep = [w and _is_vector(df, c) for c, w in zip(columns, wants, strict=True)]
    return [
        feature_layout(
            df,
            c,
            sparse=k,
            shape=shapes[i] if i < len(shapes) else None,
            padding=padding,
            label=_input_words(input_names, i),
        )
        for i, (c, k) in enumerate(zip(columns, keep, strict=True))
    ]


def input_columns(model: Any, features_col: Any) -> list[Any]:
    """The user's column(s) behind each of ``model``'s inputs, in ``model.inputs`` order.

    Raises:
        SchemaError: ``features_col`` does not match the model's inputs.
    """
    return _feature_slots(
        features_col,
        keras_io.input_names(model),
        keras_io.written_order(model),
        keras_io.input_keys(model),
    )


def _input_words(names: Sequence[str], index: int) -> str:
    return f" {names[index]!r}" if len(names) > 1 else ""


def label_columns(
    df: DataFrame, labels: Any, output_names: Sequence[str]
) -> list[tuple[Column, str]]:
    """One label expression and kind per model output (see :func:`feature_columns`)."""
    slots = _label_slots(labels, output_names)
    if len(output_names) <= 1:
        labels = slots[0]
        if isinstance(labels, (list, tuple)) and labels and all(isinstance(c, str) for c in labels):
            return [_label_array(df, list(labels))]  # several targets of one output
        if not isinstance(labels, str):
            raise SchemaError(
                f"The model has one output; expected label_col to be one column name, or a "
                f"list of numeric columns (one target each). Received: {labels!r}"
            )
        return [label_column(df, labels)]
    return [label_column(df, c) for c in slots]


def _feature_slots(
    features: Any,
    input_names: Sequence[str],
    order: Sequence[int] = (),
    keys: dict[str, int] | None = None,
) -> list[Any]:
    """The user's column(s) behind each model input, in ``model.inputs`` order (what
    :func:`feature_columns` takes). A dict names each input by its input layer's name
    or, for a model built on a dict of inputs, by that dict's key (``keys``: each key's
    input position, :func:`~sparkdl.contract.keras_io.input_keys`)."""
    if len(input_names) > 1:
        if isinstance(features, dict) and keys:
            features = {
                input_names[keys[k]] if k not in input_names and k in keys else k: v
                for k, v in features.items()
            }
        return _per_slot(features, input_names, "features_col", "input", order)
    if isinstance(features, dict):
        if len(features) != 1:
            raise SchemaError(
                f"The model has one input; features_col names {len(features)} inputs."
            )
        features = next(iter(features.values()))
    return [features]


def _label_slots(labels: Any, output_names: Sequence[str]) -> list[Any]:
    """The user's column(s) behind each model output (one output: a name, or a list of
    numeric columns as its targets; checked by :func:`label_columns`)."""
    if len(output_names) > 1:
        return _per_slot(labels, output_names, "label_col", "output")
    if isinstance(labels, dict) and len(labels) == 1:
        labels = next(iter(labels.values()))
    if isinstance(labels, (list, tuple)) and len(labels) == 1:
        labels = labels[0]
    return [labels]


def _per_slot(
    given: Any, names: Sequence[str], setting: str, what: str, order: Sequence[int] = ()
) -> list[str]:
    """One column per slot from a dict by name or a list in ``order`` (positions in
    ``names`` as the user wrote them; empty: ``names``'s order)."""
    written = list(order) or list(range(len(names)))
    if isinstance(given, dict):
        missing = [n for n in names if n not in given]
        extra = sorted(set(given) - set(names))
        if missing or extra:
            raise SchemaError(
                f"Expected {setting} to map each model {what} {list(names)} to a column. "
                f"Missing: {missing}; unknown: {extra}."
            )
        columns = [given[n] for n in names]
    elif isinstance(given, (list, tuple)) and len(given) == len(names):
        columns = [""] * len(names)
        for column, slot in zip(given, written, strict=True):
            columns[slot] = column
    else:
        raise SchemaError(
            f"The model has {len(names)} {what}s {[names[i] for i in written]}: pass "
            f"{setting} as a list of {len(names)} columns (in that order) or a dict from "
            f"{what} name to column. Received: {given!r}"
        )
    for column in columns:
        if not isinstance(column, str):
            raise SchemaError(
                f"Expected each entry of {setting} to be one column name. Received: {column!r}"
            )
    return columns


def feature_layout(
    df: DataFrame,
    features: str | Sequence[str],
    *,
    sparse: bool = False,
    shape: Sequence[int | None] | None = None,
    padding: SequencePadding | None = None,
    label: str = "",
) -> Layout:
    """How the features of one model input are read.

    Args:
        df: The input DataFrame.
        features: One column (``array<numeric>``, nested arrays of numbers, Spark's
            image struct, an ML ``Vector`` or a numeric scalar) or a list of numeric
            column names.
        sparse: An ML vector column is returned as it is (it travels sparse).
        shape: The model input's per-sample shape (``None`` for an open length);
            nested arrays and images need it.
        padding: Makes an ``array<numeric>`` column feeding an input of one dimension
            (a token sequence) that input's length
            (:class:`~sparkdl.driver.tensors.SequencePadding`); other columns are not
            padded.
        label: The input's name in messages (``" 'tokens'"``; empty for one input).

    Raises:
        SchemaError: A column is missing (the message lists the available ones), or
            its rows cannot have the input's shape.
        ColumnTypeError: A column is not numeric.
    """
    if isinstance(features, str):
        dtype = _column_type(df, features, "features_col")
        col = F.col(_quote(features))
        ref = column_ref(features)
        if isinstance(dtype, VectorUDT):
            if sparse:
                return Layout(col, kind="sparse")
            return Layout(vector_to_array(col, dtype="float32"))
        rank = tensors.nested_rank(dtype)
        if rank == 1:
            length = _padded_length(shape, padding) if padding is not None else None
            if padding is not None and length is not None:
                return Layout(tensors.padded(col, length, padding))
            return Layout(col.cast(ArrayType(FloatType())))
        if rank > 1:
            return _nested(col, rank, shape, ref, features, label)
        if tensors.is_image(dtype):
            if shape is None:
                raise SchemaError(
                    f"Column {features!r} holds images; the model needs a keras.Input"
                    "((height, width, channels)) to take them."
                )
            dims = tensors.image_dims(shape, f"Column {features!r}")
            return tensors.image_layout(col, dims, ref)
        if _numeric(dtype):
            return Layout(F.array(col.cast("float")))
        raise ColumnTypeError(
            f"Expected features_col {features!r} to be array<numeric> (nested arrays of "
            "any rank too), an ML Vector, a numeric column, or an image struct "
            f"(spark.read.format('image')). Received: {dtype.simpleString()}. "
            f"{_conversion(features, dtype)}"
        )
    names = list(features)
    if not names:
        raise SchemaError("Expected features_col to name at least one column. Received: []")
    return Layout(_numeric_array(df, names, "features_col"))


def _nested(
    col: Column, rank: int, shape: Sequence[int | None] | None, ref: str, name: str, label: str
) -> Layout:
    """The layout of a nested array column for an input of per-sample ``shape``.

    Raises:
        SchemaError: Rows of ``rank`` levels cannot have the input's shape.
    """
    if shape is None:  # an unbuilt model: the flat rows build it
        return Layout(tensors.flattened(col, rank))
    dims = tensors.data_dims(shape, rank)
    if dims is None and len(shape) >= rank:
        raise SchemaError(
            f"Column {name!r} holds arrays nested {rank} deep; the model's input{label} "
            f"takes the shape {(None, *shape)}, whose extra dimensions are not 1, so its "
            f"rows cannot fill it. Give the model a keras.Input with {rank} dimensions (a "
            "keras.layers.Reshape after it can make the shape the layers need)."
        )
    if dims is None:
        flat = f"df = df.withColumn({name!r}, F.flatten(F.col({ref!r})))"
        if rank > 2:
            flat = f"df = df.withColumn({name!r}, F.flatten(...)) once per extra level"
        raise SchemaError(
            f"Column {name!r} holds arrays nested {rank} deep; the model's input{label} "
            f"takes the shape {(None, *shape)}, which has fewer dimensions. Give the model "
            f"a keras.Input with {rank} dimensions, or flatten the rows "
            f"(import pyspark.sql.functions as F): {flat}"
        )
    return tensors.nested_layout(col, rank, dims, ref, f"column {name!r}")


def _padded_length(shape: Sequence[int | None] | None, padding: SequencePadding) -> int | None:
    """The length a token-sequence column is made for an input of per-sample ``shape``:
    the input's length, else (an open length) ``padding.length``; ``None``: the input
    is not a sequence of one dimension, so its rows are not padded.

    Raises:
        ConfigError: ``padding.length`` differs from the input's fixed length, or the
            input's length is open and no length was given or found.
    """
    if shape is None or len(shape) != 1:
        return None
    (fixed,) = shape
    if fixed is not None:
        if padding.length is not None and padding.length != fixed:
            raise ConfigError(
                f"sequence_padding's length is {padding.length}; the model's input takes "
                f"{fixed} values a row. Leave the length out (the input's is used) or "
                "change keras.Input(shape=...)."
            )
        return int(fixed)
    if padding.length is None:
        raise ConfigError(
            "The model's input takes sequences of any length; give sequence_padding the "
            "length to make them, e.g. sequence_padding={'padding': 'post', 'length': 100} "
            "(a fit finds the longest row itself and records it in the fitted model)."
        )
    return padding.length


def resolve_padding(
    df: DataFrame, model: Any, features_col: Any, padding: SequencePadding | None
) -> SequencePadding | None:
    """``padding`` with its ``length`` found when an input of open length takes a token
    column and none was given: the longest row of ``df`` in those columns (one Spark
    job). A fit resolves it once, for its training and validation rows and for the
    fitted model's ``transform``.
    """
    if padding is None or padding.length is not None:
        return padding
    shapes = keras_io.input_dims(model)
    slots = input_columns(model, features_col)
    types = {f.name: f.dataType for f in df.schema.fields}
    open_columns = [
        c
        for i, c in enumerate(slots)
        if isinstance(c, str)
        and tensors.nested_rank(types.get(c)) == 1
        and i < len(shapes)
        and shapes[i] == (None,)
    ]
    if not open_columns:
        return padding
    found = df.agg(*[F.max(F.size(F.col(_quote(c)))) for c in open_columns]).first()
    longest = max((int(v or 0) for v in (found or ())), default=0)
    return dataclasses.replace(padding, length=max(longest, 1))


def _sources(df: DataFrame, model: Any, features_col: Any, label_col: Any) -> Sources:
    """The user's columns behind each prepared column, for the data scan's messages
    (built only when the scan has something to say: one read of the schema)."""
    inputs = input_columns(model, features_col)
    outputs = _label_slots(label_col, keras_io.output_names(model))
    keyed = [
        *((f"f{i}", c) for i, c in enumerate(inputs)),
        *((f"y{j}", c) for j, c in enumerate(outputs)),
    ]
    types = {f.name: f.dataType for f in df.schema.fields}
    widths = [math.prod(s) if s is not None else None for s in keras_io.declared_shapes(model)]
    return Sources(
        names={key: _described(c) for key, c in keyed},
        fixes={
            key: drop_statement(c, types.get(c))
            if isinstance(c, str)
            else drop_statement(list(c), None)
            for key, c in keyed
        },
        widths=tuple(widths) if len(widths) == len(inputs) else (),
        columns={
            key: column_ref(c)
            for key, c in keyed
            if isinstance(c, str) and tensors.nested_rank(types.get(c)) == 1
        },
        sequences=frozenset(
            f"f{i}"
            for i, (c, shape) in enumerate(zip(inputs, keras_io.input_dims(model), strict=False))
            if isinstance(c, str) and tensors.nested_rank(types.get(c)) == 1 and len(shape) == 1
        ),
    )


def _described(columns: Any) -> str:
    return f"column {columns!r}" if isinstance(columns, str) else f"columns {list(columns)!r}"


def column_ref(name: str) -> str:
    """``name`` as a pasted ``F.col(...)`` takes it: in backticks when Spark would read
    a dot in it as a nested field.

    Example:
        >>> column_ref("x"), column_ref("a.b")
        ('x', '`a.b`')
    """
    return _quote(name) if any(c in name for c in ".`") else name


def _conversion(name: str, dtype: DataType) -> str:
    """How to turn a column of ``dtype`` into one a model can take, as a statement
    that works when pasted (with ``import pyspark.sql.functions as F``)."""
    column = repr(column_ref(name))
    if isinstance(dtype, ArrayType) and isinstance(dtype.elementType, ArrayType):
        return (
            "Flatten the nested arrays (the flat row fills the model's shaped input): "
            f"df = df.withColumn({name!r}, F.flatten(F.col({column})))"
        )
    if isinstance(dtype, StringType):
        return (
            "If it holds numbers as text, cast it: "
            f"df = df.withColumn({name!r}, F.col({column}).cast('double')); if it holds "
            "categories, index them (pyspark.ml.feature.StringIndexer) and feed the index."
        )
    return (
        "Convert it to numbers (numeric columns assemble into a vector with "
        "pyspark.ml.feature.VectorAssembler), or pass a list of numeric column names."
    )


def drop_statement(columns: str | list[str], dtype: DataType | None) -> str:
    """A statement that drops the rows with a null or NaN in one column of type
    ``dtype`` (any value of an array or vector) or in numeric ``columns``, as pasted
    after ``import pyspark.sql.functions as F``.

    Example:
        >>> from pyspark.sql.types import ArrayType, DoubleType
        >>> drop_statement("x", ArrayType(DoubleType()))
        "df = df.filter(F.forall(F.col('x'), lambda v: v.isNotNull() & ~F.isnan(v)))"
        >>> drop_statement("y", DoubleType()), drop_statement(["a", "b"], None)
        ("df = df.dropna(subset=['y'])", "df = df.dropna(subset=['a', 'b'])")
        >>> drop_statement("a.b", DoubleType())
        "df = df.filter(F.col('`a.b`').isNotNull() & ~F.isnan(F.col('`a.b`')))"
    """
    names = [columns] if isinstance(columns, str) else list(columns)
    if isinstance(columns, str) and tensors.is_image(dtype):  # a null struct or null bytes
        image = f"F.col({column_ref(columns)!r})"
        return f"df = df.filter({image}.isNotNull() & {image}.data.isNotNull())"
    if not isinstance(columns, str) or not isinstance(dtype, (VectorUDT, ArrayType)):
        if all(column_ref(n) == n for n in names):
            return f"df = df.dropna(subset={names!r})"
        kept = " & ".join(
            f"F.col({column_ref(n)!r}).isNotNull() & ~F.isnan(F.col({column_ref(n)!r}))"
            for n in names
        )
        return f"df = df.filter({kept})"
    column = f"F.col({column_ref(columns)!r})"
    if isinstance(dtype, VectorUDT):
        return (
            f"df = df.filter(F.forall(vector_to_array({column}), lambda v: ~F.isnan(v)))"
            "  # from pyspark.ml.functions import vector_to_array"
        )
    for _ in range(tensors.nested_rank(dtype) - 1):
        column = f"F.flatten({column})"
    return f"df = df.filter(F.forall({column}, lambda v: v.isNotNull() & ~F.isnan(v)))"


def label_column(df: DataFrame, label: str) -> tuple[Column, str]:
    """Returns the label expression and its kind (``"int"``, ``"float"`` or ``"array"``).

    Raises:
        SchemaError: The column is missing.
        ColumnTypeError: The column is not numeric, a numeric array, or a Vector.
    """
    dtype = _column_type(df, label, "label_col")
    kind = label_kind(dtype)
    col = F.col(_quote(label))
    if isinstance(dtype, VectorUDT):
        return vector_to_array(col, dtype="float32"), kind
    if kind == "array":  # nested arrays (per-pixel or per-token targets) flattened
        return tensors.flattened(col, tensors.nested_rank(dtype)), kind
    return col.cast("int" if kind == "int" else "float"), kind


def _label_array(df: DataFrame, columns: list[str]) -> tuple[Column, str]:
    """Numeric columns as one array label (a regression of several targets)."""
    return _numeric_array(df, columns, "label_col"), "array"


def _numeric_array(df: DataFrame, names: list[str], setting: str) -> Column:
    """Numeric columns as one ``array<float>`` (a list given as ``setting``)."""
    for name in names:
        dtype = _column_type(df, name, setting)
        if not _numeric(dtype):
            raise ColumnTypeError(
                f"Expected every column in {setting} to be numeric. Received: {name!r} of "
                f"type {dtype.simpleString()}."
            )
    return F.array(*[F.col(_quote(n)).cast("float") for n in names])


def label_kind(dtype: DataType) -> str:
    """Classifies a label type as ``"int"``, ``"float"`` or ``"array"``.

    Raises:
        ColumnTypeError: The type cannot be a label.

    Example:
        >>> from pyspark.sql.types import ArrayType, DoubleType
        >>> label_kind(ArrayType(DoubleType()))
        'array'
    """
    if isinstance(dtype, VectorUDT):
        return "array"
    if tensors.nested_rank(dtype):  # nested levels: flattened, then shaped per output
        return "array"
    if _numeric(dtype):
        name = dtype.typeName()
        return "int" if name in ("byte", "short", "integer", "long", "boolean") else "float"
    raise ColumnTypeError(
        f"Expected label_col to be numeric, array<numeric> or an ML Vector. Received: "
        f"{dtype.simpleString()}. Index string labels first (pyspark.ml.feature.StringIndexer)."
    )


def _mostly_dense(vectors: DataFrame, rows: int = 64) -> bool:
    """Whether the first ``rows`` vectors of a one-column DataFrame store more than half
    of their values (one small Spark job; only two numbers a row reach the driver)."""
    column = F.col(vectors.columns[0])
    fields = F.from_json(F.to_json(F.struct(column.alias("v"))), _VECTOR_SIZES)["v"]
    sizes = vectors.limit(rows).select(
        F.size(fields["values"]).alias("stored"),
        F.coalesce(fields["size"], F.size(fields["values"])).alias("size"),
    )
    found = sizes.agg(F.sum("stored"), F.sum("size")).first()
    stored, size = (int(v or 0) for v in (found or (0, 0)))
    return 2 * stored > size


def _is_vector(df: DataFrame, column: Any) -> bool:
    """Whether ``column`` names one ML vector column of ``df``."""
    if not isinstance(column, str):
        return False
    fields = {f.name: f.dataType for f in df.schema.fields}
    return isinstance(fields.get(column), VectorUDT)


def _column_type(df: DataFrame, name: str, setting: str) -> DataType:
    fields = {f.name: f.dataType for f in df.schema.fields}
    if name not in fields:
        raise SchemaError(
            f"Column {name!r} given as {setting} is not in the DataFrame. "
            f"Available columns: {sorted(fields)}."
        )
    return fields[name]


def _numeric(dtype: DataType) -> bool:
    return isinstance(dtype, (NumericType, BooleanType))


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"
