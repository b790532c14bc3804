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
outgrows its budget (resolved on the driver: :func:`sparkdl.cluster.cache_budget`); a
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

Example:
    >>> csr = Csr(np.array([0, 2, 3]), np.array([1, 4, 0], np.int32),
    ...           np.array([1.0, 2.0, 3.0], np.float32), width=5)
    >>> csr.dense().tolist()
    [[0.0, 1.0, 0.0, 0.0, 2.0], [3.0, 0.0, 0.0, 0.0, 0.0]]
    >>> csr.take(np.array([1, 0])).indices.tolist()
    [0, 1, 4]
"""

from __future__ import annotations

import contextlib
import gc
import mmap
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from sparkdl.errors import ConfigError, SchemaError
from sparkdl.payload import Column
from sparkdl.plan import DEFAULT_CACHE_BUDGET

__all__ = [
    "BLOCK_BYTES",
    "WINDOW_BYTES",
    "Block",
    "Budget",
    "Csr",
    "FileSpool",
    "MemorySpool",
    "PartitionCache",
    "convert",
    "epoch_batches",
    "local_dir",
    "slice_block",
    "take_block",
]

#: Rows of about this many bytes are read together (one ``pread``).
BLOCK_BYTES = 64 * 1024
#: Rows of about this many bytes are shuffled together (the window of a block shuffle).
WINDOW_BYTES = 16 * 1024 * 1024

Block = dict[str, Any]  # column name -> ndarray (dense, scalar) or Csr (sparse)


@dataclass
class Csr:
    """Rows of a sparse matrix: ``indptr`` (row offsets from 0), column ``indices``
    and ``values``."""

    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    width: int

    def __len__(self) -> int:
        return len(self.indptr) - 1

    @property
    def nbytes(self) -> int:
        """Bytes of the three arrays."""
        return int(self.indptr.nbytes + self.indices.nbytes + self.values.nbytes)

    def take(self, rows: np.ndarray) -> Csr:
        """Rows ``rows`` (any order), as a new matrix."""
        starts = self.indptr[rows]
        lengths = self.indptr[rows + 1] - starts
        indptr = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(lengths, out=indptr[1:])
        # Position k of new row r comes from starts[r] + k.
        gather = np.repeat(starts - indptr[:-1], lengths) + np.arange(indptr[-1])
        return Csr(indptr, self.indices[gather], self.values[gather], self.width)

    def slice(self, start: int, stop: int) -> Csr:
        """Rows ``start`` to ``stop`` (clipped to the rows there are, as numpy slices)."""
        stop = min(stop, len(self))
        start = min(start, stop)
        lo, hi = int(self.indptr[start]), int(self.indptr[stop])
        return Csr(
            self.indptr[start : stop + 1] - lo,
            self.indices[lo:hi],
            self.values[lo:hi],
            self.width,
        )

    @staticmethod
    def concat(parts: Sequence[Csr]) -> Csr:
        """The rows of ``parts``, one after another."""
        if len(parts) == 1:
            return parts[0]
        offsets = np.cumsum([0] + [int(p.indptr[-1]) for p in parts[:-1]])
        shifted = [p.indptr[1:] + o for p, o in zip(parts, offsets, strict=True)]
        indptr = np.concatenate([np.zeros(1, np.int64), *shifted])
        return Csr(
            indptr,
            np.concatenate([p.indices for p in parts]),
            np.concatenate([p.values for p in parts]),
            parts[0].width,
        )

    def coo(self) -> tuple[np.ndarray, np.ndarray]:
        """``(indices, values)`` as ``tf.SparseTensor`` takes them: ``[row, column]``
        pairs in row-major order."""
        rows = np.repeat(np.arange(len(self), dtype=np.int64), np.diff(self.indptr))
        return np.stack([rows, self.indices.astype(np.int64)], axis=1), self.values

    def dense(self) -> np.ndarray:
        """The rows as a dense float32 array."""
        out = np.zeros((len(self), self.width), np.float32)
        rows = np.repeat(np.arange(len(self)), np.diff(self.indptr))
        out[rows, self.indices] = self.values
        return out


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


class PartitionCache:
    """One partition's prepared columns, appended batch by batch, read back in blocks.

    Args:
        columns: The stored columns (features, then labels).
        mode: ``"memory"``, ``"disk"`` or ``"auto"`` (memory until ``budget`` bytes).
        budget: Bytes an ``"auto"`` cache may hold in memory, or a :class:`Budget`
            it shares with other caches.
        directory: Where disk spools go; ``None``: :func:`local_dir`.

    Example:
        >>> import pyarrow as pa
        >>> cache = PartitionCache([Column("x", "dense", 2), Column("y", "int", 1)],
        ...                        mode="disk", directory=tempfile.gettempdir())
        >>> cache.append(pa.record_batch({"x": [[1.0, 2.0], [3.0, 4.0]], "y": [0, 1]}))
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
                width = column.width if column.kind == "dense" else 1
                flat = self._spools[name].read(column.dtype, start * width, (stop - start) * width)
                out[name] = flat.reshape(-1, width) if column.kind == "dense" else flat
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
    """One epoch's batches of rows ``start`` to ``stop``, read block by block.

    With ``shuffle``, blocks come in a random order and each window's rows are
    shuffled; every batch but the last holds ``batch_size`` rows. ``limit`` stops after
    that many rows (a random subset of the range when shuffling).

    Example:
        >>> import pyarrow as pa
        >>> cache = PartitionCache([Column("y", "int", 1)])
        >>> cache.append(pa.record_batch({"y": list(range(10))}))
        >>> rng = np.random.default_rng(0)
        >>> [len(b["y"]) for b in epoch_batches(cache, 0, 10, 4, shuffle=True, rng=rng)]
        [4, 4, 2]
        >>> sorted(np.concatenate([b["y"] for b in epoch_batches(
        ...     cache, 0, 10, 4, shuffle=True, rng=rng)]).tolist()) == list(range(10))
        True
    """
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
        merged = _concat(carry + parts)
        n = _rows(merged)
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


