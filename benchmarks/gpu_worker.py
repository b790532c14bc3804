"""sparkdl's worker loop on a GPU against plain Keras on the same GPU, without Spark.

A GPU machine may have no JVM for Spark (the device machines this project is lent have
none, and nothing can be installed there). This benchmark runs what a Spark task runs
once its partition is cached: the driver's half (the plan from
:meth:`~sparkdl.contract.plan.FitPlan.resolve`, the
:class:`~sparkdl.server.state.store.WeightStore` and the real
:class:`~sparkdl.server.web.service.ParameterService` on 127.0.0.1) in this process, and
``W`` worker processes that each cache their share of the rows in a
:class:`~sparkdl.executor.cache.PartitionCache`, open the channel, join and call
:func:`sparkdl.executor.training.train`: the executor's whole training loop (model
rebuilt from its ``.keras`` bytes, the learning-rate recipe, the feed, ``model.fit`` with
:class:`~sparkdl.executor.callback.SyncCallback`). What is left out is Spark's part:
scheduling the barrier stage and streaming the partition's record batches to the task.
The W workers share the one GPU (the JAX backend does not preallocate its memory).

Workloads (``--workloads``):

* ``digits``: scikit-learn's digits, 80/20 split, the demo's MLP 64-64-10 with Adam
  0.003, batch 32, ``--digits-epochs``: test accuracy, plain Keras against sparkdl;
* ``teacher``: ``--rows`` rows of ``benchmarks/scale.py``'s teacher (100 features, 10
  classes), MLP 100-512-512-10, Adam 1e-3, batch ``--batch-size``, ``--epochs``: samples/s,
  and test accuracy on 10k held-out rows.

For each: a row for plain Keras (``model.fit`` on the numpy arrays in this process; its
samples/s from the wall time of ``model.fit``) and one per (workers, frequency) for
sparkdl in synchronous mode (samples/s: rows x epochs over the slowest worker's
``train_seconds``, as ``benchmarks/scale.py`` counts). Both include the first epoch's
compilation. ``x Keras`` is the ratio of samples/s measured in this run.

Run:
    KERAS_BACKEND=jax python benchmarks/gpu_worker.py
    KERAS_BACKEND=jax python benchmarks/gpu_worker.py --workloads digits --workers 1
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


@dataclass(frozen=True)
class Workload:
    """A model and its data, built the same way in every process."""

    name: str
    epochs: int
    batch_size: int
    rows: int  # teacher rows (digits: ignored)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(x_train, y_train, x_test, y_test)``."""
        if self.name == "digits":
            from examples.digits import digits_arrays

            x_train, x_test, y_train, y_test = digits_arrays(0)
            return x_train, y_train.astype(np.int32), x_test, y_test.astype(np.int32)
        from benchmarks.scale import teacher_rows, teacher_weights

        teacher = teacher_weights(0)
        x, y = teacher_rows(teacher, np.random.default_rng(1), self.rows)
        x_test, y_test = teacher_rows(teacher, np.random.default_rng(2), 10_000)
        return x, y, x_test, y_test

    def model(self) -> Any:
        if self.name == "digits":
            from examples.digits import digits_model

            return digits_model(0)
        from benchmarks.scale import build_model

        return build_model([512, 512], 0)


def test_accuracy(model: Any, x: np.ndarray, y: np.ndarray) -> float:
    predicted = model.predict(x, batch_size=4096, verbose=0).argmax(axis=1)
    return float((predicted == y).mean())


def device_name() -> str:
    import jax

    device = jax.devices()[0]
    return f"{device.platform}: {getattr(device, 'device_kind', device)}"


def plain_keras(workload: Workload) -> dict[str, Any]:
    """``model.fit`` on the numpy arrays, in this process."""
    x, y, x_test, y_test = workload.arrays()
    model = workload.model()
    started = time.perf_counter()
    model.fit(x, y, epochs=workload.epochs, batch_size=workload.batch_size, verbose=0)
    seconds = time.perf_counter() - started
    return {
        "seconds": seconds,
        "samples_s": len(x) * workload.epochs / seconds,
        "accuracy": test_accuracy(model, x_test, y_test),
    }


def _worker(payload: Any, worker: int, workers: int, workload: Workload, out: Any) -> None:
    """One worker process: caches its rows (``worker::workers``), trains, reports."""
    import pyarrow as pa

    from sparkdl.executor.backends import backend_for
    from sparkdl.executor.cache import PartitionCache
    from sparkdl.executor.channel import open_channel
    from sparkdl.executor.training import train

    backend_for(payload.plan.backend).prepare()
    x, y, x_test, y_test = workload.arrays()
    x, y = x[worker::workers], y[worker::workers]
    data = PartitionCache(payload.cached_columns())
    width = x.shape[1]
    flat = pa.array(x.ravel())
    offsets = pa.array(np.arange(len(x) + 1, dtype=np.int32) * width)
    inputs, outputs = [c.name for c in payload.columns()[0]], [c.name for c in payload.columns()[1]]
    data.append(
        pa.RecordBatch.from_arrays(
            [pa.ListArray.from_arrays(offsets, flat), pa.array(y)], names=[*inputs, *outputs]
        )
    )
    channel = open_channel(payload, worker, attempt=worker)
    try:
        report = train(payload, channel, worker, data, None, channel.join(data.rows))
        accuracy = None
        if worker == 0:  # synchronous: after the closing round its model is the center
            from sparkdl.contract.keras_io import model_from_bytes

            model = model_from_bytes(payload.model_bytes.value)
            model.set_weights(channel.pull(0)[0])
            accuracy = test_accuracy(model, x_test, y_test)
        out.send(
            {
                "train_seconds": report.train_seconds,
                "accuracy": accuracy,
                "gpus": report.gpus,
                "wait": report.wait_seconds,
            }
        )
    finally:
        channel.close()
        out.close()


