"""Ctrl-C (SIGINT) to a driver process in the middle of a fit (``interrupt_fit.py``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.idle_connections import free_port

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_sigint_mid_fit_raises_keyboard_interrupt_and_releases_everything(
    tmp_path: Path,
) -> None:
    script = os.path.join(os.path.dirname(__file__), "interrupt_fit.py")
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONUNBUFFERED="1")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, script, str(port), str(tmp_path / "release"), str(tmp_path / "ckpt")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 300
        for line in proc.stdout:
            if line.startswith("TRAINING") or time.monotonic() > deadline:
                break
        time.sleep(1.0)  # a few epochs into the job
        interrupted_at = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:] + err[-5000:]
    line = next(line for line in out.splitlines() if line.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    assert result["raised"] == "KeyboardInterrupt", result
    assert result["released_at"] - interrupted_at <= 5.0, result
    assert result["fit_jobs_active"] == [] and result["fit_jobs_after_3s"] == [], result
    assert result["port_closed"] and result["threads_left"] == [], result
    assert result["caller_group"] == "the-callers-group", result
    assert result["sigint_handler"].startswith("pyspark."), result  # PySpark's, restored
    assert result["idle_cpu_seconds"] < 0.5, result  # no thread left spinning
    assert result["other_job_running"], result  # not cancelled with the fit
    assert result["other_job"] == {"result": "finished"}, result
    assert result["second_fit_epochs"] == 2, result
    print(
        f"interrupt to fit returned {result['returned_at'] - interrupted_at:.2f} s, "
        f"to everything released {result['released_at'] - interrupted_at:.2f} s"
    )
