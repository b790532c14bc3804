"""A real Spark standalone cluster on 127.0.0.1: a master and two workers started with
spark-class (shipped with pip's pyspark), a fit against spark://127.0.0.1:PORT, then stop.
This is the driver-host and executor path YARN and Databricks use."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_port(port: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {seconds}s")


def test_fit_on_a_standalone_cluster(tmp_path) -> None:
    spark_class = os.path.join(os.path.dirname(sys.executable), "spark-class")
    env = dict(
        os.environ,
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        SPARK_LOG_DIR=str(tmp_path / "logs"),
    )
    port = _free_port()
    master_url = f"spark://127.0.0.1:{port}"
    procs = []
    logs = []
    try:
        log = open(tmp_path / "master.log", "w")  # noqa: SIM115 - closed below
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [
                    spark_class,
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--webui-port",
                    "0",
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        _wait_for_port(port, 60)
        for i in range(2):
            log = open(tmp_path / f"worker{i}.log", "w")  # noqa: SIM115 - closed below
            logs.append(log)
            procs.append(
                subprocess.Popen(
                    [
                        spark_class,
                        "org.apache.spark.deploy.worker.Worker",
                        master_url,
                        "--host",
                        "127.0.0.1",
                        "--cores",
                        "1",
                        "--memory",
                        "1536m",
                        "--webui-port",
                        "0",
                        "--work-dir",
                        str(tmp_path / f"work{i}"),
                    ],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        script = os.path.join(os.path.dirname(__file__), "local_cluster_fit.py")
        fit = subprocess.run(
            [sys.executable, script, master_url],
            capture_output=True,
            text=True,
            timeout=900,
            env=env,
        )
        assert fit.returncode == 0, fit.stdout[-3000:] + fit.stderr[-5000:]
        match = re.search(r"ACCURACY ([0-9.]+)", fit.stdout)
        assert match and float(match.group(1)) >= 0.95, fit.stdout
        assert "EXECUTOR_PIDS 2" in fit.stdout
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        for log in logs:
            log.close()
    with pytest.raises(ConnectionRefusedError):  # the master is gone
        socket.create_connection(("127.0.0.1", port), timeout=2)
