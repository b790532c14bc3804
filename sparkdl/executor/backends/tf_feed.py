"""The TensorFlow side of :mod:`sparkdl.executor.feed`: its batches as ``tf.data``.

Dense batches cross from the Python generator to TensorFlow up to :data:`GROUP` at a
time (stacked; ``tf.data`` unstacks them), so the generator's per-element cost, paid
under the GIL next to the training step, is spread over many steps. Every pipeline
runs with ``tf.data``'s autotuner off (:func:`untuned`). Only a TensorFlow worker
imports this module (:class:`~sparkdl.executor.backends.tensorflow.TensorFlowBackend`);
it reads a feed through :class:`~sparkdl.executor.backends.base.BatchLayout`.

Example:
    >>> from sparkdl.contract.payload import Column, pack_inputs
    >>> spec(Column("y", "int", 1), (), sparse=False)
    TensorSpec(shape=(None,), dtype=tf.int32, name=None)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from sparkdl.contract.payload import Column, pack_inputs
from sparkdl.executor.backends.base import BatchLayout

__all__ = ["GROUP", "GROUP_BYTES", "counted", "endless", "signature", "spec", "streamed", "untuned"]

#: Dense batches cross from the generator to TensorFlow up to this many at a time...
GROUP = 16
#: ...and up to about this many bytes at a time.
GROUP_BYTES = 4 << 20


def endless(feed: BatchLayout, make: Callable[[], Iterator[Any]]) -> tf.data.Dataset:
    """The batches of ``make()`` (endless epochs), prefetched."""
    return untuned(_generated(feed, make).prefetch(2))


def counted(feed: BatchLayout, make: Callable[[], Iterator[Any]], batches: int) -> tf.data.Dataset:
    """The ``batches`` batches of ``make()``, of known length (Keras warns when a
    dataset of unknown length ends), prefetched."""
    data = _generated(feed, make).apply(tf.data.experimental.assert_cardinality(batches))
    return untuned(data.prefetch(2))


def streamed(feed: BatchLayout, make: Callable[[], Iterator[Any]]) -> tf.data.Dataset:
    """The batches of ``make()``, already in the feed's structure, as they come."""
    return untuned(tf.data.Dataset.from_generator(make, output_signature=signature(feed)))


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
    dtype = {"int": tf.int32, "bytes": tf.uint8}.get(column.kind, tf.float32)
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


def signature(feed: BatchLayout) -> tuple[Any, ...]:
    """The ``(x, y)`` (or ``(x, y, w)``) type specs of one of the feed's batches."""
    x = pack_inputs(feed.input_structure, [spec(c, s, sparse=p) for c, s, p in feed.input_slots()])
    y = _one([spec(c, shape, sparse=False) for c, shape in feed.output_slots()])
    if feed.weight is None:
        return x, y
    return x, y, tf.TensorSpec((None,), tf.float32)


def _generated(feed: BatchLayout, make: Callable[[], Iterator[Any]]) -> tf.data.Dataset:
    """A dataset of the batches ``make()`` yields, dense ones grouped."""
    columns = [*feed.inputs, *feed.outputs, *([feed.weight] if feed.weight else [])]
    row_bytes = sum(c.dtype.itemsize * max(c.width, 1) for c in columns)
    group = min(GROUP, max(1, GROUP_BYTES // max(row_bytes * feed.batch_size, 1)))
    if group == 1 or any(c.kind == "sparse" for c in feed.inputs):
        # SparseTensors do not stack; sparse rows densified are made one batch at a time.
        return tf.data.Dataset.from_generator(make, output_signature=signature(feed))
    grouped = tf.data.Dataset.from_generator(
        lambda: _groups(make(), group),
        output_signature=tf.nest.map_structure(_stacked, signature(feed)),
    )
    return grouped.flat_map(lambda *parts: tf.data.Dataset.from_tensor_slices(parts))


def _one(values: list[Any]) -> Any:
    return values[0] if len(values) == 1 else tuple(values)
