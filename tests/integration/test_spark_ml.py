"""KerasEstimator / KerasModel as Spark ML citizens: Params, Pipeline, CrossValidator,
persistence. Real Spark local[2], real TensorFlow."""

from __future__ import annotations

import math
import os
import re

import keras
import numpy as np
import pytest
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.evaluation import MulticlassClassificationEvaluator
from pyspark.ml.feature import StandardScaler, VectorAssembler
from pyspark.ml.tuning import CrossValidator, ParamGridBuilder

from examples.digits import digits_arrays, digits_model
from sparkdl import KerasEstimator, KerasModel
from sparkdl.errors import ModelError
from tests.integration.load_pipeline import in_new_process

pytestmark = [pytest.mark.spark]

PIXELS = [f"p{i}" for i in range(64)]


@pytest.fixture(scope="module")
def pixel_frames(spark):  # type: ignore[no-untyped-def]
    """Digits as 64 numeric columns plus an id and the label (train, test)."""
    x_train, x_test, y_train, y_test = digits_arrays()

    def frame(x, y, offset):  # type: ignore[no-untyped-def]
        rows = [(offset + i, *map(float, x[i]), int(y[i])) for i in range(len(x))]
        schema = "id long, " + ", ".join(f"{c} double" for c in PIXELS) + ", label long"
        return spark.createDataFrame(rows, schema).repartition(2).cache()

    return frame(x_train, y_train, 0), frame(x_test, y_test, 100_000)


@pytest.mark.compat
@pytest.mark.slow  # a second driver process loads the pipeline
def test_pipeline_fits_saves_and_loads_in_a_new_session(pixel_frames, tmp_path) -> None:
    train_df, test_df = pixel_frames
    pipeline = Pipeline(
        stages=[
            VectorAssembler(inputCols=PIXELS, outputCol="raw"),
            StandardScaler(inputCol="raw", outputCol="scaled", withMean=True, withStd=True),
            KerasEstimator(
                model=digits_model(learning_rate=0.001),
                features_col="scaled",
                class_col="class",
                num_workers=2,
                epochs=20,
                seed=0,
            ),
        ]
    )
    fitted = pipeline.fit(train_df)
    scored = fitted.transform(test_df).orderBy("id").collect()
    accuracy = np.mean([r["class"] == r.label for r in scored])
    assert accuracy >= 0.95, accuracy
    assert {"id", "p0", "raw", "scaled", "prediction", "class"} <= set(scored[0].asDict())

    model_dir = str(tmp_path / "pipeline")
    fitted.save(model_dir)
    data_dir = str(tmp_path / "test.parquet")
    test_df.write.parquet(data_dir)
    out = str(tmp_path / "pred.npy")
    proc = in_new_process(model_dir, data_dir, out, os.environ)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    expected = np.array([r.prediction for r in scored], np.float32)
    np.testing.assert_allclose(np.load(out), expected, atol=1e-6)
    match = re.search(r"CLASSES (\d+)", proc.stdout)
    assert match and int(match.group(1)) == sum(r["class"] == r.label for r in scored)

    same_session = PipelineModel.load(model_dir).stages[-1]
    assert isinstance(same_session, KerasModel)
    assert same_session.history == fitted.stages[-1].history


@pytest.mark.slow  # six fits (fast tier: 6 minutes)
def test_cross_validator_picks_the_better_learning_rate(digits) -> None:
    check_cross_validator(digits[0])


def check_cross_validator(train_df) -> None:  # type: ignore[no-untyped-def]
    """A 2-fold CrossValidator over two learning rates picks the one that learns
    (tests/connect runs it over Spark Connect too)."""
    estimator = KerasEstimator(
        model=digits_model(), class_col="class", num_workers=2, epochs=4, seed=0
    )
    grid = ParamGridBuilder().addGrid(estimator.learningRate, [1e-6, 0.003]).build()
    evaluator = MulticlassClassificationEvaluator(
        predictionCol="class", labelCol="label", metricName="accuracy"
    )
    cv = CrossValidator(
        estimator=estimator, estimatorParamMaps=grid, evaluator=evaluator, numFolds=2, seed=0
    )
    best = cv.fit(train_df)
    metrics = best.avgMetrics
    assert metrics[1] > metrics[0] + 0.3, metrics  # 0.003 learns, 1e-6 barely moves
    assert best.bestModel.getOrDefault("classCol") == "class"
    lr = float(keras.ops.convert_to_numpy(best.bestModel.get_model().optimizer.learning_rate))
    assert abs(lr - 0.003) < 1e-9
    # The estimator's own model kept its learning rate.
    assert abs(float(estimator.model.optimizer.learning_rate.numpy()) - 0.003) < 1e-9


