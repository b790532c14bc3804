"""Where a worker's cached rows live: append-only bytes in memory or in a file.

* :class:`MemorySpool`: an anonymous memory map grown by ``mremap`` (no copy when it
  grows, so the partition costs its own bytes and no more).
* :class:`FileSpool`: an unnamed temporary file under the executor's Spark local
  directories (:func:`local_dir`): the kernel removes it when it is closed or the
  process dies, so a failed or killed task leaves nothing behind.

A :class:`Budget` is the bytes the memory spools of one task may take together.

Example:
    >>> budget = Budget(100)
    >>> budget.take(60), budget.take(60)
    (True, False)
"""

from __future__ import annotations

import contextlib
import gc
import mmap
import os
import tempfile
from typing import Any

import numpy as np

__all__ = ["Budget", "FileSpool", "MemorySpool", "local_dir"]


class Budget:
    """Bytes of memory that the ``"auto"`` caches of one task may hold together.

    Args:
        limit: The bytes; the cache whose append passes them moves to disk.

    Example:
        >>> budget = Budget(100)
        >>> budget.take(60), budget.take(60), budget.held
        (True, False, 120)
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, nbytes: int) -> bool:
        """Counts ``nbytes`` more held in memory; whether the total stays in the limit."""
        self.held += nbytes
        return self.held <= self.limit

    def give(self, nbytes: int) -> None:
        """Counts ``nbytes`` no longer held in memory (a cache moved to disk)."""
        self.held -= nbytes


class MemorySpool:
    """Append-only bytes in an anonymous memory map that grows without copying."""

    def __init__(self, capacity: int = 1 << 20) -> None:
        # Private: a shared anonymous map (Python's default) cannot grow in place, its
        # pages past the first size would raise SIGBUS.
        self._map = mmap.mmap(-1, max(capacity, mmap.PAGESIZE), flags=mmap.MAP_PRIVATE)
        self.nbytes = 0

    def reserve(self, nbytes: int) -> None:
        """Makes room for ``nbytes`` more bytes.

        Raises:
            OSError: The map cannot grow (ENOMEM: the address space is capped, as
                ``spark.executor.pyspark.memory`` caps a Python worker's).
        """
        end = self.nbytes + nbytes
        if end > len(self._map):
            # mremap: pages move, no copy. Growing by a quarter keeps the address
            # space (RLIMIT_AS under spark.executor.pyspark.memory) near the data.
            self._map.resize(max(end, len(self._map) + len(self._map) // 4, 1 << 20))

    def write(self, data: np.ndarray) -> None:
        """Appends ``data``'s bytes."""
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8).data
        self.reserve(raw.nbytes)
        end = self.nbytes + raw.nbytes
        self._map[self.nbytes : end] = raw
        self.nbytes = end

    def read(self, dtype: Any, start: int, count: int) -> np.ndarray:
        """``count`` items of ``dtype`` from item ``start``: a view, no copy."""
        size = np.dtype(dtype).itemsize
        return np.frombuffer(self._map, dtype, count, start * size)

    def copy_to(self, other: FileSpool) -> None:
        """Writes everything held so far to ``other`` (a spill to disk)."""
        step = 64 << 20
        for lo in range(0, self.nbytes, step):
            other.write(np.frombuffer(self._map, np.uint8, min(step, self.nbytes - lo), lo))

    def close(self) -> None:
        """Frees the memory (views taken by :meth:`read` must be gone)."""
        try:
            self._map.close()
        except BufferError:  # a view (a finished pipeline's) awaits the collector
            gc.collect()
            with contextlib.suppress(BufferError):  # else the map goes with the view
                self._map.close()


class FileSpool:
    """Append-only bytes in an unnamed temporary file, read back with ``pread``."""

    def __init__(self, directory: str) -> None:
        # Closed by close(); O_TMPFILE: the file has no name and dies with the process.
        self._file = tempfile.TemporaryFile(dir=directory, prefix="sparkdl-cache-")  # noqa: SIM115
        self._fd = self._file.fileno()
        self.nbytes = 0

    def write(self, data: np.ndarray) -> None:
        """Appends ``data``'s bytes."""
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8).data
        done = 0
        while done < raw.nbytes:
            done += os.pwrite(self._fd, raw[done:], self.nbytes + done)
        self.nbytes += raw.nbytes

    def read(self, dtype: Any, start: int, count: int) -> np.ndarray:
        """``count`` items of ``dtype`` from item ``start``, read from the file."""
        size = np.dtype(dtype).itemsize
        out = np.empty(count, dtype)
        view = out.view(np.uint8).data
        done = 0
        while done < view.nbytes:
            got = os.preadv(self._fd, [view[done:]], start * size + done)
            if got <= 0:
                raise OSError(f"sparkdl's cache file ended early ({done} of {view.nbytes}).")
            done += got
        return out

    def close(self) -> None:
        """Closes the file, which removes it."""
        self._file.close()


def local_dir() -> str:
    """The directory for cache files: one of Spark's local directories.

    Spark gives its Python workers the executor's ``SPARK_LOCAL_DIRS`` (the block
    manager's directories, where shuffle files go); a task picks one by its pid so
    that tasks of one executor spread over the disks. Outside Spark: the temp dir.
    """
    dirs = [d for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(",") if d]
    dirs = [d for d in dirs if os.path.isdir(d)]
    return dirs[os.getpid() % len(dirs)] if dirs else tempfile.gettempdir()
