"""The JAX backend on an executor.

JAX reads its settings from the environment as it loads: a worker turns off XLA's
preallocation of most of the GPU's memory (:meth:`JaxBackend.prepare`), so that it
shares its GPU as a TensorFlow worker (memory growth) does. JAX has no input pipeline
of its own: ``model.fit`` reads the feed's Python generator itself, and validation and
``evaluate`` a ``keras.utils.PyDataset`` of known length (:func:`replayed`); sparse
rows become ``BCOO`` arrays. Keras's JAX trainer keeps its state apart from the
model's variables in the middle of an epoch: weight access writes it back first
(:class:`JaxWeights`). Nothing imports JAX or Keras until a call needs it, and nothing
here imports TensorFlow.

Example:
    >>> JaxBackend().environment
    {'XLA_PYTHON_CLIENT_PREALLOCATE': 'false'}
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from sparkdl.executor.backends.base import Backend, BatchLayout
from sparkdl.executor.blocks import Csr
from sparkdl.executor.weight_access import WeightAccess

__all__ = ["GeneratorFeeds", "JaxBackend", "JaxWeights", "replayed"]

_log = logging.getLogger(__name__)


class GeneratorFeeds:
    """The feeds of a backend without an input pipeline of its own (JAX, PyTorch):
    ``model.fit`` reads the feed's generator itself; validation and ``evaluate`` a
    ``keras.utils.PyDataset`` of known length (:func:`replayed`)."""

    def endless(self, layout: BatchLayout, make: Callable[[], Iterator[Any]]) -> Any:
        return make()

    def counted(self, layout: BatchLayout, make: Callable[[], Iterator[Any]], batches: int) -> Any:
        return replayed(make, batches)

    def streamed(self, layout: BatchLayout, make: Callable[[], Iterator[Any]]) -> Any:
        return make()


class JaxBackend(GeneratorFeeds, Backend):
    """Keras on JAX."""

    name = "jax"

    # A worker shares its GPU's memory as TensorFlow's memory growth does.
    environment = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}

    def configure(self, threads: int | None = None) -> list[Any]:
        """The visible GPUs; XLA sizes its own thread pools (``threads`` has no effect)
        and read its memory settings as it loaded (:meth:`prepare`)."""
        import jax

        try:
            gpus = list(jax.devices("gpu"))
        except RuntimeError:  # no GPU platform in this jaxlib, or no device
            gpus = []
        if not gpus:
            _log.info("sparkdl worker: no GPU visible, training on the CPU")
        return gpus

    def sparse_batch(self, rows: Csr, *, tensor: bool = False) -> Any:
        """A ``jax.experimental.sparse.BCOO`` (what both a generator and
        ``predict_on_batch`` take)."""
        from jax.experimental import sparse

        indices, values = rows.coo()
        shape = (len(rows), rows.width)
        return sparse.BCOO((values, indices.astype(np.int32)), shape=shape)

    def weight_access(self, model: Any) -> WeightAccess:
        return JaxWeights(model)


class JaxWeights(WeightAccess):
    """Keras's ``get_weights`` / ``set_weights``, the trainer's state written back to
    the model's variables first (inside ``model.fit``; elsewhere that is nothing)."""

    def get(self) -> list[np.ndarray]:
        _synced(self.model)
        return super().get()

    def set(self, arrays: Sequence[np.ndarray]) -> None:
        _synced(self.model)  # the next step then reads the variables written here
        super().set(arrays)


def _synced(model: Any) -> None:
    """Inside ``model.fit``, the trainer's state written back to the model's variables
    (Keras keeps it apart between callbacks' reads)."""
    sync = getattr(model, "jax_state_sync", None)
    if sync is not None:
        sync()


def replayed(make: Callable[[], Iterator[Any]], batches: int) -> Any:
    """The batches of ``make()`` as a ``keras.utils.PyDataset`` of ``batches`` batches,
    read again from the start each epoch (Keras asks for them in order)."""
    import keras

    class Replayed(keras.utils.PyDataset):
        def __init__(self) -> None:
            super().__init__()
            self._batches: Iterator[Any] = iter(())
            self._next = 0

        @property
        def num_batches(self) -> int:
            return batches

        def __getitem__(self, index: int) -> Any:
            if index == 0 or index != self._next:  # a new epoch (or a jump): start over
                self._batches = make()
                for _ in range(index):
                    next(self._batches)
            self._next = index + 1
            return next(self._batches)

    return Replayed()
