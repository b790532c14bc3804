"""Fit digits on local-cluster[2,1,1024], or the master given as the first argument.

Separate executor JVMs and Python workers. With a second argument MARKER the fit is
asynchronous and writes MARKER when epoch 3 closes, so that a test can kill an
executor's machine (a standalone worker JVM) in the middle of the fit.

Run by tests/integration/test_local_cluster.py in its own process, since a process has
one SparkContext. Prints "ACCURACY <value>" and the executor process ids seen.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from examples.digits import accuracy, digits_arrays, digits_frames, digits_model
from sparkdl import KerasEstimator
from tests.integration.conftest import spark_builder


def main() -> None:
    master = sys.argv[1] if len(sys.argv) > 1 else "local-cluster[2,1,1024]"
    builder = spark_builder(master)
    if master.startswith("spark://"):  # standalone workers: one 1-core executor each
        builder = builder.config("spark.executor.cores", "1").config("spark.executor.memory", "1g")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    train_df, _ = digits_frames(spark, partitions=2)
    _, x_test, _, y_test = digits_arrays()
    marker = sys.argv[2] if len(sys.argv) > 2 else None
    settings: dict[str, object] = {}
    if marker:
        import keras

        def mark(epoch: int, logs: dict[str, float]) -> None:
            if epoch == 2:
                with open(marker, "w") as out:
                    out.write(str(time.time()))

        settings = {
            "mode": "asynchronous",
            "frequency": 4,
            "callbacks": [keras.callbacks.LambdaCallback(on_epoch_end=mark)],
        }
    fitted = KerasEstimator(
        model=digits_model(), num_workers=2, epochs=20, batch_size=32, seed=0, **settings
    ).fit(train_df)
    pids = spark.sparkContext.parallelize(range(4), 2).map(lambda _: os.getpid()).distinct().count()
    print(f"ACCURACY {accuracy(fitted.get_model(), x_test, y_test):.4f}")
    print(f"EXECUTOR_PIDS {pids}")
    service = fitted.fit_report["service"]
    print(f"RESTARTS {service['restarts']} EPOCHS {len(fitted.history['loss'])}")
    print(f"SAMPLES {service['samples_seen']}")
    spark.stop()


if __name__ == "__main__":
    main()
