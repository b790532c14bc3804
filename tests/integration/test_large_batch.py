"""The large-batch recipe on teacher data: 4 synchronous workers x batch 128 (a global
batch of 512) fall far behind one process at batch 128 after the same epochs with the
model's learning rate (``lr_scaling=None``), and reach it within a point with the default
(``lr_scaling="auto"``: linear for SGD)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_four_workers_reach_one_process_with_the_recipe() -> None:
    script = os.path.join(os.path.dirname(__file__), "large_batch_fit.py")
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [sys.executable, script], capture_output=True, text=True, timeout=900, env=env
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    match = re.search(r"RESULT (.*)", proc.stdout)
    assert match, proc.stdout[-3000:]
    result = json.loads(match.group(1))
    # Without the recipe each epoch takes 1/4 of the steps: far behind.
    assert result["none"] < result["plain"] - 0.05, result
    # By default the workers train at 4 times the model's rate and catch up.
    assert result["linear"] >= result["plain"] - 0.01, result
    assert result["none_rates"] == [0.01] and result["linear_rates"] == [0.04], result
