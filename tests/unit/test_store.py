from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from sparkdl.protocol import wire
from sparkdl.server.state.store import StoreError, WeightStore
from sparkdl.sync.merges import Average, Delta, Elastic
from tests.stores import joined


def sync_call(store: WeightStore, worker: int, *, round_no: int, wait: float, **kw):  # type: ignore[no-untyped-def]
    """A synchronous push as the route runs it: push, then wait for its answer."""
    kw.setdefault("attempt", 0)
    target = store.push(worker, base_version=round_no, **kw)
    return store.pull(target, wait)


def async_call(store: WeightStore, worker: int, **kw):  # type: ignore[no-untyped-def]
    kw.setdefault("attempt", 0)
    return store.push(worker, **kw)


def make_store(workers: int = 2) -> WeightStore:
    return joined(WeightStore([np.zeros(3, np.float32)], num_workers=workers, merge=Average()))


def push(
    store: WeightStore,
    worker: int,
    value: float,
    *,
    seq: int,
    round_no: int,
    samples: int = 1,
    wait: float = 5.0,
):
    return sync_call(
        store,
        worker,
        seq=seq,
        round_no=round_no,
        arrays=[np.full(3, value, np.float32)],
        samples=samples,
        meta={},
        wait=wait,
    )


def test_round_waits_for_every_worker_then_merges() -> None:
    store = make_store()
    assert push(store, 0, 1.0, seq=1, round_no=0, wait=0.05) is None  # round still open
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("r", store.pull(1, 5.0)))
    t.start()
    weights, version = push(store, 1, 3.0, seq=1, round_no=0, samples=3)
    t.join()
    assert version == 1
    np.testing.assert_allclose(weights[0], 2.5)
    assert result["r"][1] == 1


def test_retried_push_is_counted_once() -> None:
    store = make_store()
    push(store, 0, 1.0, seq=1, round_no=0, wait=0.0)
    push(store, 0, 1.0, seq=1, round_no=0, wait=0.0)  # retry while the round is open
    assert store.status()["round_pushed"] == [0]
    push(store, 1, 1.0, seq=1, round_no=0)
    _, version = push(store, 1, 1.0, seq=1, round_no=0)  # retry after the merge
    assert version == 1
    assert store.status()["samples_seen"] == 2


def test_wrong_round_shape_worker_and_nan_are_refused_and_weights_kept() -> None:
    store = make_store()
    with pytest.raises(StoreError) as err:
        push(store, 0, 1.0, seq=1, round_no=3)
    assert err.value.status == 409
    with pytest.raises(StoreError, match="shape"):
        sync_call(
            store,
            0,
            seq=1,
            round_no=0,
            arrays=[np.zeros(4, np.float32)],
            samples=1,
            meta={},
            wait=0,
        )
    with pytest.raises(StoreError, match="Unknown worker"):
        push(store, 7, 1.0, seq=1, round_no=0)
    with pytest.raises(StoreError, match="NaN"):
        push(store, 0, float("nan"), seq=1, round_no=0)
    np.testing.assert_array_equal(store.weights()[0], np.zeros(3))
    assert store.version == 0


def test_failure_aborts_waiting_pushes() -> None:
    store = make_store()
    errors = []

    def waiting() -> None:
        try:
            push(store, 0, 1.0, seq=1, round_no=0, wait=10.0)
        except StoreError as exc:
            errors.append(exc)

    t = threading.Thread(target=waiting)
    t.start()
    store.report_failure(1, "Traceback\nValueError: boom")
    t.join(timeout=5)
    assert errors and errors[0].status == 409
    assert store.failures() == {1: "Traceback\nValueError: boom"}


def test_epoch_logs_are_averaged_by_samples() -> None:
    store = make_store()
    for worker, (n, loss) in enumerate([(100, 1.0), (300, 2.0)]):
        sync_call(
            store,
            worker,
            seq=1,
            round_no=0,
            arrays=[np.zeros(3, np.float32)],
            samples=n,
            meta={"epoch": 0, "epoch_logs": {"loss": loss, "accuracy": 0.5}, "epoch_samples": n},
            wait=0,
        )
    assert store.history() == {"accuracy": [0.5], "loss": [1.75]}


def test_join_returns_all_row_counts() -> None:
    store = WeightStore([np.zeros(3, np.float32)], num_workers=2, merge=Average())
    assert store.join(0, 10, wait=0.0) is None
    assert store.join(1, 12, wait=1.0) == {
        "rows": [10, 12],
        "seq": 0,
        "version": 0,
        "position": None,
        "generation": 0,
    }
    assert store.join(0, 10, wait=0.0)["rows"] == [10, 12]


