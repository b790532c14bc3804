"""Writes the backward-compatibility fixture ``tests/data/saved_stages/``.

What it writes (read by ``tests/integration/test_saved_stages.py``):

* ``saved_stages/keras_model/``: a fitted ``sparkdl.KerasModel`` (``KerasModel.save``);
* ``saved_stages/keras_estimator/``: the unfitted ``sparkdl.KerasEstimator`` that
  produced it (``KerasEstimator.save``);
* ``saved_stages/pipeline_model/``: a ``pyspark.ml.PipelineModel`` whose single stage
  is that fitted model (``PipelineModel.save``);
* ``saved_stages/expected.json``: the 64 rows (``features``, ``label``), the fitted
  model's ``prediction`` and ``class`` for each row, its history, fit report and input
  shape, and the estimator's Params and initial weights, all as read back by the
  release's own ``load`` right after saving.

The model is Input(4) -> Dense(8, relu) -> Dense(3, softmax), compiled with Adam,
``sparse_categorical_crossentropy`` and accuracy, trained for one epoch on 64 rows by
``KerasEstimator(num_workers=2, epochs=1, seed=0, class_col="class")`` on a local[2]
SparkSession. Spark's ``.crc`` checksum files are removed (loading does not need them).

THIS FIXTURE WAS GENERATED WITH RELEASE 0.1.0, COMMIT 26fd9d5. Its purpose is to prove
that stages saved by that release keep loading with later code, so do NOT re-run this
script with newer code: that would replace the old format with the new one and the test
would prove nothing. Re-run it only against the release itself, or when a new saved
format version is intended (then keep the old directory and add a new one beside it).
The script refuses to overwrite an existing ``saved_stages/`` without ``--overwrite``.

The exact command used (with Java 17 on PATH; /work/main is the repository)::

    cd /work/main && git worktree add /tmp/release 26fd9d5
    cd /tmp/release && TF_CPP_MIN_LOG_LEVEL=2 SPARK_LOCAL_IP=127.0.0.1 \\
        PYTHONPATH=/tmp/release /work/main/.venv/bin/python \\
        /work/main/tests/data/make_saved_stages.py
    cd /work/main && git worktree remove --force /tmp/release

``PYTHONPATH`` makes the driver import ``sparkdl`` from the release worktree instead of
the editable install. Run it from the worktree, not from the repository: Spark starts
its Python workers with ``python -m pyspark.daemon``, which puts the current directory
first on ``sys.path``, so from the repository root the executors would import the
newer ``sparkdl/``. The script prints both locations and stops if they differ. It
writes next to itself, whatever the current directory.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "saved_stages")
ROWS = 64
SEED = 0


def make_rows() -> list[tuple[int, list[float], int]]:
    """64 rows (id, 4 float32 features, label in {0, 1, 2}) from a fixed numpy seed."""
    import numpy as np

    rng = np.random.default_rng(SEED)
    x = rng.normal(size=(ROWS, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(int) + (x[:, 1] > 0.5).astype(int)  # 0, 1 or 2
    return [(i, [float(v) for v in x[i]], int(y[i])) for i in range(ROWS)]


def make_model():  # type: ignore[no-untyped-def]
    import keras

    keras.utils.set_random_seed(SEED)
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dense(3, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def executor_sparkdl_file(_: object) -> str:
    import sparkdl

    return str(sparkdl.__file__)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--overwrite", action="store_true", help="replace saved_stages/")
    args = parser.parse_args()
    if os.path.exists(OUT) and not args.overwrite:
        sys.exit(f"{OUT} exists: it is a fixture of an old release; see this file's docstring")

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

    import numpy as np
    from pyspark.ml import PipelineModel
    from pyspark.sql import SparkSession

    import sparkdl
    from sparkdl import KerasEstimator, KerasModel

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("make-saved-stages")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    remote = spark.sparkContext.parallelize([0], 1).map(executor_sparkdl_file).first()
    print(f"sparkdl {sparkdl.__version__} on the driver:  {sparkdl.__file__}")
    print(f"sparkdl on the executors: {remote}")
    if os.path.realpath(remote) != os.path.realpath(sparkdl.__file__):
        sys.exit("The driver and the executors import different sparkdl copies.")

    rows = make_rows()
    df = spark.createDataFrame(rows, "id long, features array<float>, label int").repartition(2)
    estimator = KerasEstimator(
        model=make_model(),
        features_col="features",
        label_col="label",
        epochs=1,
        num_workers=2,
        seed=0,
        class_col="class",
    )
    fitted = estimator.fit(df)

    if os.path.exists(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    paths = {
        name: os.path.join(OUT, name)
        for name in ("keras_model", "keras_estimator", "pipeline_model")
    }
    fitted.save(paths["keras_model"])
    estimator.save(paths["keras_estimator"])
    PipelineModel(stages=[fitted]).save(paths["pipeline_model"])
    for crc in glob.glob(os.path.join(OUT, "**", ".*.crc"), recursive=True):
        os.remove(crc)

    # Everything recorded is what the release's own load gives back, after the .crc
    # files are gone: the fixture is known to load with the code that wrote it.
    model = KerasModel.load(paths["keras_model"])
    loaded_est = KerasEstimator.load(paths["keras_estimator"])
    pipeline = PipelineModel.load(paths["pipeline_model"])
    scored = model.transform(df).orderBy("id").collect()
    predictions = [[float(v) for v in r.prediction] for r in scored]
    classes = [float(r["class"]) for r in scored]
    direct = fitted.get_model().predict(np.array([r[1] for r in rows], np.float32), verbose=0)
    np.testing.assert_allclose(predictions, direct, atol=1e-5)
    np.testing.assert_array_equal(classes, direct.argmax(axis=1))
    piped = pipeline.transform(df).orderBy("id").collect()
    np.testing.assert_allclose([r.prediction for r in piped], predictions, atol=1e-6)
    assert loaded_est.uid == estimator.uid and model.uid == fitted.uid
    assert model.history == fitted.history and model.history["loss"]

    estimator_params = {p.name: loaded_est.getOrDefault(p) for p in loaded_est.params}
    assert estimator_params == {p.name: estimator.getOrDefault(p) for p in estimator.params}
    expected = {
        "generated_by": f"sparkdl {sparkdl.__version__} (release commit 26fd9d5)",
        "features": [r[1] for r in rows],
        "labels": [r[2] for r in rows],
        "predictions": predictions,
        "classes": classes,
        "model": {
            "uid": model.uid,
            "featuresCol": model.getOrDefault("featuresCol"),
            "predictionCol": model.getOrDefault("predictionCol"),
            "classCol": model.getOrDefault("classCol"),
            "input_shape": list(model.input_shape),
            "history": model.history,
            "fit_report": model.fit_report,
        },
        "estimator": {
            "uid": loaded_est.uid,
            "params": estimator_params,
            "weight_shapes": [list(w.shape) for w in loaded_est.model.get_weights()],
            "count_params": int(loaded_est.model.count_params()),
            "weights": [w.tolist() for w in loaded_est.model.get_weights()],
        },
        "pipeline": {"stage_uids": [s.uid for s in pipeline.stages]},
    }
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    spark.stop()
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
