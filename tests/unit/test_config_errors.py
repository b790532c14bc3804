from __future__ import annotations

import pickle

import pytest

from sparkdl.config import TrainConfig
from sparkdl.errors import ConfigError, SchemaError, SparkDLError, WorkerError


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"mode": "turbo"}, "mode"),
        ({"merge": "median"}, "merge"),
        ({"frequency": "hourly"}, "frequency"),
        ({"frequency": 0}, "frequency"),
        ({"frequency": True}, "frequency"),
        ({"epochs": 0}, "epochs"),
        ({"batch_size": -1}, "batch_size"),
        ({"num_workers": 0}, "num_workers"),
        ({"verbose": 5}, "verbose"),
        ({"port": 70000}, "port"),
        ({"request_timeout": 0}, "request_timeout"),
        ({"seed": 1.5}, "seed"),
        ({"request_retries": -1}, "request_retries"),
        ({"overlap": True}, "overlap"),  # synchronous rounds wait for their result
        ({"overlap": "yes", "mode": "hogwild"}, "overlap"),
    ],
)
def test_invalid_settings_fail_at_once(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        TrainConfig(**kwargs)


def test_defaults_and_resolved_frequency() -> None:
    assert TrainConfig().merge == "average"
    assert TrainConfig().sync.resolved_frequency is None
    assert TrainConfig(frequency="batch").sync.resolved_frequency == 1
    assert TrainConfig(frequency=4).sync.resolved_frequency == 4
    assert not TrainConfig().sync.resolved_overlap
    assert TrainConfig(mode="asynchronous").sync.resolved_overlap
    assert not TrainConfig(mode="hogwild", overlap=False).sync.resolved_overlap


def test_config_is_keyword_only_and_frozen() -> None:
    with pytest.raises(TypeError):
        TrainConfig("synchronous")  # type: ignore[misc]
    config = TrainConfig()
    with pytest.raises(AttributeError):
        config.epochs = 3  # type: ignore[misc]


def test_errors_survive_pickling() -> None:
    err = WorkerError("2 workers failed", {0: "Traceback...\nValueError: boom"})
    back = pickle.loads(pickle.dumps(err))
    assert isinstance(back, WorkerError) and back.failures == {0: "Traceback...\nValueError: boom"}
    assert "boom" in str(back)
    schema = pickle.loads(pickle.dumps(SchemaError("missing column")))
    assert isinstance(schema, ValueError) and isinstance(schema, SparkDLError)
