"""Saved stages across session kinds: a stage saved on a classic session (release 0.1.0's
files in ``tests/data/saved_stages``) loads and scores over Spark Connect, and a
pipeline saved by a Connect client (Parquet chunks of its files) loads and scores on a
classic session in a process of its own."""

from __future__ import annotations

import os

import numpy as np
import pytest

from examples.digits import digits_model
from sparkdl import KerasEstimator, KerasModel
from tests.connect.conftest import clean_env
from tests.integration.load_pipeline import in_new_process
from tests.integration.test_saved_stages import SAVED, assert_scores_match

pytestmark = [pytest.mark.spark]


def test_a_model_and_a_pipeline_saved_on_a_classic_session_load_over_connect(
    spark, expected
) -> None:
    from pyspark.ml import PipelineModel

    rows = [
        (i, features, label)
        for i, (features, label) in enumerate(
            zip(expected["features"], expected["labels"], strict=True)
        )
    ]
    rows_df = spark.createDataFrame(rows, "id long, features array<float>, label int")
    model = KerasModel.load(os.path.join(SAVED, "keras_model"))
    assert model.uid == expected["model"]["uid"]
    assert model.history == expected["model"]["history"]
    assert_scores_match(model.transform(rows_df.repartition(2)), expected)
    pipeline = PipelineModel.load(os.path.join(SAVED, "pipeline_model"))
    assert [s.uid for s in pipeline.stages] == expected["pipeline"]["stage_uids"]
    assert_scores_match(pipeline.transform(rows_df.repartition(2)), expected)
    estimator = KerasEstimator.load(os.path.join(SAVED, "keras_estimator"))
    assert estimator.model.count_params() == expected["estimator"]["count_params"]


@pytest.mark.slow  # a classic driver process of its own loads the pipeline
def test_a_pipeline_saved_over_connect_loads_on_a_classic_session(digits, tmp_path) -> None:
    from pyspark.ml import Pipeline
    from pyspark.sql import functions as F

    train_df, test_df, _ = digits
    estimator = KerasEstimator(
        model=digits_model(), class_col="class", num_workers=2, epochs=3, seed=0
    )
    fitted = Pipeline(stages=[estimator]).fit(train_df)
    model_dir = str(tmp_path / "pipeline")
    fitted.write().save(model_dir)
    data_dir = str(tmp_path / "test.parquet")
    test_df.withColumn("id", F.monotonically_increasing_id()).write.parquet(data_dir)
    scored = fitted.transform(test_df.sparkSession.read.parquet(data_dir)).orderBy("id")
    want = np.array([r.prediction for r in scored.collect()], np.float32)

    out = str(tmp_path / "pred.npy")
    env = clean_env()
    env.pop("SPARKDL_TEST_REMOTE", None)
    proc = in_new_process(model_dir, data_dir, out, env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    np.testing.assert_allclose(np.load(out), want, atol=1e-6)
