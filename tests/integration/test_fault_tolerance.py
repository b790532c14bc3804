"""Real failures: a Python worker process exits mid-epoch, or one is slow on purpose.

The fits run in one subprocess on ``local[3,4]`` (4 attempts per task, as
``spark.task.maxFailures`` on a cluster), since a process has one SparkContext and the
session's ``local[2]`` never retries a task.
See tests/integration/failure_fit.py for the scenarios.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from typing import Any

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROWS = 1437
EPOCHS = 20


def _run(master: str, scenarios: list[str]) -> dict[str, dict[str, Any]]:
    script = os.path.join(os.path.dirname(__file__), "failure_fit.py")
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [sys.executable, script, master, *scenarios],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    found = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT ") :])
            found[result["scenario"]] = result
    assert set(found) == set(scenarios), proc.stdout[-3000:]
    return found


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, Any]]:
    # One driver process for every scenario (one JVM, one pool of Python workers):
    # local[3,4] has 3 task slots, for the straggler fit's 3 workers (the others use 2),
    # and 4 attempts per task, as spark.task.maxFailures on a cluster.
    return _run(
        "local[3,4]",
        [
            "sync-kill",
            "async-kill",
            "async-always",
            "async-kill-topk",
            "sync-kill-sign",
            "sync-backup",
            "sync-kill-hosted",
            "async-kill-hosted",
            "sync-kill-shards",
            "async-kill-shards",
            "sync-kill-fragments",
            "async-kill-fragments",
        ],
    )


@pytest.mark.parametrize("scenario", ["sync-kill", "async-kill"])
def test_a_killed_worker_rejoins_and_the_fit_completes(results, scenario) -> None:
    result = results[scenario]
    assert "error" not in result, result.get("error")
    assert len(result["kills"]) == 1  # the process really died, once
    assert result["epochs"] == EPOCHS and result["accuracy"] >= 0.95
    worker = result["workers"][0]
    # The new attempt resumed in epoch 6, where the old one died, not at epoch 0.
    assert worker["resumed_at"] is not None and worker["resumed_at"][0] == 5, worker
    assert result["service_workers"]["0"]["attempts"] == 2
    assert result["restarts"] >= 1
    seen = result["samples_seen"]
    if scenario == "async-kill":
        # Pushes carry the samples since the last one: the batches the dead process
        # trained but never pushed were redone once, and nothing was counted twice.
        assert seen == EPOCHS * ROWS
        assert result["service_workers"]["1"]["attempts"] == 1  # never waited or restarted
    else:
        # The whole barrier stage is retried and rejoins at the last completed round:
        # only the dropped open round (at most 4 batches a worker) is counted again,
        # far less than one epoch, where a restart from scratch would add 5 epochs.
        assert result["generation"] == 1 and result["restarts"] == 2
        assert EPOCHS * ROWS <= seen <= EPOCHS * ROWS + 2 * 4 * 32


@pytest.mark.parametrize(
    "scenario", ["sync-kill-hosted", "async-kill-hosted", "sync-kill-shards", "async-kill-shards"]
)
def test_a_killed_service_host_resumes_from_its_last_snapshot(results, scenario) -> None:
    """service_placement="cluster": the process that dies mid-epoch 6 hosts the service
    (with two shards, shard 1). The retried barrier stage finds the snapshot of the last
    closed epoch on the executor's disk (of every shard), new hosts serve it, and the fit
    completes at accuracy."""
    result = results[scenario]
    assert "error" not in result, result.get("error")
    assert len(result["kills"]) == 1  # the host's process really died, once
    assert result["epochs"] == EPOCHS and result["accuracy"] >= 0.95
    # The new service counts only what it served: epochs after its snapshot.
    seen = result["samples_seen"]
    assert seen < EPOCHS * ROWS or scenario.startswith("async"), seen
    if scenario.startswith("sync"):
        # Synchronous epochs close together: the snapshot after epoch 5 is the last
        # closed one, so only the epoch in progress is redone.
        assert seen == (EPOCHS - 5) * ROWS, seen
    else:
        # An asynchronous epoch closes when the slowest worker ends it: the snapshot
        # is at most as new as that worker (which may not have closed one yet when
        # the host died), and nothing trains twice beyond it.
        assert seen % ROWS == 0 and seen <= EPOCHS * ROWS, seen
    assert all(w["epochs_run"] <= EPOCHS for w in result["workers"])
    # The new service resumed from its snapshot's epoch and served exactly the rest.
    resumed = result["initial_epochs"]
    assert seen == (EPOCHS - resumed) * ROWS, (seen, resumed)
    if scenario.startswith("sync"):
        assert resumed == 5
    if scenario.endswith("-shards"):
        # Every shard resumed from the same epoch: each served the same samples.
        assert [s["shard"] for s in result["shards"]] == [0, 1]
        assert {s["initial_epochs"] for s in result["shards"]} == {resumed}
        assert {s["samples_seen"] for s in result["shards"]} == {seen}


@pytest.mark.parametrize("scenario", ["sync-kill-fragments", "async-kill-fragments"])
def test_a_killed_worker_of_a_fragmented_fit_resumes_where_its_fragments_stood(
    results, scenario
) -> None:
    """sync_fragments=2: each fragment counted only its own rounds; the new attempt
    resumes after the last sync any fragment completed (synchronous: the rounds of
    both, mapped back onto the epoch's syncs) and the fit completes."""
    result = results[scenario]
    assert "error" not in result, result.get("error")
    assert len(result["kills"]) == 1
    assert result["epochs"] == EPOCHS and result["accuracy"] >= 0.93
    worker = result["workers"][0]
    # Killed 10 batches into epoch 6 with a sync every 4: back at its 8th batch.
    assert worker["resumed_at"] == [5, 8], worker
    if scenario.startswith("sync"):
        # Shard 0 (fragment 0) takes every closing push: every sample, plus at most
        # the dropped open round's.
        assert EPOCHS * ROWS <= result["samples_seen"] <= EPOCHS * ROWS + 2 * 4 * 32 * 2


@pytest.mark.parametrize("scenario", ["async-kill-topk", "sync-kill-sign"])
def test_a_killed_worker_with_compression_starts_again_from_the_full_weights(
    results, scenario
) -> None:
    result = results[scenario]
    assert "error" not in result, result.get("error")
    assert len(result["kills"]) == 1 and result["epochs"] == EPOCHS
    assert result["accuracy"] >= 0.93, result["accuracy"]
    assert result["service_workers"]["0"]["attempts"] == 2
    full = result["full_answers"]
    assert full["0"] == 2, full  # the retried task pulled the full weights again
    if scenario.startswith("async"):
        assert full["1"] == 1  # the other task kept its copy throughout
    else:  # a barrier stage retries every task: each began from the full weights
        assert full["1"] == 2


def test_retries_running_out_raise_worker_error_and_stop_the_service(results) -> None:
    result = results["async-always"]
    assert len(result["kills"]) == 4  # local[3,4]: four attempts, each killed
    assert "Worker 0 failed 4 times" in result["error"]
    assert "Python worker exited unexpectedly" in result["error"]
    assert "spark.task.maxFailures" in result["error"]
    assert "0" in result["failures"]
    with pytest.raises(ConnectionRefusedError):  # the service was shut down
        socket.create_connection(("127.0.0.1", result["port"]), timeout=2)


def test_backup_workers_do_not_wait_for_a_straggler(results) -> None:
    result = results["sync-backup"]
    assert "error" not in result, result.get("error")
    assert result["epochs"] == EPOCHS and result["accuracy"] >= 0.95
    workers = result["service_workers"]
    slow = workers["2"]  # sleeps 150 ms per batch: about 10x slower than the others
    # 479 rows a worker: 4 rounds an epoch
    assert workers["0"]["pushes"] == workers["1"]["pushes"] == EPOCHS * 4
    # Rounds closed on the two fast workers: the straggler's pushes came late and
    # were dropped, and the fit ended (stopping it) when the others had done every
    # epoch. Had rounds waited for it, it would have run all 20 epochs.
    assert slow["late"] >= 1 and slow["pushes"] < workers["0"]["pushes"]
    assert result["workers"][2]["epochs_run"] < EPOCHS
    assert result["late_pushes"] == slow["late"]
