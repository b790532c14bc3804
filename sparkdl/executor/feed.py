"""The batches ``model.fit`` and ``model.evaluate`` read from a worker's
:class:`~sparkdl.executor.cache.PartitionCache`, on any Keras backend.

A generator cuts each epoch into batches, chosen by where the partition is:

* in memory: the rows stay where the cache put them; each epoch shuffles row
  *indices* (4 bytes a row) and gathers each batch from the cache's memory, as
  ``model.fit(x, y, shuffle=True)`` would order them. (Tensors over the whole
  partition would copy it, and a ``tf.data`` shuffle of a million row indices holds
  a few hundred bytes per row.)
* on disk: it reads the epoch's blocks through
  :func:`~sparkdl.executor.cache.epoch_batches` (a block-wise shuffle).

Each batch becomes numpy arrays, or, for a sparse vector column feeding a model input
built with ``keras.Input(..., sparse=True)``, the backend's sparse batch (a
``tf.SparseTensor``, a JAX ``BCOO``); sparse rows for a dense input are densified one
batch at a time.

The backend (:mod:`sparkdl.executor.backends`) turns the generator into what its
``model.fit`` reads: ``tf.data`` on TensorFlow
(:mod:`sparkdl.executor.backends.tf_feed`); on JAX, which has no input pipeline of its
own, the generator itself for ``model.fit`` and a ``keras.utils.PyDataset`` of known
length for ``evaluate``, and nothing imports TensorFlow. Either way one endless
pipeline serves every epoch of a ``model.fit`` call (Keras would build a new iterator
per epoch, which costs more than a small partition's steps).

Example:
    >>> import numpy as np
    >>> from sparkdl.contract.payload import Column, pack_inputs
    >>> x, y = Column("x", "dense", 2), Column("y", "int", 1)
    >>> feed = Feed(None, [x], [(2,)], [False], [y], batch_size=4, backend="jax")
    >>> batch = (np.ones((3, 2), np.float32), np.zeros(3, np.int32))
    >>> [x.shape for x, _ in feed.stream(lambda: iter([batch]))]
    [(3, 2)]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparkdl.contract.payload import Column, pack_inputs
from sparkdl.executor.backends import backend_for
from sparkdl.executor.blocks import Block, Csr
from sparkdl.executor.cache import PartitionCache, epoch_batches

__all__ = ["Feed", "model_input", "sparse_batch"]


@dataclass(frozen=True)
class Feed:
    """Batches of one cache as ``model.fit`` and ``model.evaluate`` take them.

    Attributes:
        cache: The partition (or its validation rows); ``None`` for a feed used only
            for :meth:`structure` and :meth:`stream` (scoring a stream).
        inputs: The feature columns, one per model input.
        input_shapes: Per-sample shape of each model input.
        sparse_inputs: Whether each model input takes the backend's sparse batch.
        outputs: The label columns, one per model output.
        batch_size: Rows per batch.
        weight: The rows' weights, fed as Keras's ``sample_weight`` (each batch is
            ``(x, y, w)``); ``None``: ``(x, y)``.
        output_shapes: Per-sample shape of each label (array labels are reshaped to
            it); ``None``: flat arrays and scalars.
        backend: The name of the Keras backend that reads the batches
            (:func:`~sparkdl.executor.backends.backend_for`).
        input_structure: The structure the model takes its inputs in
            (:func:`~sparkdl.contract.keras_io.input_structure`); ``None``: one array,
            or a tuple of them in ``model.inputs`` order.
    """

    cache: PartitionCache | None
    inputs: Sequence[Column]
    input_shapes: Sequence[tuple[int, ...]]
    sparse_inputs: Sequence[bool]
    outputs: Sequence[Column]
    batch_size: int
    weight: Column | None = None
    output_shapes: Sequence[tuple[int, ...]] | None = None
    backend: str = "tensorflow"
    input_structure: Any = None

    def train(
        self,
        start: int,
        stop: int,
        *,
        shuffle: bool,
        seed: int,
        limit: int | None = None,
    ) -> Any:
        """Endless epochs over rows ``start`` to ``stop`` (``limit`` rows of them, a
        random subset, when given), each in a new order when ``shuffle``."""
        rng = np.random.default_rng(seed)

        def epochs() -> Iterator[Any]:
            while True:
                for block in self._epoch(start, stop, shuffle=shuffle, rng=rng, limit=limit):
                    yield self.structure(block)

        return backend_for(self.backend).endless(self, epochs)

    def evaluate(self, start: int = 0, stop: int | None = None) -> Any:
        """One pass over rows ``start`` to ``stop`` in order (validation, evaluate)."""
        stop = self._data.rows if stop is None else stop
        rng = np.random.default_rng(0)

        def once() -> Iterator[Any]:
            for block in self._epoch(start, stop, shuffle=False, rng=rng):
                yield self.structure(block)

        # A known length: Keras warns when a dataset of unknown length ends.
        batches = -(-(stop - start) // self.batch_size)
        return backend_for(self.backend).counted(self, once, batches)

    def stream(self, make: Callable[[], Iterator[Any]]) -> Any:
        """The batches ``make()`` yields, each already in :meth:`structure`'s form,
        as they come (a stream of unknown length: scoring a DataFrame).

        Example:
            >>> from sparkdl.contract.payload import Column, pack_inputs
            >>> x, y = Column("x", "dense", 2), Column("y", "int", 1)
            >>> feed = Feed(None, [x], [(2,)], [False], [y], batch_size=4)
            >>> batch = (np.ones((3, 2), np.float32), np.zeros(3, np.int32))
            >>> [x.shape.as_list() for x, _ in feed.stream(lambda: iter([batch]))]
            [[3, 2]]
        """
        return backend_for(self.backend).streamed(self, make)

    # ------------------------------------------------------------------ helpers
    def input_slots(self) -> list[tuple[Column, tuple[int, ...], bool]]:
        """``(column, shape, takes a SparseTensor)`` per model input."""
        return list(zip(self.inputs, self.input_shapes, self.sparse_inputs, strict=True))

    def output_slots(self) -> list[tuple[Column, tuple[int, ...]]]:
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

    def structure(self, block: Block) -> tuple[Any, ...]:
        """``(x, y)`` of a block, and ``w`` for a weighted feed: one value each, or a
        tuple for several outputs; ``x`` in the model's input structure."""
        xs = [
            model_input(block[c.name], shape, sparse, self.backend)
            for c, shape, sparse in self.input_slots()
        ]
        ys = [_label(block[c.name], shape) for c, shape in self.output_slots() if c.name in block]
        x = pack_inputs(self.input_structure, xs)
        if self.weight is None:
            return x, _one(ys)
        return x, _one(ys), block[self.weight.name]


