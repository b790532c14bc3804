"""scikit-learn's digits (ships inside its wheel, no download) as Spark DataFrames.

Example:
    >>> x_train, x_test, y_train, y_test = digits_arrays(seed=0)
    >>> x_train.shape, x_test.shape
    ((1437, 64), (360, 64))
"""

from __future__ import annotations

from typing import Any

import numpy as np


def digits_arrays(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Digits scaled to [0, 1], split 80/20 with a fixed, stratified shuffle."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=seed, stratify=y
    )
    return x_train, x_test, y_train, y_test


def digits_frames(spark: Any, seed: int = 0, partitions: int = 2) -> tuple[Any, Any]:
    """Returns ``(train_df, test_df)`` with ``features`` (array<float>) and ``label`` (long).

    Each frame is made from an Arrow table (``spark.createDataFrame`` takes one since
    Spark 4.0; on 3.5 :func:`~sparkdl.compat.spark_versions.frame_from_arrow` passes it
    through pandas): a local relation in the JVM, read by no Python process. A frame made
    from Python rows (``createDataFrame(rows, schema)``) is an RDD of pickled rows that
    every query over it reads back through Python workers, which made the demo's data
    checks slower (README, "Start warm"). Both give the same rows in the same partitions.
    """
    x_train, x_test, y_train, y_test = digits_arrays(seed)
    return arrow_frame(spark, x_train, y_train, partitions), arrow_frame(
        spark, x_test, y_test, partitions
    )


def arrow_frame(spark: Any, x: np.ndarray, y: np.ndarray, partitions: int = 2) -> Any:
    """A DataFrame of ``features`` (array<float>: each row of ``x``, flattened) and
    ``label`` (long, one per row), from one Arrow table, in ``partitions`` partitions."""
    import pyarrow as pa

    rows = len(x)
    x = np.asarray(x, dtype=np.float32).reshape(rows, -1)
    y = np.asarray(y).reshape(rows).astype(np.int64)
    if x.size >= 2**31:
        raise ValueError(f"{x.size} feature values are too many for one Arrow list column")
    offsets = (np.arange(rows + 1, dtype=np.int64) * x.shape[1]).astype(np.int32)
    features = pa.ListArray.from_arrays(offsets, pa.array(x.ravel()))
    table = pa.table({"features": features, "label": pa.array(y)})
    from sparkdl.compat.spark_versions import frame_from_arrow

    return frame_from_arrow(spark, table).repartition(partitions)


def digits_model(seed: int = 0, learning_rate: float = 0.003, optimizer: str = "adam") -> Any:
    """A small compiled MLP for digits (64 -> 64 -> 10), with Adam or plain SGD
    (``optimizer="sgd"``; ``"momentum"`` is SGD with momentum 0.9)."""
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    optimizers = {
        "adam": lambda: keras.optimizers.Adam(learning_rate),
        "sgd": lambda: keras.optimizers.SGD(learning_rate),
        "momentum": lambda: keras.optimizers.SGD(learning_rate, momentum=0.9),
    }
    model.compile(
        optimizer=optimizers[optimizer](),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def accuracy(model: Any, x: np.ndarray, y: np.ndarray) -> float:
    """Share of rows whose arg-max prediction equals the label."""
    pred = np.asarray(model.predict(x, verbose=0)).argmax(axis=1)
    return float((pred == y).mean())