class Scale(keras.layers.Layer):
    """A custom layer: multiplies by a trainable scalar."""

    def build(self, input_shape):  # type: ignore[no-untyped-def]
        self.factor = self.add_weight(shape=(), initializer="ones", name="factor")

    def call(self, x):  # type: ignore[no-untyped-def]
        return x * self.factor


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
@pytest.mark.compat
def test_model_and_estimator_with_a_custom_layer_save_and_load(digits, tmp_path) -> None:
    train_df, test_df, _ = digits
    inputs = keras.Input((64,))
    hidden = Scale()(keras.layers.Dense(32, activation="relu")(inputs))
    net = keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(hidden))
    net.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    estimator = KerasEstimator(
        model=net, custom_objects={"Scale": Scale}, num_workers=2, epochs=2, batchSize=64
    )
    est_dir = str(tmp_path / "estimator")
    estimator.save(est_dir)
    # custom_objects.pkl is a pickle: a safe load refuses it, naming both ways in.
    with pytest.raises(ModelError, match=r"custom_objects=\{\.\.\.\}.*safe_mode=False"):
        KerasEstimator.load(est_dir)
    loaded_est = KerasEstimator.load(est_dir, safe_mode=False)  # trusted: we saved it
    assert loaded_est.getOrDefault("batchSize") == 64 and loaded_est.uid == estimator.uid
    assert isinstance(loaded_est.model.layers[2], Scale)

    fitted = loaded_est.fit(train_df)
    model_dir = str(tmp_path / "model")
    fitted.write().overwrite().save(model_dir)
    fitted.write().overwrite().save(model_dir)  # overwrite works
    with pytest.raises(Exception, match="already exists"):
        fitted.save(model_dir)
    loaded = KerasModel.load(model_dir, custom_objects={"Scale": Scale})  # no unpickling
    assert loaded.history == fitted.history and loaded.input_shape == (64,)
    a = np.array([r.prediction for r in fitted.transform(test_df).collect()])
    b = np.array([r.prediction for r in loaded.transform(test_df).collect()])
    np.testing.assert_allclose(a, b, atol=1e-6)
    for got, want in zip(
        loaded.get_model().get_weights(), fitted.get_model().get_weights(), strict=True
    ):
        np.testing.assert_array_equal(got, want)


