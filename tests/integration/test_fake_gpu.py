"""GPU assignment on local-cluster with a fake discovery script: each task sees its own id."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_each_task_sees_only_its_own_gpu(tmp_path) -> None:
    here = os.path.dirname(__file__)
    env = dict(
        os.environ,
        SPARK_LOCAL_IP="127.0.0.1",
        FAKE_GPU_DIR=str(tmp_path),
        PYTHONUNBUFFERED="1",
    )
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(here, "fake_gpu_fit.py"),
            os.path.join(here, "fake_gpu_discovery.sh"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    reports = [
        json.loads(line.split(" ", 1)[1])
        for line in proc.stdout.splitlines()
        if line.startswith("GPU_REPORT ")
    ]
    assert len(reports) == 2
    ids = sorted(r["gpu_ids"][0] for r in reports)
    assert ids == ["0", "1"]  # one distinct GPU per task
    for r in reports:
        assert r["gpu_ids"] == [r["cuda_visible_devices"]]  # set before TensorFlow started
        assert r["gpus"] == 0  # no real GPU: the task fell back to the CPU
