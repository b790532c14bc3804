"""Tensors and images: nested arrays of any rank, flat arrays for shaped inputs, Spark's
image struct and token sequences of varying length, through fit, transform and
evaluate (digits as 8 x 8 images; the CNN reaches 0.9 test accuracy in plain Keras in
a few epochs)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from pyspark.sql import functions as F

from examples.digits import digits_arrays
from sparkdl import KerasEstimator, KerasModel
from sparkdl.driver.arrow_batches import BATCH_BYTES, RECORDS_SETTING
from sparkdl.driver.tensors import SequencePadding
from sparkdl.errors import ConfigError, SchemaError

EPOCHS = 8
BAR = 0.9


@pytest.fixture(scope="module")
def arrays():  # type: ignore[no-untyped-def]
    return digits_arrays(0)


def _cnn(shape: tuple[int, ...], scale: float = 1.0) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input(shape),
            keras.layers.Rescaling(scale),
            keras.layers.Reshape((8, 8, 1)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _frame(spark, rows, schema, *, shuffled: bool = True):  # type: ignore[no-untyped-def]
    """Training rows shuffled into 2 partitions; test rows in their order."""
    df = spark.createDataFrame(rows, schema)
    return df.repartition(2) if shuffled else df


def _nested(x: np.ndarray, shape: tuple[int, ...]) -> list:  # type: ignore[type-arg]
    return x.reshape((len(x), *shape)).tolist()


def _fit_and_check(spark, model, train, test, x_test, y_test, column="x"):  # type: ignore[no-untyped-def]
    """Fits, then checks accuracy, and that transform matches the model's own predict
    and evaluate matches transform."""
    est = KerasEstimator(
        model=model, features_col=column, label_col="label", epochs=EPOCHS, batch_size=32, seed=0
    )
    fitted = est.fit(train)
    trained = fitted.get_model()
    got = np.array([r.prediction for r in fitted.transform(test).select("prediction").collect()])
    want = trained.predict(x_test, verbose=0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    accuracy = float((got.argmax(axis=1) == y_test).mean())
    assert accuracy >= BAR, accuracy
    assert fitted.evaluate(test)["accuracy"] == pytest.approx(accuracy, abs=1e-6)
    return fitted


@pytest.mark.slow  # the fast tier's CNN is the image struct's (fast tier <= 6 min)
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_a_cnn_trains_from_nested_or_flat_arrays(spark, arrays, rank: int) -> None:
    """Rank 2 (8 x 8) and rank 3 (8 x 8 x 1) rows feed an (8, 8, 1) input, and so does a
    flat row of 64 values (reshaped as predict_batch_udf's input_tensor_shapes does)."""
    x_train, x_test, y_train, y_test = arrays
    shape = {1: (64,), 2: (8, 8), 3: (8, 8, 1)}[rank]
    schema = f"x {'array<' * rank}float{'>' * rank}, label int"
    train = _frame(spark, list(zip(_nested(x_train, shape), y_train.tolist(), strict=True)), schema)
    test = _frame(
        spark,
        list(zip(_nested(x_test, shape), y_test.tolist(), strict=True)),
        schema,
        shuffled=False,
    )
    _fit_and_check(spark, _cnn((8, 8, 1)), train, test, x_test.reshape(-1, 8, 8, 1), y_test)


def _images(x: np.ndarray, y: np.ndarray, size: int = 8) -> list:  # type: ignore[type-arg]
    pixels = (x * 16).clip(0, 255).astype(np.uint8).reshape(-1, 8, 8, 1)
    return [
        ((f"mem://{i}.png", size, size, 1, 0, bytearray(p.tobytes())), int(label))
        for i, (p, label) in enumerate(zip(pixels, y, strict=True))
    ]


#: The schema of spark.read.format("image") (ImageSchema.columnSchema needs the JVM),
#: with a label.
IMAGES = (
    "image struct<origin:string,height:int,width:int,nChannels:int,mode:int,data:binary>, label int"
)


@pytest.mark.compat
def test_spark_image_struct_feeds_an_image_input_as_uint8(spark, arrays) -> None:
    x_train, x_test, y_train, y_test = arrays
    train = _frame(spark, _images(x_train, y_train), IMAGES)
    test = _frame(spark, _images(x_test, y_test), IMAGES, shuffled=False)
    pixels = (x_test * 16).clip(0, 255).astype(np.uint8).reshape(-1, 8, 8, 1)
    fitted = _fit_and_check(
        spark, _cnn((8, 8, 1), scale=1 / 16), train, test, pixels, y_test, column="image"
    )
    # An image of another size is refused before training, by its origin.
    other = spark.createDataFrame([(("mem://big.png", 9, 9, 1, 0, bytearray(81)), 0)], IMAGES)
    with pytest.raises(SchemaError, match=r"row 0 .*\(9, 9, 1\).*mem://big\.png") as info:
        KerasEstimator(model=_cnn((8, 8, 1)), features_col="image", epochs=1).fit(
            other.union(train.limit(10))
        )
    assert "(8, 8, 1) in an 8-bit mode" in str(info.value)
    with pytest.raises(Exception, match=r"mem://big\.png"):
        fitted.transform(other).collect()


@pytest.mark.slow  # fast tier <= 6 min: the image struct's test stays in it
@pytest.mark.compat
def test_misshaped_rows_are_named_and_the_pasted_fix_works(spark, arrays) -> None:
    x_train, _, y_train, _ = arrays
    rows = list(zip(_nested(x_train[:200], (8, 8)), y_train[:200].tolist(), strict=True))
    rows[7] = ([[0.0] * 7, *rows[7][0][1:]], rows[7][1])  # a short first line: 63 values
    rows[9] = ([[0.0] * 9, *rows[9][0][1:-1], [0.0] * 7], rows[9][1])  # 64, misshaped
    df = spark.createDataFrame(rows, "x array<array<float>>, label int").coalesce(1)
    est = KerasEstimator(model=_cnn((8, 8, 1)), features_col="x", epochs=1, batch_size=32)
    with pytest.raises(SchemaError) as info:
        est.fit(df)
    message = str(info.value)
    assert "2 row(s) do not have the shape the model's input takes, (8, 8)" in message
    assert "the first is row 7" in message and "of shape (8, 7..8)" in message
    fix = next(line.strip() for line in message.splitlines() if line.strip().startswith("df ="))
    scope = {"df": df, "F": F}
    exec(fix, scope)
    assert scope["df"].count() == 198
    est.fit(scope["df"])
    # Rows nested deeper than the input has dimensions: flatten them, the message says.
    deep = spark.createDataFrame([([[[1.0]]], 0)], "x array<array<array<float>>>, label int")
    flat = keras.Sequential([keras.Input((1,)), keras.layers.Dense(2, activation="softmax")])
    flat.compile("adam", "sparse_categorical_crossentropy")
    with pytest.raises(SchemaError, match=r"nested 3 deep.*F\.flatten"):
        KerasEstimator(model=flat, features_col="x", epochs=1).fit(deep)


def _tokens(rows: int, seed: int = 0) -> tuple[list[list[int]], np.ndarray]:
    """Token sequences of 3-12 tokens; the label is whether token 7 occurs."""
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(1, 20, size=int(rng.integers(3, 13))).tolist() for _ in range(rows)]
    return seqs, np.array([int(7 in s) for s in seqs])