def test_round_timeout_closes_the_round_with_the_workers_present(caplog) -> None:
    store = joined(
        WeightStore([np.zeros(1, np.float32)], num_workers=2, merge=Average(), round_timeout=0.2)
    )
    sync_call(
        store, 0, seq=1, round_no=0, arrays=[np.ones(1, np.float32)], samples=1, meta={}, wait=0
    )
    with caplog.at_level("WARNING", logger="sparkdl.server.state.store"):
        weights, version = store.pull(1, wait=3.0)
    assert version == 1 and weights[0].tolist() == [1.0]
    assert "round_timeout" in caplog.text and "[1]" in caplog.text
    # Worker 1's push for the closed round is dropped; it gets the current weights.
    late = sync_call(
        store,
        1,
        seq=1,
        round_no=0,
        arrays=[np.full(1, 9.0, np.float32)],
        samples=1,
        meta={},
        wait=0,
    )
    assert late is not None and late[1] == 1 and late[0][0].tolist() == [1.0]
    status = store.status()
    assert status["timed_out_rounds"] == 1 and status["workers"]["1"]["late"] == 1


def sync_push(store: WeightStore, worker: int, value: float, **kw):  # type: ignore[no-untyped-def]
    kw.setdefault("meta", {})
    return sync_call(store, worker, arrays=[np.full(1, value, np.float32)], samples=1, wait=0, **kw)


def test_a_retried_barrier_stage_starts_a_generation_and_fences_the_old_one() -> None:
    store = WeightStore([np.zeros(1, np.float32)], num_workers=2, merge=Average())
    store.join(0, 10, wait=0.0, attempt=0)
    store.join(1, 10, wait=0.0, attempt=1)
    sync_push(store, 0, 2.0, seq=1, round_no=0, attempt=0)
    assert sync_push(store, 1, 4.0, seq=1, round_no=0, attempt=1)[1] == 1
    sync_push(store, 0, 50.0, seq=2, round_no=1, attempt=0)  # then worker 1 dies
    # Spark retries the stage: new task attempts 3 and 2, in any order.
    assert store.join(1, 10, wait=0.0, attempt=3) is None  # waits for worker 0
    with pytest.raises(StoreError, match="superseded") as zombie:
        sync_push(store, 0, 99.0, seq=3, round_no=1, attempt=0)  # old attempt of worker 0
    assert zombie.value.status == 409
    joined = store.join(0, 10, wait=0.0, attempt=2)
    assert joined is not None and joined["version"] == 1 and joined["generation"] == 1
    assert store.weights()[0].tolist() == [3.0]  # the open round's push was dropped
    sync_push(store, 0, 5.0, seq=3, round_no=1, attempt=2)
    assert sync_push(store, 1, 7.0, seq=2, round_no=1, attempt=3)[0][0].tolist() == [6.0]
    status = store.status()
    assert status["restarts"] == 2 and status["generation"] == 1


def test_backup_workers_close_rounds_on_a_quorum_and_drop_late_pushes() -> None:
    store = joined(
        WeightStore(
            [np.zeros(1, np.float32)], num_workers=3, merge=Average(), backup_workers=1, epochs=1
        )
    )
    sync_push(store, 0, 3.0, seq=1, round_no=0)
    weights, version = sync_push(store, 1, 5.0, seq=1, round_no=0)  # quorum: 2 of 3
    assert version == 1 and weights[0].tolist() == [4.0]
    late = sync_push(store, 2, 100.0, seq=1, round_no=0)  # the straggler: dropped
    assert late[1] == 1 and store.weights()[0].tolist() == [4.0]
    assert store.status()["workers"]["2"]["late"] == 1
    # The epoch closes on the quorum's logs; then every answer says stop.
    for worker in (0, 1):
        logs = {"epoch_logs": {"loss": float(worker)}, "epoch": 0, "epoch_samples": 1}
        sync_push(store, worker, 4.0, seq=2, round_no=1, meta=logs)
    assert store.history() == {"loss": [0.5]}
    assert store.status()["finished"]
    chunks, _ = store.encoded()
    assert wire.decode(b"".join(bytes(c) for c in chunks))[1]["stop"] is True
    answer = sync_push(store, 2, 1.0, seq=2, round_no=2)  # straggler: answered at once
    assert answer is not None