def convert(batch: pa.RecordBatch, columns: Sequence[Column]) -> Block:
    """One record batch's ``columns`` as numpy arrays (CSR for sparse vectors).

    Columns the batch lacks (labels, when scoring) are left out. A dense column of
    width 0 takes its width from the batch.

    Raises:
        SchemaError: A row does not have the column's width.

    Example:
        >>> import pyarrow as pa
        >>> convert(pa.record_batch({"y": [1, 2]}), [Column("y", "float", 1)])["y"]
        array([1., 2.], dtype=float32)
    """
    out: Block = {}
    for column in columns:
        if column.name not in batch.schema.names:
            continue
        values = batch.column(column.name)
        if column.kind == "sparse":
            out[column.name] = Csr(*_vector_rows(values, column.width), column.width)
        elif column.kind == "dense":
            out[column.name] = _dense_rows(values, column.width)
        else:
            out[column.name] = values.to_numpy(zero_copy_only=False).astype(
                column.dtype, copy=False
            )
    return out


def local_dir() -> str:
    """The directory for cache files: one of Spark's local directories.

    Spark gives its Python workers the executor's ``SPARK_LOCAL_DIRS`` (the block
    manager's directories, where shuffle files go); a task picks one by its pid so
    that tasks of one executor spread over the disks. Outside Spark: the temp dir.
    """
    dirs = [d for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(",") if d]
    dirs = [d for d in dirs if os.path.isdir(d)]
    return dirs[os.getpid() % len(dirs)] if dirs else tempfile.gettempdir()


# ---------------------------------------------------------------------- helpers
def _parts(column: Column) -> list[str]:
    if column.kind == "sparse":
        return [column.name + ":indptr", column.name + ":indices", column.name + ":values"]
    return [column.name]


def _dense_rows(values: pa.Array, width: int) -> np.ndarray:
    """A ``list<float>`` column as a ``(rows, width)`` float32 array."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    flat = values.flatten().to_numpy(zero_copy_only=False)
    if not width and len(values):
        width = flat.size // len(values)
    if flat.size != len(values) * width:
        raise SchemaError(
            f"Expected rows of {width} values each; the partition holds {flat.size} "
            f"values in {len(values)} rows."
        )
    return flat.astype(np.float32, copy=False).reshape(len(values), width)


def _vector_rows(vectors: pa.Array, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ML vectors (Arrow ``struct<type, size, indices, values>``) as CSR arrays.

    ``type`` 0 is a SparseVector (``size``, ``indices``, ``values``), 1 a DenseVector
    (``values`` only), which gets indices ``0..n-1``.
    """
    if isinstance(vectors, pa.ChunkedArray):
        vectors = vectors.combine_chunks()
    if vectors.null_count:
        raise SchemaError(
            f"Found {vectors.null_count} row(s) with null feature vectors. Drop them "
            "(df.dropna()) or impute them first."
        )
    kinds = vectors.field("type").to_numpy(zero_copy_only=False)
    values_list = vectors.field("values")
    lengths = values_list.value_lengths().to_numpy(zero_copy_only=False).astype(np.int64)
    values = values_list.flatten().to_numpy(zero_copy_only=False).astype(np.float32)
    indptr = np.zeros(len(vectors) + 1, np.int64)
    np.cumsum(lengths, out=indptr[1:])
    dense = kinds == 1
    if dense.any():
        position = np.arange(indptr[-1]) - np.repeat(indptr[:-1], lengths)
        indices = position.astype(np.int32)
        sparse_values = np.repeat(~dense, lengths)
        indices[sparse_values] = vectors.field("indices").flatten().to_numpy(zero_copy_only=False)
    else:
        indices = vectors.field("indices").flatten().to_numpy(zero_copy_only=False)
        indices = indices.astype(np.int32, copy=False)
    sizes = np.where(dense, lengths, vectors.field("size").to_numpy(zero_copy_only=False))
    if len(sizes) and (sizes.min() != width or sizes.max() != width):
        raise SchemaError(
            f"Expected every feature vector to have size {width}. Received sizes between "
            f"{int(sizes.min())} and {int(sizes.max())}."
        )
    if indices.size and (indices.min() < 0 or indices.max() >= width):
        raise SchemaError(f"A sparse vector has an index outside [0, {width}).")
    return indptr, indices, values


def _rows(block: Block) -> int:
    first = next(iter(block.values()))
    return len(first)


def _concat(blocks: list[Block]) -> Block:
    if len(blocks) == 1:
        return blocks[0]
    out: Block = {}
    for name, first in blocks[0].items():
        if isinstance(first, Csr):
            out[name] = Csr.concat([b[name] for b in blocks])
        else:
            out[name] = np.concatenate([b[name] for b in blocks])
    return out


def take_block(block: Block, rows: np.ndarray) -> Block:
    """Rows ``rows`` (any order) of every column of ``block``, copied."""
    return {name: a.take(rows) if isinstance(a, Csr) else a[rows] for name, a in block.items()}


def slice_block(block: Block, start: int, stop: int) -> Block:
    """Rows ``start`` to ``stop`` of every column of ``block``."""
    return {
        name: a.slice(start, stop) if isinstance(a, Csr) else a[start:stop]
        for name, a in block.items()
    }
