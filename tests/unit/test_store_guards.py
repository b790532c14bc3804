"""The store refuses what a token holder could use to poison or stall a fit.

Each refusal is checked to leave the training state as it was: the center, its
version, the samples and sequence numbers, the workers' attempts and the history.
"""

from __future__ import annotations

import json
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from benchmarks.fuzz_service import training_state
from sparkdl.protocol import wire
from sparkdl.server.state.store import SEQ_WINDOW, StoreError, WeightStore
from sparkdl.sync.merges import Average, Delta, Elastic, is_float

ROWS = 100


def make(mode: str, merge: Any, dtype: Any = np.float32, workers: int = 2) -> WeightStore:
    store = WeightStore([np.zeros(3, dtype)], num_workers=workers, merge=merge, mode=mode)
    for worker in range(workers):
        store.join(worker, ROWS, wait=0.0)
    return store


def send(store: WeightStore, worker: int = 0, *, value: float = 1.0, **kw: Any) -> int:
    kw.setdefault("seq", 1)
    kw.setdefault("attempt", 0)
    kw.setdefault("base_version", store.version)
    kw.setdefault("samples", 10)
    kw.setdefault("meta", {})
    dtype = store.weights()[0].dtype
    arrays = kw.pop("arrays", [np.full(3, value, dtype)])
    return store.push(worker, arrays=arrays, **kw)


STORES = {
    "async-delta": lambda: make("asynchronous", Delta()),
    "async-elastic": lambda: make("asynchronous", Elastic()),
    "hogwild-delta": lambda: make("hogwild", Delta()),
    "hogwild-elastic": lambda: make("hogwild", Elastic()),
    "sync-delta": lambda: make("synchronous", Delta()),
    "sync-elastic": lambda: make("synchronous", Elastic()),
}


@pytest.mark.parametrize("name", sorted(STORES))
def test_a_push_that_would_overflow_the_center_is_refused(name: str) -> None:
    """Two pushes of 3e38 deltas would make the center inf: the one that would is
    refused, the center stays finite and keeps serving honest pushes."""
    store = STORES[name]()
    big = 3e38
    send(store, 0, value=big, seq=1)
    before = training_state(store)
    with pytest.raises(StoreError, match="past the range of float32") as info:
        send(store, 1, value=big, seq=1)
    assert info.value.status == 400
    assert training_state(store) == before
    if store.mode.barrier:  # close the round with an honest push of worker 1
        send(store, 1, value=0.0, seq=1)
    assert np.isfinite(store.weights()[0]).all()
    send(store, 0, value=1.0, seq=2, base_version=store.version)  # an honest push
    if store.mode.barrier:
        send(store, 1, value=1.0, seq=2, base_version=store.version - 1)
    assert np.isfinite(store.weights()[0]).all()


def test_an_average_is_never_refused_for_its_size() -> None:
    """An average stays within the values averaged: 16 workers of float16 weights
    near its limit still merge (a sum of their magnitudes would pass 65504)."""
    store = make("synchronous", Average(), dtype=np.float16, workers=16)
    for worker in range(16):
        send(store, worker, value=5000.0)
    assert store.version == 1
    np.testing.assert_array_equal(store.weights()[0], [5000.0] * 3)


def test_samples_cannot_exceed_the_rows_the_worker_joined_with() -> None:
    store = make("synchronous", Average())
    before = training_state(store)
    with pytest.raises(StoreError, match="100 rows") as info:
        send(store, 0, samples=2**61)
    assert info.value.status == 400 and training_state(store) == before
    send(store, 0, value=2.0, samples=ROWS)
    send(store, 1, value=4.0, samples=ROWS)
    np.testing.assert_array_equal(store.weights()[0], [3.0, 3.0, 3.0])


def planned(mode: str, rows: list[int]) -> WeightStore:
    """A store as a fit makes it: the driver's planned rows set before any worker joins."""
    store = WeightStore(
        [np.zeros(3, np.float32)], num_workers=len(rows), merge=Average(), mode=mode
    )
    store.plan_rows(rows)
    return store


