"""A Spark Connect client that can reach nothing but its Connect server, training on digits.

Run by tests/connect/test_connect_server.py against a Connect server in a process of its
own (``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer``):

    python tests/connect/remote_client.py PORT SCENARIO [SCENARIO ...]

Before it imports Spark or Keras, the process restricts its own network (a restriction
of this process, not a mock of Spark): a Python socket may connect only to
``127.0.0.1:PORT`` and may not listen on an IP address; every refused call is recorded
(a bind alone opens nothing: urllib3 binds a socket to ``::1`` when imported, to learn
whether the machine has IPv6). PySpark's gRPC channel opens its sockets in C, out of
that patch's sight, so a monitor thread also reads the process's own TCP sockets from
``/proc`` every 50 ms during each fit and records any socket that listens and any
connection to a port other than the server's.

Scenarios (one ``RESULT {json}`` line each):

Each scenario runs, scoring and saving included, under the monitor.

- ``sync``: synchronous average fit with TLS to the service, the progress bar, a
  callback that records epochs, checkpoints; then transform, evaluate, save and load;
- ``async-stop``: an asynchronous delta fit that a callback stops after its third epoch;
- ``sync-kill``, ``async-kill``: the Python process of worker 0, which hosts the service
  on the first attempt, exits in the middle of epoch 6 (the server's master retries
  tasks); the retried stage resumes from the last closed epoch;
- ``driver`` (run it last): ``service_placement="driver"``, which needs this process to
  listen, so the restriction must make it fail.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from typing import Any

PORT = int(sys.argv[1])
ALLOWED = {("127.0.0.1", PORT), ("::ffff:127.0.0.1", PORT)}
REFUSED: list[str] = []
_INET = (socket.AF_INET, socket.AF_INET6)


def _restrict_network() -> None:
    """Python sockets of this process connect only to the Connect server and never listen."""
    connect, connect_ex = socket.socket.connect, socket.socket.connect_ex

    def check_connect(sock: socket.socket, address: Any) -> None:
        if sock.family in _INET and tuple(address[:2]) not in ALLOWED:
            REFUSED.append(f"connect {address!r}")
            raise PermissionError(f"this client may connect only to 127.0.0.1:{PORT}")

    def guarded_connect(sock: socket.socket, address: Any) -> None:
        check_connect(sock, address)
        connect(sock, address)

    def guarded_connect_ex(sock: socket.socket, address: Any) -> int:
        check_connect(sock, address)
        return connect_ex(sock, address)

    def refuse(name: str) -> Any:
        original = getattr(socket.socket, name)

        def guarded(sock: socket.socket, *args: Any) -> Any:
            if sock.family in _INET:
                REFUSED.append(f"{name} {args!r}")
                raise PermissionError(f"this client may not {name} on an IP address")
            return original(sock, *args)

        return guarded

    socket.socket.connect = guarded_connect  # type: ignore[method-assign]
    socket.socket.connect_ex = guarded_connect_ex  # type: ignore[method-assign]
    socket.socket.listen = refuse("listen")  # type: ignore[method-assign]


_restrict_network()
# The test sends SIGUSR1 before it kills a client past its deadline: every thread's
# stack goes to stderr, naming where it hung (imports included).
faulthandler.register(signal.SIGUSR1, all_threads=True)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

from examples.digits import accuracy, digits_arrays, digits_frames, digits_model  # noqa: E402
from sparkdl import KerasEstimator, KerasModel  # noqa: E402
from tests.integration.failure_fit import KILL_AT_STEP, crash_loss  # noqa: E402


class SocketWatch:
    """Reads this process's TCP sockets from /proc while a fit runs."""

    def __init__(self) -> None:
        self.listening: set[str] = set()
        self.foreign: set[str] = set()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> SocketWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.sample()

    def sample(self) -> None:
        inodes = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
        for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
                    if inode not in inodes:
                        continue
                    if state == "0A":  # LISTEN
                        self.listening.add(local)
                    elif not _is_server(remote):
                        self.foreign.add(f"{local} -> {remote} state {state}")
        self.samples += 1


def _is_server(remote: str) -> bool:
    """Whether a /proc/net/tcp{,6} remote address (hex ``ADDRESS:PORT``) is the Connect
    server, 127.0.0.1:PORT (as IPv4, or IPv4-mapped IPv6), or no peer at all."""
    address, port = remote.rsplit(":", 1)
    if int(port, 16) == 0 and int(address, 16) == 0:
        return True  # no peer (a socket not connected yet)
    loopback = ("0100007F", "0000000000000000FFFF00000100007F")
    return int(port, 16) == PORT and address.upper() in loopback


def watch_self_test() -> bool:
    """Whether :class:`SocketWatch` sees a listening socket and a foreign connection
    (opened past the restriction, through the C methods, then closed again)."""
    import _socket

    with socket.socket() as listener, socket.socket() as peer:
        listener.bind(("127.0.0.1", 0))
        _socket.socket.listen(listener, 1)
        _socket.socket.connect(peer, listener.getsockname())
        watch = SocketWatch()
        watch.sample()
    return bool(watch.listening) and bool(watch.foreign)


