"""sparkdl: train Keras 3 models on Apache Spark DataFrames.

Example:
    >>> import sparkdl
    >>> sorted(sparkdl.__all__)[:2]
    ['ClusterError', 'ConfigError']
"""

import importlib
from typing import TYPE_CHECKING

from sparkdl.errors import (
    ClusterError,
    ConfigError,
    ModelError,
    SchemaError,
    ServiceError,
    SparkDLError,
    TrainingError,
    WorkerError,
)

if TYPE_CHECKING:
    from sparkdl.config import TrainConfig
    from sparkdl.contract.tf_logs import quiet_tensorflow
    from sparkdl.driver.warmup import warm_up
    from sparkdl.estimator import KerasEstimator
    from sparkdl.ml.persistence import loading_options
    from sparkdl.model import KerasModel
    from sparkdl.optimizers import LARS

__all__ = [
    "LARS",
    "ClusterError",
    "ConfigError",
    "KerasEstimator",
    "KerasModel",
    "ModelError",
    "SchemaError",
    "ServiceError",
    "SparkDLError",
    "TrainConfig",
    "TrainingError",
    "WorkerError",
    "loading_options",
    "quiet_tensorflow",
    "warm_up",
]
__version__ = "0.1.0"


#: Where each public name lives: imported at first use, so that ``import sparkdl`` (and
#: every Spark worker that unpickles one of its functions) stays light. The estimator
#: loads ``pyspark.ml`` (0.6 s), ``LARS`` Keras; a worker needs neither.
_LAZY = {
    "KerasEstimator": "sparkdl.estimator",
    "KerasModel": "sparkdl.model",
    "LARS": "sparkdl.optimizers",
    "TrainConfig": "sparkdl.config",
    "loading_options": "sparkdl.ml.persistence",
    "quiet_tensorflow": "sparkdl.contract.tf_logs",
    "warm_up": "sparkdl.driver.warmup",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sparkdl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
