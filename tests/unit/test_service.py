"""The fit's service behind one interface (sparkdl/driver/service.py): where it goes,
what the payload learns of it, how the plan of rows reaches it, what it gives back.
Real stores and real HTTP services on loopback; no Spark."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from sparkdl.config import TrainConfig
from sparkdl.contract.payload import WorkerPayload
from sparkdl.contract.plan import FitPlan
from sparkdl.driver.service import ServiceStart, open_service, placement
from sparkdl.errors import WorkerError


@dataclass
class Tools:
    """The session facts :func:`placement` and the services read (a classic session
    on a local master, without a SparkContext to check task attempts)."""

    master: str = "local[2]"
    connect: bool = False
    spark: Any = None

    def spark_context(self) -> None:
        return None


def _plan(workers: int = 1, **settings: Any) -> FitPlan:
    placed = settings.pop("service_placement", "driver")
    return FitPlan.resolve(
        TrainConfig(epochs=2, **settings),
        num_workers=workers,
        rows=100,
        threads=1,
        service_host="127.0.0.1",
        service_placement=placed,
    )


def _start(weights: list[np.ndarray], followed: bool = False) -> ServiceStart:
    return ServiceStart(
        specs=[(w.shape, w.dtype) for w in weights],
        weights=lambda: [w.copy() for w in weights],
        metric_merge=lambda: None,
        history=None,
        gate_epochs=False,
        outer_state=None,
        followed=followed,
    )


def _payload(plan: FitPlan) -> WorkerPayload:
    return WorkerPayload(
        plan=plan,
        url="",
        token="",
        model_bytes=None,
        custom_objects=None,
        input_shapes=[],
        label_kinds=[],
    )


def test_the_placement_follows_the_session_and_the_followers() -> None:
    driver = placement(TrainConfig(), Tools(), followed=True)  # type: ignore[arg-type]
    assert (driver.name, driver.host, driver.local, driver.spare_slot) == (
        "driver",
        "127.0.0.1",
        True,
        False,
    )
    config = TrainConfig(service_placement="cluster")
    hosted = placement(config, Tools(master="yarn"), followed=True)  # type: ignore[arg-type]
    assert hosted.hosted and hosted.host == "executor" and hosted.spare_slot
    quiet = placement(config, Tools(), followed=False)  # type: ignore[arg-type]
    assert quiet.host == "127.0.0.1" and not quiet.spare_slot


def test_one_service_in_the_driver_serves_its_store() -> None:
    plan = _plan()
    weights = [np.arange(8, dtype=np.float32).reshape(4, 2)]
    service = open_service(plan, _start(weights), tools=Tools(), group="g")  # type: ignore[arg-type]
    with contextlib.ExitStack() as stack:
        payload = service.open(stack, _payload(plan))
        assert payload.url.startswith("http://127.0.0.1:") and payload.token
        assert payload.hosting is None and payload.shard_urls == ()
        assert service.plan_rows(payload, [100]) is payload
        assert service.events.status()["planned_rows"] == [100]
        service.finish([])
        np.testing.assert_array_equal(service.weights()[0], weights[0])


def test_shards_in_the_driver_each_get_a_service_and_join_back() -> None:
    plan = _plan(workers=2, service_shards=2)
    weights = [np.arange(16, dtype=np.float32).reshape(8, 2)]
    service = open_service(plan, _start(weights), tools=Tools(), group="g")  # type: ignore[arg-type]
    with contextlib.ExitStack() as stack:
        payload = service.open(stack, _payload(plan))
        assert len(set(payload.shard_urls)) == 2 and payload.url == payload.shard_urls[0]
        assert payload.shard_layout is not None
        service.plan_rows(payload, [50, 50])
        assert service.events.status()["planned_rows"] == [50, 50]
        np.testing.assert_array_equal(service.weights()[0], weights[0])


def test_a_service_in_the_cluster_travels_in_the_payload() -> None:
    plan = _plan(service_placement="cluster")
    service = open_service(
        plan,
        _start([np.zeros(2, np.float32)]),
        tools=Tools(),
        group="fit-7",  # type: ignore[arg-type]
    )
    with contextlib.ExitStack() as stack:
        payload = service.open(stack, _payload(plan))
        assert payload.url == "" and payload.token and payload.hosting is not None
        assert payload.hosting.fit_id == "fit-7" and payload.hosting.bind_host == "127.0.0.1"
        planned = service.plan_rows(payload, [100])
        assert planned.hosting is not None and planned.hosting.planned_rows == [100]
        with pytest.raises(WorkerError, match="without the service's result"):
            service.finish([])  # no host's result row came back
