"""Ctrl-C during a fit on a Spark Connect session: ``KeyboardInterrupt`` for the caller,
the fit's jobs interrupted through their job tag, the service stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from benchmarks.idle_connections import free_port

pytestmark = [pytest.mark.spark, pytest.mark.slow]  # a driver process of its own


def test_sigint_mid_fit_raises_keyboard_interrupt_and_frees_the_slots() -> None:
    script = os.path.join(os.path.dirname(__file__), "interrupt_fit.py")
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONUNBUFFERED="1", SPARK_TESTING="1")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, script, str(port)],
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
    assert result["returned_at"] - interrupted_at <= 6.0, result
    assert result["port_closed_at"] is not None, result
    # The interrupted barrier job no longer holds two of the three slots.
    assert result["second_fit_epochs"] == 1, result
