"""A sharded parameter service under many simulated workers: bytes per host, round time,
asynchronous pushes per second.

W worker processes run the real client (one :class:`~sparkdl.protocol.client.ServiceClient`
per shard, called at once as a sharded fit's worker calls them:
:class:`~sparkdl.protocol.sharded.ShardedClient`) with float32 arrays of the model's
size and no Keras; k shard processes each serve their part of the weights with the real
service (:class:`~sparkdl.server.web.service.ParameterService`), as k hosts of a cluster
would. The model is M parameters in 8 matrices, split by
:class:`~sparkdl.sync.shards.ShardLayout`.

For each (W, M, k) it prints:

* **round s**: the mean wall time of a synchronous round (every worker pushes its
  update to every shard and gets the averaged part back), after one warm-up round;
* **busiest host in / out per round**, in units of M bytes, counted by the services
  (their ``traffic``) and the clients: host j holds shard j and worker j (j < k; the
  others hold a worker only), and traffic between the two on one host is not counted,
  as it never crosses the network. With k = W a ring all-reduce moves 2 (W-1)/W x M in
  each direction through every host; the target is at most 1.1 times that;
* **async pushes/s**: the asynchronous mode's pushes per second (every worker pushing
  in a loop for ``--seconds``; a push to k shards counts once), and with ``--driver``
  the same with the k shards as threads of one process, as ``service_placement=
  "driver"`` serves them.

* **host / worker CPU ns/B**: CPU seconds the shard hosts and the workers spent in the
  synchronous rounds, per byte the services moved (in and out): the per-byte costs the
  docs' model of larger clusters starts from (the warm-up round is included, so they
  are upper bounds).

Configurations whose processes would not fit in memory (``--memory-gb``) are skipped
and said so.

Run:
    python benchmarks/shards.py --driver                     # the full grid
    python benchmarks/shards.py --model 0.5 0.4 0.3          # the model, from costs
    python benchmarks/shards.py --workers 8 --params 1 --shards 1 2
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import secrets
import statistics
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

PARAMS_BYTES = 4  # float32
MATRICES = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--params", type=float, nargs="+", default=[1, 10, 100], help="M params")
    parser.add_argument(
        "--shards", nargs="+", default=["1", "2", "4", "8", "W"], help="k values; W: one per worker"
    )
    parser.add_argument("--rounds", type=int, default=3, help="synchronous rounds measured")
    parser.add_argument("--seconds", type=float, default=4.0, help="asynchronous run per config")
    parser.add_argument(
        "--driver",
        action="store_true",
        help="also run the asynchronous test with every shard in one process (the driver)",
    )
    parser.add_argument(
        "--memory-gb",
        type=float,
        default=_available_gb() * 0.7,
        help="skip configurations estimated above this (default: 70%% of available memory)",
    )
    parser.add_argument(
        "--model",
        nargs=3,
        type=float,
        metavar=("HOST_NS", "WORKER_NS", "REQUEST_MS"),
        help="print only the model of larger clusters from these measured costs: CPU ns "
        "per byte of a service and of a worker, CPU ms per request",
    )
    args = parser.parse_args()
    if args.model:
        _print_model(*args.model)
        return
    ctx = multiprocessing.get_context("spawn")
    print(f"machine: {os.cpu_count()} CPUs, {_available_gb():.1f} GB available")
    print(
        "| W | params | k | round s | busiest host in / M | out / M | all-reduce / M "
        f"| async pushes/s |{' in one process |' if args.driver else ''} "
        "host CPU ns/B | worker CPU ns/B |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|" + ("---|" if args.driver else ""))
    for workers in args.workers:
        with _workers(ctx, workers) as pool:
            for millions in args.params:
                params = int(millions * 1_000_000)
                for k in _shard_counts(args.shards, workers):
                    need = _memory_gb(workers, k, params)
                    label = f"| {workers} | {millions:g}M | {k} |"
                    if need > args.memory_gb:
                        print(f"{label} skipped: needs about {need:.0f} GB | | | | |", flush=True)
                        continue
                    sync = _run(ctx, pool, params, k, "synchronous", rounds=args.rounds)
                    pushes = _run(ctx, pool, params, k, "asynchronous", seconds=args.seconds)
                    threads = None
                    if args.driver and k > 1:
                        threads = _run(
                            ctx, pool, params, k, "asynchronous", seconds=args.seconds, driver=True
                        )["pushes_per_s"]
                    allreduce = 2 * (workers - 1) / workers
                    rate = pushes["pushes_per_s"]
                    in_driver = ""
                    if args.driver:
                        in_driver = " | -" if threads is None else f" | {threads:.0f}"
                    print(
                        f"{label} {sync['round_seconds']:.3f} | {sync['host_in']:.2f} "
                        f"| {sync['host_out']:.2f} | {allreduce:.2f} | {rate:.0f}{in_driver} "
                        f"| {sync['host_cpu_per_byte'] * 1e9:.2f} "
                        f"| {sync['worker_cpu_per_byte'] * 1e9:.2f} |",
                        flush=True,
                    )


def _run(
    ctx: Any,
    pool: list[tuple[Any, Connection]],
    params: int,
    k: int,
    mode: str,
    *,
    rounds: int = 0,
    seconds: float = 0.0,
    driver: bool = False,
) -> dict[str, float]:
    """One configuration: k shard hosts up, every worker runs, figures back."""
    from sparkdl.sync.shards import ShardLayout

    workers = len(pool)
    shapes = _shapes(params)
    layout = ShardLayout.plan([(s, "float32") for s in shapes], k)
    token = secrets.token_urlsafe(16)
    with _shard_hosts(ctx, layout, workers, mode, token, driver) as (urls, hosts):
        job = {
            "urls": urls,
            "token": token,
            "layout": layout.to_json(),
            "mode": mode,
            "rounds": rounds + 1,  # one warm-up round
            "seconds": seconds,
        }
        for worker, (_, conn) in enumerate(pool):
            conn.send({**job, "worker": worker})
        results = [conn.recv() for _, conn in pool]
        for result in results:
            if "error" in result:
                raise RuntimeError(result["error"])
        traffic = []
        for _, conn in hosts:
            conn.send("status")
            traffic.extend(conn.recv())
    moved = sum(t["bytes_in"] + t["bytes_out"] for t in traffic)
    costs = {
        # CPU seconds per byte a service moved (in or out), and per byte a worker did.
        "host_cpu_per_byte": sum(t["cpu"] for t in traffic) / max(moved, 1),
        "worker_cpu_per_byte": sum(r["cpu"] for r in results) / max(moved, 1),
    }
    if mode != "synchronous":
        total = sum(r["pushes"] for r in results)
        return {**costs, "pushes_per_s": total / max(max(r["seconds"] for r in results), 1e-9)}
    model_bytes = sum(r * c for r, c in shapes) * PARAMS_BYTES
    host_in, host_out = _busiest_host(traffic, results, workers, k)
    done_rounds = rounds + 1
    return {
        **costs,
        "round_seconds": statistics.mean(statistics.mean(r["round_seconds"][1:]) for r in results),
        "host_in": host_in / done_rounds / model_bytes,
        "host_out": host_out / done_rounds / model_bytes,
    }


def _busiest_host(
    traffic: list[dict[str, int]], results: list[dict[str, Any]], workers: int, k: int
) -> tuple[float, float]:
    """The most bytes in and out of one host: shard j and worker j share host j (j < k);
    what worker j and shard j send each other stays on the host."""
    host_in, host_out = [], []
    for j in range(workers):
        sent, got = results[j]["sent"], results[j]["received"]
        into = sum(got) + (traffic[j]["bytes_in"] - sent[j] if j < k else 0)
        out = sum(sent) + (traffic[j]["bytes_out"] - got[j] if j < k else 0)
        if j < k:  # worker j's own shard: local
            into -= got[j]
            out -= sent[j]
        host_in.append(into)
        host_out.append(out)
    return max(host_in), max(host_out)


# ---------------------------------------------------------------------- processes
@contextlib.contextmanager
def _workers(ctx: Any, count: int) -> Iterator[list[tuple[Any, Connection]]]:
    """``count`` worker processes, each with its end of a pipe, stopped at the end."""
    pool = []
    try:
        for _ in range(count):
            parent, child = ctx.Pipe()
            process = ctx.Process(target=_worker_main, args=(child,), daemon=True)
            process.start()
            pool.append((process, parent))
        yield pool
    finally:
        for _, conn in pool:
            with contextlib.suppress(OSError):
                conn.send(None)
        for process, _ in pool:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()


@contextlib.contextmanager
def _shard_hosts(
    ctx: Any, layout: Any, workers: int, mode: str, token: str, driver: bool
) -> Iterator[tuple[list[str], list[tuple[Any, Connection]]]]:
    """The shards' services: one process per shard (k hosts), or all of them in one
    process (``driver``: as ``service_placement="driver"`` serves them, threads of one
    process). Yields their URLs in shard order."""
    groups = [list(range(layout.count))] if driver else [[j] for j in range(layout.count)]
    hosts = []
    try:
        for group in groups:
            parent, child = ctx.Pipe()
            process = ctx.Process(
                target=_host_main,
                args=(child, layout.to_json(), group, workers, mode, token),
                daemon=True,
            )
            process.start()
            hosts.append((process, parent))
        urls = [url for _, conn in hosts for url in conn.recv()]
        yield urls, hosts
    finally:
        for _, conn in hosts:
            with contextlib.suppress(OSError):
                conn.send("stop")
        for process, _ in hosts:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()


def _host_main(
    conn: Connection,
    layout_json: dict[str, Any],
    shards: list[int],
    workers: int,
    mode: str,
    token: str,
) -> None:
    """A host of some shards: the real service over each one's part of the weights."""
    from sparkdl.server.state.store import WeightStore
    from sparkdl.server.web.service import ParameterService
    from sparkdl.sync.merges import Average, Delta
    from sparkdl.sync.shards import ShardLayout

    layout = ShardLayout.from_json(layout_json)
    stores = []
    for shard in shards:
        part = [
            np.zeros((p.stop - p.start, *layout.shapes[p.variable][1:]), np.float32)
            for p in layout.shards[shard]
        ]
        merge = Average() if mode == "synchronous" else Delta()
        store = WeightStore(part, num_workers=workers, merge=merge, mode=mode, round_timeout=600)
        for worker in range(workers):
            store.join(worker, 1 << 40, wait=0.0)
        stores.append(store)
    with contextlib.ExitStack() as stack:
        services = [
            stack.enter_context(ParameterService(store, host="127.0.0.1", token=token))
            for store in stores
        ]
        conn.send([service.url for service in services])
        started = time.process_time()
        while conn.recv() != "stop":
            cpu = (time.process_time() - started) / len(stores)  # (one process: shared)
            conn.send([{**store.status()["traffic"], "cpu": cpu} for store in stores])


