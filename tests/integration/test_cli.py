"""The command line: --help, and the example job under spark-submit on local-cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from examples.digits import accuracy, digits_arrays
from sparkdl import KerasModel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_help_exits_zero_and_lists_every_setting() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sparkdl", "--help"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    for flag in (
        "--data",
        "--model",
        "--output",
        "--config",
        "--epochs",
        "--merge",
        "--elastic-alpha",
        "--checkpoint-dir",
        "--mlflow-run",
    ):
        assert flag in proc.stdout


def test_bad_setting_is_a_usage_error() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sparkdl",
            "--data",
            "d",
            "--model",
            "m:f",
            "--output",
            "o",
            "--mode",
            "sideways",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "mode" in proc.stderr


@pytest.mark.spark
@pytest.mark.slow
def test_example_job_under_spark_submit_on_local_cluster(digits, tmp_path) -> None:
    train_df, _, _ = digits
    data = str(tmp_path / "digits.parquet")
    train_df.write.parquet(data)
    output = str(tmp_path / "model")
    submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    env = dict(
        os.environ,
        PYSPARK_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    proc = subprocess.run(
        [
            submit,
            "--master",
            "local-cluster[2,1,1024]",
            "--conf",
            "spark.driver.host=127.0.0.1",
            "--conf",
            "spark.ui.enabled=false",
            os.path.join(ROOT, "examples", "digits_job.py"),
            "--config",
            os.path.join(ROOT, "conf", "train-digits.json"),
            "--data",
            data,
            "--output",
            output,
            "--epochs",
            "20",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["output"] == output and summary["epochs"] == 20
    loaded = KerasModel.load(output)
    _, x_test, _, y_test = digits_arrays()
    assert len(loaded.history["loss"]) == 20
    assert accuracy(loaded.get_model(), x_test, y_test) >= 0.95
    assert np.isfinite(loaded.history["loss"][-1])