@keras.saving.register_keras_serializable(package="sparkdl_tests")
class TwoDense(keras.Model):
    """A subclassed model without build(): its layers' weights appear when called."""

    def __init__(self, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(32, activation="relu")
        self.out = keras.layers.Dense(10, activation="softmax")

    def call(self, x):  # type: ignore[no-untyped-def]
        return self.out(self.hidden(x))


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_a_subclassed_model_fits_scores_and_loads_unbuilt(digits, tmp_path) -> None:
    train_df, test_df, _ = digits
    keras.utils.set_random_seed(0)
    net = TwoDense()  # never called: sparkdl builds it for the rows' width
    net.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    fitted = KerasEstimator(model=net, num_workers=2, epochs=8, batch_size=32, seed=0).fit(train_df)
    scored = fitted.transform(test_df).select("features", "label", "prediction").collect()
    assert len(scored[0].prediction) == 10
    x_test = np.array([r.features for r in scored], np.float32)
    y_test = np.array([r.label for r in scored])
    accuracy = float(np.mean(np.argmax([r.prediction for r in scored], axis=1) == y_test))
    assert accuracy > 0.9, (accuracy, fitted.history)
    got = fitted.evaluate(test_df)
    want = fitted.get_model().evaluate(x_test, y_test, verbose=0, return_dict=True)
    assert abs(got["accuracy"] - float(want["accuracy"])) < 1e-4
    fitted.write().overwrite().save(str(tmp_path / "sub"))
    again = KerasModel.load(str(tmp_path / "sub"))
    rescored = again.transform(test_df).select("prediction").collect()
    np.testing.assert_allclose(
        [r.prediction for r in rescored], [r.prediction for r in scored], atol=1e-6
    )


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_validation_data_and_validation_split_add_val_logs(digits) -> None:
    train_df, test_df, _ = digits
    fitted = KerasEstimator(
        model=digits_model(), validation_data=test_df, num_workers=2, epochs=5, seed=0
    ).fit(train_df)
    history = fitted.history
    assert set(history) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert all(len(v) == 5 for v in history.values())
    assert history["val_loss"][-1] < history["val_loss"][0]
    # Workers report val_* on their own weights before the epoch's merge; after the
    # last merge the model scores close to the last epoch's validation figures.
    final = fitted.evaluate(test_df)
    assert abs(final["accuracy"] - history["val_accuracy"][-1]) < 0.05

    split = KerasEstimator(
        model=digits_model(),
        validation_split=0.2,
        mode="asynchronous",
        num_workers=2,
        epochs=3,
        seed=0,
    ).fit(train_df)
    assert len(split.history["val_accuracy"]) == 3
    # 20% of each partition is held out: the service saw only the training rows.
    held_in = sum(math.floor(w["rows"] * (1 - 0.2)) for w in split.fit_report["workers"])
    assert split.fit_report["service"]["samples_seen"] == 3 * held_in


@pytest.mark.compat
def test_transform_and_evaluate_match_keras_on_collected_rows(digits, spark) -> None:
    from pyspark.sql import functions as F

    train_df, test_df, _ = digits
    fitted = KerasEstimator(
        model=digits_model(), class_col="class", num_workers=2, epochs=3, seed=0
    ).fit(train_df)
    wide = (
        test_df.withColumn("id", F.monotonically_increasing_id())
        .withColumn("note", F.concat(F.lit("row-"), F.col("label").cast("string")))
        .repartition(4)
    )
    assert wide.select(F.spark_partition_id()).distinct().count() == 4
    rows = fitted.transform(wide).collect()
    assert set(rows[0].asDict()) == {"features", "label", "id", "note", "prediction", "class"}
    x = np.array([r.features for r in rows], np.float32)
    y = np.array([r.label for r in rows])
    want = fitted.get_model().predict(x, verbose=0)
    np.testing.assert_allclose(np.array([r.prediction for r in rows]), want, atol=1e-5)
    np.testing.assert_array_equal([r["class"] for r in rows], want.argmax(axis=1))
    got = fitted.evaluate(wide)
    keras_logs = fitted.get_model().evaluate(x, y, verbose=0, return_dict=True)
    assert set(got) == set(keras_logs)
    for key, value in keras_logs.items():
        assert abs(got[key] - float(value)) < 1e-4, (key, got[key], value)


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_a_model_trained_elsewhere_scores_in_a_pipeline(spark, tmp_path) -> None:
    """KerasModel.from_keras: a plain Keras model (or its .keras file), no fit here."""
    x_train, x_test, y_train, y_test = digits_arrays()
    net = digits_model()
    net.fit(x_train, y_train, epochs=3, batch_size=64, verbose=0)
    columns = [f"p{i}" for i in range(64)]
    rows = [(*map(float, x), int(y)) for x, y in zip(x_test, y_test, strict=True)]
    frame = spark.createDataFrame(rows, [*columns, "label"]).repartition(3)
    want = net.predict(x_test, verbose=0)
    keras_logs = net.evaluate(x_test, y_test, verbose=0, return_dict=True)

    wrapped = KerasModel.from_keras(net, features_col="pixels", class_col="class")
    assert wrapped.safe_mode is False and wrapped.input_shapes == [(64,)]
    pipeline = PipelineModel(
        stages=[VectorAssembler(inputCols=columns, outputCol="pixels"), wrapped]
    )
    path = str(tmp_path / "pipeline")
    pipeline.write().save(path)
    for model in (pipeline, PipelineModel.load(path)):
        scored = model.transform(frame).select(*columns, "prediction", "class").collect()
        x = np.array([[r[c] for c in columns] for r in scored], np.float32)
        expected = net.predict(x, verbose=0)
        np.testing.assert_allclose([r.prediction for r in scored], expected, atol=1e-5)
        np.testing.assert_array_equal([r["class"] for r in scored], expected.argmax(axis=1))

    file = str(tmp_path / "net.keras")
    net.save(file)
    from_file = KerasModel.from_keras(file, features_col=columns)
    assert from_file.safe_mode is True  # a file is loaded in Keras's safe mode
    got = from_file.evaluate(frame)
    assert set(got) == set(keras_logs)
    for key, value in keras_logs.items():
        assert abs(got[key] - float(value)) < 1e-4, (key, got[key], value)
    scored = from_file.transform(frame.limit(5)).collect()
    assert len(scored) == 5 and len(scored[0].prediction) == want.shape[1]

    plain = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])  # never compiled
    unfitted = KerasModel.from_keras(plain, features_col=columns)
    assert unfitted.transform(frame).count() == len(x_test)
    with pytest.raises(ModelError, match="compile"):
        unfitted.evaluate(frame)
    (tmp_path / "not-a-model.keras").write_bytes(b"hello")
    with pytest.raises(ModelError, match=r"not a \.keras archive"):
        KerasModel.from_keras(str(tmp_path / "not-a-model.keras"))