def test_async_rejoin_learns_its_position() -> None:
    store = make_async()
    store.join(0, 10, wait=0.0)
    async_call(
        store,
        0,
        seq=1,
        base_version=0,
        arrays=[np.ones(3, np.float32)],
        samples=4,
        meta={"epoch": 2, "step": 5},
    )
    joined = store.join(0, 10, wait=0.0, attempt=1)
    assert joined["position"] == [2, 5] and joined["seq"] == 1


def test_only_fatal_failures_abort_and_later_reports_keep_the_first() -> None:
    store = make_async()
    store.report_failure(0, "ServiceError: unreachable", fatal=False)
    assert store.status()["aborted"] is None and not store.aborted_event.is_set()
    push_async(store, 1, 1.0, seq=1)  # training goes on
    store.report_failure(1, "ValueError: bad loss", fatal=True)
    store.report_failure(0, "TrainingError: aborted", fatal=True)
    assert store.aborted_event.is_set()
    assert store.failures() == {0: "ServiceError: unreachable", 1: "ValueError: bad loss"}


def make_async(staleness: str = "none") -> WeightStore:
    return joined(
        WeightStore(
            [np.zeros(3, np.float32)],
            num_workers=2,
            merge=Delta(staleness=staleness),
            mode="asynchronous",
        )
    )


def push_async(store: WeightStore, worker: int, value: float, *, seq: int, **kw):
    kw.setdefault("base_version", store.version)
    return async_call(
        store, worker, seq=seq, arrays=[np.full(3, value, np.float32)], samples=1, meta={}, **kw
    )


def test_async_deltas_apply_once_per_sequence_number() -> None:
    store = make_async()
    assert push_async(store, 0, 1.0, seq=1) == 1
    assert push_async(store, 1, 2.0, seq=1) == 2
    assert push_async(store, 0, 1.0, seq=1) == 2  # retry: acknowledged, not applied
    assert push_async(store, 0, 4.0, seq=2) == 3
    np.testing.assert_array_equal(store.weights()[0], [7.0, 7.0, 7.0])
    status = store.status()
    assert status["duplicates"] == 1 and status["workers"]["0"]["seq"] == 2


def test_async_inverse_staleness_scales_old_deltas() -> None:
    store = make_async("inverse")
    for seq in range(1, 5):
        push_async(store, 0, 0.0, seq=seq)
    push_async(store, 1, 8.0, seq=1, base_version=0)  # 4 versions old
    np.testing.assert_array_equal(store.weights()[0], [2.0, 2.0, 2.0])
    with pytest.raises(StoreError, match="version 9"):
        push_async(store, 1, 1.0, seq=2, base_version=9)


def test_retried_task_rejoins_under_its_id_and_fences_the_old_attempt() -> None:
    store = make_async()
    store.join(0, 10, wait=0.0)
    push_async(store, 0, 1.0, seq=1)
    push_async(store, 0, 1.0, seq=2)
    joined = store.join(0, 10, wait=0.0, attempt=1)  # Spark retried the task
    assert joined["seq"] == 2 and joined["version"] == 2
    with pytest.raises(StoreError, match="superseded") as info:
        push_async(store, 0, 5.0, seq=3, attempt=0)  # the zombie attempt
    assert info.value.status == 409
    push_async(store, 0, 1.0, seq=3, attempt=1)
    np.testing.assert_array_equal(store.weights()[0], [3.0, 3.0, 3.0])
    assert store.status()["workers"]["0"]["attempt"] == 1


def test_encoded_snapshot_is_built_once_per_version() -> None:
    store = make_async()
    body, version = store.encoded()
    assert version == 0 and store.encoded()[0] is body
    push_async(store, 0, 1.0, seq=1)
    body2, version2 = store.encoded(1)
    assert version2 == 1 and body2 is not body
    assert store.encoded(5, wait=0.0) is None


def test_hogwild_adds_into_the_live_arrays_and_counts_every_push_once() -> None:
    store = joined(
        WeightStore([np.zeros(3, np.float32)], num_workers=4, merge=Delta(), mode="hogwild")
    )
    live = store.weights()[0]

    def work(worker: int) -> None:
        for seq in range(1, 51):
            push_async(store, worker, 1.0, seq=seq, base_version=0)
            push_async(store, worker, 1.0, seq=seq, base_version=0)  # a retry: not applied

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.weights()[0] is live  # changed in place, never replaced
    assert store.version == 200 and store.status()["duplicates"] == 200
    # Concurrent read-modify-write adds may lose a few increments, never add extra ones.
    assert live.min() > 0 and live.max() <= 200.0
    chunks, version = store.encoded()
    assert version == 200
    np.testing.assert_array_equal(np.frombuffer(chunks[1], np.float32), live)  # a live view


