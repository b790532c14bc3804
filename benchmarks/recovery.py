"""What one lost worker costs, and what a straggler costs with and without backup workers.

Digits, 20 epochs, batches of 32, ``frequency=4``, on ``local[3,4]`` (4 attempts per
task). All fits run side by side in one Spark application (one process), a warm-up
fit first. Figures:

* kill: partition 0's Python worker exits (``os._exit``, as an out-of-memory kill) in
  the middle of epoch 6, first attempt only. *Recover* is the time from the exit to the
  new attempt's rejoin and to its first update the service applied; *extra* is the fit
  time over the same fit without a failure.
* straggler: 3 workers, one sleeping 150 ms per batch (about 10x slower), synchronous,
  with ``backup_workers=0`` and ``1``, against the same fit with no slow worker.

Run:
    .venv/bin/python benchmarks/recovery.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCENARIOS = [
    "async-clean",  # warm-up: Python workers start and import TensorFlow
    "sync-clean",
    "sync-kill",
    "async-clean",
    "async-kill",
    "sync-fast",
    "sync-slow",
    "sync-backup",
]


def main() -> None:
    env = dict(
        os.environ,
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONUNBUFFERED="1",
    )
    script = os.path.join(ROOT, "tests", "integration", "failure_fit.py")
    proc = subprocess.run(
        [sys.executable, script, "local[3,4]", *SCENARIOS],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    if proc.returncode != 0:
        sys.exit(proc.stdout[-3000:] + proc.stderr[-5000:])
    runs = [json.loads(ln[7:]) for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    results = {r["scenario"]: r for r in runs[1:]}  # the last of each; skip the warm-up

    print("One worker killed mid-epoch (local[3,4], 2 workers, 20 epochs)")
    print(
        f"{'mode':<13} {'clean fit s':>11} {'killed fit s':>12} {'extra s':>8} "
        f"{'to rejoin s':>11} {'to 1st update s':>15} {'acc':>6} {'samples':>8}"
    )
    for mode in ("sync", "async"):
        clean, kill = results[f"{mode}-clean"], results[f"{mode}-kill"]
        died = kill["kills"][0]
        worker = kill["service_workers"]["0"]
        print(
            f"{kill['mode']:<13} {clean['seconds']:>11.2f} {kill['seconds']:>12.2f} "
            f"{kill['seconds'] - clean['seconds']:>8.2f} {worker['attempt_joined'] - died:>11.2f} "
            f"{worker['attempt_first_push'] - died:>15.2f} {kill['accuracy']:>6.4f} "
            f"{kill['samples_seen']:>8}"
        )
    print()
    print("Straggler: 3 workers, one 10x slower (synchronous, frequency=4)")
    fast = results["sync-fast"]["seconds"]
    print(f"{'run':<28} {'fit s':>7} {'x no straggler':>14} {'acc':>6} {'late pushes':>11}")
    for name, label in (
        ("sync-fast", "no straggler"),
        ("sync-slow", "straggler, backup_workers=0"),
        ("sync-backup", "straggler, backup_workers=1"),
    ):
        r = results[name]
        print(
            f"{label:<28} {r['seconds']:>7.2f} {r['seconds'] / fast:>14.2f} "
            f"{r['accuracy']:>6.4f} {r['late_pushes']:>11}"
        )


if __name__ == "__main__":
    main()
