"""The rendezvous of a service in the cluster (:mod:`sparkdl.executor.hosting`), with
worker threads whose ``allGather`` is a ``threading.Barrier`` and whose machines hold
the snapshots a test gives them: which worker hosts, how many gathers it takes, and what
a worker sees when the host cannot serve. (The real barrier stage, service and relay are
tested by the slow tier's killed-host fits.)"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest

from sparkdl.config import TrainConfig
from sparkdl.contract import rendezvous as rv
from sparkdl.contract.payload import Hosting, WorkerPayload
from sparkdl.contract.plan import FitPlan
from sparkdl.executor.hosting import Hosted


class FakeBarrier:
    """``allGather`` of ``n`` worker threads, counting the gathers."""

    def __init__(self, n: int) -> None:
        self.messages: list[str] = [""] * n
        self.barrier = threading.Barrier(n, timeout=10)
        self.gathers = 0

    def context(self, worker: int) -> Any:
        barrier = self

        class Context:
            def taskAttemptId(self) -> int:
                return 100 + worker

            def allGather(self, message: str = "") -> list[str]:
                barrier.messages[worker] = message
                if barrier.barrier.wait() == 0:
                    barrier.gathers += 1
                gathered = list(barrier.messages)
                barrier.barrier.wait()  # every worker read before the next gather writes
                return gathered

        return Context()


class Worker(Hosted):
    """A worker whose machine holds snapshots of ``held[shard]`` epochs, and whose
    service of a shard is a URL naming it (or an error)."""

    held: list[list[int]]
    fails = False
    served = 0
    stopped = 0

    def _held(self, shard: int) -> list[int]:
        return list(self.held[shard])

    def _serve(self, shard: int, epoch: int | None) -> dict[str, Any]:
        if self.fails:
            raise OSError("no port free")
        assert epoch is None or epoch in self.held[shard], (shard, epoch, self.held)
        self.served += 1
        self._services.append(object())
        self._shards_served.append(shard)
        url = f"http://w{self._worker}" + (f"/s{shard}" if self.shards > 1 else "")
        return {"url": url, "cert": "", "initial_epoch": epoch or 0}

    def _stop_services(self) -> None:
        self.stopped += len(self._services)
        self._services, self._shards_served = [], []


def payload(shards: int = 1) -> WorkerPayload:
    plan = FitPlan.resolve(
        TrainConfig(service_shards=shards, service_placement="cluster"),
        num_workers=3,
        rows=300,
        threads=1,
        service_host="x",
        service_placement="cluster",
    )
    return WorkerPayload(
        plan=plan,
        url="",
        token="t",
        model_bytes=b"",
        custom_objects=None,
        input_shapes=[(3,)],
        label_kinds=["int"],
        hosting=Hosting("test-rendezvous", "d", False, None, [100, 100, 100], "127.0.0.1"),
    )


def rendezvous(
    snapshots: list[Any], fails: set[int] = frozenset(), shards: int = 1
) -> tuple[list[Any], FakeBarrier]:  # type: ignore[assignment]
    """Runs ``_enter`` in one thread per worker; returns each one's result or error.

    ``snapshots[worker]``: with one shard, the newest snapshot's epoch on that worker's
    machine (or ``None``); with several, the epochs it holds of each shard."""
    fake = FakeBarrier(len(snapshots))
    workers = []
    for worker, snapshot in enumerate(snapshots):
        hosted = Worker(payload(shards), fake.context(worker), worker, lambda: None)
        if shards == 1:
            hosted.held = [[] if snapshot is None else [snapshot]]
        else:
            hosted.held = snapshot
        hosted.fails = worker in fails
        workers.append(hosted)
    results: list[Any] = [None] * len(workers)

    def enter(worker: int) -> None:
        try:
            results[worker] = workers[worker]._enter()
        except Exception as exc:
            results[worker] = exc
        finally:
            workers[worker].__exit__(None, None, None)

    threads = [threading.Thread(target=enter, args=(w,)) for w in range(len(workers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    return [(r, w) for r, w in zip(results, workers, strict=True)], fake


def test_a_first_attempt_takes_one_gather_and_worker_0_hosts() -> None:
    results, fake = rendezvous([None, None, None])
    assert fake.gathers == 1
    assert [r.payload.url for r, _ in results] == ["http://w0"] * 3
    assert [w.served for _, w in results] == [1, 0, 0]


def test_a_retry_moves_the_service_to_the_newest_snapshot() -> None:
    results, fake = rendezvous([3, 5, 5])  # worker 0's machine holds an older snapshot
    assert fake.gathers == 2
    assert [r.payload.url for r, _ in results] == ["http://w1"] * 3
    assert [r.payload.plan.initial_epoch for r, _ in results] == [5, 5, 5]
    assert [w.served for _, w in results] == [1, 1, 0]
    assert results[0][1].stopped == 1  # worker 0's service stopped before the move


def test_a_retry_that_finds_the_newest_snapshot_on_worker_0_takes_one_gather() -> None:
    results, fake = rendezvous([5, None, 5])
    assert fake.gathers == 1
    assert {r.payload.url for r, _ in results} == {"http://w0"}


def test_a_host_that_cannot_serve_fails_every_worker_with_its_reason() -> None:
    results, fake = rendezvous([None, None, None], fails={0})
    assert fake.gathers == 1  # worker 0 still took part: nobody waits for ever
    assert isinstance(results[0][0], OSError)
    for result, _ in results[1:]:
        assert isinstance(result, RuntimeError)
        assert "Worker 0 could not start the parameter service" in str(result)


def test_a_worker_0_that_cannot_serve_trains_when_the_service_moves() -> None:
    results, fake = rendezvous([None, 4, None], fails={0})
    assert fake.gathers == 2
    assert [r.payload.url for r, _ in results] == ["http://w1"] * 3


def test_a_moved_host_that_cannot_serve_fails_every_worker_too() -> None:
    results, fake = rendezvous([None, 4, None], fails={0, 1})
    assert fake.gathers == 2
    assert isinstance(results[1][0], OSError)
    for result, _ in (results[0], results[2]):
        assert "Worker 1 could not start the parameter service" in str(result)


def test_a_sharded_first_attempt_takes_one_gather_and_worker_j_hosts_shard_j() -> None:
    results, fake = rendezvous([[[], []], [[], []], [[], []]], shards=2)
    assert fake.gathers == 1
    assert [r.payload.shard_urls for r, _ in results] == [("http://w0/s0", "http://w1/s1")] * 3
    assert [w.served for _, w in results] == [1, 1, 0]


def test_sharded_hosts_resume_from_the_newest_epoch_every_shard_has() -> None:
    # Shard 0's host closed epoch 6 before the kill; shard 1's only 5: both resume at 5.
    results, fake = rendezvous([[[4, 5, 6], []], [[], [4, 5]], [[], []]], shards=2)
    assert fake.gathers == 2  # worker 0 first served epoch 6, then 5
    assert [r.payload.plan.initial_epoch for r, _ in results] == [5, 5, 5]
    assert results[0][0].payload.shard_urls == ("http://w0/s0", "http://w1/s1")
    assert results[0][1].served == 2 and results[0][1].stopped == 2  # the first; at exit


def test_a_shard_whose_snapshot_is_on_another_machine_moves_there() -> None:
    # A retried stage put worker 0 and 2 on the machines swapped: shard 0's snapshot is
    # on worker 2's machine now, which hosts it.
    results, fake = rendezvous([[[], []], [[], [3]], [[3], []]], shards=2)
    assert fake.gathers == 2
    assert {r.payload.shard_urls for r, _ in results} == {("http://w2/s0", "http://w1/s1")}
    assert {r.payload.plan.initial_epoch for r, _ in results} == {3}


def test_shards_without_a_common_snapshot_start_from_the_model() -> None:
    results, fake = rendezvous([[[6], []], [[], [4]], [[], []]], shards=2)
    assert fake.gathers == 2
    assert {r.payload.plan.initial_epoch for r, _ in results} == {0}


def test_a_shard_host_that_cannot_serve_fails_every_worker_naming_the_shard() -> None:
    results, fake = rendezvous([[[], []], [[], []], [[], []]], fails={1}, shards=2)
    assert fake.gathers == 1
    assert isinstance(results[1][0], OSError)
    for result, _ in (results[0], results[2]):
        assert "Worker 1 could not start the parameter service (shard 1)" in str(result)


def test_the_relay_reads_the_newest_attempts_file_and_stale_ones_go() -> None:

    assert rv.read_rendezvous("fit") is None
    old = rv.write_rendezvous("fit", 0, 7, {"urls": ["http://dead"], "certs": [""]})
    rv.write_rendezvous("fit", 1, 8, {"urls": ["http://dead"], "certs": [""]})
    assert rv.read_rendezvous("fit") == {"urls": ["http://dead"], "certs": [""]}
    # A retried stage: its attempts (larger ids) win, and older files on this machine go.
    mine = rv.write_rendezvous("fit", 1, 12, {"urls": ["http://live"], "certs": [""]})
    rv.write_rendezvous("fit", 0, 11, {"urls": ["http://live"], "certs": [""]})
    assert not os.path.exists(old)
    assert sorted(rv.rendezvous_files("fit")) == [11, 12]
    os.remove(mine)  # worker 1 ended first: worker 0's file still answers
    assert rv.read_rendezvous("fit") == {"urls": ["http://live"], "certs": [""]}
    assert rv.read_rendezvous("other-fit") is None


def test_prune_removes_what_ended_fits_left_and_keeps_the_rest(tmp_path) -> None:
    from sparkdl.executor import hosting

    directory = rv.rendezvous_dir()
    left = rv.write_rendezvous("old-fit", 0, 1, {"urls": ["u"], "certs": [""]})
    snapshots = os.path.join(directory, "old-fit-snapshots")
    os.makedirs(os.path.join(snapshots, "epoch-3"))
    live = rv.write_rendezvous("live-fit", 0, 2, {"urls": ["u"], "certs": [""]})
    long_ago = time.time() - hosting.PRUNE_SECONDS - 60
    for path in (left, snapshots):
        os.utime(path, (long_ago, long_ago))
    hosting.prune()
    assert not os.path.exists(left) and not os.path.exists(snapshots)
    assert os.path.exists(live)


@pytest.fixture(autouse=True)
def _own_rendezvous_dir(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
