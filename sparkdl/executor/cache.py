"""A worker's partition, cached as it streams in and read back in blocks.

The training task receives its partition as Arrow record batches. Holding them all (then
numpy copies, then tensors) cost about 4.5 bytes of memory per byte of data, so each
batch is converted to the model's dtypes and appended to a *spool* as it arrives, then
dropped: Python never holds more than one record batch. A spool is append-only bytes:

* :class:`MemorySpool`: an anonymous memory map grown by ``mremap`` (no copy when it
  grows, so the partition costs its own bytes and no more); training gathers batches
  straight from it (:meth:`PartitionCache.arrays`).
* :class:`FileSpool`: an unnamed temporary file (``O_TMPFILE``) under the executor's
  Spark local directories (``SPARK_LOCAL_DIRS``, where Spark keeps its shuffle files):
  the kernel removes it when it is closed or the process dies, so a failed or killed
  task leaves nothing behind. Training reads it back in blocks
  (:func:`epoch_batches`), so the memory a worker needs does not grow with its data.

``data_cache="auto"`` starts in memory and moves to disk the moment the partition
outgrows its budget (resolved on the driver: :func:`sparkdl.driver.cluster.cache_budget`); a
task's training and validation caches share one :class:`Budget`.

Columns are stored as the model takes them: dense features as float32 rows, scalar
labels as int32 or float32, and ML ``SparseVector`` features as CSR (row offsets,
int32 indices, float32 values), so a hashed or one-hot feature space is never
densified, except one batch at a time for a model whose input is not sparse.

Each epoch reads the rows in a new order: the row range is cut into blocks of about
:data:`BLOCK_BYTES`; the blocks are visited in a random order and gathered into
windows of about :data:`WINDOW_BYTES`, whose rows are shuffled and cut into batches
(a block-wise shuffle, as in ``tf.data``'s interleave-and-shuffle recipes; rows of one
window come from many places in the partition).

The block format and Arrow conversion are :mod:`sparkdl.executor.blocks`'s; the
spools and the budget :mod:`sparkdl.executor.spool`'s.

Example:
    >>> cache = PartitionCache([Column("x", "dense", 2)])
    >>> rows = pa.array([[1.0, 2.0]], pa.list_(pa.float32()))
    >>> cache.append(pa.RecordBatch.from_pydict({"x": rows}))
    >>> cache.rows, cache.read(0, 1)["x"].tolist()
    (1, [[1.0, 2.0]])
    >>> cache.close()
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from sparkdl.contract.payload import Column
from sparkdl.contract.plan import DEFAULT_CACHE_BUDGET
from sparkdl.errors import ConfigError
from sparkdl.executor.blocks import (
    Block,
    Csr,
    concat_blocks,
    convert,
    rows_of,
    slice_block,
    take_block,
)
from sparkdl.executor.spool import Budget, FileSpool, MemorySpool, local_dir

__all__ = ["BLOCK_BYTES", "WINDOW_BYTES", "PartitionCache", "epoch_batches"]

#: Rows of about this many bytes are read together (one ``pread``).
BLOCK_BYTES = 64 * 1024
#: Rows of about this many bytes are shuffled together (the window of a block shuffle).
WINDOW_BYTES = 16 * 1024 * 1024


class PartitionCache:
    """One partition's prepared columns, appended batch by batch, read back in blocks.

    Args:
        columns: The stored columns (features, then labels).
        mode: ``"memory"``, ``"disk"`` or ``"auto"`` (memory until ``budget`` bytes).
        budget: Bytes an ``"auto"`` cache may hold in memory, or a :class:`Budget`
            it shares with other caches.
        directory: Where disk spools go; ``None``: :func:`local_dir`.

    Example:
        >>> import tempfile
        >>> cache = PartitionCache([Column("x", "dense", 2), Column("y", "int", 1)],
        ...                        mode="disk", directory=tempfile.gettempdir())
        >>> cache.append(pa.RecordBatch.from_pydict({"x": [[1.0, 2.0], [3.0, 4.0]], "y": [0, 1]}))
        >>> cache.rows, cache.data_bytes, cache.mode
        (2, 24, 'disk')
        >>> cache.read(1, 2)["x"].tolist()
        [[3.0, 4.0]]
        >>> cache.close()
    """

    def __init__(
        self,
        columns: Sequence[Column],
        *,
        mode: str = "memory",
        budget: int | Budget = DEFAULT_CACHE_BUDGET,
        directory: str | None = None,
    ) -> None:
        if mode not in ("auto", "memory", "disk"):
            raise ValueError(f"Expected mode 'auto', 'memory' or 'disk'. Received: {mode!r}")
        self.columns = list(columns)
        self.budget = budget if isinstance(budget, Budget) else Budget(budget)
        self.directory = directory
        self.mode = "disk" if mode == "disk" else "memory"
        self._auto = mode == "auto"
        self.rows = 0
        self._spools: dict[str, Any] = {}
        for column in self.columns:
            for part in _parts(column):
                self._spools[part] = self._new_spool()
            if column.kind == "sparse":
                self._spools[column.name + ":indptr"].write(np.zeros(1, np.int64))

    @property
    def data_bytes(self) -> int:
        """Bytes of the cached data (float32 features; CSR for sparse features)."""
        return sum(spool.nbytes for spool in self._spools.values())

    def append(self, batch: pa.RecordBatch) -> None:
        """Converts one record batch and appends it; the batch can then be dropped.

        Raises:
            SchemaError: A row does not have the width the driver found.
        """
        if not batch.num_rows:
            return
        before = self.data_bytes
        block = convert(batch, self.columns)
        if self.mode == "memory":
            self._make_room(block)
        for name, value in block.items():
            if isinstance(value, Csr):
                offset = self._spools[name + ":values"].nbytes // 4  # values held so far
                self._spools[name + ":indptr"].write(value.indptr[1:] + offset)
                self._spools[name + ":indices"].write(value.indices)
                self._spools[name + ":values"].write(value.values)
            else:
                self._spools[name].write(value)
        self.rows += batch.num_rows
        grown = self.data_bytes - before
        if self._auto and self.mode == "memory" and not self.budget.take(grown):
            self.budget.give(self.data_bytes)
            self._spill()

    def read(self, start: int, stop: int) -> Block:
        """Rows ``start`` to ``stop`` of every column (views in memory mode)."""
        out: Block = {}
        for column in self.columns:
            name = column.name
            if name not in self._spools and name + ":indptr" not in self._spools:
                continue
            if column.kind == "sparse":
                indptr = self._spools[name + ":indptr"].read(np.int64, start, stop - start + 1)
                lo, count = int(indptr[0]), int(indptr[-1] - indptr[0])
                out[name] = Csr(
                    indptr - lo,
                    self._spools[name + ":indices"].read(np.int32, lo, count),
                    self._spools[name + ":values"].read(np.float32, lo, count),
                    column.width,
                )
            else:
                width = column.width if column.rows_of_values else 1
                flat = self._spools[name].read(column.dtype, start * width, (stop - start) * width)
                out[name] = flat.reshape(-1, width) if column.rows_of_values else flat
        return out

    def arrays(self) -> Block:
        """Every row of every column: views of memory, no copy (memory mode only)."""
        if self.mode != "memory":
            raise RuntimeError("PartitionCache.arrays() needs the memory mode.")
        return self.read(0, self.rows)

    def row_bytes(self) -> float:
        """Mean bytes a row takes in the cache."""
        return self.data_bytes / max(self.rows, 1)

    def close(self) -> None:
        """Frees the memory and removes the files."""
        for spool in self._spools.values():
            spool.close()
        self._spools.clear()

    def __enter__(self) -> PartitionCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ helpers
    def _new_spool(self) -> MemorySpool | FileSpool:
        if self.mode == "disk":
            return FileSpool(self.directory or local_dir())
        return MemorySpool()

    def _make_room(self, block: Block) -> None:
        """Grows the memory maps for ``block`` before anything is written, so that a
        map that cannot grow leaves the cache whole: ``"auto"`` then moves to disk."""
        try:
            for name, value in block.items():
                if isinstance(value, Csr):
                    self._spools[name + ":indptr"].reserve(8 * len(value))
                    self._spools[name + ":indices"].reserve(value.indices.nbytes)
                    self._spools[name + ":values"].reserve(value.values.nbytes)
                else:
                    self._spools[name].reserve(value.nbytes)
        except (OSError, MemoryError) as exc:
            if not self._auto:
                raise ConfigError(
                    f"data_cache='memory' could not keep this partition in memory "
                    f"({self.data_bytes:,} bytes held, {exc}). Use data_cache='disk' "
                    "(or 'auto'), give the Python workers more memory "
                    "(spark.executor.pyspark.memory), or split the data over more workers."
                ) from exc
            self.budget.give(self.data_bytes)
            self._spill()

    def _spill(self) -> None:
        """Moves every memory spool to a file (``"auto"`` past its budget)."""
        self.mode = "disk"
        for part, spool in list(self._spools.items()):
            on_disk = self._new_spool()
            spool.copy_to(on_disk)
            spool.close()
            self._spools[part] = on_disk


def epoch_batches(
    cache: PartitionCache,
    start: int,
    stop: int,
    batch_size: int,
    *,
    shuffle: bool,
    rng: np.random.Generator,
    limit: int | None = None,
) -> Iterator[Block]:
    """One epoch's batches of rows ``start`` to ``stop``: the epoch order of both modes.

    In memory, rows are gathered in a full random order (with ``shuffle``). On disk
    they are read block by block: with ``shuffle``, blocks come in a random order and
    each window's rows are shuffled. Every batch but the last holds ``batch_size``
    rows. ``limit`` stops after that many rows (a random subset of the range when
    shuffling; its first rows, in order, without).

    Example:
        >>> import pyarrow as pa
        >>> cache = PartitionCache([Column("y", "int", 1)])
        >>> cache.append(pa.RecordBatch.from_pydict({"y": list(range(10))}))
        >>> rng = np.random.default_rng(0)
        >>> [len(b["y"]) for b in epoch_batches(cache, 0, 10, 4, shuffle=True, rng=rng)]
        [4, 4, 2]
        >>> sorted(np.concatenate([b["y"] for b in epoch_batches(
        ...     cache, 0, 10, 4, shuffle=True, rng=rng)]).tolist()) == list(range(10))
        True
    """
    if cache.mode != "disk":
        yield from _memory_batches(cache, start, stop, batch_size, shuffle, rng, limit)
        return
    total = stop - start if limit is None else min(limit, stop - start)
    row_bytes = max(cache.row_bytes(), 1.0)
    block = max(1, int(BLOCK_BYTES // row_bytes))
    window = max(batch_size, int(WINDOW_BYTES // row_bytes))
    starts = np.arange(start, stop, block)
    if shuffle:
        starts = rng.permutation(starts)
    spans, count = [], 0
    for lo in starts.tolist():
        if count >= total:
            break
        # Shuffled, whole blocks are read and the rows past ``total`` are dropped
        # after the window's shuffle: a random subset even of a single block.
        hi = min(lo + block, stop) if shuffle else min(lo + block, stop, lo + total - count)
        spans.append((lo, hi))
        count += hi - lo
    carry: list[Block] = []
    parts: list[Block] = []
    held = emitted = 0
    for i, (lo, hi) in enumerate(spans):
        parts.append(cache.read(lo, hi))
        held += hi - lo
        last = i == len(spans) - 1
        if held < window and not last:
            continue
        merged = concat_blocks(carry + parts)
        n = rows_of(merged)
        if shuffle:
            merged = take_block(merged, rng.permutation(n))
        full = n if last else n - n % batch_size
        for row in range(0, full, batch_size):
            end = min(row + batch_size, full, row + total - emitted)
            yield slice_block(merged, row, end)
            emitted += end - row
            if emitted >= total:
                return
        carry = [slice_block(merged, full, n)] if full < n else []
        parts, held = [], 0


# ---------------------------------------------------------------------- helpers
def _memory_batches(
    cache: PartitionCache,
    start: int,
    stop: int,
    batch_size: int,
    shuffle: bool,
    rng: np.random.Generator,
    limit: int | None,
) -> Iterator[Block]:
    """An in-memory epoch: rows gathered from the cache's memory in a full random order."""
    # int32 and shuffled in place: the order costs 4 bytes a row, not 16.
    order = np.arange(start, stop, dtype=np.int32 if stop < 2**31 else np.int64)
    if shuffle:
        rng.shuffle(order)
    if limit is not None:
        order = np.sort(order[:limit]) if not shuffle else order[:limit]
    arrays = cache.arrays()  # views of the cache's memory: each batch is a copy
    for lo in range(0, len(order), batch_size):
        yield take_block(arrays, order[lo : lo + batch_size])


def _parts(column: Column) -> list[str]:
    if column.kind == "sparse":
        return [column.name + ":indptr", column.name + ":indices", column.name + ":values"]
    return [column.name]
