"""A Spark Connect client that gets SIGINT in the middle of a fit (a notebook's Ctrl-C).

Run by tests/connect/test_connect_interrupt.py in its own process. On
``remote("local[3]")``: a synchronous fit (a barrier job of two tasks) with a driver
callback that prints ``TRAINING`` once an epoch closed; the test then sends SIGINT and
this script prints one ``RESULT {json}`` line: what ``fit`` raised, when it returned and
when the service's port was closed (``time.monotonic()``), and whether a second fit then
trains (the first one's tasks were cancelled through its job tag, so their slots are
free).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import keras
from pyspark.sql import SparkSession

from examples.digits import digits_frames, digits_model
from sparkdl import KerasEstimator


def main() -> None:
    port = int(sys.argv[1])
    spark = (
        SparkSession.builder.remote("local[3]")
        # A free port (the test's own server holds 15002): PySpark's client finds a
        # local server's ephemeral port only under SPARK_TESTING, which the test sets.
        .config("spark.connect.grpc.binding.port", "0")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    train, _ = digits_frames(spark, partitions=2)

    class Announce(keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if epoch == 0:
                print("TRAINING", flush=True)

    estimator = KerasEstimator(
        model=digits_model(),
        mode="synchronous",
        num_workers=2,
        epochs=500,
        port=port,
        callbacks=[Announce()],
        verbose=0,
    )
    result: dict[str, Any] = {}
    try:
        estimator.fit(train)
        result["raised"] = None
    except BaseException as exc:
        result["raised"] = type(exc).__name__
    result["returned_at"] = time.monotonic()
    result["port_closed_at"] = _port_closed_at(port, deadline=time.monotonic() + 10)
    started = time.monotonic()
    second = KerasEstimator(model=digits_model(), num_workers=2, epochs=1, verbose=0).fit(train)
    result["second_fit_epochs"] = len(second.history["loss"])
    result["second_fit_seconds"] = time.monotonic() - started
    print("RESULT " + json.dumps(result), flush=True)
    spark.stop()


def _port_closed_at(port: int, *, deadline: float) -> float | None:
    """When a connection to ``port`` on 127.0.0.1 was first refused (``None``: never)."""
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            probe.settimeout(0.2)
            if probe.connect_ex(("127.0.0.1", port)) != 0:
                return time.monotonic()
        time.sleep(0.05)
    return None


if __name__ == "__main__":
    main()
