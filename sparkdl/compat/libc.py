"""glibc's ``malloc_trim``: freed heap memory handed back to the operating system.

glibc's allocator returns freed memory to the system only from the top of each heap;
a heap whose top is still in use keeps every free page below it resident.
``malloc_trim(0)`` (a glibc extension, in neither POSIX nor Python) walks each arena
and releases the free pages wherever they lie. :func:`malloc_trim` calls it through
``ctypes`` on the running process's own C library, and does nothing where that library
has no such function (macOS, musl, Windows).

Example:
    >>> isinstance(malloc_trim(), bool)
    True
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

__all__ = ["malloc_trim"]


def malloc_trim() -> bool:
    """Runs glibc's ``malloc_trim(0)``; ``True`` when it released memory.

    ctypes releases the GIL for the call: other threads run while it walks the heaps
    (a few milliseconds for some hundred megabytes), though one that allocates from an
    arena being trimmed waits for that arena.

    Returns:
        ``False`` also where the C library has no ``malloc_trim`` (then it is a no-op).
    """
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(None)  # the process's own symbols: its C library included
        trim = libc.malloc_trim
    except (OSError, TypeError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim
