"""Every use sparkdl makes of Python's import machinery beyond ``import``.

* :func:`global_import_lock`: holds the interpreter's global import lock
  (``_imp.acquire_lock()`` / ``release_lock()``, CPython's private ``_imp`` module) for
  a whole import, so that no other thread of the process imports anything new
  meanwhile. ``importlib`` only has per-module locks, and TensorFlow and Keras import
  each other in cycles: two threads importing them by different ways in deadlock
  (Python raises ``_DeadlockError``) or see a partially initialised module.
* :func:`modules_hidden`: marks modules missing in ``sys.modules`` (the value
  ``None``, which makes ``import`` raise ``ModuleNotFoundError``) while an import runs,
  so that Keras takes scikit-learn and matplotlib as not installed (its
  ``try: import sklearn / except ImportError`` path) and does not load them.

``tests/unit/test_compat_shapes.py`` checks both against the running Python.

Example:
    >>> import sys
    >>> with modules_hidden(["no_such_module_here"]) as hidden:
    ...     hidden, sys.modules["no_such_module_here"]
    (['no_such_module_here'], None)
    >>> "no_such_module_here" in sys.modules
    False
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterable, Iterator

__all__ = ["global_import_lock", "modules_hidden"]

_log = logging.getLogger(__name__)


@contextlib.contextmanager
def global_import_lock() -> Iterator[bool]:
    """Holds the interpreter's global import lock while inside.

    Uses ``_imp.acquire_lock()`` and ``_imp.release_lock()``: CPython's import lock, which
    ``import`` of a module not yet loaded waits for (modules already in ``sys.modules``
    import without it). When ``_imp`` lacks them (another Python), holds nothing, logs
    it at debug level and yields ``False``: concurrent imports then race as without it.

    Yields:
        Whether the lock is held.

    Example:
        >>> with global_import_lock() as held:
        ...     import json  # this thread may import while holding it
        >>> held
        True
    """
    try:
        import _imp

        acquire, release = _imp.acquire_lock, _imp.release_lock
    except (ImportError, AttributeError) as exc:
        _log.debug("no global import lock in this Python (%s): imports may race", exc)
        yield False
        return
    acquire()
    try:
        yield True
    finally:
        release()


@contextlib.contextmanager
def modules_hidden(names: Iterable[str]) -> Iterator[list[str]]:
    """Makes ``import name`` raise ``ModuleNotFoundError`` while inside, for each of
    ``names`` not imported yet (those already imported stay usable).

    Sets ``sys.modules[name] = None``, Python's documented way to block an import (see
    the import system's "The module cache"), and removes each mark after, unless
    something replaced it meanwhile. What it relies on is the importer's side: that it
    catches ``ImportError`` and goes on without the module, as Keras does for
    scikit-learn and matplotlib.

    Args:
        names: Top-level module names.

    Yields:
        The names actually hidden.
    """
    hidden = [name for name in names if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        yield hidden
    finally:
        for name in hidden:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
