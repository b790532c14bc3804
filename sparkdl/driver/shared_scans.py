"""Data scans shared by the fits of one hyper-parameter search.

Every fit checks its prepared data with one Spark job (:func:`~sparkdl.driver.data_scan.
summarize`). The trials of a search (:mod:`sparkdl.search`) read the same DataFrame
with the same columns, so while a search runs (:func:`sharing`) a scan's summary is kept
by what decides it: the prepared frame's semantic hash (its columns, casts, padding and
shape checks: everything the scan reads) and the scan's own arguments. A trial whose
prepared frame is the same as an earlier trial's takes that summary without a job; one
that starts while another runs the same scan waits for it. A scan that fails is not
kept (each fit then reports it). Outside a search nothing is kept. Spark ML's tuners
(``CrossValidator``, ``TrainValidationSplit``) fit one model per param map from parallel
threads through the estimator's ``fitMultiple``: those fits share scans too
(:class:`SharingFits`).

Example:
    >>> with sharing():
    ...     first = summary(("frame", 1), lambda: "scanned")
    ...     second = summary(("frame", 1), lambda: "scanned again")
    >>> first, second, summary(("frame", 1), lambda: "outside a search")
    ('scanned', 'scanned', 'outside a search')
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Hashable, Iterator
from typing import Any, TypeVar

__all__ = ["SharingFits", "frame_key", "sharing", "summary"]

T = TypeVar("T")

_lock = threading.RLock()  # reentrant: SharingFits may close in a finalizer
_users = 0
_kept: dict[Hashable, Any] = {}
_running: dict[Hashable, threading.Lock] = {}


@contextlib.contextmanager
def sharing() -> Iterator[None]:
    """Keeps scans' summaries while the block runs (searches may nest or overlap; the
    summaries go when the last one ends)."""
    global _users
    with _lock:
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                _kept.clear()
                _running.clear()


def summary(key: Hashable | None, scan: Callable[[], T]) -> T:
    """``scan()``'s result, or the one kept under ``key`` while a search shares scans
    (``key`` ``None``: the frame has no stable key, so it is scanned)."""
    if key is None:
        return scan()
    with _lock:
        if _users == 0:
            sharing_now = False
        else:
            sharing_now = True
            if key in _kept:
                return _kept[key]
            gate = _running.setdefault(key, threading.Lock())
    if not sharing_now:
        return scan()
    with gate:  # a second fit of the same scan waits for the first
        with _lock:
            if key in _kept:
                return _kept[key]
        found = scan()
        with _lock:
            if _users:
                _kept[key] = found
        return found


def frame_key(frame: Any, *parts: Hashable) -> Hashable | None:
    """What decides a scan of ``frame``: its semantic hash and ``parts``; ``None`` when
    the session cannot hash the plan (nothing is then shared)."""
    try:
        return (int(frame.semanticHash()), *parts)
    except Exception:  # a session without semanticHash: every fit scans
        return None


class SharingFits:
    """Spark ML's ``fitMultiple`` iterator, its fits sharing scans (:func:`sharing`)
    from its creation until its last model was taken (or it is dropped).

    ``CrossValidator`` and ``TrainValidationSplit`` take ``(index, model)`` pairs from
    it in several threads at once; the fits of one fold read the same DataFrame, so they
    share that fold's scan.

    Args:
        fits: What ``Estimator.fitMultiple`` returned (thread-safe, one fit per ``next``).
        count: The number of param maps.

    Example:
        >>> from sparkdl.driver import shared_scans
        >>> fits = SharingFits(iter([(0, "model")]), 1)
        >>> shared_scans._users  # sharing while a model is still to come
        1
        >>> next(fits), shared_scans._users
        ((0, 'model'), 0)
    """

    def __init__(self, fits: Iterator[Any], count: int) -> None:
        self._fits = fits
        self._left = count
        self._count_lock = threading.Lock()
        self._sharing: contextlib.ExitStack | None = contextlib.ExitStack()
        self._sharing.enter_context(sharing())
        if count == 0:
            self._close()

    def __iter__(self) -> SharingFits:
        return self

    def __next__(self) -> Any:
        try:
            found = next(self._fits)
        except BaseException:
            self._close()
            raise
        with self._count_lock:
            self._left -= 1
            last = self._left <= 0
        if last:
            self._close()
        return found

    def _close(self) -> None:
        with self._count_lock:
            stack, self._sharing = self._sharing, None
        if stack is not None:
            stack.close()

    def __del__(self) -> None:
        self._close()