def test_hogwild_pushes_in_sequence_are_exact() -> None:
    store = joined(
        WeightStore([np.zeros(3, np.float32)], num_workers=2, merge=Elastic(), mode="hogwild")
    )
    push_async(store, 0, 0.5, seq=1)
    push_async(store, 1, -0.25, seq=1)
    np.testing.assert_array_equal(store.weights()[0], [0.25, 0.25, 0.25])


def test_epoch_gate_holds_the_closing_round_until_the_callbacks_ran() -> None:
    store = joined(
        WeightStore([np.zeros(1, np.float32)], num_workers=2, merge=Average(), gate_epochs=True)
    )
    logs = {"epoch": 0, "epoch_logs": {"loss": 1.0}, "epoch_samples": 1}
    sync_push(store, 0, 2.0, seq=1, round_no=0, meta=logs)
    assert sync_push(store, 1, 4.0, seq=1, round_no=0, meta=logs) is None  # held
    assert store.history() == {"loss": [1.0]} and store.version == 1
    assert store.epoch_weights(0, wait=1.0)[0].tolist() == [3.0]  # what callbacks see
    store.request_stop()  # EarlyStopping decided on epoch 0
    assert store.pull(1, wait=0.0) is None
    store.release(0)
    chunks, version = store.encoded(1, wait=1.0)
    assert version == 1 and wire.decode(b"".join(bytes(c) for c in chunks))[1]["stop"] is True


def async_gated(workers: int = 2) -> WeightStore:
    return WeightStore(
        [np.zeros(1, np.float32)],
        num_workers=workers,
        merge=Delta(),
        mode="asynchronous",
        gate_epochs=True,
    )


def end_epoch(store: WeightStore, worker: int, epoch: int, seq: int) -> None:
    """A worker's push that closes its epoch ``epoch`` (the service records it)."""
    meta = {"epoch": epoch, "epoch_logs": {"loss": 1.0}, "epoch_samples": 1}
    async_call(
        store,
        worker,
        seq=seq,
        base_version=store.version,
        arrays=[np.zeros(1, np.float32)],
        samples=1,
        meta=meta,
    )


def test_async_epoch_ends_wait_for_the_callbacks_one_epoch_behind() -> None:
    store = joined(async_gated())
    control = store.control
    assert control.callback_lag == 1 and control.callbacks_caught_up(0)
    end_epoch(store, 0, 0, seq=1)
    end_epoch(store, 0, 1, seq=2)  # worker 0 ended epoch 1; epoch 0 is not closed
    assert not control.callbacks_caught_up(1)
    started = time.monotonic()
    store.wait_callbacks(0, wait=0.3)  # bounded: a dead worker's epoch never closes
    assert time.monotonic() - started >= 0.25
    threading.Timer(0.1, store.release, args=(0,)).start()
    started = time.monotonic()
    store.wait_callbacks(0, wait=10.0)  # woken by the release
    assert time.monotonic() - started < 5.0 and not control.callbacks_caught_up(2)
    store.encoded(0, wait=0.0)  # an answer cached before the stop...
    store.request_stop()  # ...a callback stopped the fit: nobody waits any more
    assert control.callbacks_caught_up(5)
    chunks, _ = store.encoded(0, wait=0.0)  # ...is not what answers now
    assert wire.decode(b"".join(bytes(c) for c in chunks))[1]["stop"] is True


def test_async_epoch_ends_do_not_wait_for_queued_or_failed_workers() -> None:
    queued = async_gated()
    queued.join(0, 100, wait=0.0)  # worker 1's task waits for a slot
    end_epoch(queued, 0, 0, seq=1)
    end_epoch(queued, 0, 1, seq=2)
    started = time.monotonic()
    queued.wait_callbacks(0, wait=5.0)
    assert time.monotonic() - started < 1.0
    failed = joined(async_gated())
    end_epoch(failed, 0, 0, seq=1)
    end_epoch(failed, 0, 1, seq=2)
    failed.report_failure(1, "lost executor", fatal=False)  # Spark retries worker 1
    started = time.monotonic()
    failed.wait_callbacks(0, wait=5.0)
    assert time.monotonic() - started < 1.0


def test_async_without_callbacks_and_resumed_fits_do_not_wait() -> None:
    free = WeightStore([np.zeros(1, np.float32)], num_workers=2, merge=Delta(), mode="hogwild")
    assert free.control.callback_lag is None and free.control.callbacks_caught_up(10)
    resumed = WeightStore(
        [np.zeros(1, np.float32)],
        num_workers=2,
        merge=Delta(),
        mode="asynchronous",
        gate_epochs=True,
        history={"loss": [1.0, 0.9, 0.8]},
    )
    # Epochs 0-2 ran in an earlier fit: epoch 3's end waits for nothing.
    assert resumed.control.callbacks_caught_up(3) and not resumed.control.callbacks_caught_up(4)
    synchronous = WeightStore(
        [np.zeros(1, np.float32)], num_workers=2, merge=Average(), gate_epochs=True
    )
    assert synchronous.control.callback_lag is None  # the round gate does it there


