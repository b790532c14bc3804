"""The same synchronous fit on local-cluster[2,1,1024]: separate executor processes,
and a model of custom objects that only the driver defines."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_digits_on_local_cluster() -> None:
    script = os.path.join(os.path.dirname(__file__), "local_cluster_fit.py")
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [sys.executable, script], capture_output=True, text=True, timeout=600, env=env
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    match = re.search(r"ACCURACY ([0-9.]+)", proc.stdout)
    assert match, proc.stdout
    assert float(match.group(1)) >= 0.95
    assert "EXECUTOR_PIDS 2" in proc.stdout
    # The model is made of custom objects the estimator was not given (a registered
    # layer, an unregistered activation and initializer from a module the executors
    # cannot import, a registered loss and an unregistered metric from __main__).
    custom = json.loads(re.search(r"CUSTOM (.*)", proc.stdout).group(1))  # type: ignore[union-attr]
    assert custom["transform_max_diff"] < 1e-5, custom
    assert custom["evaluate"]["row_accuracy"] >= 0.95, custom
    assert custom["reloaded_rows"] == 360, custom
    assert custom["reloaded_evaluate"] == pytest.approx(custom["evaluate"], abs=1e-6), custom
    assert custom["layers"] == ["Dense", "Scale", "Dense"], custom
