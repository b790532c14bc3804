"""The PyTorch backend on an executor.

Keras on PyTorch reads batches as JAX's trainer does: ``model.fit`` takes the feed's
Python generator, and validation and ``evaluate`` a ``keras.utils.PyDataset`` of known
length (:func:`~sparkdl.executor.backends.jax.replayed`). PyTorch sizes its CPU thread
pool from the worker's share of the executor's cores (:meth:`TorchBackend.configure`),
and sees only the GPUs Spark gave the task: ``CUDA_VISIBLE_DEVICES`` is set before
PyTorch starts CUDA (:func:`~sparkdl.executor.backends.devices.assign_gpus`).

Weights are written in place (Keras's torch variables copy into their parameter), so
the optimizer's references to the parameters survive every write from the service;
the reads are copies. Keras's torch backend has no sparse tensors as model inputs
(``keras.Input(..., sparse=True)`` raises on the driver already); sparse columns
(ML ``SparseVector``) feed a dense input as dense rows, as on the other backends.
Nothing here creates a ``torch.distributed`` process group (Keras would wrap the model
in ``DistributedDataParallel`` if one existed), and nothing imports TensorFlow or JAX.

Example:
    >>> TorchBackend().name
    'torch'
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from sparkdl.contract.backends import BackendError
from sparkdl.executor.backends.base import Backend
from sparkdl.executor.backends.jax import GeneratorFeeds
from sparkdl.executor.blocks import Csr
from sparkdl.executor.weight_access import WeightAccess

__all__ = ["TorchBackend", "TorchWeights"]

_log = logging.getLogger(__name__)


class TorchBackend(GeneratorFeeds, Backend):
    """Keras on PyTorch."""

    name = "torch"

    def configure(self, threads: int | None = None) -> list[Any]:
        """PyTorch's CPU threads (``threads``, when given) and the visible GPUs."""
        import torch

        if threads:
            torch.set_num_threads(int(threads))
        gpus = [f"cuda:{i}" for i in range(torch.cuda.device_count())]
        if not gpus:
            _log.info("sparkdl worker: no GPU visible, training on the CPU")
        return gpus

    def sparse_batch(self, rows: Csr, *, tensor: bool = False) -> Any:
        """Refused: Keras's torch backend takes no sparse inputs."""
        raise BackendError(SPARSE_ON_TORCH)

    def weight_access(self, model: Any) -> WeightAccess:
        return TorchWeights(model)


#: Why a sparse input cannot train on torch, and what to do instead.
SPARSE_ON_TORCH = (
    "Keras's torch backend has no sparse inputs (keras.Input(..., sparse=True)). Build "
    "the input without sparse=True (sparkdl then feeds dense rows), or run Keras on "
    "TensorFlow or JAX (KERAS_BACKEND=tensorflow or jax before importing Keras)."
)


class TorchWeights(WeightAccess):
    """Keras's ``get_weights`` / ``set_weights`` on torch, reads copied.

    ``set_weights`` copies into each parameter (its identity, which the optimizer
    holds, stays); ``get_weights`` copies too on every Keras the tests run, and a read
    is copied again here only where it shares memory with a parameter, so that a
    center kept between syncs never moves with training.
    """

    def get(self) -> list[np.ndarray]:
        arrays = super().get()
        live = [v.value for v in self.model.weights]
        return [_owned(a, v) for a, v in zip(arrays, live, strict=True)]


def _owned(array: np.ndarray, tensor: Any) -> np.ndarray:
    """``array``, copied when it may share memory with ``tensor`` (a parameter on the
    CPU; a GPU's parameter is always read into new host memory)."""
    if getattr(getattr(tensor, "device", None), "type", None) != "cpu":
        return array
    try:
        shared = np.may_share_memory(array, tensor.detach().numpy())
    except (TypeError, RuntimeError):  # a dtype numpy has no view of (bfloat16): copied
        return array.copy()
    return array.copy() if shared else array
