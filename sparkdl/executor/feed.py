"""``tf.data`` pipelines over a worker's :class:`~sparkdl.executor.cache.PartitionCache`.

A generator cuts each epoch into batches, chosen by where the partition is:

* in memory: the rows stay where the cache put them; each epoch shuffles row
  *indices* (4 bytes a row) and gathers each batch from the cache's memory, as
  ``model.fit(x, y, shuffle=True)`` would order them. (Tensors over the whole
  partition would copy it, and a ``tf.data`` shuffle of a million row indices holds
  a few hundred bytes per row.)
* on disk: it reads the epoch's blocks through
  :func:`~sparkdl.executor.cache.epoch_batches` (a block-wise shuffle).

Each batch becomes tensors: a ``tf.SparseTensor`` for a sparse vector column feeding
a model input built with ``keras.Input(..., sparse=True)``, else dense rows made one
batch at a time.

Either way one endless pipeline serves every epoch of a ``model.fit`` call (Keras would
build a new iterator per epoch, which costs more than a small partition's steps).
Every pipeline runs with ``tf.data``'s autotuner off (:func:`untuned`).

Example:
    >>> from sparkdl.payload import Column
    >>> spec(Column("y", "int", 1), (), sparse=False)
    TensorSpec(shape=(None,), dtype=tf.int32, name=None)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from sparkdl.executor.blocks import Block, Csr
from sparkdl.executor.cache import PartitionCache, epoch_batches
from sparkdl.payload import Column

__all__ = ["GROUP", "GROUP_BYTES", "Feed", "spec", "untuned"]

#: Dense batches cross from the generator to TensorFlow up to this many at a time...
GROUP = 16
#: ...and up to about this many bytes at a time.
GROUP_BYTES = 4 << 20


@dataclass(frozen=True)
class Feed:
    """Batches of one cache as ``model.fit`` and ``model.evaluate`` take them.

    Attributes:
        cache: The partition (or its validation rows); ``None`` for a feed used only
            for :meth:`structure` and :meth:`signature` (scoring a stream).
        inputs: The feature columns, one per model input.
        input_shapes: Per-sample shape of each model input.
        sparse_inputs: Whether each model input takes a ``tf.SparseTensor``.
        outputs: The label columns, one per model output.
        batch_size: Rows per batch.
        weight: The rows' weights, fed as Keras's ``sample_weight`` (each batch is
            ``(x, y, w)``); ``None``: ``(x, y)``.
        output_shapes: Per-sample shape of each label (array labels are reshaped to
            it); ``None``: flat arrays and scalars.
    """

    cache: PartitionCache | None
    inputs: Sequence[Column]
    input_shapes: Sequence[tuple[int, ...]]
    sparse_inputs: Sequence[bool]
    outputs: Sequence[Column]
    batch_size: int
    weight: Column | None = None
    output_shapes: Sequence[tuple[int, ...]] | None = None

    def train(
        self,
        start: int,
        stop: int,
        *,
        shuffle: bool,
        seed: int,
        limit: int | None = None,
    ) -> tf.data.Dataset:
        """Endless epochs over rows ``start`` to ``stop`` (``limit`` rows of them, a
        random subset, when given), each in a new order when ``shuffle``."""
        rng = np.random.default_rng(seed)

        def epochs() -> Iterator[Any]:
            while True:
                for block in self._epoch(start, stop, shuffle=shuffle, rng=rng, limit=limit):
                    yield self.structure(block)

        return untuned(self._generated(epochs).prefetch(2))

    def evaluate(self, start: int = 0, stop: int | None = None) -> tf.data.Dataset:
        """One pass over rows ``start`` to ``stop`` in order (validation, evaluate)."""
        stop = self._data.rows if stop is None else stop
        rng = np.random.default_rng(0)

        def once() -> Iterator[Any]:
            for block in self._epoch(start, stop, shuffle=False, rng=rng):
                yield self.structure(block)

        # A known length: Keras warns when a dataset of unknown length ends.
        batches = -(-(stop - start) // self.batch_size)
        counted = self._generated(once).apply(tf.data.experimental.assert_cardinality(batches))
        return untuned(counted.prefetch(2))

    def stream(self, make: Callable[[], Iterator[Any]]) -> tf.data.Dataset:
        """The batches ``make()`` yields, each already in :meth:`structure`'s form,
        as they come (a stream of unknown length: scoring a DataFrame).

        Example:
            >>> from sparkdl.payload import Column
            >>> x, y = Column("x", "dense", 2), Column("y", "int", 1)
            >>> feed = Feed(None, [x], [(2,)], [False], [y], batch_size=4)
            >>> batch = (np.ones((3, 2), np.float32), np.zeros(3, np.int32))
            >>> [x.shape.as_list() for x, _ in feed.stream(lambda: iter([batch]))]
            [[3, 2]]
        """
        return untuned(tf.data.Dataset.from_generator(make, output_signature=self.signature()))

    # ------------------------------------------------------------------ helpers
    def _inputs(self) -> list[tuple[Column, tuple[int, ...], bool]]:
        """``(column, shape, takes a SparseTensor)`` per model input."""
        return list(zip(self.inputs, self.input_shapes, self.sparse_inputs, strict=True))

    def _outputs(self) -> list[tuple[Column, tuple[int, ...]]]:
        """``(column, per-sample label shape)`` per model output."""
        shapes = self.output_shapes or [_label_shape(c) for c in self.outputs]
        return list(zip(self.outputs, shapes, strict=True))

    @property
    def _data(self) -> PartitionCache:
        if self.cache is None:
            raise RuntimeError("This Feed has no cache to read from.")
        return self.cache

    def _epoch(
        self,
        start: int,
        stop: int,
        *,
        shuffle: bool,
        rng: np.random.Generator,
        limit: int | None = None,
    ) -> Iterator[Block]:
        """One epoch's batches, in the order the cache's mode reads well
        (:func:`~sparkdl.executor.cache.epoch_batches`)."""
        yield from epoch_batches(
            self._data, start, stop, self.batch_size, shuffle=shuffle, rng=rng, limit=limit
        )

    def _generated(self, make: Any) -> tf.data.Dataset:
        """A dataset of the batches ``make()`` yields.

        Dense batches cross from Python to TensorFlow up to :data:`GROUP` (and
        :data:`GROUP_BYTES`) at a time (stacked;
        ``tf.data`` unstacks them), so the generator's per-element cost, paid under the
        GIL next to the training step, is spread over many steps.
        """
        columns = [*self.inputs, *self.outputs, *([self.weight] if self.weight else [])]
        row_bytes = sum(4 * max(c.width, 1) for c in columns)
        group = min(GROUP, max(1, GROUP_BYTES // max(row_bytes * self.batch_size, 1)))
        if group == 1 or any(c.kind == "sparse" for c in self.inputs):
            # SparseTensors do not stack; sparse rows densified are made one batch at a time.
            return tf.data.Dataset.from_generator(make, output_signature=self.signature())
        grouped = tf.data.Dataset.from_generator(
            lambda: _groups(make(), group),
            output_signature=tf.nest.map_structure(_stacked, self.signature()),
        )
        return grouped.flat_map(lambda *parts: tf.data.Dataset.from_tensor_slices(parts))

    def signature(self) -> tuple[Any, ...]:
        """The ``(x, y)`` (or ``(x, y, w)``) type specs of a batch."""
        x = _one([spec(c, s, sparse=p) for c, s, p in self._inputs()])
        y = _one([spec(c, shape, sparse=False) for c, shape in self._outputs()])
        if self.weight is None:
            return x, y
        return x, y, tf.TensorSpec((None,), tf.float32)

    def structure(self, block: Block) -> tuple[Any, ...]:
        """``(x, y)`` of a block, and ``w`` for a weighted feed: one value each, or a
        tuple for several inputs or outputs."""
        xs = [_feature(block[c.name], shape, sparse) for c, shape, sparse in self._inputs()]
        ys = [_label(block[c.name], shape) for c, shape in self._outputs() if c.name in block]
        if self.weight is None:
            return _one(xs), _one(ys)
        return _one(xs), _one(ys), block[self.weight.name]


def untuned(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """``dataset`` without ``tf.data``'s autotuning.

    Nothing in this module's pipelines has a size to tune (Python generators, a fixed
    prefetch), and we attribute a stall at the end of ``model.fit`` to the autotuner's
    thread, as deleting the fit's iterator waited for it: in one process, 4 of 16
    digits fits returned 0.4 s after their last epoch with it on, none of 16 with it
    off; on a ``local[2]`` worker the stall was 1.1-1.3 s, a third of a first digits
    fit's training loop.

    Example:
        >>> untuned(tf.data.Dataset.range(3)).options().autotune.enabled
        False
    """
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def spec(column: Column, shape: tuple[int, ...], *, sparse: bool) -> Any:
    """The ``tf.TypeSpec`` of a batch of ``column`` fed as ``shape`` per row."""
    if column.kind == "sparse" and sparse:
        return tf.SparseTensorSpec((None, column.width), tf.float32)
    dtype = tf.int32 if column.kind == "int" else tf.float32
    return tf.TensorSpec((None, *shape), dtype)


def _groups(batches: Iterator[Any], group: int) -> Iterator[Any]:
    """Consecutive batches of one size stacked ``group`` at a time; a batch of another
    size (an epoch's last) alone."""
    held: list[Any] = []
    size = None
    for batch in batches:
        rows = len(tf.nest.flatten(batch)[0])
        if held and (rows != size or len(held) == group):
            yield tf.nest.map_structure(lambda *a: np.stack(a), *held)
            held = []
        held.append(batch)
        size = rows
    if held:
        yield tf.nest.map_structure(lambda *a: np.stack(a), *held)


def _stacked(spec: tf.TensorSpec) -> tf.TensorSpec:
    return tf.TensorSpec((None, *spec.shape), spec.dtype)


def _feature(value: Any, shape: tuple[int, ...], sparse: bool) -> Any:
    if isinstance(value, Csr):
        if sparse:
            indices, values = value.coo()
            return tf.compat.v1.SparseTensorValue(indices, values, (len(value), value.width))
        return value.dense().reshape((-1, *shape))
    if isinstance(value, np.ndarray):
        return value.reshape((-1, *shape))
    return tf.reshape(value, (-1, *shape))


def _label(value: Any, shape: tuple[int, ...]) -> Any:
    """A batch of labels in their per-sample ``shape`` (``()``: one value a row)."""
    return value.reshape((-1, *shape)) if isinstance(value, np.ndarray) else value


def _label_shape(column: Column) -> tuple[int, ...]:
    return (column.width,) if column.kind == "dense" else ()


def _one(values: list[Any]) -> Any:
    return values[0] if len(values) == 1 else tuple(values)