def sparse_batch(rows: Csr, backend: str, *, tensor: bool = False) -> Any:
    """CSR rows as the backend's sparse batch
    (:meth:`~sparkdl.executor.backends.base.Backend.sparse_batch`): on TensorFlow a
    ``SparseTensorValue`` (a ``tf.SparseTensor`` when ``tensor``: what
    ``predict_on_batch`` takes), on JAX a ``BCOO``."""
    return backend_for(backend).sparse_batch(rows, tensor=tensor)


def model_input(
    value: Any, shape: tuple[int, ...], sparse: bool, backend: str, *, tensor: bool = False
) -> Any:
    """A batch of one feature column as its model input takes it: the backend's sparse
    batch (:func:`sparse_batch`) for CSR rows and a ``sparse`` input, else dense rows in
    the input's per-sample ``shape``."""
    if isinstance(value, Csr):
        if sparse:
            return sparse_batch(value, backend, tensor=tensor)
        return value.dense().reshape((-1, *shape))
    return np.asarray(value).reshape((-1, *shape))


def _label(value: Any, shape: tuple[int, ...]) -> Any:
    """A batch of labels in their per-sample ``shape`` (``()``: one value a row)."""
    return value.reshape((-1, *shape)) if isinstance(value, np.ndarray) else value


def _label_shape(column: Column) -> tuple[int, ...]:
    return (column.width,) if column.kind == "dense" else ()


def _one(values: list[Any]) -> Any:
    return values[0] if len(values) == 1 else tuple(values)
