"""Where a fit's parameter service lives, behind one interface: :class:`FitService`.

A fit talks to its service the same way wherever it runs:

* in the driver, one :class:`~sparkdl.server.state.store.WeightStore` behind one
  :class:`~sparkdl.server.web.service.ParameterService`
  (:class:`~sparkdl.driver.driver_service.DriverService`);
* in the driver, sharded (``service_shards``): one store and one service per shard,
  followed as one :class:`~sparkdl.server.state.sharded.ShardedStore`
  (:class:`~sparkdl.driver.driver_service.ShardedService`);
* in the cluster (``service_placement="cluster"``, the default on Spark Connect): the
  workers host it and the driver follows it through Spark poll jobs
  (:class:`~sparkdl.driver.hosted_service.HostedService`, around
  :class:`~sparkdl.driver.relay.Relay`).

What differs between them is a method of the interface: how the payload learns where
the service is (:meth:`FitService.open`), how the driver's plan of rows per worker
reaches it (:meth:`FitService.plan_rows`), and how the result is read back as the job
ends (:meth:`FitService.finish`, :meth:`FitService.weights`). What the fit's followers
read and decide goes through :attr:`FitService.events`
(:class:`~sparkdl.server.state.events.FitEvents`).

:func:`placement` (before the plan: a service in the cluster may need a task slot for
its polls) and :func:`open_service` (from the plan) are the only places that tell the
variants apart.

Example:
    >>> start = ServiceStart(specs=[], weights=list, metric_merge=lambda: None,
    ...                      history=None, gate_epochs=False, outer_state=None,
    ...                      followed=False)
    >>> start.followed
    False
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from sparkdl.driver import cluster
from sparkdl.driver.driver_service import DriverService, ShardedService
from sparkdl.driver.hosted_service import HostedService
from sparkdl.server.state.sharded import ShardedStore
from sparkdl.server.state.store import WeightStore
from sparkdl.sync.shards import ShardLayout, split_outer

if TYPE_CHECKING:
    from sparkdl.compat.sessions import SessionTools
    from sparkdl.config import TrainConfig
    from sparkdl.contract.payload import WorkerPayload
    from sparkdl.contract.plan import FitPlan
    from sparkdl.server.state.events import FitEvents

__all__ = ["FitService", "Placement", "ServiceStart", "open_service", "placement"]

#: Merges the workers' metric states into an epoch's logs.
MetricMerge = Callable[[Sequence[Any]], dict[str, float]]


class FitService(Protocol):
    """A fit's parameter service, as the fit drives it (wherever it runs)."""

    @property
    def events(self) -> FitEvents:
        """The running fit as the driver's followers read it and tell it."""

    def open(self, stack: contextlib.ExitStack, payload: WorkerPayload) -> WorkerPayload:
        """Starts the service (or the driver's polls of it), stopped by ``stack``;
        returns ``payload`` with what the workers need to reach or host it."""

    def plan_rows(self, payload: WorkerPayload, rows: Sequence[int]) -> WorkerPayload:
        """Gives the service the most training rows each worker may join with, before
        the job starts; returns the payload to run with."""

    def finish(self, rows: list[Any]) -> None:
        """The training job ended with ``rows`` (its result rows): the service's
        history, status and weights are final from now on.

        Raises:
            WorkerError: The service's result is missing from the rows.
        """

    def weights(self) -> list[np.ndarray]:
        """The center weights as training ended (after :meth:`finish`)."""


