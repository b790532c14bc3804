"""4 synchronous workers x batch 128 against one process at batch 128, with and without
the large-batch recipe, on teacher data read from Parquet (``local[4]``; the 8-worker
figures are benchmarks/large_batch.py's).

Run by tests/integration/test_large_batch.py in its own process (a process has one
SparkContext; the suite's is local[2]). Prints "RESULT {json}": test accuracies of
plain Keras, of the distributed fit without the recipe (``lr_scaling=None``) and with
the default ``lr_scaling="auto"`` (linear for SGD) and ``warmup_epochs=0.25``, and the
workers' learning rates.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import keras
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.scale import build_model, teacher_rows, teacher_weights
from sparkdl import KerasEstimator
from tests.integration.conftest import spark_builder

ROWS, WORKERS, BATCH, EPOCHS, RATE = 24_000, 4, 128, 4, 0.01


def model() -> keras.Model:
    """The benchmark's MLP 100-512-512-10, compiled with plain SGD."""
    net = build_model([512, 512], seed=0)
    net.compile(optimizer=keras.optimizers.SGD(RATE), loss="sparse_categorical_crossentropy")
    return net


def accuracy(net: keras.Model, x: np.ndarray, y: np.ndarray) -> float:
    return float((net.predict(x, batch_size=4096, verbose=0).argmax(axis=1) == y).mean())


def main() -> None:
    teacher = teacher_weights(0)
    x, y = teacher_rows(teacher, np.random.default_rng(1), ROWS)
    x_test, y_test = teacher_rows(teacher, np.random.default_rng(2), 10_000)
    result: dict[str, object] = {}
    plain = model()
    plain.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0)
    result["plain"] = accuracy(plain, x_test, y_test)
    with tempfile.TemporaryDirectory(prefix="sparkdl-large-batch-") as tmp:
        for i, part in enumerate(np.array_split(np.arange(ROWS), WORKERS)):
            features = pa.FixedSizeListArray.from_arrays(pa.array(x[part].reshape(-1)), 100)
            table = pa.table({"features": features, "label": pa.array(y[part])})
            pq.write_table(table, os.path.join(tmp, f"part-{i}.parquet"))
        spark = spark_builder(f"local[{WORKERS}]").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        frame = spark.read.parquet(tmp)
        for name, recipe in [
            ("none", {"lr_scaling": None}),
            ("linear", {"warmup_epochs": 0.25}),  # lr_scaling="auto": linear for SGD
        ]:
            fitted = KerasEstimator(
                model=model(),
                num_workers=WORKERS,
                mode="synchronous",
                merge="average",
                frequency="batch",
                epochs=EPOCHS,
                batch_size=BATCH,
                seed=0,
                **recipe,
            ).fit(frame)
            result[name] = accuracy(fitted.get_model(), x_test, y_test)
            result[f"{name}_rates"] = sorted(
                {round(w["learning_rate"], 6) for w in fitted.fit_report["workers"]}
            )
        spark.stop()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
