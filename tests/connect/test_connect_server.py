"""A Spark Connect server in a process of its own, and a client that reaches nothing else.

The server is what a cluster runs (``spark-submit --class
org.apache.spark.sql.connect.service.SparkConnectServer``), on ``local[3,4]`` (two
workers, a slot for the relay's jobs, four attempts per task as on a cluster), started
in an empty directory with no ``PYTHONPATH``: the executors find the test's own modules
(the model's custom loss) only in what sparkdl ships them. The client
(tests/connect/remote_client.py) may open no TCP connection but to the server and may
not listen; it trains with the parameter service in the cluster (the default on
Connect), stops a fit from a callback, scores, saves and loads, and survives the death
of the Python process that hosts the service.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from benchmarks.idle_connections import free_port
from tests.connect.conftest import clean_env

pytestmark = [pytest.mark.spark, pytest.mark.slow]  # processes of their own

ROWS = 1437
EPOCHS = 20
#: Seconds the client's five scenarios may take together (about 50 s here).
CLIENT_SECONDS = 600


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, str, int]]:
    import pyspark

    workdir = tmp_path_factory.mktemp("connect-server")
    log_path = str(workdir / "server.log")
    port = free_port()
    submit = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit")
    env = clean_env()
    env.pop("PYTHONPATH", None)
    env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [
                submit,
                "--class",
                "org.apache.spark.sql.connect.service.SparkConnectServer",
                "--master",
                "local[3,4]",
                "--conf",
                f"spark.connect.grpc.binding.port={port}",
                "--conf",
                "spark.connect.grpc.binding.address=127.0.0.1",
                "--conf",
                "spark.ui.enabled=false",
                # A Python worker past 5 minutes (a hung one: tasks here take seconds)
                # writes its threads' stacks to the log.
                "--conf",
                "spark.python.worker.tracebackDumpIntervalSeconds=300",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(workdir),
            env=env,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, _tail(log_path)
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "no Connect server after 120 s\n" + _tail(log_path)
            time.sleep(0.5)
        yield port, log_path, proc.pid  # start_new_session: the JVM leads its group
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


@pytest.fixture(scope="module")
def results(
    server: tuple[int, str, int], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, Any]]:
    port, log_path, server_pid = server
    scenarios = ["sync", "async-stop", "sync-kill", "async-kill", "driver"]
    script = os.path.join(os.path.dirname(__file__), "remote_client.py")
    env = clean_env()
    env.update(PYTHONUNBUFFERED="1")
    outputs = tmp_path_factory.mktemp("connect-client")
    out_path, err_path = str(outputs / "stdout"), str(outputs / "stderr")
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, script, str(port), *scenarios], stdout=out, stderr=err, env=env
        )
        try:
            proc.wait(timeout=CLIENT_SECONDS)
        except BaseException as exc:
            if not isinstance(exc, subprocess.TimeoutExpired):
                proc.kill()  # an interrupted test leaves no client behind
                proc.wait()
                raise
            # Where it hung: the client's threads (its faulthandler, on SIGUSR1) and the
            # server's (a JVM thread dump on SIGQUIT, into its log).
            proc.send_signal(signal.SIGUSR1)
            with contextlib.suppress(ProcessLookupError):
                os.kill(server_pid, signal.SIGQUIT)
            time.sleep(3)
            proc.kill()
            proc.wait()
            stdout = _read(out_path)
            started = [line[6:] for line in stdout.splitlines() if line.startswith("START ")]
            pytest.fail(
                f"The client ran past {CLIENT_SECONDS} s, in scenario "
                f"{started[-1] if started else '(none yet)'} (or after it, if its RESULT line "
                "is there)\n" + stdout[-3000:] + _read(err_path)[-12000:] + _tail(log_path, 60000)
            )
    stdout, stderr = _read(out_path), _read(err_path)
    assert proc.returncode == 0, stdout[-3000:] + stderr[-5000:] + _tail(log_path)
    found = {}
    for line in stdout.splitlines():
        if line.startswith("SESSION "):  # opening the session: nothing else reached
            assert json.loads(line[len("SESSION ") :]) == [], line
        if line.startswith("WATCH "):
            # The /proc monitor saw the listener and the connection its self-test opened.
            assert json.loads(line[len("WATCH ") :]) is True, line
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT ") :])
            found[result["scenario"]] = result
    assert set(found) == set(scenarios), stdout[-3000:]
    assert "WATCH true" in stdout
    found["sync"]["stderr"] = stderr
    return found


@pytest.mark.parametrize("scenario", ["sync", "async-stop", "sync-kill", "async-kill", "driver"])
def test_no_thread_of_a_fit_outlives_it(results, scenario) -> None:
    """Every fit, the one that fails at its start included, ended its threads as it
    returned or raised (one still inside TensorFlow or a gRPC call as the client exits
    crashes or hangs it)."""
    assert results[scenario]["threads"] == [], results[scenario]


@pytest.mark.parametrize("scenario", ["sync", "async-stop", "sync-kill", "async-kill"])
def test_the_client_never_listens_and_reaches_only_the_server(results, scenario) -> None:
    result = results[scenario]
    assert result["watch_samples"] >= 10  # the monitor really looked during the fit
    assert result["listening"] == [], result
    assert result["foreign"] == [], result
    assert result["refused"] == [], result  # nothing even tried
    assert "in the cluster" in result["service"]


def test_the_restriction_refuses_what_a_service_in_the_client_needs(results) -> None:
    """The control: with the service in the client, the fit must listen, and cannot."""
    result = results["driver"]
    assert "error" in result and "service_placement='cluster'" in result["error"], result
    assert any(call.startswith("listen") for call in result["refused"]), result


def test_a_synchronous_fit_reaches_accuracy_scores_saves_and_loads(results) -> None:
    result = results["sync"]
    assert result["epochs"] == EPOCHS and result["callback_epochs"] == list(range(EPOCHS))
    assert result["accuracy"] >= 0.95, result
    assert result["service_url"].startswith("https://127.0.0.1:")
    assert "Epoch 20/20" in result["stderr"] and "samples/s" in result["stderr"]
    assert result["transform_error"] <= 1e-5
    assert result["evaluate_accuracy"] == pytest.approx(result["accuracy"], abs=1e-6)
    assert result["loaded_error"] <= 1e-6
    assert result["checkpoints"], "checkpoint_dir stayed empty"


def test_a_callback_stops_an_asynchronous_fit(results) -> None:
    result = results["async-stop"]
    assert result["callback_epochs"][:3] == [0, 1, 2]
    assert 3 <= result["epochs"] < 40, result


@pytest.mark.parametrize("scenario", ["sync-kill", "async-kill"])
def test_a_killed_service_host_costs_at_most_the_epoch_in_progress(results, scenario) -> None:
    result = results[scenario]
    assert result["kills"] == 1  # the host's Python process really died, once
    assert result["epochs"] == EPOCHS and result["accuracy"] >= 0.95, result
    seen = result["samples_seen"]
    if scenario == "sync-kill":
        # The new service resumes from the snapshot after epoch 5: only epoch 6 is redone.
        assert seen == (EPOCHS - 5) * ROWS, seen
    else:
        # An asynchronous epoch closes when the slower worker ends it: the snapshot is
        # at most as new as that worker (which may not have closed one yet when the
        # host died), and nothing trains twice beyond it.
        assert seen % ROWS == 0 and seen <= EPOCHS * ROWS, seen
    assert all(run <= EPOCHS for run in result["epochs_run"])


def _read(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()


def _tail(path: str, chars: int = 4000) -> str:
    try:
        return "\n--- server log ---\n" + _read(path)[-chars:]
    except OSError:
        return ""
