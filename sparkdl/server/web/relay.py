"""The relay's service half: what a client that cannot reach the service reads and tells.

With ``service_placement="cluster"`` the parameter service runs beside a worker and
the user's process (a Spark Connect client, say) never connects to it: it runs small
Spark jobs whose one task calls these routes from inside the cluster
(:mod:`sparkdl.driver.relay`, the client half). They carry what the driver's threads would
otherwise call on the store (:class:`~sparkdl.server.state.events.FitEvents`): the status and
history, an epoch's weights for the callbacks, the epoch gate's release, a callback's
``stop_training`` or learning rate, and an abort.

They answer only the relay's own token, which the workers never hold: the service
keeps its SHA-256 digest (:func:`relay_digest`), and the workers' token opens none of
these routes (nor the relay's token theirs). Every number is checked against the fit.

Routes:
    ``GET /relay?known=K&wait=S&released=R&stop=0|1&lr=X&abort=TEXT``: applies what the
        client decided (the gate released through epoch R - 1, the stop flag, a new
        learning rate, an abort), waits up to S seconds for epoch K + 1 to close, and
        answers the service's JSON status.
    ``GET /relay/weights?epoch=E``: the center as epoch E ended (wire format), then
        the outer optimizer's state when the fit has one (``outer_pushes`` in the
        metadata).

Example:
    >>> len(relay_digest("secret"))
    64
"""

from __future__ import annotations

import hashlib
import hmac
import math
from typing import Any

from flask import request

from sparkdl.protocol import wire
from sparkdl.server.state.store import WeightStore
from sparkdl.server.web.parse import BadArg, int_arg

__all__ = ["PREFIX", "RelayRoutes", "is_relay_path", "relay_digest", "token_matches"]

#: Every relay route's path starts here.
PREFIX = "/relay"
_MAX_REASON = 500


def relay_digest(token: str) -> str:
    """The SHA-256 (hex) the service keeps of the relay's token."""
    return hashlib.sha256(token.encode()).hexdigest()


def is_relay_path(path: str) -> bool:
    """Whether ``path`` is one of the relay's routes."""
    return path == PREFIX or path.startswith(PREFIX + "/")


def token_matches(header: str, digest: str) -> bool:
    """Whether an ``Authorization`` header carries the token of ``digest`` (constant
    time over the digests)."""
    given = header[len("Bearer ") :] if header.startswith("Bearer ") else ""
    found = hashlib.sha256(given.encode("utf-8", "replace")).hexdigest()
    return hmac.compare_digest(found, digest)


class RelayRoutes:
    """The relay's handlers over ``store``; :func:`sparkdl.server.web.app.create_app`
    registers them and answers what they return."""

    def __init__(self, store: WeightStore) -> None:
        self.store = store
        self.epochs = int(store.epochs or 0)

    def exchange(self, wait: float) -> dict[str, Any]:
        """``GET /relay``: applies the client's decisions, long-polls the next epoch
        (up to ``wait`` seconds), returns the status."""
        store = self.store
        known = self._epoch_arg("known", 0)
        released = self._epoch_arg("released", 0)
        stop = request.args.get("stop", "0")
        if stop not in ("0", "1"):
            raise BadArg(f"Expected 'stop' to be 0 or 1. Received: {stop[:20]!r}")
        rate = _rate_arg()
        reason = request.args.get("abort")
        if reason is not None:
            store.abort(f"the driver aborted the fit: {reason[:_MAX_REASON]}")
        if stop == "1":
            store.request_stop()
        if rate is not None:
            store.set_learning_rate(rate)
        for epoch in range(released):  # idempotent: only a held epoch is let go
            store.release(epoch)
        store.wait_epochs(known + 1, wait)
        return store.status()

    def weights(self) -> list[Any]:
        """``GET /relay/weights``: the wire chunks of the center as an epoch ended."""
        epoch = int_arg("epoch", 0)
        if epoch >= max(self.epochs, 1):
            raise BadArg(f"Expected 'epoch' below {self.epochs}. Received: {epoch}")
        weights, outer = self.store.epoch_state(epoch, wait=0.0)
        arrays = list(weights)
        meta: dict[str, Any] = {"epoch": epoch}
        if outer is not None:  # the outer optimizer's state follows, for checkpoints
            arrays += outer[0]
            meta["outer_pushes"] = outer[1]
        return wire.encode(arrays, meta)

    def _epoch_arg(self, name: str, default: int) -> int:
        value = int_arg(name, default)
        if value > self.epochs:
            raise BadArg(f"Expected '{name}' of at most {self.epochs} epochs. Received: {value}")
        return value


def _rate_arg() -> float | None:
    raw = request.args.get("lr")
    if raw is None:
        return None
    try:
        rate = float(raw)
    except ValueError:
        rate = math.nan
    if not math.isfinite(rate) or rate <= 0:
        raise BadArg(f"Expected 'lr' to be a finite number > 0. Received: {raw[:30]!r}")
    return rate
