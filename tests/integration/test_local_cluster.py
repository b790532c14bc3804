"""The same synchronous fit on local-cluster[2,1,1024]: separate executor processes,
a model of custom objects that only the driver defines, and a fake GPU per worker.

One cluster boot (one driver process, ``local_cluster_fit.py``) serves every test here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

HERE = os.path.dirname(__file__)


@pytest.fixture(scope="module")
def run(tmp_path_factory: Any) -> str:
    """The script's output: the fit on local-cluster with one fake GPU per worker."""
    env = dict(
        os.environ,
        SPARK_LOCAL_IP="127.0.0.1",
        PYTHONUNBUFFERED="1",
        FAKE_GPU_DISCOVERY=os.path.join(HERE, "fake_gpu_discovery.sh"),
        FAKE_GPU_DIR=str(tmp_path_factory.mktemp("gpus")),
    )
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "local_cluster_fit.py")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout


def test_digits_on_local_cluster(run: str) -> None:
    match = re.search(r"ACCURACY ([0-9.]+)", run)
    assert match, run
    assert float(match.group(1)) >= 0.95
    assert "EXECUTOR_PIDS 2" in run
    # The model is made of custom objects the estimator was not given (a registered
    # layer, an unregistered activation and initializer from a module the executors
    # cannot import, a registered loss and an unregistered metric from __main__).
    custom = json.loads(re.search(r"CUSTOM (.*)", run).group(1))  # type: ignore[union-attr]
    assert custom["transform_max_diff"] < 1e-5, custom
    assert custom["evaluate"]["row_accuracy"] >= 0.95, custom
    assert custom["reloaded_rows"] == 360, custom
    assert custom["reloaded_evaluate"] == pytest.approx(custom["evaluate"], abs=1e-6), custom
    assert custom["layers"] == ["Dense", "Scale", "Dense"], custom


def test_each_task_sees_only_its_own_gpu(run: str) -> None:
    """GPU assignment with a fake discovery script: each task sees its own id."""
    reports = [
        json.loads(line.split(" ", 1)[1])
        for line in run.splitlines()
        if line.startswith("GPU_REPORT ")
    ]
    assert len(reports) == 2
    ids = sorted(r["gpu_ids"][0] for r in reports)
    assert ids == ["0", "1"]  # one distinct GPU per task
    for r in reports:
        assert r["gpu_ids"] == [r["cuda_visible_devices"]]  # set before TensorFlow started
        assert r["gpus"] == 0  # no real GPU: the task fell back to the CPU
