"""Data at Spark scale: the disk cache, bounded worker memory, sparse vectors, no needless
shuffle. Real Spark local[2], real TensorFlow, the real service."""

from __future__ import annotations

import numpy as np
import pytest

from examples.digits import accuracy, digits_model
from sparkdl import KerasEstimator

pytestmark = [pytest.mark.spark]

MB = 1 << 20


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_parquet_with_validation_spills_to_disk_past_the_budget(
    spark, digits, tmp_path, monkeypatch
) -> None:
    """A user's table: Parquet in many files; validation rows travel with the partitions
    (shuffled with them, so each worker gets a share); an "auto" cache over its budget
    moves to disk while the partition streams in."""
    from sparkdl.driver import cluster

    # The budget of a Python worker capped at a few hundred kB (it comes from
    # spark.executor.pyspark.memory, which a running session cannot change).
    monkeypatch.setattr(cluster, "cache_budget", lambda tools: 100_000)
    train_df, test_df, (_, x_test, _, y_test) = digits
    train_df.repartition(8).write.parquet(str(tmp_path / "train"))
    spark.conf.set("spark.sql.files.maxPartitionBytes", "16k")  # a file a partition
    try:
        table = spark.read.parquet(str(tmp_path / "train"))
        assert table.rdd.getNumPartitions() == 8
        fitted = KerasEstimator(
            model=digits_model(),
            features_col="features",
            label_col="label",
            mode="asynchronous",
            num_workers=2,
            epochs=20,
            batch_size=32,
            seed=0,
            data_cache="auto",
            validation_data=test_df,
        ).fit(table)
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
    acc = accuracy(fitted.get_model(), x_test, y_test)
    assert acc >= 0.95, acc
    assert len(fitted.history["val_accuracy"]) == 20
    assert fitted.history["val_accuracy"][-1] == pytest.approx(acc, abs=0.03)
    report = fitted.fit_report
    workers = report["workers"]
    assert [w["cache_mode"] for w in workers] == ["disk", "disk"]
    assert sum(w["rows"] for w in workers) == 1437
    assert min(w["rows"] for w in workers) > 600  # both workers train
    assert sum(w["validation_rows"] for w in workers) == 360
    assert min(w["validation_rows"] for w in workers) > 120  # both score validation rows
    # 64 float32 features and an int32 label a row, training and validation rows.
    assert sum(w["data_bytes"] for w in workers) == (1437 + 360) * 65 * 4
    assert all(w["peak_rss_bytes"] > 100 * MB for w in workers)
    assert report["prepare_seconds"] > 0 and report["data_seconds"] > 0
    assert report["train_seconds"] > 0


def _wide(spark, rows: int, width: int):  # type: ignore[no-untyped-def]
    from pyspark.sql import functions as F

    angles = F.sequence(F.lit(1), F.lit(width))
    return (
        spark.range(rows, numPartitions=2)
        .select(
            F.transform(angles, lambda i: F.sin(i * F.col("id"))).cast("array<float>").alias("x"),
            (F.col("id") % 2).cast("int").alias("y"),
        )
        .cache()
    )


@pytest.mark.slow  # 440 MB of rows through two workers
def test_disk_mode_worker_memory_does_not_grow_with_the_partition(spark) -> None:
    """Per worker: a 40 MB partition, then a 400 MB one; in disk mode the worker's peak
    memory grows by far less than the 360 MB between them (bound: 300 MB)."""
    import keras

    width = 1000
    peaks, sizes = [], []
    for rows in (20_000, 200_000):
        df = _wide(spark, rows, width)
        df.count()
        model = keras.Sequential([keras.Input((width,)), keras.layers.Dense(2, "softmax")])
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
        fitted = KerasEstimator(
            model=model,
            features_col="x",
            label_col="y",
            mode="asynchronous",
            num_workers=2,
            epochs=1,
            batch_size=2048,
            data_cache="disk",
            validate=False,
        ).fit(df)
        df.unpersist()
        workers = fitted.fit_report["workers"]
        peaks.append(max(w["peak_rss_bytes"] for w in workers))
        sizes.append(max(w["data_bytes"] for w in workers))
    assert sizes[1] > 380 * MB  # ten times the data per worker...
    growth = peaks[1] - peaks[0]
    assert growth < 300 * MB, (growth / MB, [p / MB for p in peaks])  # ...not its memory


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_wide_dense_vectors_are_cached_as_float_rows(spark) -> None:
    """4,096-wide DenseVectors (an image flattened by VectorAssembler) go dense: float32
    rows, not CSR with an index beside every value; scoring agrees with Keras."""
    import keras
    from pyspark.ml.linalg import Vectors

    width, rows = 4096, 200
    x = np.random.default_rng(0).random((rows, width), dtype=np.float32)
    y = (x[:, :8].sum(axis=1) > 4).astype(int)
    df = spark.createDataFrame(
        [(Vectors.dense(r), int(label)) for r, label in zip(x.tolist(), y, strict=True)],
        ["features", "label"],
    ).repartition(4)  # dealt round robin to the 2 workers
    model = keras.Sequential([keras.Input((width,)), keras.layers.Dense(2, "softmax")])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    fitted = KerasEstimator(
        model=model,
        features_col="features",
        label_col="label",
        mode="asynchronous",
        num_workers=2,
        epochs=1,
        batch_size=50,
    ).fit(df)
    workers = fitted.fit_report["workers"]
    assert sum(w["data_bytes"] for w in workers) == rows * (width + 1) * 4
    assert sorted(w["rows"] for w in workers) == [100, 100]  # half of each partition
    scored = fitted.transform(df).select("features", "prediction").collect()
    expected = fitted.get_model().predict(np.array([r.features for r in scored]), verbose=0)
    np.testing.assert_allclose([r.prediction for r in scored], expected, atol=1e-5)