@pytest.mark.parametrize("mode", ["synchronous", "asynchronous", "hogwild"])
def test_a_join_or_rejoin_cannot_raise_a_worker_past_its_planned_rows(mode: str) -> None:
    """Issue 35: a re-join with the same attempt and rows=2**62-1 was answered 200 and
    lifted the samples bound. Rows come from the driver's plan: more than the plan's
    total leaves the worker, given the others' rows, is a 400 that changes nothing, on a
    first join, a re-join of the same attempt or a retry."""
    store = planned(mode, [100, 50])
    with pytest.raises(StoreError, match="counted 150 for the fit") as info:
        store.join(1, 151, wait=0.0)
    assert info.value.status == 400 and store.status()["joined_rows"] == {}
    for worker, rows in ((0, 100), (1, 50)):
        store.join(worker, rows, wait=0.0)
    before = training_state(store), store.status()["joined_rows"], store.status()["generation"]
    for attempt, rows in ((0, 2**62 - 1), (0, 101), (5, 2**62 - 1)):
        with pytest.raises(StoreError, match="cannot raise its row count") as info:
            store.join(0, rows, wait=0.0, attempt=attempt)
        assert info.value.status == 400
        status = store.status()
        assert (training_state(store), status["joined_rows"], status["generation"]) == before
    assert status["planned_rows"] == [100, 50] and status["joined_rows"] == {"0": 100, "1": 50}
    # The bound on a push stays the planned rows: 2**61 samples, or one more than planned.
    for samples in (2**61, 101):
        with pytest.raises(StoreError, match="joined with 100 rows") as info:
            send(store, 0, samples=samples)
        assert info.value.status == 400 and training_state(store) == before[0]
    # A retried task rejoins with its real rows (a synchronous one then waits for the
    # others to rejoin too).
    store.join(0, 90, wait=0.0, attempt=1)
    assert store.status()["joined_rows"] == {"0": 90, "1": 50}


def test_an_inflated_samples_claim_cannot_skew_a_synchronous_average() -> None:
    """Issue 35's figure: a worker pushing all 100s against an honest one pushing all 0s,
    each holding 100 rows, moved the sample-weighted mean to 100.0 after a re-join with
    2**62-1 rows and a push claiming 2**61 samples; the mean must stay 50.0."""
    store = planned("synchronous", [100, 100])
    for worker in range(2):
        store.join(worker, 100, wait=0.0)
    with pytest.raises(StoreError):
        store.join(0, 2**62 - 1, wait=0.0)
    with pytest.raises(StoreError):
        send(store, 0, value=100.0, samples=2**61)
    send(store, 0, value=100.0, samples=100)
    send(store, 1, value=0.0, samples=100)
    np.testing.assert_array_equal(store.weights()[0], [50.0, 50.0, 50.0])


def test_planned_rows_are_one_count_per_worker() -> None:
    store = WeightStore([np.zeros(3, np.float32)], num_workers=2, merge=Average())
    for bad in ([100], [100, 100, 100], [100, -1]):
        with pytest.raises(ValueError, match="one per worker"):
            store.plan_rows(bad)
    assert store.status()["planned_rows"] is None


def test_a_worker_pushes_only_after_it_joined() -> None:
    store = WeightStore(
        [np.zeros(3, np.float32)], num_workers=2, merge=Delta(), mode="asynchronous"
    )
    with pytest.raises(StoreError, match="join") as info:
        send(store, 0)
    assert info.value.status == 409 and store.version == 0
    store.join(0, ROWS, wait=0.0)
    assert send(store, 0) == 1


