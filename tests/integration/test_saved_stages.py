"""Backward compatibility: stages saved by release 0.1.0 (commit 26fd9d5) still load.

``tests/data/saved_stages/`` was written by ``tests/data/make_saved_stages.py`` with the
release's code (never regenerate it with newer code: see that script). Each test loads
one saved stage with the current code and compares it with ``expected.json``, which
holds what the release itself read back. Real Spark local[2], real TensorFlow.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from pyspark.ml import PipelineModel

from sparkdl import KerasEstimator, KerasModel

pytestmark = [pytest.mark.spark]

SAVED = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "saved_stages")


@pytest.fixture(scope="module")
def expected() -> dict:  # type: ignore[type-arg]
    with open(os.path.join(SAVED, "expected.json")) as f:
        return json.load(f)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def rows_df(spark, expected):  # type: ignore[no-untyped-def]
    """The 64 saved rows, with an id to put the scored rows back in order."""
    rows = [
        (i, features, label)
        for i, (features, label) in enumerate(
            zip(expected["features"], expected["labels"], strict=True)
        )
    ]
    return spark.createDataFrame(rows, "id long, features array<float>, label int").repartition(2)


def assert_scores_match(scored_df, expected) -> None:  # type: ignore[no-untyped-def]
    scored = scored_df.orderBy("id").collect()
    assert len(scored) == len(expected["predictions"]) == 64
    assert {"id", "features", "label", "prediction", "class"} == set(scored[0].asDict())
    got = np.array([r.prediction for r in scored], np.float64)
    want = np.array(expected["predictions"], np.float64)
    assert got.shape == want.shape == (64, 3)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    classes = [r["class"] for r in scored]
    assert classes == expected["classes"]
    assert classes == [float(c) for c in want.argmax(axis=1)]


def test_saved_keras_model_loads_and_predicts_as_saved(rows_df, expected) -> None:
    model = KerasModel.load(os.path.join(SAVED, "keras_model"))
    saved = expected["model"]
    assert isinstance(model, KerasModel)
    assert model.uid == saved["uid"]
    assert model.getOrDefault("featuresCol") == saved["featuresCol"] == "features"
    assert model.getOrDefault("predictionCol") == saved["predictionCol"] == "prediction"
    assert model.getOrDefault("classCol") == saved["classCol"] == "class"
    assert tuple(model.input_shape) == tuple(saved["input_shape"]) == (4,)

    # state.json survived: the fit's history and report.
    assert model.history == saved["history"]
    assert set(model.history) == {"loss", "accuracy"} and len(model.history["loss"]) == 1
    assert model.fit_report == saved["fit_report"]
    assert model.fit_report["rows"] == 64 and len(model.fit_report["workers"]) == 2

    assert model.get_model().count_params() == 67
    assert_scores_match(model.transform(rows_df), expected)


def test_saved_keras_estimator_loads_with_its_settings_and_model(expected) -> None:
    estimator = KerasEstimator.load(os.path.join(SAVED, "keras_estimator"))
    saved = expected["estimator"]
    assert isinstance(estimator, KerasEstimator)
    assert estimator.uid == saved["uid"]
    assert estimator.getOrDefault("epochs") == 1
    assert estimator.getOrDefault("numWorkers") == 2
    assert estimator.getOrDefault("seed") == 0
    assert estimator.getOrDefault("classCol") == "class"
    assert estimator.getOrDefault("featuresCol") == "features"
    assert estimator.getOrDefault("labelCol") == "label"
    # Every Param the release saved reads back with its saved value.
    got = {name: estimator.getOrDefault(name) for name in saved["params"]}
    assert got == saved["params"]

    model = estimator.model
    assert model.compiled and model.optimizer is not None
    weights = model.get_weights()
    assert [list(w.shape) for w in weights] == saved["weight_shapes"]
    assert model.count_params() == saved["count_params"] == 67
    for got_w, want_w in zip(weights, saved["weights"], strict=True):
        np.testing.assert_array_equal(got_w, np.array(want_w, np.float32))


def test_saved_pipeline_model_loads_and_predicts_as_saved(rows_df, expected) -> None:
    pipeline = PipelineModel.load(os.path.join(SAVED, "pipeline_model"))
    assert [s.uid for s in pipeline.stages] == expected["pipeline"]["stage_uids"]
    (stage,) = pipeline.stages
    assert isinstance(stage, KerasModel)
    assert stage.history == expected["model"]["history"]
    assert stage.getOrDefault("classCol") == "class"
    assert_scores_match(pipeline.transform(rows_df), expected)
