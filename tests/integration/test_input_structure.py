"""Models whose inputs are a dict (in any key order) or a nested structure: columns map
to inputs by name (a dict) or in the order the inputs were written (a list), and fit,
transform, evaluate and from_keras feed each batch in the structure the model takes."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from sparkdl import KerasEstimator, KerasModel
from sparkdl.errors import SchemaError

ROWS = 600


@pytest.fixture(scope="module")
def frame(spark):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    a, b, c = rng.normal(size=(ROWS, 2)), rng.normal(size=(ROWS, 3)), rng.normal(size=(ROWS, 1))
    y = a[:, 0] - 2 * b[:, 1] + 0.5 * c[:, 0]
    rows = [
        (ra.tolist(), rb.tolist(), rc.tolist(), float(t))
        for ra, rb, rc, t in zip(a, b, c, y, strict=True)
    ]
    schema = "av array<double>, bv array<double>, cv array<double>, y double"
    df = spark.createDataFrame(rows, schema)
    return df.repartition(2).cache(), (a, b, c, y)


def _unsorted_dict_model() -> keras.Model:
    """Inputs written as {"b": ..., "a": ...}: model.inputs lists them as [a, b]."""
    b_in, a_in = keras.Input((3,), name="b"), keras.Input((2,), name="a")
    hidden = keras.layers.Dense(16, activation="relu")(keras.layers.Concatenate()([b_in, a_in]))
    model = keras.Model({"b": b_in, "a": a_in}, keras.layers.Dense(1)(hidden))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


def _fit(model: keras.Model, features_col: dict[str, str], df, y) -> KerasModel:  # type: ignore[no-untyped-def]
    """A 2-worker fit of ``model`` on ``df`` that must learn the target ``y``."""
    fitted = KerasEstimator(
        model=model,
        features_col=features_col,
        label_col="y",
        num_workers=2,
        epochs=8,
        batch_size=32,
        seed=0,
    ).fit(df)
    assert fitted.history["loss"][-1] < 0.2 * float(np.var(y))
    return fitted


def test_dict_inputs_in_any_key_order_fit_transform_and_evaluate(frame, tmp_path) -> None:
    df, (_, _, _, y) = frame
    model = _unsorted_dict_model()
    assert [t.name for t in model.inputs] == ["a", "b"]  # Keras's flat order is sorted
    fitted = _fit(model, {"a": "av", "b": "bv"}, df, y)

    rows = fitted.transform(df).select("av", "bv", "prediction").collect()
    net = fitted.get_model()
    want = net.predict(
        {"a": np.array([r.av for r in rows]), "b": np.array([r.bv for r in rows])}, verbose=0
    )[:, 0]
    np.testing.assert_allclose([r.prediction for r in rows], want, rtol=1e-4, atol=1e-5)
    # evaluate reads the columns the model was fitted with, also once saved and loaded.
    loss = fitted.evaluate(df)["loss"]
    assert loss < 0.2 * float(np.var(y))
    fitted.save(str(tmp_path / "stage"))
    loaded = KerasModel.load(str(tmp_path / "stage"))
    assert loaded.evaluate(df)["loss"] == pytest.approx(loss, rel=1e-5)

    scorer = KerasModel.from_keras(net, features_col={"b": "bv", "a": "av"})
    again = [r.prediction for r in scorer.transform(df).select("prediction").collect()]
    np.testing.assert_allclose(sorted(again), sorted(want), rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_a_list_of_columns_follows_the_order_the_inputs_were_written(frame) -> None:
    df, _ = frame
    model = _unsorted_dict_model()
    scorer = KerasModel.from_keras(model, features_col=["bv", "av"])  # as written: b, a
    rows = scorer.transform(df).select("av", "bv", "prediction").collect()
    want = model.predict(
        {"a": np.array([r.av for r in rows]), "b": np.array([r.bv for r in rows])}, verbose=0
    )[:, 0]
    np.testing.assert_allclose([r.prediction for r in rows], want, rtol=1e-4, atol=1e-5)
    with pytest.raises(SchemaError, match=r"2 inputs \['b', 'a'\]"):
        KerasModel.from_keras(model, features_col=["bv"]).transform(df)


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_nested_input_structure_trains_and_scores(frame) -> None:
    df, (_, _, _, y) = frame
    a_in, b_in, c_in = (keras.Input((n,), name=k) for n, k in [(2, "a"), (3, "b"), (1, "c")])
    joined = keras.layers.Concatenate()([c_in, b_in, a_in])
    out = keras.layers.Dense(1)(keras.layers.Dense(16, activation="relu")(joined))
    model = keras.Model({"z": [c_in, b_in], "a": a_in}, out)
    assert [t.name for t in model.inputs] == ["a", "c", "b"]
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    fitted = _fit(model, {"a": "av", "b": "bv", "c": "cv"}, df, y)
    first = fitted.transform(df).select("av", "bv", "cv", "prediction").first()
    net = fitted.get_model()
    want = net.predict(
        {"z": [np.array([first.cv]), np.array([first.bv])], "a": np.array([first.av])},
        verbose=0,
    )
    assert first.prediction == pytest.approx(float(want[0, 0]), rel=1e-4, abs=1e-5)
