"""The parameter service in the driver: one store, or one per shard, each served over HTTP.

:class:`DriverService` serves one :class:`~sparkdl.server.state.store.WeightStore`
behind a :class:`~sparkdl.server.web.service.ParameterService` on a driver thread;
:class:`ShardedService` serves each shard's store behind a service of its own (the
same token and certificate; shard ``j`` takes ``port + j`` when a port is set) and
follows them as one :class:`~sparkdl.server.state.sharded.ShardedStore`. Both are
:class:`~sparkdl.driver.service.FitService`\\ s: the workers learn the URL(s), the token
and the certificate from the payload, the driver tells the store its plan of rows
directly, and the center at the end is the store's.

Example:
    >>> import numpy as np
    >>> from sparkdl.sync.merges import Average
    >>> store = WeightStore([np.zeros(2, np.float32)], num_workers=1, merge=Average())
    >>> service = DriverService(store, plan=None, tools=None, group="g")
    >>> service.events is store, service.weights()[0].tolist()
    (True, [0.0, 0.0])
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from sparkdl.server.state.sharded import ShardedStore
from sparkdl.server.state.store import WeightStore
from sparkdl.server.web.attempts import SparkAttempts
from sparkdl.server.web.service import ParameterService
from sparkdl.server.web.tls import Certificate

if TYPE_CHECKING:
    from sparkdl.compat.sessions import SessionTools
    from sparkdl.contract.payload import WorkerPayload
    from sparkdl.contract.plan import FitPlan
    from sparkdl.server.state.events import FitEvents

__all__ = ["DriverService", "ShardedService"]


class DriverService:
    """One store served in the driver.

    Args:
        store: The fit's training state.
        plan: The fit's plan (host, port, TLS).
        tools: The session's tools (Spark's record of task attempts, where it has one).
        group: The fit's job group: only its tasks' attempts are taken.
    """

    def __init__(
        self, store: WeightStore, plan: FitPlan, *, tools: SessionTools | None, group: str
    ) -> None:
        self.store = store
        self._plan = plan
        self._tools = tools
        self._group = group
        #: The services' URLs, in shard order, once open.
        self.urls: list[str] = []

    @property
    def events(self) -> FitEvents:
        """The store itself."""
        return self.store

    @property
    def stores(self) -> list[WeightStore]:
        """The stores served, in shard order."""
        return [self.store]

    def open(self, stack: contextlib.ExitStack, payload: WorkerPayload) -> WorkerPayload:
        """Serves every store (TLS as the plan says), stopped by ``stack``; the payload
        carries the first service's URL, the token and the certificate."""
        urls, token, certificate = self._serve(stack)
        self.urls = urls
        return dataclasses.replace(
            payload, url=urls[0], token=token, tls_cert=certificate.pem if certificate else None
        )

    def plan_rows(self, payload: WorkerPayload, rows: Sequence[int]) -> WorkerPayload:
        """Tells the store (every shard) the driver's plan of rows per worker."""
        self._tell_rows(rows)
        return payload

    def _tell_rows(self, rows: Sequence[int]) -> None:
        """Gives the plan to the store
        (:meth:`~sparkdl.server.state.store.WeightStore.plan_rows`)."""
        self.store.plan_rows(rows)

    def finish(self, rows: list[Any]) -> None:
        """Nothing to read back: the store is in this process."""

    def weights(self) -> list[np.ndarray]:
        """The store's center."""
        return self.store.weights()

    def _serve(self, stack: contextlib.ExitStack) -> tuple[list[str], str, Certificate | None]:
        """One :class:`ParameterService` per store, sharing the token and the
        certificate, started and stopped by ``stack``; their URLs, the token and the
        certificate."""
        plan = self._plan
        certificate = Certificate.make(plan.service_host) if plan.service_tls else None
        sc = self._tools.spark_context() if self._tools is not None else None
        attempts = SparkAttempts(sc, self._group)
        token = secrets.token_urlsafe(32)
        urls = []
        for j, store in enumerate(self.stores):
            service = ParameterService(
                store,
                host=plan.service_host,
                port=plan.port + j if plan.port else 0,  # a set port: shard j takes port + j
                token=token,
                attempts=attempts,
                tls=certificate,
            )
            urls.append(stack.enter_context(service).url)
        return urls, token, certificate


class ShardedService(DriverService):
    """Shard stores served in the driver, followed as one fit.

    Args:
        sharded: The shards' stores and their layout.
        plan: The fit's plan (host, port, TLS).
        tools: The session's tools.
        group: The fit's job group.
    """

    def __init__(
        self, sharded: ShardedStore, plan: FitPlan, *, tools: SessionTools | None, group: str
    ) -> None:
        super().__init__(sharded.stores[0], plan, tools=tools, group=group)
        self.sharded = sharded

    @property
    def events(self) -> FitEvents:
        """The shards followed as one (:class:`~sparkdl.server.state.sharded.ShardedStore`)."""
        return self.sharded

    @property
    def stores(self) -> list[WeightStore]:
        return list(self.sharded.stores)

    def open(self, stack: contextlib.ExitStack, payload: WorkerPayload) -> WorkerPayload:
        """Follows the shards' aborts and serves every shard; the payload also carries
        every shard's URL and the layout."""
        self.sharded.start()
        stack.callback(self.sharded.close)
        payload = super().open(stack, payload)
        return dataclasses.replace(
            payload, shard_urls=tuple(self.urls), shard_layout=self.sharded.layout.to_json()
        )

    def _tell_rows(self, rows: Sequence[int]) -> None:
        self.sharded.plan_rows(rows)

    def weights(self) -> list[np.ndarray]:
        """The whole center, joined from the shards'."""
        return self.sharded.weights()