def run(spark: Any, scenario: str, workdir: str) -> dict[str, Any]:
    """Runs one scenario under a :class:`SocketWatch` (the fit and all that follows)."""
    result: dict[str, Any] = {"scenario": scenario}
    started = time.time()
    with SocketWatch() as watch:
        if scenario == "driver":
            _driver_placement(spark, result)
        else:
            _train_and_score(spark, scenario, workdir, result)
    result.update(
        # The fit's threads, ended with it (one still inside TensorFlow or a gRPC call
        # as the client exits would crash or hang it).
        threads=[t.name for t in threading.enumerate() if t.name.startswith("sparkdl-")],
        seconds=time.time() - started,
        listening=sorted(watch.listening),
        foreign=sorted(watch.foreign),
        watch_samples=watch.samples,
        refused=list(REFUSED),
    )
    return result


def _driver_placement(spark: Any, result: dict[str, Any]) -> None:
    train_df, _ = digits_frames(spark)
    try:
        KerasEstimator(
            model=digits_model(), num_workers=2, epochs=1, service_placement="driver"
        ).fit(train_df)
    except Exception as exc:  # what the user would see
        result["error"] = f"{type(exc).__name__}: {exc}"


def _train_and_score(spark: Any, scenario: str, workdir: str, result: dict[str, Any]) -> None:
    train_df, test_df = digits_frames(spark)
    _, x_test, _, y_test = digits_arrays()
    seen: list[int] = []
    model = digits_model()

    def record(epoch: int, logs: Any) -> None:
        seen.append(epoch)
        if scenario == "async-stop" and epoch == 2:
            recorder.model.stop_training = True

    recorder = keras.callbacks.LambdaCallback(on_epoch_end=record)
    settings: dict[str, Any]
    if scenario == "sync":
        settings = dict(
            mode="synchronous",
            frequency=4,
            epochs=20,
            verbose=1,
            service_tls=True,
            checkpoint_dir=os.path.join(workdir, "checkpoints"),
        )
    elif scenario == "async-stop":
        settings = dict(mode="asynchronous", merge="delta", epochs=40)
    else:
        marker = os.path.join(workdir, f"{scenario}.marker")
        loss = crash_loss(marker, 0, KILL_AT_STEP)
        model.compile(
            optimizer=keras.optimizers.Adam(0.003),
            loss=loss,
            metrics=["accuracy"],
            jit_compile=False,
        )
        settings = dict(
            mode="synchronous" if scenario.startswith("sync") else "asynchronous",
            frequency=4,
            epochs=20,
            custom_objects={loss.__name__: loss},
        )
    fitted = KerasEstimator(
        model=model, callbacks=[recorder], num_workers=2, batch_size=32, seed=0, **settings
    ).fit(train_df)
    report = fitted.fit_report
    result.update(
        epochs=len(fitted.history["loss"]),
        callback_epochs=seen,
        accuracy=accuracy(fitted.get_model(), x_test, y_test),
        service=report["resolved"]["service"],
        service_url=report["service_url"],
        samples_seen=report["service"]["samples_seen"],
        rows=sum(w["rows"] for w in report["workers"]),
        epochs_run=[w["epochs_run"] for w in report["workers"]],
    )
    if scenario.endswith("-kill"):
        with open(os.path.join(workdir, f"{scenario}.marker")) as f:
            result["kills"] = len(f.read().split())
    if scenario == "sync":
        model = fitted.get_model()
        rows = fitted.transform(test_df).collect()
        x = np.array([r.features for r in rows], np.float32)
        predictions = np.array([r.prediction for r in rows], np.float32)
        result["transform_error"] = float(np.max(np.abs(predictions - model.predict(x, verbose=0))))
        result["evaluate_accuracy"] = fitted.evaluate(test_df)["accuracy"]
        path = os.path.join(workdir, "model")
        fitted.write().save(path)
        loaded = KerasModel.load(path)
        again = np.array([r.prediction for r in loaded.transform(test_df).collect()], np.float32)
        result["loaded_error"] = float(np.max(np.abs(again - predictions)))
        result["checkpoints"] = sorted(os.listdir(os.path.join(workdir, "checkpoints")))


def main() -> None:
    print("WATCH " + json.dumps(watch_self_test()), flush=True)
    with SocketWatch() as watch:
        spark = SparkSession.builder.remote(f"sc://127.0.0.1:{PORT}").getOrCreate()
        spark.range(1).collect()
    print("SESSION " + json.dumps(sorted(watch.listening) + sorted(watch.foreign)), flush=True)
    with tempfile.TemporaryDirectory() as workdir:
        for scenario in sys.argv[2:]:
            print(f"START {scenario}", flush=True)
            print("RESULT " + json.dumps(run(spark, scenario, workdir)), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
