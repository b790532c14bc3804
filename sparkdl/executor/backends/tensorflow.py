"""The TensorFlow backend on an executor.

Its devices take TensorFlow's thread pools and GPU memory growth (:meth:`configure`),
its feeds go through ``tf.data`` (:mod:`sparkdl.executor.backends.tf_feed`), sparse
rows become ``tf.SparseTensor`` values, and weights are read and written one
TensorFlow op per variable where every weight is a plain resource variable
(:mod:`sparkdl.executor.backends.tf_weights`). TensorFlow loads at the first call that
needs it, never with this module.

Example:
    >>> TensorFlowBackend().name
    'tensorflow'
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

from sparkdl.executor.backends.base import Backend, BatchLayout
from sparkdl.executor.blocks import Csr
from sparkdl.executor.weight_access import WeightAccess

__all__ = ["TensorFlowBackend"]

_log = logging.getLogger(__name__)


class TensorFlowBackend(Backend):
    """Keras on TensorFlow."""

    name = "tensorflow"

    def configure(self, threads: int | None = None) -> list[Any]:
        """Sets thread counts and GPU memory growth; returns the visible GPUs.

        Settings that TensorFlow refuses after its runtime started (a reused Python
        worker) are left as they are.
        """
        import tensorflow as tf

        if threads:
            with contextlib.suppress(RuntimeError):  # runtime already started
                tf.config.threading.set_intra_op_parallelism_threads(threads)
                tf.config.threading.set_inter_op_parallelism_threads(max(2, threads))
        gpus = tf.config.list_physical_devices("GPU")
        for gpu in gpus:
            with contextlib.suppress(RuntimeError):
                tf.config.experimental.set_memory_growth(gpu, True)
        if not gpus:
            _log.info("sparkdl worker: no GPU visible, training on the CPU")
        return list(gpus)

    def endless(self, layout: BatchLayout, make: Callable[[], Iterator[Any]]) -> Any:
        from sparkdl.executor.backends import tf_feed

        return tf_feed.endless(layout, make)

    def counted(self, layout: BatchLayout, make: Callable[[], Iterator[Any]], batches: int) -> Any:
        from sparkdl.executor.backends import tf_feed

        return tf_feed.counted(layout, make, batches)

    def streamed(self, layout: BatchLayout, make: Callable[[], Iterator[Any]]) -> Any:
        from sparkdl.executor.backends import tf_feed

        return tf_feed.streamed(layout, make)

    def sparse_batch(self, rows: Csr, *, tensor: bool = False) -> Any:
        """A ``tf.compat.v1.SparseTensorValue`` (what a ``tf.data`` generator yields),
        or a ``tf.SparseTensor`` when ``tensor`` (what ``predict_on_batch`` takes)."""
        import tensorflow as tf

        indices, values = rows.coo()
        shape = (len(rows), rows.width)
        if tensor:
            return tf.SparseTensor(indices, values, shape)
        return tf.compat.v1.SparseTensorValue(indices, values, shape)

    def weight_access(self, model: Any) -> WeightAccess:
        """One TensorFlow op per variable when every weight is a plain resource
        variable (:class:`~sparkdl.executor.backends.tf_weights.TensorFlowWeights`),
        else Keras's ``get_weights`` / ``set_weights``."""
        from sparkdl.executor.backends.tf_weights import TensorFlowWeights, resource_variables

        handles = resource_variables(model)
        return WeightAccess(model) if handles is None else TensorFlowWeights(model, handles)
