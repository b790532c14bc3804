"""A driver that gets SIGINT in the middle of a fit, as a notebook user's Ctrl-C.

Run by tests/integration/test_interrupt.py in its own process (the signal goes to this
whole process). On ``local[3]``: a synchronous fit (a barrier job over two task slots)
with a driver callback and ``checkpoint_dir``, while another job of another job group
holds the third slot, and while the caller's own job group is set. The callback
prints ``TRAINING`` once an epoch closed; the test then sends SIGINT and this script
checks what must hold and prints one ``RESULT {json}`` line:

- what ``fit`` raised;
- when (``time.monotonic()``, comparable with the test's clock) ``fit`` returned, and
  when the fit's jobs had ended, its port was closed and its threads were gone;
- whether a job of the fit came back within 3 s after that (a retried stage);
- the caller's job group afterwards, whether the other job finished uncancelled, the
  CPU this process used over 2 s once idle, and whether a second fit then trains.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import keras

from examples.digits import digits_frames, digits_model
from sparkdl import KerasEstimator
from tests.integration.conftest import spark_builder

OTHER_GROUP = "another-users-job"
CALLER_GROUP = "the-callers-group"


def main() -> None:
    port, release_file, checkpoint_dir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    spark = spark_builder("local[3]").getOrCreate()
    spark.sparkContext.setLogLevel("OFF")
    sc = spark.sparkContext
    train, _ = digits_frames(spark, partitions=2)
    train = train.cache()
    train.count()

    other: dict[str, Any] = {}

    def other_job() -> None:  # holds one slot until the test is over
        sc.setJobGroup(OTHER_GROUP, "not sparkdl's")
        try:
            other["result"] = sc.parallelize([release_file], 1).map(_wait_for_file).collect()[0]
        except Exception as exc:
            other["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"

    other_thread = threading.Thread(target=other_job, daemon=True)
    other_thread.start()
    sc.setJobGroup(CALLER_GROUP, "the caller's own group")

    class Announce(keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if epoch == 0:
                print("TRAINING", flush=True)

    estimator = KerasEstimator(
        model=digits_model(),
        mode="synchronous",
        num_workers=2,
        epochs=500,
        batch_size=32,
        port=port,
        callbacks=[Announce()],
        checkpoint_dir=checkpoint_dir,
        verbose=0,
    )
    result: dict[str, Any] = {}
    try:
        estimator.fit(train)
        result["raised"] = None
    except BaseException as exc:  # what fit raised is the finding
        result["raised"] = type(exc).__name__
        result["message"] = str(exc)[:500]
    result["returned_at"] = time.monotonic()
    other_ids = set(sc.statusTracker().getJobIdsForGroup(OTHER_GROUP))

    def fit_jobs() -> list[int]:
        return [j for j in sc.statusTracker().getActiveJobsIds() if j not in other_ids]

    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if not fit_jobs() and _port_closed(port) and not _our_threads():
            break
        time.sleep(0.05)
    result["released_at"] = time.monotonic()
    result["fit_jobs_active"] = fit_jobs()
    result["port_closed"] = _port_closed(port)
    result["threads_left"] = _our_threads()
    time.sleep(3)
    result["fit_jobs_after_3s"] = fit_jobs()
    result["caller_group"] = sc.getLocalProperty("spark.jobGroup.id")
    handler = signal.getsignal(signal.SIGINT)
    result["sigint_handler"] = f"{getattr(handler, '__module__', '')}.{handler!r}"
    usage = resource.getrusage(resource.RUSAGE_SELF)
    before = usage.ru_utime + usage.ru_stime
    time.sleep(2)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result["idle_cpu_seconds"] = round(usage.ru_utime + usage.ru_stime - before, 3)
    result["other_job_running"] = other_thread.is_alive()
    with open(release_file, "w") as marker:
        marker.write("done")
    other_thread.join(timeout=60)
    result["other_job"] = other
    again = KerasEstimator(
        model=digits_model(), mode="synchronous", num_workers=2, epochs=2, verbose=0
    ).fit(train)
    result["second_fit_epochs"] = len(again.history["loss"])
    print("RESULT " + json.dumps(result), flush=True)
    spark.stop()


def _wait_for_file(path: str) -> str:
    deadline = time.time() + 240
    while not os.path.exists(path) and time.time() < deadline:
        time.sleep(0.1)
    return "finished" if os.path.exists(path) else "timed out"


def _port_closed(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return True
    return False


def _our_threads() -> list[str]:
    return sorted(
        t.name
        for t in threading.enumerate()
        if t.is_alive() and (t.name.startswith("sparkdl") or "CP Server" in t.name)
    )


if __name__ == "__main__":
    main()