@dataclass(frozen=True)
class _Bytes:
    """What a Spark broadcast gives a task: ``.value``."""

    value: bytes


def sparkdl_fit(workload: Workload, workers: int, frequency: Any) -> dict[str, Any]:
    """The driver's half here, ``workers`` worker processes (spawned) on the GPU."""
    from sparkdl.config import TrainConfig
    from sparkdl.contract import keras_io
    from sparkdl.contract.payload import WorkerPayload
    from sparkdl.contract.plan import FitPlan
    from sparkdl.server.state.store import WeightStore
    from sparkdl.server.web.service import ParameterService

    model = workload.model()
    x = workload.arrays()[0]
    config = TrainConfig(
        epochs=workload.epochs,
        batch_size=workload.batch_size,
        mode="synchronous",
        frequency=frequency,
        seed=0,
    )
    plan = FitPlan.resolve(
        config,
        num_workers=workers,
        rows=len(x),
        threads=max(1, (os.cpu_count() or 2) // workers),
        service_host="127.0.0.1",
        optimizer=keras_io.optimizer_kind(model),
    )
    store = WeightStore.for_plan(
        plan, model.get_weights(), history=None, gate_epochs=False, metric_merge=None
    )
    context = multiprocessing.get_context("spawn")
    started = time.perf_counter()
    with ParameterService(store, host="127.0.0.1") as service:
        payload = WorkerPayload(
            plan=plan,
            url=service.url,
            token=service.token,
            model_bytes=_Bytes(keras_io.model_to_bytes(model)),
            custom_objects=None,
            input_shapes=[(x.shape[1],)],
            label_kinds=["int"],
            input_structure=keras_io.input_structure(model),
        )
        pipes, processes = [], []
        for worker in range(workers):
            ours, theirs = context.Pipe(duplex=False)
            process = context.Process(
                target=_worker, args=(payload, worker, workers, workload, theirs)
            )
            process.start()
            pipes.append(ours)
            processes.append(process)
        results = [pipe.recv() for pipe in pipes]
        for process in processes:
            process.join(timeout=60)
    wall = time.perf_counter() - started
    slowest = max(r["train_seconds"] for r in results)
    return {
        "seconds": slowest,
        "wall": wall,
        "samples_s": len(x) * workload.epochs / slowest,
        "accuracy": results[0]["accuracy"],
        "gpus": results[0]["gpus"],
        "wait": max(r["wait"] for r in results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["digits", "teacher"])
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 4])
    parser.add_argument("--frequencies", nargs="+", default=["epoch", "8", "1"])
    parser.add_argument("--rows", type=int, default=200_000, help="teacher rows")
    parser.add_argument("--epochs", type=int, default=5, help="teacher epochs")
    parser.add_argument("--batch-size", type=int, default=256, help="teacher batch")
    parser.add_argument("--digits-epochs", type=int, default=20)
    args = parser.parse_args()

    import keras

    print(
        f"Keras {keras.__version__} on {keras.backend.backend()}, device {device_name()}, "
        f"{os.cpu_count()} CPUs",
        flush=True,
    )
    for name in args.workloads:
        digits = name == "digits"
        workload = Workload(
            name,
            args.digits_epochs if digits else args.epochs,
            32 if digits else args.batch_size,
            args.rows,
        )
        print(f"\n## {name}: {workload.epochs} epochs, batch {workload.batch_size}", flush=True)
        print(
            f"{'run':<34} {'train s':>8} {'samples/s':>10} {'x Keras':>8} "
            f"{'test acc':>8} {'wait s':>7}",
            flush=True,
        )
        base = plain_keras(workload)
        print(
            f"{'plain Keras (1 process)':<34} {base['seconds']:8.1f} {base['samples_s']:10,.0f} "
            f"{1.0:8.2f} {base['accuracy']:8.4f} {'':>7}",
            flush=True,
        )
        for workers in args.workers:
            for frequency in args.frequencies:
                value: Any = frequency if frequency == "epoch" else int(frequency)
                got = sparkdl_fit(workload, workers, value)
                label = f"sparkdl {workers} worker(s), sync {frequency}"
                print(
                    f"{label:<34} {got['seconds']:8.1f} {got['samples_s']:10,.0f} "
                    f"{got['samples_s'] / base['samples_s']:8.2f} {got['accuracy']:8.4f} "
                    f"{got['wait']:7.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
