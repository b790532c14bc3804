"""The one exception the service's state raises: a refused request and its HTTP status.

Nothing below the Flask routes knows about HTTP beyond this status number.

Example:
    >>> StoreError(409, "Training was aborted.").status
    409
"""

from __future__ import annotations

__all__ = ["StoreError"]


class StoreError(Exception):
    """A request the service refuses; ``status`` is the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
