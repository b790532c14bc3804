"""The relay's poll task on an executor: one exchange with the service's relay routes.

With ``service_placement="cluster"`` the driver follows the fit by small Spark jobs
(:class:`sparkdl.driver.relay.Relay`); each job's one task runs the function of
:func:`sparkdl.contract.poll_task.poll_function`, which imports this module by name
when it starts. The task reads the service's addresses from the rendezvous file the
workers wrote on its machine (:mod:`sparkdl.contract.rendezvous`), sends the driver's
query to every shard's relay routes (:mod:`sparkdl.server.web.relay`) at once, and
answers the joined status, and the weights of a newly closed epoch when the driver
wants them, as rows of :data:`~sparkdl.contract.poll_task.POLL_SCHEMA`. It lives on the
executor side so that the executor's Python worker imports no driver module.

Example:
    >>> _CHUNK
    4194304
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["poll_rows"]

#: Bytes of weights per row: a closed epoch's weights span as many rows as they need.
_CHUNK = 4 << 20


def poll_rows(request: dict[str, Any]) -> pa.RecordBatch:
    """One exchange with the service's relay routes, as rows of
    :data:`~sparkdl.contract.poll_task.POLL_SCHEMA`.

    Args:
        request: What the driver sent (:func:`sparkdl.contract.poll_task.poll_function`).

    Returns:
        One ``"missing"`` row when no rendezvous is on this machine or the service did
        not answer; else the ``"status"`` row and the ``"weights"`` rows.

    Example:
        >>> poll_rows({"fit_id": "no-such-fit"}).column("kind").to_pylist()
        ['missing']
    """
    import pyarrow as pa

    from sparkdl.contract.rendezvous import read_rendezvous
    from sparkdl.errors import ServiceError

    kinds: list[str] = []
    parts: list[int] = []
    bodies: list[bytes] = []

    def add(kind: str, body: bytes, part: int = 0) -> None:
        kinds.append(kind)
        parts.append(part)
        bodies.append(body)

    found = read_rendezvous(request["fit_id"])
    if found is None:
        add("missing", b"no rendezvous on this executor yet")
    else:
        try:
            status, blob = _exchange(request, found)
            add("status", status)
            for i in range(0, len(blob), _CHUNK):
                add("weights", blob[i : i + _CHUNK], i // _CHUNK)
        except (ServiceError, OSError, ValueError) as exc:
            add("missing", f"the service did not answer: {exc}"[:1000].encode())
    return pa.RecordBatch.from_pydict(
        {"kind": kinds, "part": parts, "body": bodies},
        schema=pa.schema([("kind", pa.string()), ("part", pa.int32()), ("body", pa.binary())]),
    )


def _exchange(request: dict[str, Any], found: dict[str, Any]) -> tuple[bytes, bytes]:
    """The relay's exchange with every shard of the service at once: the joined status
    (JSON) and, when the driver wants them, the weights of a newly closed epoch (wire
    format, empty if none)."""
    from concurrent.futures import ThreadPoolExecutor

    from sparkdl.errors import ServiceError
    from sparkdl.protocol import wire
    from sparkdl.protocol.client import ServiceClient
    from sparkdl.sync.shards import joined_status

    query = dict(request["query"])
    urls, certs = list(found["urls"]), list(found["certs"])
    clients = [
        ServiceClient(
            url,
            request["token"],
            worker=0,
            timeout=max(float(request["timeout"]), float(query.get("wait", 0)) + 5),
            retries=1,
            tls_cert=cert.encode() if cert else None,
        )
        for url, cert in zip(urls, certs, strict=True)
    ]

    def get(j: int, path: str) -> bytes:
        status, data = clients[j].get(path)
        if status != 200:
            raise ServiceError(f"relay answered {status}: {bytes(data)[:300]!r}")
        return bytes(data)

    def weights(j: int, epoch: int) -> tuple[list[np.ndarray], dict[str, Any]] | None:
        status, data = clients[j].get(f"/relay/weights?epoch={epoch}")
        return wire.decode(bytes(data)) if status == 200 else None

    try:
        with ThreadPoolExecutor(len(clients)) as pool:
            path = f"/relay?{urlencode(query)}"
            statuses = [json.loads(b) for b in pool.map(lambda j: get(j, path), range(len(urls)))]
            status = statuses[0] if len(urls) == 1 else joined_status(statuses)
            blob = b""
            known = int(status.get("epochs_done", 0))
            if request["fetched"] is not None and known - 1 > request["fetched"]:
                parts = list(pool.map(lambda j: weights(j, known - 1), range(len(urls))))
                if all(p is not None for p in parts):
                    blob = _joined_weights(
                        [p for p in parts if p is not None], request.get("layout"), known - 1
                    )
    finally:
        for client in clients:
            client.close()
    return json.dumps(status).encode(), blob


def _joined_weights(
    parts: list[tuple[list[np.ndarray], dict[str, Any]]],
    layout: dict[str, Any] | None,
    epoch: int,
) -> bytes:
    """Every shard's answer of ``/relay/weights`` (its part of the weights, then of the
    outer optimizer's state) as one answer for the whole model (wire format)."""
    from sparkdl.protocol import wire
    from sparkdl.sync.shards import ShardLayout, join_outer

    meta: dict[str, Any] = {"epoch": epoch}
    if len(parts) == 1:
        arrays = parts[0][0]
        meta.update({k: v for k, v in parts[0][1].items() if k == "outer_pushes"})
    else:
        shards = ShardLayout.from_json(layout or {})
        sizes = [len(pieces) for pieces in shards.shards]
        arrays = shards.join([a[:n] for (a, _), n in zip(parts, sizes, strict=True)])
        if "outer_pushes" in parts[0][1]:
            states = [(a[n:], 0) for (a, _), n in zip(parts, sizes, strict=True)]
            arrays = arrays + join_outer(shards, states)
            meta["outer_pushes"] = parts[0][1]["outer_pushes"]
    return b"".join(wire.encode([np.asarray(a) for a in arrays], meta))