def test_async_epoch_ends_do_not_wait_for_a_silent_worker() -> None:
    """A lost executor's task that Spark can reschedule only once the survivor ends:
    after SILENT_SECONDS without a word from it, the survivor's epoch ends go on."""
    from sparkdl.server.state.training import SILENT_SECONDS

    store = joined(async_gated())
    end_epoch(store, 1, 0, seq=1)  # worker 1 ended epoch 0, then went quiet
    end_epoch(store, 0, 0, seq=1)
    end_epoch(store, 0, 1, seq=2)
    end_epoch(store, 0, 2, seq=3)  # epoch 1 is open: worker 1 has not ended it
    started = time.monotonic()
    store.wait_callbacks(0, wait=0.3)  # worker 1 spoke just now: worker 0 waits
    assert time.monotonic() - started >= 0.25
    store.ledger.records[1].last_seen -= SILENT_SECONDS
    started = time.monotonic()
    store.wait_callbacks(0, wait=5.0)
    assert time.monotonic() - started < 1.0
    store.release(0)
    end_epoch(store, 1, 1, seq=2)  # worker 1 is back and ends epoch 1
    end_epoch(store, 0, 3, seq=4)
    started = time.monotonic()
    store.wait_callbacks(0, wait=0.3)  # epoch 2 waits for worker 1, heard from again
    assert time.monotonic() - started >= 0.25
    end_epoch(store, 1, 2, seq=3)  # epoch 2 closed: only the driver's callbacks are
    for record in store.ledger.records.values():  # owed, and nobody's silence counts
        record.last_seen -= SILENT_SECONDS
    started = time.monotonic()
    store.wait_callbacks(0, wait=0.3)
    assert time.monotonic() - started >= 0.25


def test_a_failure_during_the_wait_releases_it() -> None:
    store = joined(async_gated())
    end_epoch(store, 0, 0, seq=1)
    end_epoch(store, 0, 1, seq=2)
    timer = threading.Timer(0.2, store.report_failure, args=(1, "lost executor"))
    timer.kwargs = {"fatal": False}
    timer.start()
    started = time.monotonic()
    store.wait_callbacks(0, wait=10.0)
    assert time.monotonic() - started < 3.0


@pytest.mark.parametrize("mode", ["synchronous", "asynchronous"])
def test_epoch_copies_keep_the_center_as_each_epoch_closed(mode) -> None:
    """A service in the cluster snapshots each epoch as it closed, not as the center is
    when the snapshot is written (every shard's snapshot of an epoch is then of one
    round)."""
    merge = Average() if mode == "synchronous" else Delta()
    store = joined(
        WeightStore(
            [np.zeros(3, np.float32)],
            num_workers=2,
            merge=merge,
            mode=mode,
            keep_epoch_copies=True,
        )
    )
    seq = 0
    for epoch in range(2):
        for closing in (False, True):
            seq += 1
            for worker in (0, 1):
                meta = {"epoch": epoch}
                if closing:
                    meta.update(epoch_logs={"loss": 1.0}, epoch_samples=5)
                store.push(
                    worker,
                    seq=seq,
                    attempt=0,
                    base_version=store.version if mode == "synchronous" else 0,
                    arrays=[np.full(3, float(seq), np.float32)],
                    samples=5,
                    meta=meta,
                )
        if epoch == 0:
            at_close = store.weights()[0].copy()
    if mode == "asynchronous":  # the center moves on; the copies stay as they were
        store.push(
            0,
            seq=seq + 1,
            attempt=0,
            base_version=0,
            arrays=[np.full(3, 9.0, np.float32)],
            samples=1,
            meta={"epoch": 2},
        )
    copies = store.take_epoch_copies(0.0)
    assert [e for e, _, _ in copies] == [0, 1]
    np.testing.assert_array_equal(copies[0][1][0], at_close)
    assert copies[0][2] is None  # no outer optimizer
    assert store.take_epoch_copies(0.0) == []  # taken once
    plain = joined(WeightStore([np.zeros(3, np.float32)], num_workers=2, merge=merge, mode=mode))
    assert plain.take_epoch_copies(0.0) == []
