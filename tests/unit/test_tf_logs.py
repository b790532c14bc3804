"""TensorFlow's C++ log lines (:mod:`sparkdl.contract.tf_logs`): decided on the driver, filtered
while TensorFlow loads, everything else written back."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from sparkdl.contract import tf_logs
from sparkdl.contract.tf_logs import (
    LEVEL_VARIABLE,
    TensorFlowLogs,
    filtered_stderr,
    is_tensorflow_line,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: Lines TensorFlow 2.21's import and first operation print on a machine without a GPU.
LOAD_LINES = (b"absl::InitializeLog()", b"port.cc", b"cudart_stub.cc", b"cuInit")


@pytest.mark.parametrize(
    ("environ", "local", "gpus", "expected"),
    [
        ({}, True, False, TensorFlowLogs("3", filtered=True)),
        ({}, True, True, TensorFlowLogs("2", filtered=True)),  # CUDA's errors stay visible
        ({}, False, False, TensorFlowLogs()),  # executors' own logs keep every line
        ({LEVEL_VARIABLE: "0"}, True, False, TensorFlowLogs("0")),  # the user wants them all
        ({LEVEL_VARIABLE: "1"}, True, False, TensorFlowLogs("1", filtered=True)),
        ({LEVEL_VARIABLE: "2"}, False, False, TensorFlowLogs("2")),
    ],
)
def test_the_driver_resolves_how_workers_load_tensorflow(environ, local, gpus, expected) -> None:
    assert TensorFlowLogs.resolve(local=local, gpus=gpus, environ=environ) == expected


def test_a_level_hides_its_severities_and_nothing_else() -> None:
    info = b"I0000 00:00:1795571540.870139    2173 port.cc:153] oneDNN custom operations"
    error = b"E0000 00:00:1795571548.693702    2192 cuda_platform.cc:52] failed call to cuInit"
    notice = b"WARNING: All log messages before absl::InitializeLog() is called are written to"
    fatal = b"F0000 00:00:1795571548.693702    2192 status.cc:1] Check failed"
    assert [is_tensorflow_line(x, 1) for x in (info, error, notice)] == [True, False, False]
    assert [is_tensorflow_line(x, 3) for x in (info, error, notice)] == [True, True, True]
    assert not is_tensorflow_line(fatal, 3) and not is_tensorflow_line(info, 0)
    assert not is_tensorflow_line(b"WARNING:tensorflow:From keras: a Python warning", 3)


def test_the_filter_writes_back_what_is_not_tensorflows(capfd: pytest.CaptureFixture) -> None:
    with filtered_stderr(3), filtered_stderr(3):  # nested blocks share one capture
        os.write(2, b"I0000 00:00:17.5    21 port.cc:153] oneDNN custom operations are on\n")
        os.write(2, b"a user's line\n")
        print("stdout untouched", flush=True)
    captured = capfd.readouterr()
    assert captured.err == "a user's line\n"
    assert captured.out == "stdout untouched\n"


def test_an_executors_own_level_wins_on_a_cluster_and_the_drivers_on_a_local_master(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(LEVEL_VARIABLE, "1")  # spark.executorEnv.TF_CPP_MIN_LOG_LEVEL
    TensorFlowLogs("2").load(lambda: None)  # a cluster: the user's driver level
    assert os.environ[LEVEL_VARIABLE] == "1"
    TensorFlowLogs("3", filtered=True).load(lambda: None)  # a local master
    assert os.environ[LEVEL_VARIABLE] == "3"


@pytest.mark.parametrize(
    ("logs", "user_level", "expected"),
    [
        (TensorFlowLogs("3", filtered=True), logging.NOTSET, logging.ERROR),  # local master
        (TensorFlowLogs("2", filtered=True), logging.NOTSET, logging.ERROR),
        (TensorFlowLogs("1", filtered=True), logging.NOTSET, logging.NOTSET),  # warnings wanted
        (TensorFlowLogs(), logging.NOTSET, logging.NOTSET),  # a cluster: its own log
        (TensorFlowLogs("3", filtered=True), logging.INFO, logging.INFO),  # the user's
    ],
)
def test_tensorflows_python_warnings_follow_the_level_on_a_local_master(
    logs: TensorFlowLogs, user_level: int, expected: int
) -> None:
    logger = logging.getLogger("tensorflow")
    saved = logger.level
    try:
        logger.setLevel(user_level)
        logs.quiet_python_warnings()
        assert logger.level == expected
    finally:
        logger.setLevel(saved)


def test_the_level_quiet_tensorflow_sets_is_not_taken_for_the_users(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(LEVEL_VARIABLE, raising=False)
    monkeypatch.setattr(tf_logs, "_set_here", None)
    with tf_logs.quiet_tensorflow():
        pass
    assert os.environ[LEVEL_VARIABLE] == "3"
    # Executors on a cluster keep their own logs, GPU workers see CUDA's errors.
    assert TensorFlowLogs.resolve(local=False, gpus=True) == TensorFlowLogs()
    assert TensorFlowLogs.resolve(local=True, gpus=True) == TensorFlowLogs("2", filtered=True)
    monkeypatch.setenv(LEVEL_VARIABLE, "1")  # the user's own, set afterwards
    assert TensorFlowLogs.resolve(local=False, gpus=True) == TensorFlowLogs("1")


def test_a_process_that_dies_in_the_block_still_shows_what_it_printed() -> None:
    code = (
        "import os, time\n"
        "from sparkdl.contract.tf_logs import filtered_stderr\n"
        "with filtered_stderr(3):\n"
        "    os.write(2, b'I0000 00:00:17.5    21 port.cc:153] oneDNN custom operations\\n')\n"
        "    os.write(2, b'F0000 00:00:17.5    21 status.cc:1] Check failed: the reason\\n')\n"
        "    time.sleep(0.5)\n"
        "    os._exit(3)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, timeout=60)
    assert done.returncode == 3
    assert b"Check failed: the reason" in done.stderr and b"oneDNN" not in done.stderr


def test_no_stderr_means_no_filter_and_no_error() -> None:
    code = (
        "import os, sys\n"
        "sys.stderr = None\n"
        "os.close(2)\n"
        "from sparkdl.contract.tf_logs import filtered_stderr\n"
        "with filtered_stderr(3):\n"
        "    pass\n"
        "print('ran')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == b"ran", done


@pytest.mark.slow  # two fresh processes importing TensorFlow
@pytest.mark.parametrize("filtered", [True, False])
def test_tensorflow_loads_quietly_in_a_fresh_process(filtered: bool) -> None:
    """The real thing: TensorFlow's import and first operation, with and without the
    filter (without it the lines appear, so this test can fail)."""
    code = (
        "from sparkdl.contract.tf_logs import TensorFlowLogs\n"
        f"keras = TensorFlowLogs('3', filtered={filtered}).load(lambda: __import__('keras'))\n"
        "import sys; print('user stderr line', file=sys.stderr)\n"
        "print(float(keras.ops.sum(keras.ops.ones(3))))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != LEVEL_VARIABLE}
    env["KERAS_BACKEND"] = "tensorflow"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, timeout=300
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.strip().endswith(b"3.0")
    assert b"user stderr line" in done.stderr
    loud = [line for line in LOAD_LINES if line in done.stderr]
    assert (loud == []) if filtered else (len(loud) >= 2), done.stderr.decode()


def test_a_fresh_worker_loads_a_model_to_score_quietly(tmp_path) -> None:
    """transform's and evaluate's first model load in a fresh Python worker of a local
    master (:func:`sparkdl.executor.scoring.load_model`) imports Keras with the filter on."""
    import keras

    from sparkdl.contract.keras_io import model_to_bytes

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    path = tmp_path / "model.keras"
    path.write_bytes(model_to_bytes(model))
    code = (
        "import numpy as np\n"
        "from sparkdl.executor.scoring import load_model\n"
        "from sparkdl.contract.payload import ScoringPayload\n"
        "from sparkdl.contract.tf_logs import TensorFlowLogs\n"
        "class Broadcast:\n"
        f"    value = open({str(path)!r}, 'rb').read()\n"
        "logs = TensorFlowLogs('3', filtered=True)\n"
        "net = load_model(ScoringPayload(Broadcast(), 'd', None, [(3,)], [], [''], 8, "
        "tf_logs=logs))\n"
        "print(net.predict(np.zeros((1, 3), np.float32), verbose=0).shape)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != LEVEL_VARIABLE}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, timeout=300
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.strip().endswith(b"(1, 2)")
    assert [line for line in LOAD_LINES if line in done.stderr] == [], done.stderr.decode()