def _worker_main(conn: Connection) -> None:
    """A simulated worker: runs each job it is sent with the real clients."""
    from sparkdl.protocol.client import ServiceClient
    from sparkdl.protocol.sharded import ShardedClient
    from sparkdl.sync.shards import ShardLayout

    while (job := conn.recv()) is not None:
        try:
            layout = ShardLayout.from_json(job["layout"])
            clients = [
                ServiceClient(url, job["token"], worker=job["worker"], timeout=600, retries=0)
                for url in job["urls"]
            ]
            client = ShardedClient(clients, layout)
            update = layout.split([np.full(s, 1e-3, np.float32) for s in layout.shapes])
            conn.send(_work(client, update, job))
            client.close()
        except Exception as exc:  # the driver process prints it
            conn.send({"error": f"worker {job['worker']}: {type(exc).__name__}: {exc}"})


def _work(client: Any, update: list[list[np.ndarray]], job: dict[str, Any]) -> dict[str, Any]:
    shards = range(len(client.clients))
    versions = [0] * len(client.clients)

    def push(j: int) -> None:
        _, versions[j] = client.clients[j].push(update[j], base_version=versions[j], samples=1)

    round_seconds = []
    pushes = 0
    cpu_start = time.process_time()
    start = time.perf_counter()
    if job["mode"] == "synchronous":
        for _ in range(job["rounds"]):
            began = time.perf_counter()
            client.each_shard(push)
            round_seconds.append(time.perf_counter() - began)
            pushes += 1
    else:
        deadline = start + job["seconds"]
        while time.perf_counter() < deadline:
            client.each_shard(push)
            pushes += 1
    return {
        "cpu": time.process_time() - cpu_start,
        "round_seconds": round_seconds,
        "pushes": pushes,
        "seconds": time.perf_counter() - start,
        "sent": [client.clients[j].bytes_sent for j in shards],
        "received": [client.clients[j].bytes_received for j in shards],
    }


