"""The worker's Keras callbacks that set the learning rate batch by batch.

:class:`ScaledRate` is the worker half of the large-batch recipe. Before every batch it
sets the optimizer's learning rate to what :class:`~sparkdl.sync.recipe.LearningRateRecipe`
says for the optimizer's step count (the scaled rate, ramped over the warm-up). The
user's rate is read once, when the first batch begins; a driver callback that changes it
(``ReduceLROnPlateau``) passes the new one through :meth:`ScaledRate.rebase`.

:class:`ShortBatchRate` scales the step of an epoch's short last batch by the rows it
holds. Every worker of a fit ends its epoch with such a batch (its partition's rows
modulo the batch size: often a row or two), each at the worker's scaled rate, and the
merge then adds or averages those steps as if each were a full batch's: a few rows'
noisy gradient moved the merged model as far as a whole batch's. Measured on digits
(CNN, SGD 0.03, 2 workers syncing every batch), the merged model's training loss
jumped from 0.16 to 1.10 at the epochs' ends while the workers' own loss kept falling;
with the step scaled (or with rows that fill every batch) it fell smoothly. A row then
moves the model as much in the short batch as in any other.

Example:
    >>> from sparkdl.sync.recipe import LearningRateRecipe
    >>> ScaledRate(LearningRateRecipe(factor=4.0), steps_per_epoch=10).recipe.factor
    4.0
    >>> ShortBatchRate(rows=70, batch_size=32).share  # the last of 3 batches holds 6 rows
    0.1875
"""

from __future__ import annotations

from typing import Any

import keras

from sparkdl.contract.keras_io import scheduled_rate
from sparkdl.sync.recipe import LearningRateRecipe
from sparkdl.sync.schedule import steps_for

__all__ = ["ScaledRate", "ShortBatchRate"]


class ScaledRate(keras.callbacks.Callback):
    """Sets the learning rate of the large-batch recipe before every batch.

    Args:
        recipe: The fit's recipe (resolved on the driver).
        steps_per_epoch: The worker's batches per epoch (the warm-up's unit).
    """

    def __init__(self, recipe: LearningRateRecipe, steps_per_epoch: int) -> None:
        super().__init__()
        self.recipe = recipe
        self.steps_per_epoch = steps_per_epoch
        #: The user's rate (what the recipe scales).
        self.base: float | None = None
        self._set: float | None = None
        self._warm = recipe.warmup_steps(steps_per_epoch)
        self._ramped = False  # past the warm-up: the rate stays until a rebase

    def rebase(self, rate: float) -> None:
        """The user's rate changed (a driver callback): scale the new one from now on."""
        self.base = float(rate)
        self._ramped = False
        self._apply()

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Sets the rate for the batch about to run (with ``steps_per_execution``, for
        each execution)."""
        if not self._ramped:
            self._apply()

    def _apply(self) -> None:
        optimizer = self.model.optimizer
        if self.base is None:  # read once: a resumed epoch runs model.fit twice
            self.base = float(optimizer.learning_rate)
        step = int(optimizer.iterations)
        self._ramped = step >= self._warm
        rate = self.recipe.rate(self.base, step, self.steps_per_epoch)
        if rate != self._set:
            optimizer.learning_rate = rate
            self._set = rate


class ShortBatchRate(keras.callbacks.Callback):
    """Scales the learning rate of an epoch's short last batch by its share of a batch.

    The rate is restored once the batch ends. An epoch that is one short batch (a
    partition smaller than a batch, or the rows a resumed epoch has left) is scaled too:
    every batch moves the model by its rows. Nothing is scaled when the epoch's batches
    are all full, when the optimizer's rate comes from a schedule (it cannot be set),
    with ``steps_per_execution`` above 1 (the short batch shares a call with full ones),
    or when a loss is summed over the batch rather than averaged (its gradient already
    shrinks with the rows).

    Args:
        rows: The rows of the epoch this ``model.fit`` call trains.
        batch_size: The fit's batch size.

    Attributes:
        steps: The epoch's batches; the last is the short one.
        share: The short batch's rows over a full batch's (1.0: nothing to scale).

    Example:
        >>> ShortBatchRate(rows=64, batch_size=32).share  # every batch full
        1.0
        >>> ShortBatchRate(rows=3, batch_size=4).share  # one short batch
        0.75
    """

    def __init__(self, rows: int, batch_size: int) -> None:
        super().__init__()
        self.steps = steps_for(rows, batch_size)
        short = rows % batch_size
        self.share = short / batch_size if short else 1.0
        self._restore: float | None = None

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Scales the rate before the epoch's last batch, when it is short."""
        if self.share == 1.0 or batch != self.steps - 1 or not self._settable():
            return
        optimizer = self.model.optimizer
        self._restore = float(optimizer.learning_rate)
        optimizer.learning_rate = self._restore * self.share

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Puts the rate back after the short batch."""
        if self._restore is not None:
            self.model.optimizer.learning_rate = self._restore
            self._restore = None

    def _settable(self) -> bool:
        if int(getattr(self.model, "steps_per_execution", 1) or 1) > 1:
            return False
        return not scheduled_rate(self.model) and _averaged_losses(self.model.loss)


def _averaged_losses(loss: Any) -> bool:
    """Whether every loss of a compiled model averages over the batch (Keras's default
    ``"sum_over_batch_size"``; a name or a plain function does)."""
    if isinstance(loss, dict):
        return all(_averaged_losses(each) for each in loss.values())
    if isinstance(loss, (list, tuple)):
        return all(_averaged_losses(each) for each in loss)
    reduction = getattr(loss, "reduction", "sum_over_batch_size")
    return reduction in ("sum_over_batch_size", "mean", "mean_with_sample_weight")
