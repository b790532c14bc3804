"""The parameter service in the cluster: the workers host it, the driver polls it.

With ``service_placement="cluster"`` (:mod:`sparkdl.executor.hosting`) the payload carries
no URL but a :class:`~sparkdl.contract.payload.Hosting`: what the workers need to start
the service beside worker 0 (or shard ``j`` beside worker ``j``), the driver's plan of
rows per worker among it. The driver follows the fit through its
:class:`~sparkdl.driver.relay.Relay` (Spark poll jobs, started only when something on
the driver follows the fit), and the job's result rows bring the service's history,
status and weights back (:func:`~sparkdl.contract.payload.service_result`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from sparkdl.contract.payload import Hosting, service_result
from sparkdl.driver import cluster
from sparkdl.driver.relay import Relay
from sparkdl.errors import WorkerError
from sparkdl.protocol import wire
from sparkdl.server.web.relay import relay_digest

if TYPE_CHECKING:
    from sparkdl.compat.sessions import SessionTools
    from sparkdl.contract.payload import WorkerPayload
    from sparkdl.contract.plan import FitPlan
    from sparkdl.server.state.events import FitEvents
    from sparkdl.sync.shards import ShardLayout

__all__ = ["HostedService"]


class HostedService:
    """A service the training job's workers host, followed by Spark poll jobs.

    Args:
        plan: The fit's plan.
        layout: Which part of the weights each shard holds (``None``: one service).
        tools: The session's tools.
        group: The fit's job group (or tag): names the fit's files on the executors.
        history: Logs of the epochs done before (a resumed fit).
        gate_epochs: Synchronous workers wait at each epoch's end for the driver's
            callbacks (the relay then brings each epoch's weights).
        outer_state: The outer optimizer's state to resume from, or ``None``.
        followed: Something on the driver follows the fit as it runs: poll it.
    """

    def __init__(
        self,
        plan: FitPlan,
        layout: ShardLayout | None,
        *,
        tools: SessionTools,
        group: str,
        history: dict[str, list[float]] | None,
        gate_epochs: bool,
        outer_state: tuple[list[np.ndarray], int] | None,
        followed: bool,
    ) -> None:
        self._layout = layout
        self._tools = tools
        self._group = group
        self._history = history
        self._gate_epochs = gate_epochs
        self._outer_state = outer_state
        self._followed = followed
        self._relay_token = secrets.token_urlsafe(32)
        self._weights: list[np.ndarray] = []
        self.relay = Relay(
            tools.spark,
            tools,
            group,
            {
                "fit_id": group,
                "token": self._relay_token,
                "timeout": plan.request_timeout,
                "layout": layout.to_json() if layout is not None else None,
            },
            epochs=plan.epochs,
            history=history,
            want_weights=gate_epochs,
        )

    @property
    def events(self) -> FitEvents:
        """The relay: the service's status and epochs as the last poll brought them."""
        return self.relay

    def open(self, stack: contextlib.ExitStack, payload: WorkerPayload) -> WorkerPayload:
        """Starts the relay's polls when the fit is followed (stopped by ``stack``);
        the payload carries what the workers need to host the service."""
        if self._followed:
            self.relay.start()
            stack.callback(self.relay.stop)
        payload = dataclasses.replace(
            payload,
            url="",
            token=secrets.token_urlsafe(32),
            tls_cert=None,
            hosting=self._hosting(),
        )
        if self._layout is not None:
            payload = dataclasses.replace(payload, shard_layout=self._layout.to_json())
        return payload

    def plan_rows(self, payload: WorkerPayload, rows: Sequence[int]) -> WorkerPayload:
        """The payload with the driver's plan of rows per worker (the hosts read it)."""
        assert payload.hosting is not None  # (set by open)
        hosting = dataclasses.replace(payload.hosting, planned_rows=list(rows))
        return dataclasses.replace(payload, hosting=hosting)

    def finish(self, rows: list[Any]) -> None:
        """Reads the hosts' result from the job's rows; the relay catches up with it.

        Raises:
            WorkerError: No host's result came back.
        """
        result = service_result(rows, self._layout)
        if result is None:
            raise WorkerError("The training job ended without the service's result.", {})
        self.relay.finish(result["history"], result["status"], result["weights"], result["outer"])
        self._weights = list(result["weights"])

    def weights(self) -> list[np.ndarray]:
        """The center the hosts returned."""
        return self._weights

    def _hosting(self) -> Hosting:
        """What the workers need to host the service among themselves."""
        outer = self._outer_state
        return Hosting(
            fit_id=self._group,
            relay_digest=relay_digest(self._relay_token),
            gate_epochs=self._gate_epochs,
            history=self._history,
            planned_rows=[],  # set by plan_rows, from how the job partitions the frame
            bind_host="127.0.0.1" if cluster.parse_local_master(self._tools.master) else None,
            outer=(
                b"".join(wire.encode(outer[0], {"pushes": outer[1]})) if outer is not None else None
            ),
        )