# ---------------------------------------------------------------------- the model
#: Per-message latency of a ring all-reduce step (TCP within a data centre), seconds.
RING_LATENCY = 20e-6


def _print_model(host_ns: float, worker_ns: float, request_ms: float) -> None:
    """Synchronous round time of W workers and a model of M bytes, from the measured
    CPU cost per byte of a service (``host_ns``) and of a worker (``worker_ns``), and
    per request (``request_ms``, service and client together):

    * one service (the driver): W x M bytes in and W x M out through one link, and all
      of them through one Python process (2 W M bytes and W requests of service CPU);
    * k = W shards, shard j on worker j's host: 2 (W-1)/W x M each way through each
      link; each host's CPU does its shard's 2 M bytes and W requests, and its worker's
      2 M bytes and W requests;
    * a ring all-reduce (Horovod): 2 (W-1)/W x M each way through each link, in
      2 (W-1) steps of :data:`RING_LATENCY`, no CPU cost counted.

    The link is full duplex; a round takes its slowest part (network or CPU).
    """
    print(
        f"Model from host {host_ns:g} ns/B, worker {worker_ns:g} ns/B, {request_ms:g} ms "
        "per request; seconds per synchronous round"
    )
    print("| Gbit/s | params | W | one service | k = W shards | ring all-reduce |")
    print("|---|---|---|---|---|---|")
    for gbit in (10, 100):
        link = gbit * 1e9 / 8
        for millions in (10, 100, 1000):
            model = millions * 1e6 * PARAMS_BYTES
            for workers in (8, 32, 128, 512):
                requests = workers * request_ms * 1e-3
                one = max(workers * model / link, 2 * workers * model * host_ns * 1e-9 + requests)
                share = 2 * (workers - 1) / workers * model
                cpu = 2 * model * (host_ns + worker_ns) * 1e-9 + 2 * requests
                sharded = max(share / link, cpu)
                ring = share / link + 2 * (workers - 1) * RING_LATENCY
                print(
                    f"| {gbit} | {millions:g}M | {workers} | {one:.3g} | {sharded:.3g} "
                    f"| {ring:.3g} |"
                )


# ---------------------------------------------------------------------- helpers
def _shapes(params: int) -> list[tuple[int, int]]:
    """M parameters as 8 matrices of 1,000 columns (rows rounded up)."""
    rows = max(1, -(-params // (MATRICES * 1000)))
    return [(rows, 1000)] * MATRICES


def _shard_counts(values: list[str], workers: int) -> list[int]:
    counts = sorted({workers if v == "W" else int(v) for v in values})
    return [k for k in counts if k <= workers]


def _memory_gb(workers: int, k: int, params: int) -> float:
    """A rough peak: each worker holds its update and an answer, each host its part
    three times (center, round sum, answer), each process about 120 MB to start."""
    model = params * PARAMS_BYTES
    return (workers * 2 * model + 3 * model + (workers + k) * 120e6) / 1e9


def _available_gb() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1e6
    except OSError:
        pass
    return 8.0


if __name__ == "__main__":
    main()
