"""Helpers for tests that talk to a :class:`~sparkdl.server.state.store.WeightStore` directly."""

from __future__ import annotations

from sparkdl.server.state.store import WeightStore

#: Rows each worker joins with: more than any test pushes as samples.
ROWS = 10_000


def joined(store: WeightStore, rows: int = ROWS, attempt: int = 0) -> WeightStore:
    """Joins every worker of ``store`` (as each task does before its first push)."""
    for worker in range(store.num_workers):
        store.join(worker, rows, wait=0.0, attempt=attempt)
    return store
