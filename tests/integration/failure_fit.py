"""Fits on digits in which a Python worker really dies, on a master that retries tasks.

Run in its own process (a process has one SparkContext) by
tests/integration/test_fault_tolerance.py and benchmarks/recovery.py:

    python tests/integration/failure_fit.py MASTER SCENARIO [SCENARIO ...]

Scenarios: ``sync-kill``, ``async-kill`` (partition 0's Python worker exits in the
middle of epoch 6, on its first attempt only), ``sync-kill-hosted``,
``async-kill-hosted`` (the same with ``service_placement="cluster"``: the process that
dies hosts the service), ``sync-kill-shards``, ``async-kill-shards`` (two shards in the
cluster; partition 1's process, shard 1's host, dies), ``sync-kill-fragments``,
``async-kill-fragments`` (``sync_fragments=2``: a worker dies mid-epoch, between two
fragments' syncs), ``sync-clean``, ``async-clean`` (the same fits without a failure),
``async-always`` (partition 0 exits on every attempt, so retries run out),
``async-kill-topk``, ``sync-kill-sign`` (the kills with compressed updates: the new
attempt starts from the full weights), ``sync-slow``, ``sync-backup`` (3 workers,
partition 2 sleeps 150 ms per batch; without and with ``backup_workers=1``),
``sync-fast`` (3 workers, none slow).
Prints one ``RESULT {json}`` line per scenario.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import keras
import numpy as np

from examples.digits import accuracy, digits_arrays, digits_frames, digits_model
from sparkdl import KerasEstimator
from sparkdl.errors import WorkerError
from tests.integration.conftest import spark_builder

EPOCHS = 20
STEPS_PER_EPOCH = 23  # 718-719 rows per worker, batches of 32
KILL_AT_STEP = 5 * STEPS_PER_EPOCH + 10  # in the middle of epoch 6


def crash_loss(marker: str, partition: int, after_steps: int, every_attempt: bool = False):  # type: ignore[no-untyped-def]
    """Cross-entropy whose Python worker exits after ``after_steps`` batches in ``partition``.

    The exit time is appended to ``marker``; while ``marker`` exists, later attempts
    train normally (unless ``every_attempt``). ``os._exit`` kills the process the way
    an out-of-memory kill or a lost machine does: no exception, no report.
    """
    counter = [0]

    def tick() -> None:
        counter[0] += 1
        if counter[0] >= after_steps and (every_attempt or not os.path.exists(marker)):
            with open(marker, "a") as out:
                out.write(f"{time.time()}\n")
            os._exit(1)

    return _loss_with_hook("crash_loss", partition, tick)


def slow_loss(partition: int, seconds: float):  # type: ignore[no-untyped-def]
    """Cross-entropy that sleeps ``seconds`` per batch in ``partition``."""
    return _loss_with_hook("slow_loss", partition, lambda: time.sleep(seconds))


def _loss_with_hook(name: str, partition: int, hook: Any):  # type: ignore[no-untyped-def]
    """Sparse cross-entropy that calls ``hook()`` every batch of ``partition`` only.

    Named ``name``: pass it as ``custom_objects={name: loss}``. Compile the model with
    ``jit_compile=False`` (the hook is a ``tf.py_function``).
    """

    def loss(y_true, y_pred):  # type: ignore[no-untyped-def]
        import tensorflow as tf
        from pyspark import TaskContext

        base = keras.losses.sparse_categorical_crossentropy(y_true, y_pred)
        ctx = TaskContext.get()
        if ctx is None or ctx.partitionId() != partition:
            return base

        def call() -> np.float32:
            hook()
            return np.float32(0.0)

        zero = tf.py_function(call, [], tf.float32)
        zero.set_shape(())
        return base + zero

    loss.__name__ = loss.__qualname__ = name
    return loss


def run(spark: Any, scenario: str, workdir: str) -> dict[str, Any]:
    """Runs one scenario and returns its figures."""
    mode = "synchronous" if scenario.startswith("sync") else "asynchronous"
    workers = 3 if scenario in ("sync-slow", "sync-backup", "sync-fast") else 2
    train_df, _ = digits_frames(spark, partitions=workers)
    train_df = train_df.cache()
    train_df.count()
    _, x_test, _, y_test = digits_arrays()
    marker = os.path.join(workdir, f"{scenario}.marker")
    model = digits_model()
    settings: dict[str, Any] = {}
    if scenario.endswith("-topk") or scenario.endswith("-sign"):
        scenario_kind, settings["compression"] = scenario.rsplit("-", 1)
    elif scenario.endswith("-hosted"):
        scenario_kind, settings["service_placement"] = scenario[: -len("-hosted")], "cluster"
    elif scenario.endswith("-shards"):
        scenario_kind = scenario[: -len("-shards")]
        settings.update(service_placement="cluster", service_shards=2)
    elif scenario.endswith("-fragments"):
        scenario_kind = scenario[: -len("-fragments")]
        # Pushes in line with training: an overlapped push (asynchronous's default)
        # may still be in flight when the process dies, and the resume point the test
        # checks would then depend on the machine's load.
        settings.update(sync_fragments=2, overlap=False)
    else:
        scenario_kind = scenario
    if scenario_kind.endswith("-kill") or scenario == "async-always":
        loss = crash_loss(
            marker,
            1 if scenario.endswith("-shards") else 0,
            KILL_AT_STEP if scenario_kind.endswith("kill") else 3,
            every_attempt=scenario == "async-always",
        )
    elif scenario in ("sync-slow", "sync-backup"):
        loss = slow_loss(2, 0.15)
        settings["backup_workers"] = 1 if scenario == "sync-backup" else 0
    else:
        loss = keras.losses.sparse_categorical_crossentropy
    model.compile(
        optimizer=keras.optimizers.Adam(0.003), loss=loss, metrics=["accuracy"], jit_compile=False
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    result: dict[str, Any] = {"scenario": scenario, "mode": mode, "port": port}
    started = time.time()
    try:
        fitted = KerasEstimator(
            model=model,
            mode=mode,
            frequency=4,
            num_workers=workers,
            epochs=EPOCHS,
            batch_size=32,
            seed=0,
            port=port,
            custom_objects={loss.__name__: loss}
            if loss.__name__ != "sparse_categorical_crossentropy"
            else None,
            **settings,
        ).fit(train_df)
    except WorkerError as exc:
        result.update(error=str(exc), failures={str(k): v[-2000:] for k, v in exc.failures.items()})
        result["seconds"] = time.time() - started
    else:
        result["seconds"] = time.time() - started
        report = fitted.fit_report
        service = report["service"]
        result.update(
            accuracy=accuracy(fitted.get_model(), x_test, y_test),
            epochs=len(fitted.history["loss"]),
            rows=sum(w["rows"] for w in report["workers"]),
            samples_seen=service["samples_seen"],
            restarts=service["restarts"],
            generation=service["generation"],
            late_pushes=service["late_pushes"],
            service_workers=service["workers"],
            full_answers=service.get("full_answers"),
            shards=service.get("shards"),
            initial_epochs=service.get("initial_epochs"),
            workers=[
                {k: w.get(k) for k in ("worker", "attempt", "resumed_at", "epochs_run", "syncs")}
                for w in report["workers"]
            ],
        )
    if os.path.exists(marker):
        with open(marker) as f:
            result["kills"] = [float(line) for line in f.read().split()]
    train_df.unpersist()
    return result


def main() -> None:
    master, scenarios = sys.argv[1], sys.argv[2:]
    spark = spark_builder(master).getOrCreate()
    spark.sparkContext.setLogLevel("OFF")
    with tempfile.TemporaryDirectory() as workdir:
        for scenario in scenarios:
            print("RESULT " + json.dumps(run(spark, scenario, workdir)), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
