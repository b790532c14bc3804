"""Loading a saved stage runs no code from the directory unless the caller allows it.

A ``Lambda`` layer's bytecode and the pickled ``custom_objects.pkl`` both run code when
loaded; a stage loaded from a directory uses Keras's safe mode, on the driver and on
the executors that score with it, unless ``safe_mode=False`` is passed.
"""

from __future__ import annotations

from typing import Any

import cloudpickle
import keras
import numpy as np
import pytest
from pyspark.ml import PipelineModel

from sparkdl import KerasModel, loading_options
from sparkdl.contract.keras_io import model_to_bytes
from sparkdl.contract.payload import ScoringPayload
from sparkdl.errors import ModelError
from sparkdl.executor.scoring import load_model

pytestmark = [pytest.mark.spark]


class Doubling(keras.layers.Layer):  # deliberately not registered with Keras
    def call(self, inputs: Any) -> Any:
        return inputs * 2.0


@keras.saving.register_keras_serializable(package="sparkdl_tests")
class Tripling(keras.layers.Layer):  # registered: a safe load finds it by name
    def call(self, inputs: Any) -> Any:
        return inputs * 3.0


def _lambda_model() -> keras.Model:
    return keras.Sequential(
        [keras.Input((3,)), keras.layers.Lambda(lambda x: x * 2.0), keras.layers.Dense(1)]
    )


def _custom_model() -> keras.Model:
    return keras.Sequential([keras.Input((3,)), Doubling(), keras.layers.Dense(1)])


def _rows(spark: Any) -> Any:
    data = [([1.0, 2.0, 3.0],), ([0.5, 0.0, -1.0],)]
    return spark.createDataFrame(data, "features array<float>")


def _scores(stage: KerasModel, spark: Any) -> list[float]:
    return [float(r.prediction) for r in stage.transform(_rows(spark)).collect()]


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_a_lambda_layer_loads_only_with_safe_mode_off(spark: Any, tmp_path: Any) -> None:
    net = _lambda_model()
    path = str(tmp_path / "lambda")
    KerasModel(model_bytes=model_to_bytes(net)).write().save(path)
    with pytest.raises(ModelError, match="safe_mode=False"):
        KerasModel.load(path)
    with pytest.raises(ModelError, match="safe_mode=False"):
        KerasModel.read().load(path)
    trusted = KerasModel.load(path, safe_mode=False)
    assert trusted.safe_mode is False
    want = net.predict(np.array([[1, 2, 3], [0.5, 0, -1]], np.float32), verbose=0)[:, 0]
    np.testing.assert_allclose(_scores(trusted, spark), want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # among the fast tier's slowest: runs in --all (fast tier <= 6 min)
def test_pickled_custom_objects_are_not_unpickled_in_safe_mode(spark: Any, tmp_path: Any) -> None:
    net = _custom_model()
    custom = cloudpickle.dumps({"Doubling": Doubling})
    path = str(tmp_path / "custom")
    KerasModel(model_bytes=model_to_bytes(net), custom_objects=custom).write().save(path)
    with pytest.raises(ModelError, match=r"custom_objects\.pkl.*custom_objects=\{"):
        KerasModel.load(path)
    pipeline_path = str(tmp_path / "pipeline")
    PipelineModel(stages=[KerasModel.load(path, safe_mode=False)]).write().save(pipeline_path)
    with pytest.raises(ModelError, match="loading_options"):
        PipelineModel.load(pipeline_path)  # a Pipeline's stages load safely too
    with loading_options(custom_objects={"Doubling": Doubling}):
        pipeline = PipelineModel.load(pipeline_path)
    scored = [float(r.prediction) for r in pipeline.transform(_rows(spark)).collect()]
    want = net.predict(np.array([[1, 2, 3], [0.5, 0, -1]], np.float32), verbose=0)[:, 0]
    np.testing.assert_allclose(scored, want, rtol=1e-5, atol=1e-6)
    given = KerasModel.load(path, custom_objects={"Doubling": Doubling})
    assert given.safe_mode is True
    np.testing.assert_allclose(_scores(given, spark), want, rtol=1e-5, atol=1e-6)
    trusted = KerasModel.load(path, safe_mode=False)
    np.testing.assert_allclose(_scores(trusted, spark), want, rtol=1e-5, atol=1e-6)


def test_registered_objects_load_safely_without_the_pickle(spark: Any, tmp_path: Any) -> None:
    net = keras.Sequential([keras.Input((3,)), Tripling(), keras.layers.Dense(1)])
    path = str(tmp_path / "registered")
    custom = cloudpickle.dumps({"Tripling": Tripling})
    KerasModel(model_bytes=model_to_bytes(net), custom_objects=custom).write().save(path)
    # A registered class is found by its name: nothing of it is pickled into the stage.
    assert not (tmp_path / "registered" / "custom_objects.pkl").exists()
    loaded = KerasModel.load(path)  # safe: the registry serves
    assert loaded.safe_mode is True
    # What the executors get is taken from this session's registry, not the pickle.
    assert loaded.custom_objects is not None
    assert cloudpickle.loads(loaded.custom_objects) == {"sparkdl_tests>Tripling": Tripling}
    want = net.predict(np.array([[1, 2, 3], [0.5, 0, -1]], np.float32), verbose=0)[:, 0]
    np.testing.assert_allclose(_scores(loaded, spark), want, rtol=1e-5, atol=1e-6)


def test_executors_load_a_safe_stages_model_in_safe_mode() -> None:
    """The executors' loader keeps the stage's safe mode (a Lambda is refused there)."""

    class Broadcast:
        value = model_to_bytes(_lambda_model())

    def scoring(digest: str, safe_mode: bool) -> ScoringPayload:
        return ScoringPayload(Broadcast(), digest, None, [(1,)], [], [""], 8, safe_mode=safe_mode)

    with pytest.raises(ModelError, match="safe mode"):
        load_model(scoring("lambda-digest-safe", True))
    assert load_model(scoring("lambda-digest-any", False)) is not None
