"""A partition's rows as numpy blocks: the CSR type, Arrow conversion, slicing.

A *block* maps each prepared column to its rows: a float32 ``(rows, width)`` array
(dense features, array labels), a 1-D int32 or float32 array (scalar labels, weights)
or a :class:`Csr` matrix (ML ``SparseVector`` features, never densified but one batch
at a time). :func:`convert` turns one Arrow record batch into a block without a
per-row loop; the cache (:mod:`sparkdl.executor.cache`), the feed and scoring
(:mod:`sparkdl.executor.scoring`) all read rows through it.

Example:
    >>> csr = Csr(np.array([0, 2, 3]), np.array([1, 4, 0], np.int32),
    ...           np.array([1.0, 2.0, 3.0], np.float32), width=5)
    >>> csr.dense().tolist()
    [[0.0, 1.0, 0.0, 0.0, 2.0], [3.0, 0.0, 0.0, 0.0, 0.0]]
    >>> csr.take(np.array([1, 0])).indices.tolist()
    [0, 1, 4]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from sparkdl.contract.payload import Column, check_row_widths
from sparkdl.errors import SchemaError

__all__ = ["Block", "Csr", "concat_blocks", "convert", "rows_of", "slice_block", "take_block"]

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


def convert(batch: pa.RecordBatch, columns: Sequence[Column]) -> Block:
    """One record batch's ``columns`` as numpy arrays (CSR for sparse vectors).

    Columns the batch lacks (labels, when scoring) are left out. A dense column of
    width 0 takes its width from the batch.

    Raises:
        SchemaError: A row does not have the column's width.

    Example:
        >>> import pyarrow as pa
        >>> convert(pa.RecordBatch.from_pydict({"y": [1, 2]}), [Column("y", "float", 1)])["y"]
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
        elif column.kind == "bytes":
            out[column.name] = _byte_rows(values, column.width)
        else:
            out[column.name] = values.to_numpy(zero_copy_only=False).astype(
                column.dtype, copy=False
            )
    return out


def row_widths(column: pa.Array) -> np.ndarray:
    """Values per row of a feature column: list lengths, or ML vectors' sizes (nulls
    left out).

    Example:
        >>> row_widths(pa.array([[1.0, 2.0], None, [3.0]])).tolist()
        [2, 1]
    """
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_struct(column.type):
        kinds = column.field("type").to_numpy(zero_copy_only=False)
        lengths = column.field("values").value_lengths().to_numpy(zero_copy_only=False)
        sizes = column.field("size").to_numpy(zero_copy_only=False)
        widths = np.where(kinds == 1, lengths, sizes)
    elif pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        import pyarrow.compute as pc

        widths = pc.binary_length(column).to_numpy(zero_copy_only=False)
    else:
        widths = column.value_lengths().to_numpy(zero_copy_only=False)
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    return np.asarray(widths, dtype=np.float64)[valid].astype(np.int64)


def rows_of(block: Block) -> int:
    first = next(iter(block.values()))
    return len(first)


def concat_blocks(blocks: list[Block]) -> Block:
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


# ---------------------------------------------------------------------- helpers
def _dense_rows(values: pa.Array, width: int) -> np.ndarray:
    """A ``list<float>`` column as a ``(rows, width)`` float32 array."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    flat = values.flatten().to_numpy(zero_copy_only=False)
    if not width and len(values):
        width = flat.size // len(values)
    _check(row_widths(values), width)
    if values.null_count:
        raise SchemaError(
            f"Found {values.null_count} null row(s) in a column of arrays. Drop them "
            "(df.dropna()) or impute them first."
        )
    return flat.astype(np.float32, copy=False).reshape(len(values), width)


def _byte_rows(values: pa.Array, width: int) -> np.ndarray:
    """A ``binary`` column of ``width`` bytes a row (an image's data) as a
    ``(rows, width)`` uint8 array: a view of the Arrow buffer, no per-row loop.

    Example:
        >>> _byte_rows(pa.array([b"ab", b"cd"]), 2).tolist()
        [[97, 98], [99, 100]]
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if values.null_count:
        raise SchemaError(
            f"Found {values.null_count} null image(s) in a column of images. Drop them "
            "(df.dropna()) first."
        )
    offsets_type: Any = np.int64 if pa.types.is_large_binary(values.type) else np.int32
    _, offsets_buffer, data = values.buffers()
    offsets = np.frombuffer(offsets_buffer, offsets_type)[
        values.offset : values.offset + len(values) + 1
    ]
    _check(np.diff(offsets), width)
    start = int(offsets[0]) if len(offsets) else 0
    flat = np.frombuffer(data, np.uint8)[start : start + len(values) * width] if data else None
    if flat is None:
        return np.zeros((len(values), width), np.uint8)
    return flat.reshape(len(values), width)


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
    _check(sizes, width)
    if indices.size and (indices.min() < 0 or indices.max() >= width):
        raise SchemaError(f"A sparse vector has an index outside [0, {width}).")
    return indptr, indices, values


def _check(widths: np.ndarray, width: int) -> None:
    """The one row-width rule (:func:`~sparkdl.contract.payload.check_row_widths`) on rows of
    ``widths`` values for a column of ``width``."""
    if len(widths):
        check_row_widths(int(widths.min()), int(widths.max()), (width,))
