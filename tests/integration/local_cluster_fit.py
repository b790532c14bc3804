"""Fit digits on local-cluster[2,1,1024], or the master given as the first argument.

Separate executor JVMs and Python workers. With ``FAKE_GPU_DISCOVERY`` (a discovery
script) and ``FAKE_GPU_DIR`` set, each local-cluster worker claims one fake GPU and
every task asks for one: the fit prints each worker's GPU report ("GPU_REPORT {json}"),
so one cluster boot serves the custom-object scenario and the GPU assignment.

With a second argument MARKER the fit is asynchronous and writes MARKER when epoch 3
closes, so that a test can kill an executor's machine (a standalone worker JVM) in the
middle of the fit; before it, a synchronous fit runs on the intact cluster
("SYNC_ACCURACY <value>", "EXECUTOR_PIDS n"), so one driver serves both standalone
scenarios.

Without arguments (local-cluster) the model is full of custom objects, as users write
them: a registered layer, an unregistered activation and initializer in a module that
only the driver can import (written to a temporary directory at start), a registered
loss and an unregistered metric defined in ``__main__``; none is passed to the
estimator. The fitted model then scores (``transform``, ``evaluate``) on the executors,
is saved, loaded (the unregistered objects passed by plain name) and scores again.

Run by tests/integration/test_local_cluster.py in its own process, since a process has
one SparkContext. Prints "ACCURACY <value>", the executor process ids seen and, for the
custom model, "CUSTOM {json}".
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import keras
import numpy as np

from examples.digits import accuracy, digits_arrays, digits_frames, digits_model
from sparkdl import KerasEstimator, KerasModel
from tests.integration.conftest import spark_builder

#: A module of the user's that the executors cannot import.
USER_PARTS = """
import keras


@keras.saving.register_keras_serializable(package="userlib")
class Scale(keras.layers.Layer):
    def __init__(self, factor=1.0, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def call(self, x):
        return x * self.factor

    def get_config(self):
        return {**super().get_config(), "factor": self.factor}


def leaky(x):
    return keras.ops.leaky_relu(x, 0.01)


class SmallUniform(keras.initializers.Initializer):
    def __call__(self, shape, dtype=None):
        return keras.initializers.GlorotUniform(seed=0)(shape, dtype=dtype)

    def get_config(self):
        return {}
"""


@keras.saving.register_keras_serializable(package="notebook")
def ce_loss(y_true, y_pred):
    return keras.losses.sparse_categorical_crossentropy(y_true, y_pred)


class RowAccuracy(keras.metrics.SparseCategoricalAccuracy):
    def __init__(self, name="row_accuracy", **kwargs):
        super().__init__(name=name, **kwargs)


def main() -> None:
    master = sys.argv[1] if len(sys.argv) > 1 else "local-cluster[2,1,1024]"
    builder = spark_builder(master)
    if master.startswith("spark://"):  # standalone workers: one 1-core executor each
        builder = builder.config("spark.executor.cores", "1").config("spark.executor.memory", "1g")
    discovery = os.environ.get("FAKE_GPU_DISCOVERY")
    if discovery and master.startswith("local-cluster"):
        builder = (
            builder.config("spark.worker.resource.gpu.amount", "1")
            .config("spark.worker.resource.gpu.discoveryScript", discovery)
            .config("spark.executor.resource.gpu.amount", "1")
            .config("spark.task.resource.gpu.amount", "1")
        )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    train_df, _ = digits_frames(spark, partitions=2)
    _, x_test, _, y_test = digits_arrays()
    marker = sys.argv[2] if len(sys.argv) > 2 else None
    settings: dict[str, object] = {}
    if marker:
        synchronous = KerasEstimator(
            model=digits_model(), num_workers=2, epochs=20, batch_size=32, seed=0
        ).fit(train_df)
        print(f"SYNC_ACCURACY {accuracy(synchronous.get_model(), x_test, y_test):.4f}")
        print(f"EXECUTOR_PIDS {_executor_pids(spark)}", flush=True)
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
    custom = marker is None and len(sys.argv) <= 1
    model = custom_model() if custom else digits_model()
    fitted = KerasEstimator(
        model=model, num_workers=2, epochs=20, batch_size=32, seed=0, **settings
    ).fit(train_df)
    print(f"ACCURACY {accuracy(fitted.get_model(), x_test, y_test):.4f}")
    if not marker:
        print(f"EXECUTOR_PIDS {_executor_pids(spark)}")
    service = fitted.fit_report["service"]
    print(f"RESTARTS {service['restarts']} EPOCHS {len(fitted.history['loss'])}")
    print(f"SAMPLES {service['samples_seen']}")
    for w in fitted.fit_report["workers"]:
        keys = ("worker", "gpu_ids", "cuda_visible_devices", "gpus")
        print("GPU_REPORT " + json.dumps({k: w[k] for k in keys}))
    if custom:
        print("CUSTOM " + json.dumps(score_save_load(spark, fitted, x_test, y_test)))
    spark.stop()


def _executor_pids(spark) -> int:  # type: ignore[no-untyped-def]
    """How many Python worker processes two tasks ran in (2: separate executors)."""
    return spark.sparkContext.parallelize(range(4), 2).map(lambda _: os.getpid()).distinct().count()


def custom_model() -> keras.Model:
    """Digits' MLP built of custom objects, none of them passed to the estimator."""
    import importlib

    folder = tempfile.mkdtemp(prefix="user-parts-")
    with open(os.path.join(folder, "user_parts.py"), "w") as module:
        module.write(USER_PARTS)
    sys.path.insert(0, folder)  # the driver's path only
    parts = importlib.import_module("user_parts")
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(64, activation=parts.leaky, kernel_initializer=parts.SmallUniform()),
            parts.Scale(1.0),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(keras.optimizers.Adam(0.003), loss=ce_loss, metrics=[RowAccuracy()])
    return model


def score_save_load(spark, fitted, x_test, y_test) -> dict:  # type: ignore[no-untyped-def]
    """Scores on the executors, saves, loads and scores again; returns what it saw."""
    parts = sys.modules["user_parts"]
    test_df = spark.createDataFrame(
        [(x.tolist(), int(y)) for x, y in zip(x_test, y_test, strict=True)],
        "features array<float>, label long",
    ).repartition(2)
    expected = fitted.get_model().predict(x_test, verbose=0)
    rows = fitted.transform(test_df).select("features", "prediction").collect()
    by_row = {tuple(np.float32(r["features"])): r["prediction"] for r in rows}
    scored = np.array([by_row[tuple(np.float32(x))] for x in x_test])
    metrics = fitted.evaluate(test_df)
    path = os.path.join(tempfile.mkdtemp(prefix="custom-stage-"), "model")
    fitted.save(path)
    loaded = KerasModel.load(
        path,
        custom_objects={
            "leaky": parts.leaky,
            "SmallUniform": parts.SmallUniform,
            "RowAccuracy": RowAccuracy,
        },
    )
    reloaded = loaded.transform(test_df).select("prediction").count()
    again = loaded.evaluate(test_df)
    return {
        "transform_max_diff": float(np.abs(scored - expected).max()),
        "evaluate": metrics,
        "reloaded_rows": reloaded,
        "reloaded_evaluate": again,
        "layers": [type(layer).__name__ for layer in loaded.get_model().layers],
    }


if __name__ == "__main__":
    main()