def _sequence_model(length: int | None) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((length,)),
            keras.layers.Embedding(20, 8),
            keras.layers.GlobalMaxPooling1D(),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )
    model.compile(keras.optimizers.Adam(0.02), "binary_crossentropy", metrics=["accuracy"])
    return model


@pytest.mark.slow
@pytest.mark.parametrize(
    "padding",
    ["post", pytest.param({"padding": "pre", "truncating": "post"}, marks=pytest.mark.slow)],
)
def test_token_sequences_are_padded_only_when_asked(spark, padding, tmp_path) -> None:  # type: ignore[no-untyped-def]
    seqs, labels = _tokens(400)
    df = spark.createDataFrame(
        list(zip(seqs, labels.tolist(), strict=True)), "tokens array<int>, label int"
    ).coalesce(1)
    with pytest.raises(SchemaError, match="sequence_padding='post'"):
        KerasEstimator(model=_sequence_model(10), features_col="tokens", epochs=1).fit(df)
    est = KerasEstimator(
        model=_sequence_model(10),
        features_col="tokens",
        epochs=15,
        batch_size=32,
        sequence_padding=padding,
        seed=0,
    )
    fitted = est.fit(df)
    assert fitted.sequence_padding == SequencePadding.of(padding)
    # transform pads as pad_sequences does (rows of 11 and 12 tokens are cut to 10).
    setting = {"padding": padding, "truncating": padding} if isinstance(padding, str) else padding
    padded = keras.utils.pad_sequences(seqs, maxlen=10, value=0, **setting)
    got = np.array([r.prediction for r in fitted.transform(df).select("prediction").collect()])
    want = fitted.get_model().predict(padded, verbose=0)[:, 0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert float(((got > 0.5) == labels).mean()) >= 0.9
    fitted.save(str(tmp_path / "model"))  # the setting is saved with the stage
    loaded = KerasModel.load(str(tmp_path / "model"))
    assert loaded.sequence_padding == fitted.sequence_padding
    again = np.array([r.prediction for r in loaded.transform(df).select("prediction").collect()])
    np.testing.assert_allclose(again, got, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_an_open_length_input_takes_the_longest_row_and_bad_settings_are_named(spark) -> None:
    seqs, labels = _tokens(200, seed=1)
    df = spark.createDataFrame(
        list(zip(seqs, labels.tolist(), strict=True)), "tokens array<int>, label int"
    )
    fitted = KerasEstimator(
        model=_sequence_model(None), features_col="tokens", epochs=1, sequence_padding="post"
    ).fit(df)
    longest = max(len(s) for s in seqs)
    assert fitted.input_shapes == [(longest,)]
    assert fitted.sequence_padding == SequencePadding("post", "post", length=longest)
    # transform pads any frame to the training's length (not the frame's own longest row)
    short = df.limit(20)
    padded = keras.utils.pad_sequences(seqs[:20], maxlen=longest, padding="post")
    got = np.array([r.prediction for r in fitted.transform(short).select("prediction").collect()])
    want = fitted.get_model().predict(padded, verbose=0)[:, 0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    with pytest.raises(ConfigError, match=r"give sequence_padding (a|the) length"):
        KerasModel.from_keras(
            _sequence_model(None), features_col="tokens", sequence_padding="post"
        ).transform(df)
    with pytest.raises(ConfigError, match="'pre', 'post' or a dict"):
        KerasEstimator(model=_sequence_model(10), sequence_padding="end")
    with pytest.raises(ConfigError, match="unknown keys"):
        KerasModel.from_keras(_sequence_model(10), sequence_padding={"maxlen": 10})


@pytest.mark.slow
def test_nested_labels_are_per_position_targets(spark) -> None:
    """A (4, 3) input per row and a (4, 2) target per row (a value per position)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 4, 3)).astype(np.float32)
    w = rng.normal(size=(3, 2)).astype(np.float32)
    y = x @ w
    df = spark.createDataFrame(
        list(zip(x.tolist(), y.tolist(), strict=True)),
        "x array<array<float>>, y array<array<float>>",
    )
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4, 3)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(0.05), "mse")
    fitted = KerasEstimator(
        model=model, features_col="x", label_col="y", epochs=20, batch_size=16
    ).fit(df)
    assert fitted.history["loss"][-1] < 0.05 * fitted.history["loss"][0]
    assert fitted.evaluate(df)["loss"] < 0.05
    first = fitted.transform(df.limit(1)).first()
    assert len(first.prediction) == 8  # the (4, 2) output, flattened


@pytest.mark.slow
# Keras 3.14 warns at each build of such a model that its keys are not its inputs' names.
@pytest.mark.filterwarnings("ignore:When providing `inputs` as a dict:UserWarning")
def test_a_dict_model_takes_an_image_and_padded_tokens_by_its_keys(spark) -> None:
    """Inputs named by the model's dict keys (its layers have other names), one image
    input and one token input, through fit, transform and evaluate."""
    rng = np.random.default_rng(0)
    seqs, labels = _tokens(200, seed=2)
    pixels = rng.integers(0, 256, size=(200, 4, 4, 3), dtype=np.uint8)
    rows = [
        ((f"mem://{i}", 4, 4, 3, 16, bytearray(p.tobytes())), s, int(t))
        for i, (p, s, t) in enumerate(zip(pixels, seqs, labels, strict=True))
    ]
    schema = IMAGES.replace("label int", "tokens array<int>, label int")
    df = spark.createDataFrame(rows, schema)
    image_in = keras.Input((4, 4, 3), name="image_layer")
    tokens_in = keras.Input((12,), name="token_layer")
    image_part = keras.layers.Flatten()(keras.layers.Rescaling(1 / 255)(image_in))
    token_part = keras.layers.GlobalMaxPooling1D()(keras.layers.Embedding(20, 8)(tokens_in))
    joined = keras.layers.Concatenate()([token_part, image_part])
    model = keras.Model(
        {"tokens": tokens_in, "pixels": image_in},
        keras.layers.Dense(1, activation="sigmoid")(joined),
    )
    model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
    fitted = KerasEstimator(
        model=model,
        features_col={"pixels": "image", "tokens": "tokens"},
        epochs=2,
        sequence_padding="post",
    ).fit(df)
    padded = keras.utils.pad_sequences(seqs, maxlen=12, padding="post", truncating="post")
    want = fitted.get_model().predict({"tokens": padded, "pixels": pixels}, verbose=0)[:, 0]
    got = np.array([r.prediction for r in fitted.transform(df).select("prediction").collect()])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert "loss" in fitted.evaluate(df)


def _wide_images(spark, rows: int, side: int):  # type: ignore[no-untyped-def]
    """``rows`` Spark image structs of ``side`` x ``side`` x 3 (12 KB at 64), made in
    the JVM, in one partition."""
    data = F.expr(f"unhex(repeat(lpad(hex(id % 256), 2, '0'), {side * side * 3}))")
    image = F.struct(
        F.lit("mem://wide.png").alias("origin"),
        F.lit(side).alias("height"),
        F.lit(side).alias("width"),
        F.lit(3).alias("nChannels"),
        F.lit(16).alias("mode"),
        data.alias("data"),
    )
    return spark.range(rows, numPartitions=1).select(
        image.alias("image"), (F.col("id") % 2).cast("int").alias("label")
    )


@pytest.mark.slow  # fast tier <= 6 min: tests/unit/test_arrow_batches.py stays in it
@pytest.mark.compat
def test_wide_rows_reach_a_worker_in_record_batches_of_bounded_bytes(spark) -> None:
    """1,200 images of 12 KB would come as one 15 MB record batch (Spark's 10,000 rows);
    the fit lowers the session's rows per batch for its job to about 4 MB of rows, keeps
    a smaller setting of the session's own, and puts the session's value back."""
    side = 64
    df = _wide_images(spark, 1_200, side)

    def fit():  # type: ignore[no-untyped-def]
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input((side, side, 3)),
                keras.layers.Rescaling(1 / 255),
                keras.layers.GlobalAveragePooling2D(),
                keras.layers.Dense(2, activation="softmax"),
            ]
        )
        model.compile("adam", "sparse_categorical_crossentropy")
        est = KerasEstimator(model=model, features_col="image", num_workers=1, epochs=1)
        (worker,) = est.fit(df).fit_report["workers"]
        assert worker["rows"] == 1_200
        return worker["record_batch_bytes"]

    own = spark.conf.get(RECORDS_SETTING)
    assert 1.2 * BATCH_BYTES >= fit() >= 0.5 * BATCH_BYTES
    assert spark.conf.get(RECORDS_SETTING) == own
    spark.conf.set(RECORDS_SETTING, "100")
    try:
        assert fit() <= 100 * (side * side * 3 + 64)
        assert spark.conf.get(RECORDS_SETTING) == "100"
    finally:
        spark.conf.set(RECORDS_SETTING, own)
