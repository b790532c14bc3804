"""sparkdl: train Keras 3 models on Apache Spark DataFrames.

Example:
    >>> import sparkdl
    >>> sorted(sparkdl.__all__)[:2]
    ['ClusterError', 'ConfigError']
"""

from typing import TYPE_CHECKING

from sparkdl.config import TrainConfig
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
from sparkdl.estimator import KerasEstimator
from sparkdl.model import KerasModel
from sparkdl.persistence import loading_options
from sparkdl.warmup import warm_up

if TYPE_CHECKING:
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
    "warm_up",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # LARS imports Keras: only when asked for, so ``import sparkdl`` stays light.
    if name == "LARS":
        from sparkdl.optimizers import LARS

        return LARS
    raise AttributeError(f"module 'sparkdl' has no attribute {name!r}")
