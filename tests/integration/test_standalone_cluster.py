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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):  # type: ignore[no-untyped-def]
    """A master and two 1-core workers on 127.0.0.1: ``(master_url, env, processes)``."""
    tmp_path = tmp_path_factory.mktemp("standalone")
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
        yield master_url, env, procs
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


SCRIPT = os.path.join(os.path.dirname(__file__), "local_cluster_fit.py")


@pytest.fixture(scope="module")
def run(cluster, tmp_path_factory) -> str:  # type: ignore[no-untyped-def]
    """One driver against the cluster: a synchronous fit on the intact cluster, then an
    asynchronous one whose second worker JVM is SIGKILLed after epoch 3 (a machine lost:
    its executor goes with it). Returns the driver's output."""
    master_url, env, procs = cluster
    marker = tmp_path_factory.mktemp("lost") / "epoch3"
    fit = subprocess.Popen(
        [sys.executable, SCRIPT, master_url, str(marker)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 900  # the synchronous fit, then three epochs
        while not marker.exists() and fit.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if not marker.exists():
            fit.kill()
            out, err = fit.communicate(timeout=60)
            raise AssertionError(f"the fit never reached epoch 3:\n{out[-3000:]}\n{err[-5000:]}")
        procs[2].kill()  # the second worker's JVM: a machine lost
        procs[2].wait(timeout=30)
        out, err = fit.communicate(timeout=600)
    finally:
        if fit.poll() is None:
            fit.kill()
    assert fit.returncode == 0, out[-3000:] + err[-5000:]
    return out


def test_fit_on_a_standalone_cluster(run: str) -> None:
    match = re.search(r"SYNC_ACCURACY ([0-9.]+)", run)
    assert match and float(match.group(1)) >= 0.95, run
    assert "EXECUTOR_PIDS 2" in run


def test_a_worker_machine_lost_mid_fit_is_rescheduled(run: str) -> None:
    """Spark reschedules the lost task on the other worker, and that attempt rejoins
    where training stood."""
    match = re.search(r"^ACCURACY ([0-9.]+)", run, re.MULTILINE)
    assert match and float(match.group(1)) >= 0.95, run
    restarts = re.search(r"RESTARTS (\d+) EPOCHS (\d+)", run)
    assert restarts, run
    assert int(restarts.group(1)) >= 1 and int(restarts.group(2)) == 20, run
    samples = re.search(r"SAMPLES (\d+)", run)
    assert samples and int(samples.group(1)) == 20 * 1437, run  # redone once, from its place