def test_sequence_numbers_are_taken_only_just_after_the_last_applied_one() -> None:
    store = make("asynchronous", Delta())
    send(store, 0, seq=1)
    before = training_state(store)
    with pytest.raises(StoreError, match="sequence number") as info:
        send(store, 0, seq=2**62 - 1)
    assert info.value.status == 400 and training_state(store) == before
    with pytest.raises(StoreError, match="sequence number"):
        send(store, 0, seq=2 + SEQ_WINDOW)
    assert send(store, 0, seq=2) == 2  # the honest next push is applied
    assert send(store, 0, seq=2 + SEQ_WINDOW) == 3  # within the window
    np.testing.assert_array_equal(store.weights()[0], [3.0, 3.0, 3.0])


BAD_META: list[tuple[str, dict[str, Any]]] = [
    ("huge loss", {"loss": 10**400}),
    ("NaN loss", {"loss": float("nan")}),
    ("inf loss", {"loss": float("inf")}),
    ("string loss", {"loss": "low"}),
    ("NaN in epoch logs", {"epoch": 0, "epoch_logs": {"loss": float("nan")}}),
    ("huge value in epoch logs", {"epoch": 0, "epoch_logs": {"loss": 10**400}}),
    ("logs not a dict", {"epoch": 0, "epoch_logs": [1, 2]}),
    ("nested logs", {"epoch": 0, "epoch_logs": {"loss": {"a": 1}}}),
    ("too many logs", {"epoch": 0, "epoch_logs": {f"m{i}": 1.0 for i in range(5000)}}),
    ("a loss too large to weigh", {"loss": 1e300}),
    ("epoch a string", {"epoch": "0"}),
    ("epoch negative", {"epoch": -1}),
    ("epoch huge", {"epoch": 2**40}),
    ("step a float", {"epoch": 0, "step": 1.5}),
    ("comm seconds inf", {"comm_seconds": float("inf")}),
    ("comm seconds negative", {"comm_seconds": -1.0}),
    ("epoch samples too many", {"epoch": 0, "epoch_logs": {}, "epoch_samples": 2**61}),
    ("validation samples a string", {"epoch": 0, "epoch_logs": {}, "val_samples": "5"}),
    ("states not an object", {"epoch": 0, "epoch_logs": {}, "epoch_states": [[1.0]]}),
    ("states of another kind", {"epoch": 0, "epoch_logs": {}, "epoch_states": {"x": None}}),
    ("a state not a list", {"epoch": 0, "epoch_logs": {}, "epoch_states": {"train": [1.0]}}),
    ("a NaN state", {"epoch": 0, "epoch_logs": {}, "epoch_states": {"val": [[float("nan")]]}}),
    ("a huge state", {"epoch": 0, "epoch_logs": {}, "epoch_states": {"train": [[10**400]]}}),
    ("a string state", {"epoch": 0, "epoch_logs": {}, "epoch_states": {"train": [["1.0"]]}}),
    ("a bool state", {"epoch": 0, "epoch_logs": {}, "epoch_states": {"train": [[True]]}}),
    ("too many states", {"epoch": 0, "epoch_states": {"train": [[0.0] * 70_000] * 2}}),
    ("too many variables", {"epoch": 0, "epoch_states": {"train": [[]] * 5000}}),
]


@pytest.mark.parametrize("mode", ["synchronous", "asynchronous", "hogwild"])
@pytest.mark.parametrize("case", BAD_META, ids=[name for name, _ in BAD_META])
def test_bad_metadata_is_refused_before_anything_changes(
    mode: str, case: tuple[str, dict[str, Any]]
) -> None:
    store = make(mode, Delta())
    send(store, 0, seq=1, meta={"loss": 0.5, "epoch": 0, "step": 1})
    before = training_state(store)
    version = store.version
    with pytest.raises(StoreError) as info:
        send(store, 0, seq=2, attempt=7, meta=case[1])
    assert info.value.status == 400, info.value.message
    assert training_state(store) == before and store.version == version
    json.loads(json.dumps(store.status(), allow_nan=False))  # valid JSON
    # The refused push's attempt number fenced nothing: attempt 0 still pushes.
    send(store, 0, seq=2, base_version=store.version, meta={"loss": 0.25})