def _documents(rows: int, seed: int) -> tuple[list[str], np.ndarray]:
    """Bag-of-words documents of 4 topics: 6 topic words among 14 common ones."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, rows)
    topic = rng.integers(0, 300, (rows, 6))
    common = rng.integers(0, 3000, (rows, 14))
    docs = [
        " ".join([f"t{k}_{i}" for i in t] + [f"w{i}" for i in c])
        for k, t, c in zip(labels.tolist(), topic.tolist(), common.tolist(), strict=True)
    ]
    return docs, labels


@pytest.mark.slow  # 2^18 features x 20k rows: trained, scored and evaluated
def test_hashed_text_stays_sparse_and_matches_plain_keras(spark) -> None:
    """2^18 hashed features x 20k rows (20 GB dense) train, score and evaluate sparse."""
    import keras
    import scipy.sparse
    from pyspark.ml.feature import HashingTF, Tokenizer

    width = 1 << 18
    docs, labels = _documents(22_000, seed=0)
    frame = spark.createDataFrame(
        [(d, int(y)) for d, y in zip(docs, labels, strict=True)], "text string, label int"
    ).repartition(4)
    words = Tokenizer(inputCol="text", outputCol="words").transform(frame)
    hashed = HashingTF(inputCol="words", outputCol="features", numFeatures=width).transform(words)
    train_df, test_df = hashed.limit(20_000).cache(), hashed.offset(20_000).cache()
    assert train_df.count() == 20_000

    def model() -> keras.Model:  # multinomial logistic regression on the hashed words
        keras.utils.set_random_seed(0)
        inputs = keras.Input((width,), sparse=True)
        net = keras.Model(inputs, keras.layers.Dense(4, activation="softmax")(inputs))
        net.compile(
            optimizer=keras.optimizers.Adam(0.003),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
        return net

    def sparse(df):  # type: ignore[no-untyped-def]  # scipy CSR: Keras takes it on any backend
        rows = df.select("features", "label").collect()
        indptr = np.cumsum([0] + [len(r.features.indices) for r in rows])
        indices = np.concatenate([r.features.indices for r in rows])
        values = np.concatenate([r.features.values for r in rows]).astype(np.float32)
        x = scipy.sparse.csr_matrix((values, indices, indptr), shape=(len(rows), width))
        return x, np.array([r.label for r in rows], np.int32)

    x_test, y_test = sparse(test_df)
    x_train, y_train = sparse(train_df)
    plain = model()
    plain.fit(x_train, y_train, epochs=2, batch_size=64, verbose=0)
    plain_acc = plain.evaluate(x_test, y_test, verbose=0, return_dict=True)["accuracy"]

    fitted = KerasEstimator(
        model=model(),
        features_col="features",
        label_col="label",
        mode="asynchronous",
        num_workers=2,
        epochs=2,
        batch_size=64,
        seed=0,
    ).fit(train_df)
    workers = fitted.fit_report["workers"]
    assert all(w["data_bytes"] < 20 * MB for w in workers)  # CSR, not 10 GB a worker
    assert all(w["peak_rss_bytes"] < 2048 * MB for w in workers)
    scores = fitted.evaluate(test_df)
    assert scores["accuracy"] >= plain_acc - 0.02, (scores, plain_acc)
    predictions = fitted.transform(test_df).select("prediction", "label").collect()
    predicted = np.array([np.argmax(r.prediction) for r in predictions])
    assert np.mean(predicted == [r.label for r in predictions]) == pytest.approx(
        scores["accuracy"], abs=1e-6
    )


def test_other_partition_counts_are_dealt_round_robin(spark) -> None:
    """Any partition count but ``num_workers`` is repartitioned round robin, ordinary
    tasks too (no ``coalesce``: the driver plans each worker's rows from the scan)."""
    from sparkdl.driver.launcher import partitioned as _partitioned

    frame = spark.range(100, numPartitions=8)

    def plan(df) -> str:  # type: ignore[no-untyped-def]
        return df._jdf.queryExecution().executedPlan().toString()

    shuffled = _partitioned(frame, 2, 8)
    assert shuffled.rdd.getNumPartitions() == 2
    assert "RoundRobinPartitioning" in plan(shuffled) and "Coalesce" not in plan(shuffled)
    assert "Exchange" in plan(_partitioned(spark.range(10, numPartitions=1), 2, 1))
    assert _partitioned(frame, 8, 8) is frame
    # Where the session cannot tell (Spark Connect), always dealt.
    assert "RoundRobinPartitioning" in plan(_partitioned(frame, 8, None))