@dataclass(frozen=True)
class ServiceStart:
    """What a fit's service starts from, besides the plan.

    Attributes:
        specs: ``(shape, dtype)`` of every model weight (how shards split them).
        weights: Reads the model's weights (a service in the driver starts from them).
        metric_merge: Builds the merge of the workers' metric states (a service in the
            driver merges them; its model loads in the background).
        history: Logs of the epochs done before (a resumed fit).
        gate_epochs: Driver callbacks see each synchronous epoch before the workers go on.
        outer_state: The outer optimizer's state to resume from, or ``None``.
        followed: Something on the driver follows the fit as it runs (callbacks,
            checkpoints, progress): a service in the cluster is then polled.
    """

    specs: list[tuple[Any, Any]]
    weights: Callable[[], list[np.ndarray]]
    metric_merge: Callable[[], MetricMerge | None]
    history: dict[str, list[float]] | None
    gate_epochs: bool
    outer_state: tuple[list[np.ndarray], int] | None
    followed: bool

    def layout(self, plan: FitPlan) -> ShardLayout | None:
        """Which part of the weights each shard holds (``None``: one service)."""
        if plan.service_shards == 1:
            return None
        return ShardLayout.plan(self.specs, plan.service_shards)


@dataclass(frozen=True)
class Placement:
    """Where the service runs, resolved before the plan.

    Attributes:
        name: ``"driver"`` or ``"cluster"`` (``service_placement`` resolved).
        host: The address the service binds to (``"executor"``: the host's own).
        local: The service's traffic stays on this machine.
        spare_slot: The driver's polls of a service in the cluster need a task slot
            beside the training job's.
    """

    name: str
    host: str
    local: bool
    spare_slot: bool

    @property
    def hosted(self) -> bool:
        """Whether the workers host the service."""
        return self.name == "cluster"


def placement(config: TrainConfig, tools: SessionTools, *, followed: bool) -> Placement:
    """Where ``config`` puts the service on this session (``"auto"``: in the cluster
    on Spark Connect, else in the driver).

    Args:
        config: The user's settings.
        tools: The session's tools.
        followed: Something on the driver follows the fit as it runs.
    """
    name = config.service_placement
    if name == "auto":
        name = "cluster" if tools.connect else "driver"
    local_master = bool(cluster.parse_local_master(tools.master))
    if name == "cluster":  # the service binds beside a worker: loopback on a local master
        host = "127.0.0.1" if local_master else "executor"
        return Placement(name, host, local_master, spare_slot=followed)
    host = config.service_host or cluster.service_host(tools)
    # Over Spark Connect the service's traffic stays on this machine only when the
    # executors reach this client on loopback.
    local = local_master and (not tools.connect or host == "127.0.0.1")
    return Placement(name, host, local, spare_slot=False)


def open_service(
    plan: FitPlan, start: ServiceStart, *, tools: SessionTools, group: str
) -> FitService:
    """The service ``plan`` asks for: in the cluster, sharded in the driver, or one
    in the driver.

    Args:
        plan: The fit's plan.
        start: What the service starts from.
        tools: The session's tools.
        group: The fit's job group (or tag).
    """
    layout = start.layout(plan)
    if plan.hosted:
        return HostedService(
            plan,
            layout,
            tools=tools,
            group=group,
            history=start.history,
            gate_epochs=start.gate_epochs,
            outer_state=start.outer_state,
            followed=start.followed,
        )
    merge = start.metric_merge()  # (its model loads in the background meanwhile)
    weights = start.weights()
    outer = start.outer_state
    if layout is None:
        store = _store(plan, start, weights, merge, outer)
        return DriverService(store, plan, tools=tools, group=group)
    outers = split_outer(layout, outer[0]) if outer else None
    stores = [
        _store(
            plan,
            start,
            part,
            merge if j == 0 else None,  # shard 0 merges the epochs' metrics
            (outers[j], outer[1]) if outers and outer else None,
        )
        for j, part in enumerate(layout.split(weights))
    ]
    return ShardedService(ShardedStore(stores, layout), plan, tools=tools, group=group)


def _store(
    plan: FitPlan,
    start: ServiceStart,
    weights: list[np.ndarray],
    merge: MetricMerge | None,
    outer: tuple[list[np.ndarray], int] | None,
) -> WeightStore:
    return WeightStore.for_plan(
        plan,
        weights,
        history=start.history,
        gate_epochs=start.gate_epochs,
        metric_merge=merge,
        outer_state=outer,
    )
