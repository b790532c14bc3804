"""``import sparkdl`` stays light: its public names load at first use.

A Spark worker that unpickles a function of :mod:`sparkdl.warmup` imports the package;
it must not load the estimator and ``pyspark.ml`` before it starts importing TensorFlow.
"""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
import sparkdl
loaded = sorted(m for m in sys.modules if m.startswith(("sparkdl.", "pyspark.ml", "keras")))
assert loaded == ["sparkdl.errors"], loaded
from sparkdl import KerasEstimator, KerasModel, LARS, TrainConfig, loading_options, warm_up
assert KerasEstimator.__module__ == "sparkdl.estimator" and sparkdl.KerasModel is KerasModel
assert set(sparkdl.__all__) <= set(dir(sparkdl))
try:
    sparkdl.no_such_name
except AttributeError as exc:
    assert "no_such_name" in str(exc)
else:
    raise AssertionError("an unknown name must raise AttributeError")
"""


def test_import_sparkdl_loads_only_its_errors_until_a_name_is_used() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
