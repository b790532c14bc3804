"""Every fix an error message names works: the statement in the message, pasted as it
stands, turns the refused DataFrame into one the same fit accepts."""

from __future__ import annotations

import math
import re

import keras
import numpy as np
import pytest
from pyspark.ml.functions import vector_to_array
from pyspark.ml.linalg import Vectors
from pyspark.sql import functions as F

from sparkdl import KerasEstimator, SchemaError

ROWS = 64
WIDTH = 4


def _model(shape: tuple[int, ...] = (WIDTH,)) -> keras.Model:
    model = keras.Sequential(
        [keras.Input(shape), keras.layers.Flatten(), keras.layers.Dense(2, activation="softmax")]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def _fit(df, features_col="features", shape=(WIDTH,)):  # type: ignore[no-untyped-def]
    return KerasEstimator(
        model=_model(shape),
        features_col=features_col,
        label_col="label",
        num_workers=1,
        epochs=1,
        batch_size=16,
        seed=0,
    ).fit(df)


def _fixed(message: str, df):  # type: ignore[no-untyped-def]
    """The DataFrame after running every ``df = ...`` statement the message names."""
    statements = re.findall(r"df = df\.[^\n;]*", message)
    assert statements, f"no statement to paste in: {message}"
    scope = {"df": df, "F": F, "vector_to_array": vector_to_array}
    for statement in statements:
        exec(statement, scope)  # the user's paste
    return scope["df"]


def _rows(values):  # type: ignore[no-untyped-def]
    return [(v, i % 2) for i, v in enumerate(values)]


def _good() -> list[list[float]]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(ROWS, WIDTH)).round(3).tolist()


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
@pytest.mark.parametrize(
    ("case", "schema"),
    [
        ("nan inside an array", "features array<double>, label int"),
        ("null inside an array", "features array<double>, label int"),
        ("null array", "features array<double>, label int"),
        ("nan inside a nested array", "features array<array<double>>, label int"),
    ],
)
def test_bad_array_values_are_dropped_by_the_named_filter(spark, case: str, schema: str) -> None:
    values: list = _good()
    if case == "nan inside an array":
        values[3][1] = math.nan
    elif case == "null inside an array":
        values[5][2] = None
    elif case == "null array":
        values[7] = None
    shape: tuple[int, ...] = (WIDTH,)
    if "nested" in case:
        values = [[row[:2], row[2:]] for row in values]
        values[3][1][0] = math.nan
        shape = (2, 2)
    df = spark.createDataFrame(_rows(values), schema)
    with pytest.raises(SchemaError, match="Drop them before fit") as err:
        _fit(df, shape=shape)
    fixed = _fixed(str(err.value), df)
    assert fixed.count() == ROWS - 1
    assert _fit(fixed, shape=shape).history["loss"]


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_null_or_nan_in_numeric_columns_and_labels(spark) -> None:
    rows = [(*row, i % 2) for i, row in enumerate(_good())]
    rows[2] = (None, *rows[2][1:])
    rows[4] = (*rows[4][:3], math.nan, rows[4][4])
    rows[6] = (*rows[6][:4], None)
    df = spark.createDataFrame(rows, "a double, b double, c double, d double, label int")
    with pytest.raises(SchemaError, match="Drop them before fit") as err:
        _fit(df, features_col=["a", "b", "c", "d"])
    fixed = _fixed(str(err.value), df)
    assert fixed.count() == ROWS - 3
    assert _fit(fixed, features_col=["a", "b", "c", "d"]).history["loss"]


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_nan_in_a_vector_column(spark) -> None:
    values = _good()
    values[1][0] = math.nan
    df = spark.createDataFrame(
        [(Vectors.dense(v), i % 2) for i, v in enumerate(values)], ["features", "label"]
    )
    with pytest.raises(SchemaError, match="Drop them before fit") as err:
        _fit(df)
    fixed = _fixed(str(err.value), df)
    assert fixed.count() == ROWS - 1
    assert _fit(fixed).history["loss"]


def test_numbers_held_as_text_are_cast_as_the_message_says(spark) -> None:
    df = spark.createDataFrame(
        [(str(v[0]), i % 2) for i, v in enumerate(_good())], "features string, label int"
    )
    with pytest.raises(SchemaError, match="cast it") as err:
        _fit(df, shape=(1,))
    assert _fit(_fixed(str(err.value), df), shape=(1,)).history["loss"]


def test_ragged_rows_name_the_column_the_count_and_the_first_row(spark, tmp_path) -> None:
    values: list = _good()
    values[9] = values[9][:3]
    values[40] = values[40] + [1.0]
    frame = spark.createDataFrame(_rows(values), "features array<double>, label int")
    frame.repartition(3).write.parquet(str(tmp_path / "ragged"))
    df = spark.read.parquet(str(tmp_path / "ragged"))  # three files: three partitions
    order = [len(r.features) for r in df.collect()]
    with pytest.raises(SchemaError) as err:
        _fit(df)
    message = str(err.value)
    first = next(i for i, n in enumerate(order) if n != WIDTH)
    assert "column 'features'" in message and "2 row(s)" in message, message
    assert f"the first is row {first} " in message, message
    fixed = _fixed(message, df)
    assert fixed.count() == ROWS - 2
    assert _fit(fixed).history["loss"]