class _Halving(keras.layers.Layer):  # unregistered: Keras cannot import it by name
    def call(self, x):  # type: ignore[no-untyped-def]
        return x * 0.5


def test_a_model_with_an_unregistered_layer_scores_from_keras(spark) -> None:
    x = np.random.default_rng(0).normal(size=(40, 5)).astype(np.float32)
    frame = spark.createDataFrame([(r.tolist(),) for r in x], "features array<float>")
    net = keras.Sequential([keras.Input((5,)), _Halving(), keras.layers.Dense(2)])
    scorer = KerasModel.from_keras(net)  # its layer found on the live model, shipped
    rows = scorer.transform(frame).select("features", "prediction").collect()
    got = np.array([r.prediction for r in rows])
    want = net.predict(np.array([r.features for r in rows], np.float32), verbose=0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_two_input_recommender_and_two_output_model(spark) -> None:
    rng = np.random.default_rng(0)
    users, items = rng.integers(0, 20, 2000), rng.integers(0, 30, 2000)
    user_bias, item_bias = rng.normal(0, 1, 20), rng.normal(0, 1, 30)
    rating = user_bias[users] + item_bias[items]
    df = spark.createDataFrame(
        [(int(u), int(i), float(r), "x") for u, i, r in zip(users, items, rating, strict=True)],
        "user_id int, item_id int, rating double, note string",
    ).repartition(2)
    user = keras.Input((1,), name="user")
    item = keras.Input((1,), name="item")
    u = keras.layers.Flatten()(keras.layers.Embedding(20, 8)(user))
    i = keras.layers.Flatten()(keras.layers.Embedding(30, 8)(item))
    score = keras.layers.Dense(1)(keras.layers.Concatenate()([u, i]))
    recommender = keras.Model([user, item], score)
    recommender.compile(optimizer=keras.optimizers.Adam(0.02), loss="mse")
    fitted = KerasEstimator(
        model=recommender,
        features_col={"item": "item_id", "user": "user_id"},  # by input name, any order
        label_col="rating",
        num_workers=2,
        epochs=15,
        seed=0,
    ).fit(df)
    assert fitted.history["loss"][-1] < 0.1 * float(np.var(rating))
    rows = fitted.transform(df).collect()
    got = np.array([r.prediction for r in rows])
    ids = [
        np.array([[r.user_id] for r in rows], np.float32),
        np.array([[r.item_id] for r in rows], np.float32),
    ]
    np.testing.assert_allclose(got, fitted.get_model().predict(ids, verbose=0)[:, 0], atol=1e-5)
    assert fitted.evaluate(df, label_col="rating")["loss"] < 0.1 * float(np.var(rating))

    # Two outputs: a class and a value, labels as a list in output order.
    x_in = keras.Input((2,), name="x")
    hidden = keras.layers.Dense(16, activation="relu")(x_in)
    cls = keras.layers.Dense(2, activation="softmax", name="cls")(hidden)
    val = keras.layers.Dense(1, name="val")(hidden)
    two = keras.Model(x_in, [cls, val])
    two.compile(optimizer="adam", loss=["sparse_categorical_crossentropy", "mse"])
    xs = rng.normal(size=(400, 2))
    frame = spark.createDataFrame(
        [(r.tolist(), int(r[0] > 0), float(r.sum())) for r in xs],
        "f array<double>, c int, v double",
    )
    both = KerasEstimator(
        model=two, features_col="f", label_col=["c", "v"], num_workers=2, epochs=3, seed=0
    ).fit(frame)
    assert len(both.history["loss"]) == 3
    out = both.transform(frame).select("prediction").first().prediction
    assert len(out.cls) == 2 and isinstance(out.val, float)