def test_bfloat16_is_a_float_everywhere() -> None:
    bf16 = np.dtype(ml_dtypes.bfloat16)
    assert is_float(np.zeros(1, bf16))
    store = make("synchronous", Average(), dtype=bf16)
    bad = np.array([1.0, np.nan, 2.0], bf16)
    before = training_state(store)
    with pytest.raises(StoreError, match="NaN or infinite"):
        send(store, 0, arrays=[bad])
    assert training_state(store) == before
    send(store, 0, value=1.0, samples=30)
    send(store, 1, value=2.0, samples=10)
    merged = store.weights()[0]
    assert merged.dtype == bf16
    np.testing.assert_allclose(merged.astype(np.float32), [1.25, 1.25, 1.25])  # weighted mean


def test_an_unhashable_dtype_in_the_header_is_a_wire_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for odd in (["float32"], {"name": "float32"}, 32, None):
        with monkeypatch.context() as patch:  # the sender names the dtype as it likes
            patch.setattr(wire, "_dtype_name", lambda dtype, odd=odd: odd)
            body = wire.encode_bytes([np.zeros(3, np.float32)], {"worker": 0})
        with pytest.raises(wire.WireError, match="expected dtype"):
            wire.decode(body)


def test_a_metric_missing_from_an_epoch_keeps_the_history_aligned_and_status_json() -> None:
    from sparkdl.server.web.app import create_app

    store = make("asynchronous", Delta(), workers=1)
    logs = [{"loss": 1.0, "auc": 0.5}, {"loss": 0.5, "auc": None}, {"loss": 0.25}]
    for epoch, metrics in enumerate(logs):
        meta = {"epoch": epoch, "epoch_logs": metrics, "epoch_samples": 10}
        send(store, 0, seq=epoch + 1, meta=meta)
    history = store.history()
    assert history["loss"] == [1.0, 0.5, 0.25]
    assert history["auc"][0] == 0.5 and np.isnan(history["auc"][1:]).all()
    assert store.status()["epochs_done"] == 3
    client = create_app(store, token="t").test_client()
    answer = client.get("/status", headers={"Authorization": "Bearer t"})
    assert answer.status_code == 200
    status = json.loads(answer.data, parse_constant=lambda name: pytest.fail(name))
    assert status["history"]["auc"] == [0.5, None, None]


def _merge_sum(parts: Any) -> dict[str, float]:
    """A merge whose result is the first state variable's total (a count)."""
    if any(len(p) != 1 for p in parts):
        raise ValueError("a worker sent other metric variables than the model has")
    return {"count": float(sum(p[0][0] for p in parts)), "not_logged": 1.0}


def test_epoch_metrics_come_from_the_summed_states_and_fall_back_to_averages() -> None:
    store = WeightStore(
        [np.zeros(3, np.float32)], num_workers=2, merge=Delta(), metric_merge=_merge_sum
    )
    for worker in range(2):
        store.join(worker, ROWS, wait=0.0)

    def close(epoch: int, states: list[Any]) -> None:
        for worker, state in enumerate(states):
            meta = {
                "epoch": epoch,
                "epoch_logs": {"loss": 1.0 + worker, "count": 10.0 * (worker + 1)},
                "epoch_samples": 10 * (worker + 1),
                "epoch_states": state,
            }
            send(store, worker, seq=epoch + 1, base_version=store.version, meta=meta)

    close(0, [{"train": [[3.0]]}, {"train": [[4.0]]}])  # merged: 7
    close(1, [{"train": [[3.0]]}, None])  # a worker without states: averages
    close(2, [{"train": [[3.0]]}, {"train": [[4.0, 5.0], [1.0]]}])  # do not fit: averages
    history = store.history()
    assert history["count"] == [7.0, 50 / 3, 50 / 3]
    assert history["loss"] == [5 / 3] * 3  # not in the merge: rows' mean
    assert "not_logged" not in history  # only what the workers logged
