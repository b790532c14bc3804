"""A batch training job for spark-submit: digits MLP from a Parquet data set.

    spark-submit --master local-cluster[2,1,1024] examples/digits_job.py \
        --data /tmp/digits.parquet --model digits_job:build_model \
        --output /tmp/digits-model --config conf/train-digits.json

The job is sparkdl's command line (``python -m sparkdl``); this file adds the function
that builds the compiled model (``--model digits_job:build_model``). spark-submit puts
this file's directory on the driver's path, so the module imports as ``digits_job``.
"""

from __future__ import annotations

import sys
from typing import Any


def build_model(learning_rate: float = 0.003) -> Any:
    """A compiled 64-64-10 MLP for scikit-learn's digits."""
    import keras

    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


if __name__ == "__main__":
    from sparkdl.cli import main

    sys.exit(main())
